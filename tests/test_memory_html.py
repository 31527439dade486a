"""ag.plot.memory_html: one offline HTML file, checked in a real headless Chromium.

The browser is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``), with no
package beyond the standard library: the page loads, Bokeh renders, nothing is logged as an error,
nothing is fetched from the network, the screenshot is not blank, the measured peak is on the page
and hovering a band names the tensor. Without Chromium or bokeh these tests skip; CI sets
AG_REQUIRE_BROWSER=1 so that a missing one fails instead.
"""
from __future__ import annotations

import base64
import json
import os
import re
import select
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

import ag
from ag import remat, trace
from ag.trace import CATEGORIES, MB, Buffer, Snapshot

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--remote-debugging-pipe")
WINDOW = (1280, 900)


def _required(what: str, reason: str):
    if os.environ.get("AG_REQUIRE_BROWSER") == "1":
        pytest.fail(f"AG_REQUIRE_BROWSER=1 but {what} is missing: {reason}")
    pytest.skip(reason)


def _bokeh_or_skip():
    try:
        import bokeh  # noqa: F401
    except ImportError:
        _required("bokeh", "memory_html needs bokeh: pip install -e '.[plot]'")


def _chromium_or_skip() -> str:
    """AG_CHROMIUM if set, else the first Chromium on PATH."""
    names = [os.environ["AG_CHROMIUM"]] if os.environ.get("AG_CHROMIUM") else ["chromium", "chromium-browser"]
    found = next((shutil.which(n) for n in names if shutil.which(n)), None)
    if not found:
        _required("chromium", f"no headless Chromium found ({', '.join(names)}): apt-get install chromium")
    return found


def _chain_timeline(strategy: str, n_layers: int = 6) -> list[Snapshot]:
    """A small traced chain of tanh(h @ w) layers, named tensors, under one checkpoint strategy."""
    rng = np.random.default_rng(0)
    weights = [ag.Tensor(rng.standard_normal((200, 200)) / 15, requires_grad=True, name=f"w{i}")
               for i in range(n_layers)]
    layers = [lambda h, w=w: ag.tanh(h @ w) for w in weights]
    x = ag.Tensor(rng.standard_normal((256, 200)), name="x")
    kept = remat.plan(n_layers, strategy)
    with trace.tracing() as timeline:
        ag.sum(remat.sequential(layers, x, kept, mode=remat.mode_for(strategy))).backward()
    return timeline


@pytest.fixture(scope="module")
def timelines():
    return {"keep all": _chain_timeline("keep all"), "sqrt": _chain_timeline("sqrt")}


@pytest.fixture(scope="module")
def html_file(timelines, tmp_path_factory):
    """memory_html's file for the two strategies, and what it returned."""
    from ag.plot.html import memory_html
    _bokeh_or_skip()
    path = tmp_path_factory.mktemp("memory_html") / "timeline.html"
    return path, memory_html(timelines, path, title="A 6-layer chain: no remat, then sqrt")


def _peak_text(snapshots) -> str:
    """The measured peak as the page prints it: max allocated over the timeline, MB to one decimal."""
    return f"{max(s.allocated_bytes for s in snapshots) / MB:.1f} MB"


def _buffer(key: int, nbytes: int, category: str = "activations kept") -> Buffer:
    kind = "grad" if category == "gradients" else "value"
    return Buffer(key, f"t{key}", (nbytes // 8,), "float64", nbytes, category, "matmul", "forward", kind)


def _snapshot(*buffers: Buffer) -> Snapshot:
    totals = dict.fromkeys(CATEGORIES, 0)
    for b in buffers:
        totals[b.category] += b.nbytes
    total = sum(totals.values())
    return Snapshot(total, total, op="matmul", phase="forward", categories=totals, buffers=tuple(buffers))


def test_empty_timelines_are_refused_with_a_clear_error(tmp_path):
    from ag.plot.html import memory_html
    with pytest.raises(ValueError, match="timelines is empty"):
        memory_html({}, tmp_path / "out.html")


def test_snapshots_without_categories_are_refused_naming_the_label(tmp_path):
    from ag.plot.html import memory_html
    trace.start_trace()
    plain = [trace.snapshot_trace("matmul", "forward")]
    trace.end_trace()
    with pytest.raises(ValueError, match=r"'by hand'.*carry no categories.*tracing\(\)"):
        memory_html({"by hand": plain}, tmp_path / "out.html")
    assert not (tmp_path / "out.html").exists()


def test_a_timeline_without_snapshots_is_refused_naming_the_label(tmp_path):
    from ag.plot.html import memory_html
    with pytest.raises(ValueError, match="'empty' holds no snapshots"):
        memory_html({"empty": []}, tmp_path / "out.html")


def test_each_buffer_is_a_band_stacked_by_category_at_its_offset():
    from ag.plot.html import _bands
    grad = _buffer(3, 1000, "gradients")
    a, b, c = _buffer(0, 4000), _buffer(1, 2000), _buffer(2, 3000, "inputs")
    bands = _bands([_snapshot(a, b, c), _snapshot(a, b, c, grad), _snapshot(b, c, grad)])
    kept = bands["activations kept"]
    # inputs at the bottom; a (older) under b; when a is freed, b drops onto the inputs
    assert bands["inputs"]["bottom"] == [0] and bands["inputs"]["right"] == [2.5]
    assert list(zip(kept["name"], kept["left"], kept["right"], kept["bottom"])) == [
        ("t0", -0.5, 1.5, 3000 / MB), ("t1", -0.5, 1.5, 7000 / MB), ("t1", 1.5, 2.5, 3000 / MB)]
    assert kept["alive"][1] == kept["alive"][2] == "steps 0 to 2 (forward matmul to forward matmul)"
    assert bands["gradients"]["bottom"] == [9000 / MB, 5000 / MB] and bands["gradients"]["name"] == ["t3.grad"] * 2


def test_bands_add_up_to_the_categories_tracing_counted(timelines):
    from ag.plot.html import _bands
    for snapshots in timelines.values():
        for category, columns in _bands(snapshots).items():
            for i, snapshot in enumerate(snapshots):
                here = [t - b for left, right, b, t in zip(columns["left"], columns["right"], columns["bottom"],
                                                          columns["top"]) if left < i < right]
                assert sum(here) == pytest.approx(snapshot.categories[category] / MB)


def test_bytes_no_buffer_holds_are_one_temporaries_band_on_top():
    from ag.plot.html import _bands
    state = Buffer(5, "w.exp_avg", (250,), "float64", 2000, "optimizer state", None, "optimizer step", "state")
    snapshot = _snapshot(_buffer(0, 4000), state)
    snapshot = Snapshot(7000, 7000, "Adam", "optimizer step", "w", snapshot.categories | {"temporaries": 1000},
                        buffers=snapshot.buffers)
    bands = _bands([snapshot])
    assert bands["optimizer state"]["bottom"] == [4000 / MB] and bands["optimizer state"]["name"] == ["w.exp_avg"]
    assert bands["temporaries"]["bottom"] == [6000 / MB] and bands["temporaries"]["top"] == [7000 / MB]


def test_a_training_step_page_shades_the_optimizer_step(tmp_path, rng):
    from ag.plot.html import memory_html
    _bokeh_or_skip()
    x = ag.Tensor(rng.standard_normal((16, 8)))
    with trace.tracing() as timeline:
        layer = ag.nn.Linear(8, 4, dtype=np.float64, name="layer")
        opt = ag.optim.Adam(list(layer.parameters()))
        ag.sum(layer(x)).backward()
        opt.step()
    page = memory_html({"step": timeline}, tmp_path / "step.html")
    text = open(page).read()
    assert '"optimizer step \\u2192"' in text  # the label over the shaded step, as Bokeh's JSON escapes it
    assert "layer.weight.exp_avg" in text


def test_snapshots_with_categories_but_no_buffers_stack_whole_categories(tmp_path):
    from ag.plot.html import _bands, memory_html
    _bokeh_or_skip()
    totals = dict.fromkeys(CATEGORIES, 0) | {"parameters": 4 * MB, "gradients": 2 * MB}
    snapshots = [Snapshot(6 * MB, 6 * MB, op="matmul", phase="forward", categories=totals)]
    assert _bands(snapshots)["gradients"]["name"] == ["all gradients"]
    memory_html({"categories only": snapshots}, tmp_path / "out.html")
    assert "6.0 MB" in (tmp_path / "out.html").read_text()


def test_the_file_is_self_contained_with_no_script_or_style_from_the_network(html_file):
    path, returned = html_file
    page = path.read_text()
    assert returned == str(path)
    assert re.findall(r"<script[^>]*\bsrc\s*=", page, re.I) == []
    assert re.findall(r"<link[^>]*\bhref\s*=\s*[\"']?(?:https?:)?//", page, re.I) == []
    assert "Bokeh" in page and "<title>A 6-layer chain: no remat, then sqrt</title>" in page


def test_demo_html_is_refused_for_demos_that_record_no_timeline(capsys):
    from ag import cli
    assert cli.main(["demo", "attention", "--html", "out.html"]) == 2
    assert cli.main(["demo", "remat", "--graph", "--html", "out.html"]) == 2
    assert "--html applies to the memory and remat demos only" in capsys.readouterr().err


def test_demo_html_hands_its_path_to_the_memory_and_remat_demos(monkeypatch, tmp_path):
    from ag import cli, demo
    _bokeh_or_skip()
    calls = []
    monkeypatch.setattr(demo, "memory", lambda out=None, html=None: calls.append(("memory", html)))
    monkeypatch.setattr(demo, "remat_demo", lambda out, html=None: calls.append(("remat", html)))
    for name in ("memory", "remat"):
        assert cli.main(["demo", name, "--html", str(tmp_path / f"{name}.html")]) == 0
    assert calls == [("memory", str(tmp_path / "memory.html")), ("remat", str(tmp_path / "remat.html"))]


def test_the_memory_demo_draws_the_chain_before_and_after_lazy_grads(tmp_path, capsys):
    from ag import demo
    _bokeh_or_skip()
    timelines = demo.chain_timelines(64, 3, width=50)
    before, after = timelines.values()
    assert before[0].categories["gradients"] > 0 and after[0].categories["gradients"] == 0  # grads in forward
    demo._save_html(str(tmp_path / "sub" / "chain.html"), timelines, "chain")
    assert f"interactive timeline written: {tmp_path / 'sub' / 'chain.html'}" in capsys.readouterr().out
    assert (tmp_path / "sub" / "chain.html").stat().st_size > 100_000


class Chromium:
    """Headless Chromium driven over the DevTools protocol: JSON messages ending in NUL on fds 3 and 4."""

    def __init__(self, binary: str, profile: str):
        to_browser, self._send = os.pipe()
        self._receive, from_browser = os.pipe()

        def pipes_on_3_and_4():
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)
        self.process = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
             "about:blank"], pass_fds=(3, 4), preexec_fn=pipes_on_3_and_4,
            start_new_session=True,  # a process group of its own: close() ends it, renderers included
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser)
        os.close(from_browser)
        self._pending, self._last_id, self.events = b"", 0, []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", page=True)
        self.call("Emulation.setDeviceMetricsOverride", {"width": WINDOW[0], "height": WINDOW[1],
                                                         "deviceScaleFactor": 1, "mobile": False}, page=True)

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._receive], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._receive, 1 << 20)
            if not chunk:
                raise EOFError("chromium closed its DevTools pipe")
            self._pending += chunk
        message, self._pending = self._pending.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict | None = None, page: bool = False, timeout: float = 15) -> dict:
        self._last_id += 1
        request = {"id": self._last_id, "method": method, "params": params or {}}
        if page:
            request["sessionId"] = self.session
        os.write(self._send, json.dumps(request).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            message = self._message(deadline)
            if message.get("id") == self._last_id:
                assert "error" not in message, f"{method}: {message['error']}"
                return message["result"]
            self.events.append(message)

    def wait_for(self, found, timeout: float = 15) -> dict:
        """The first event (seen already or to come) for which ``found(event)`` holds."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for event in self.events[seen:]:
                if found(event):
                    return event
            seen = len(self.events)
            self.events.append(self._message(deadline))

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                "returnByValue": True}, page=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def mouse(self, kind: str, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
                  page=True)

    def screenshot(self, path) -> None:
        data = self.call("Page.captureScreenshot", {"format": "png"}, page=True)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        """Ask Chromium to quit, then end its process group whatever it did."""
        try:
            self.call("Browser.close", timeout=5)
            self.process.wait(timeout=5)
        except (TimeoutError, EOFError, OSError, AssertionError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        os.close(self._send)
        os.close(self._receive)


# Bokeh draws its widgets inside shadow roots: read text and find elements through them.
DEEP = """
window.deepAll = (selector) => {
  const found = [];
  const walk = (root) => {
    found.push(...root.querySelectorAll(selector));
    for (const el of root.querySelectorAll('*')) if (el.shadowRoot) walk(el.shadowRoot);
  };
  walk(document);
  return found;
};
window.deepText = () => {
  const parts = [];
  const walk = (node) => {
    for (const child of node.childNodes) {
      if (child.nodeType === 3) parts.push(child.textContent);
      else if (child.nodeType === 1 && !['SCRIPT', 'STYLE'].includes(child.tagName)) {
        if (child.shadowRoot) walk(child.shadowRoot);
        walk(child);
      }
    }
  };
  walk(document.body);
  return parts.join(' ').replace(/\\s+/g, ' ');
};
window.frameAt = (title, x, y) => {  // the screen point of data point (x, y) in the figure so titled
  for (const root of Object.values(Bokeh.index)) for (const view of root.owner.all_views()) {
    if (view.frame && view.model.title.text.startsWith(title)) {
      const box = view.el.getBoundingClientRect();
      return [box.x + view.frame.x_scale.compute(x), box.y + view.frame.y_scale.compute(y)];
    }
  }
};
"""


@pytest.fixture(scope="module")
def browser_page(html_file):
    """memory_html's file for two strategies, opened in headless Chromium until Bokeh is idle."""
    binary = _chromium_or_skip()
    path, _ = html_file
    folder = path.parent
    browser = Chromium(binary, str(folder / "profile"))
    try:
        browser.call("Page.navigate", {"url": f"file://{path}"}, page=True)
        browser.wait_for(lambda e: e.get("method") == "Runtime.consoleAPICalled"
                         and "document idle" in " ".join(str(a.get("value")) for a in e["params"]["args"]))
        browser.evaluate(DEEP)
        yield browser, folder
    finally:
        browser.close()


def test_the_page_renders_with_bokeh_and_logs_no_error(browser_page):
    browser, _ = browser_page
    assert browser.evaluate("Bokeh.documents.length") == 1
    assert browser.evaluate("deepAll('canvas').length") >= 1
    errors = [e for e in browser.events
              if e.get("method") == "Runtime.exceptionThrown"
              or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
              or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
    assert errors == []


def test_the_page_fetches_nothing_from_the_network(browser_page):
    browser, _ = browser_page
    urls = [e["params"]["request"]["url"] for e in browser.events if e.get("method") == "Network.requestWillBeSent"]
    assert urls and [u for u in urls if not u.startswith(("file:", "data:"))] == []


def test_the_page_shows_each_measured_peak(browser_page, timelines):
    browser, _ = browser_page
    text = browser.evaluate("deepText()")
    assert len({_peak_text(s) for s in timelines.values()}) == 2, "pick strategies whose peaks differ"
    for label, snapshots in timelines.items():
        assert f"{label}: {_peak_text(snapshots)}" in text  # the tab, drawn by BokehJS


def test_the_screenshot_at_slide_size_is_not_blank(browser_page):
    from matplotlib.image import imread

    from ag.palette import SERIES_COLOURS
    browser, folder = browser_page
    browser.screenshot(folder / "page.png")
    pixels = (imread(folder / "page.png")[..., :3].reshape(-1, 3) * 255).round().astype(int)
    colours, counts = np.unique(pixels @ [1 << 16, 1 << 8, 1], return_counts=True)
    assert pixels.shape[0] == WINDOW[0] * WINDOW[1]
    assert len(colours) > 50 and counts.max() < 0.99 * len(pixels), "the page looks blank"
    for colour in SERIES_COLOURS[:2]:  # each strategy's line is drawn, in its own colour
        rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
        assert (np.abs(pixels - rgb).max(axis=1) <= 8).sum() > 200, f"no line drawn in {colour}"


def test_hovering_a_band_names_the_tensor_its_op_and_phase(browser_page, timelines):
    browser, folder = browser_page
    tab = browser.evaluate("(() => { const r = deepAll('.bk-tab')[1].getBoundingClientRect(); "
                           "return [r.x + r.width / 2, r.y + r.height / 2] })()")
    browser.mouse("mousePressed", *tab)
    browser.mouse("mouseReleased", *tab)
    snapshots = timelines["keep all"]
    step = max(range(len(snapshots)), key=lambda i: snapshots[i].allocated_bytes)
    bottom = min(snapshots[step].buffers, key=lambda b: (CATEGORIES.index(b.category), b.key))
    deadline = time.monotonic() + 5
    while "made by op" not in (text := browser.evaluate("deepText()")) and time.monotonic() < deadline:
        browser.mouse("mouseMoved", *browser.evaluate(f"frameAt('keep all:', {step}, {bottom.nbytes / 2 / MB})"))
        time.sleep(0.1)
    browser.screenshot(folder / "hover.png")
    expected = f"{bottom.name}.grad" if bottom.kind == "grad" else bottom.name
    assert f"tensor: {expected} shape: {tuple(bottom.shape)} {bottom.dtype}" in text
    assert f"made by op: {bottom.op} in: {bottom.phase}" in text
    assert f"step: {step}: {snapshots[step].label} (tracemalloc {_peak_text(snapshots)}" in text
