"""An interactive memory timeline in one HTML file that opens offline (needs the ``plot`` extra: bokeh).

``memory_html`` draws what ``ag.trace.tracing()`` recorded, never measures. Each buffer alive after
an op, a backward step or an optimizer step is a band of its own, stacked by category (inputs at the
bottom, then parameters, activations, gradients, optimizer state, and temporaries on top) as in
PyTorch's memory_viz "active memory timeline"; hovering a band names the tensor, the
op that made it and the phase. tracemalloc's count of NumPy's bytes is the line over the bands.
BokehJS is inlined in the file, so it needs no network in a lecture hall.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..palette import CATEGORY_COLOURS, TRACEMALLOC_COLOUR, series_style
from ..trace import CATEGORIES, MB, Buffer, Snapshot

DASHES = {"-": "solid", "--": "dashed", "-.": "dashdot", ":": "dotted"}
MARKERS = {"o": "circle", "s": "square", "^": "triangle", "D": "diamond", "v": "inverted_triangle",
           "P": "plus", "X": "x", "*": "star"}
HEIGHT = 580  # pixels: the header, the tabs and a figure fit a 1280 x 720 slide
ORDER = {c: i for i, c in enumerate(CATEGORIES)}  # the stack, bottom to top


def _bokeh():
    try:
        import bokeh  # noqa: F401
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("ag.plot.memory_html needs bokeh: pip install 'ag[plot]'") from error


def _stack(snapshot: Snapshot) -> list[Buffer]:
    """What the snapshot holds, bottom to top: by category, then the oldest buffer first; without
    buffers (a snapshot recorded before they were), one pseudo-buffer per category."""
    if snapshot.buffers is None:
        return [Buffer(c, f"all {c}", (), "", snapshot.categories[c], c, None, "", "") for c in CATEGORIES]
    stack = sorted(snapshot.buffers, key=lambda b: (ORDER.get(b.category, len(ORDER)), b.key))
    scratch = snapshot.categories.get("temporaries", 0)  # no tensor holds them: one band, on top
    return stack + [Buffer(-1, "temporaries", (), "", scratch, "temporaries", None, "", "")] if scratch else stack


def _rectangles(snapshots: Sequence[Snapshot]) -> list[dict]:
    """One rectangle per (buffer, run of steps where it sits unchanged at the same offset).

    Step i spans x in [i - 0.5, i + 0.5]; a rectangle grows to the right while its buffer stays alive,
    unchanged, and nothing under it is freed, so a long-lived buffer is a few rectangles, not one per step.
    """
    rectangles: list[dict] = []
    current: dict = {}
    lives: dict = {}  # [first, last] step each buffer has been alive for without a break
    for i, snapshot in enumerate(snapshots):
        bottom = 0
        for buffer in _stack(snapshot):
            if buffer.nbytes <= 0:
                continue
            life = lives.get(buffer.key)
            if life is None or life[1] != i - 1:
                life = lives[buffer.key] = [i, i]
            life[1] = i
            rectangle = current.get(buffer.key)
            if (rectangle is not None and rectangle["stop"] == i and rectangle["low"] == bottom
                    and (rectangle["buffer"] is buffer or rectangle["buffer"] == buffer)):
                rectangle["stop"] = i + 1
            else:
                rectangle = current[buffer.key] = {"buffer": buffer, "start": i, "stop": i + 1, "low": bottom,
                                                   "life": life}
                rectangles.append(rectangle)
            bottom += buffer.nbytes
    return rectangles


def _bands(snapshots: Sequence[Snapshot]) -> dict[str, dict[str, list]]:
    """The rectangles as one ColumnDataSource's columns per category: geometry in MB, then the hover's text."""
    names = ("left", "right", "bottom", "top", "name", "shape", "size", "op", "phase", "category", "alive")
    columns = {c: {k: [] for k in names} for c in CATEGORIES}
    for r in _rectangles(snapshots):
        b = r["buffer"]
        column = columns.setdefault(b.category, {k: [] for k in names})
        for name, value in (("left", r["start"] - 0.5), ("right", r["stop"] - 0.5), ("bottom", r["low"] / MB),
                            ("top", (r["low"] + b.nbytes) / MB),
                            ("name", f"{b.name}.grad" if b.kind == "grad" else b.name),
                            ("shape", f"{tuple(b.shape)} {b.dtype}" if b.dtype else ""), ("size", _size(b.nbytes)),
                            ("op", b.op or "none (a leaf)"), ("phase", b.phase), ("category", b.category),
                            ("alive", _span(snapshots, *r["life"]))):
            column[name].append(value)
    return columns


def _stepped(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """A line that holds each step's value across its whole width, [i - 0.5, i + 0.5], as the bands do."""
    xs = [x for i in range(len(values)) for x in (i - 0.5, i + 0.5)]
    return xs, [v for v in values for _ in range(2)]


def _size(nbytes: int) -> str:
    return f"{nbytes / MB:.2f} MB ({nbytes:,} B)"


def _span(snapshots: Sequence[Snapshot], first: int, last: int) -> str:
    """The steps a band covers, in words: "steps 3 to 17 (forward matmul to backward add)"."""
    if first == last:
        return f"step {first} ({snapshots[first].label})"
    return f"steps {first} to {last} ({snapshots[first].label} to {snapshots[last].label})"


def _step_labels(snapshots: Sequence[Snapshot]) -> list[str]:
    """What the hover says of each step: its index, what just ran, tracemalloc's bytes, the time."""
    start = snapshots[0].time_ns
    labels = []
    for i, s in enumerate(snapshots):
        at = f", {(s.time_ns - start) / 1e6:.1f} ms in" if s.time_ns is not None and start is not None else ""
        labels.append(f"{i}: {s.label or 'snapshot'} (tracemalloc {s.allocated_bytes / MB:.1f} MB{at})")
    return labels


@dataclass
class _Peak:
    """Where a timeline's allocated bytes are highest: the number the page prints."""

    step: int
    nbytes: int
    label: str

    @property
    def text(self) -> str:
        return f"{self.nbytes / MB:.1f} MB"


def _peak(snapshots: Sequence[Snapshot]) -> _Peak:
    step = max(range(len(snapshots)), key=lambda i: snapshots[i].allocated_bytes)
    return _Peak(step, snapshots[step].allocated_bytes, snapshots[step].label or "snapshot")


def _check(timelines: Mapping[str, Sequence[Snapshot]]) -> None:
    if not timelines:
        raise ValueError("memory_html: timelines is empty; pass {label: the snapshots of ag.trace.tracing()}")
    for label, snapshots in timelines.items():
        if len(snapshots) == 0:
            raise ValueError(f"memory_html: the timeline {label!r} holds no snapshots; record it with "
                             "ag.trace.tracing() around at least one op")
        if any(s.categories is None for s in snapshots):
            raise ValueError(f"memory_html: the snapshots of {label!r} carry no categories or buffers; "
                             "record them with ag.trace.tracing(), not snapshot_trace()")


def _style(fig, xlabel: str) -> None:
    """Type big enough to read from the back of a lecture hall."""
    fig.title.text_font_size = "17px"
    fig.xaxis.axis_label = xlabel
    fig.yaxis.axis_label = "live memory (MB)"
    for axis in (fig.xaxis, fig.yaxis):
        axis.axis_label_text_font_size = "15px"
        axis.axis_label_text_font_style = "normal"
        axis.major_label_text_font_size = "13px"
    fig.xgrid.grid_line_color = None
    fig.toolbar.logo = None


def _figure(title: str, x_range, y_range):
    from bokeh.plotting import figure
    return figure(title=title, x_range=x_range, y_range=y_range, height=HEIGHT, sizing_mode="stretch_width",
                  tools="xpan,xwheel_zoom,box_zoom,reset,save", active_scroll="xwheel_zoom")


def _mark_phases(fig, snapshots: Sequence[Snapshot], y_range) -> None:
    """Shade backward (grey), the optimizer step and every recompute step (their categories' colours, lightly)."""
    from bokeh.models import BoxAnnotation, Label
    start = next((i for i, s in enumerate(snapshots) if s.phase == "backward"), None)
    step = next((i for i, s in enumerate(snapshots) if s.phase == "optimizer step"), len(snapshots))
    if step < len(snapshots):
        fig.add_layout(BoxAnnotation(left=step - 0.5, right=len(snapshots) - 0.5, fill_color=CATEGORY_COLOURS["optimizer state"],
                                     fill_alpha=0.07, line_alpha=0, level="underlay"))
        fig.add_layout(Label(x=step - 0.5, y=y_range.end, text="optimizer step →", x_offset=6, y_offset=-40,
                             text_font_size="13px", text_color="#555555"))
    if start is not None:
        fig.add_layout(BoxAnnotation(left=start - 0.5, right=step - 0.5, fill_color="#888888",
                                     fill_alpha=0.08, line_alpha=0, level="underlay"))
        fig.add_layout(Label(x=start - 0.5, y=y_range.end, text="backward →", x_offset=6, y_offset=-22,
                             text_font_size="13px", text_color="#555555"))
        fig.add_layout(Label(x=start - 0.5, y=y_range.end, text="← forward", x_offset=-6, y_offset=-22,
                             text_align="right", text_font_size="13px", text_color="#555555"))
    for i, s in enumerate(snapshots):
        if s.phase == "recompute":
            fig.add_layout(BoxAnnotation(left=i - 0.5, right=i + 0.5, fill_color=CATEGORY_COLOURS["activations recomputed"],
                                         fill_alpha=0.07, line_alpha=0, level="underlay"))


def _mark_peak(fig, peak: _Peak, steps: int, colour: str) -> None:
    from bokeh.models import Label, Span
    fig.add_layout(Span(location=peak.step, dimension="height", line_color=colour, line_dash="dashed",
                        line_width=1.5))
    fig.scatter([peak.step], [peak.nbytes / MB], size=11, color=colour, line_color="white")
    right = peak.step > steps / 2  # keep the text inside the plot
    fig.add_layout(Label(x=peak.step, y=peak.nbytes / MB, text=f"peak {peak.text}\nafter {peak.label}",
                         x_offset=-10 if right else 10, y_offset=6, text_align="right" if right else "left",
                         text_font_size="14px", text_font_style="bold", text_color=colour,
                         background_fill_color="white", background_fill_alpha=0.8))


def _mark_high_water(fig, snapshots: Sequence[Snapshot], colour: str) -> None:
    """tracemalloc's high-water mark: it also sees what lived and died between two snapshots."""
    from bokeh.models import Label, Span
    high = max(s.peak_bytes for s in snapshots) / MB
    fig.add_layout(Span(location=high, dimension="width", line_color=colour, line_dash="dotted", line_width=1.5))
    fig.add_layout(Label(x=len(snapshots) - 0.5, y=high, text=f"tracemalloc's high-water mark {high:.1f} MB "
                         "(between snapshots too)", x_offset=-6, y_offset=4, text_align="right",
                         text_font_size="13px", text_color=colour))


def _strategy_figure(label: str, snapshots: Sequence[Snapshot], x_range, y_range):
    """The stacked bands of one timeline, tracemalloc's line over them, its peak marked."""
    from bokeh.models import ColumnDataSource, CustomJSHover, HoverTool
    peak = _peak(snapshots)
    has_buffers = all(s.buffers is not None for s in snapshots)
    what = "every buffer" if has_buffers else "the bytes of each category"
    fig = _figure(f"{label}: {what} alive after each step, stacked by category (peak {peak.text})", x_range, y_range)
    _mark_phases(fig, snapshots, y_range)
    bands = []
    for category, columns in _bands(snapshots).items():
        if not columns["left"]:
            continue  # an empty renderer would put a blank swatch in the legend
        bands.append(fig.quad(source=ColumnDataSource(columns), left="left", right="right", bottom="bottom",
                              top="top", fill_color=CATEGORY_COLOURS.get(category, "#999999"), fill_alpha=0.85,
                              line_color="white", line_width=0.6, hover_fill_alpha=1.0, hover_line_color="black",
                              hover_line_width=2, legend_label=category))
    fig.line(*_stepped([s.allocated_bytes / MB for s in snapshots]), line_color=TRACEMALLOC_COLOUR,
             line_width=2.5, legend_label="tracemalloc (NumPy's bytes)")
    _mark_peak(fig, peak, len(snapshots), TRACEMALLOC_COLOUR)
    _mark_high_water(fig, snapshots, TRACEMALLOC_COLOUR)
    step = CustomJSHover(args={"labels": _step_labels(snapshots)},
                         code="const i = Math.round(value); return labels[i] ?? ''")
    tensor = [("tensor", "@name"), ("shape", "@shape"), ("size", "@size"), ("made by op", "@op"), ("in", "@phase"),
              ("category", "@category"), ("alive", "@alive")]
    whole = [("category", "@category"), ("size", "@size"), ("alive", "@alive")]
    fig.add_tools(HoverTool(renderers=bands, tooltips=[*(tensor if has_buffers else whole), ("step", "$x{custom}")],
                            formatters={"$x": step}, point_policy="follow_mouse"))
    _style(fig, "step: each op, then each backward step")
    _legend(fig)
    return fig


def _legend(fig) -> None:
    fig.legend.click_policy = "hide"
    fig.legend.label_text_font_size = "13px"
    fig.legend.location = "top_left"
    fig.add_layout(fig.legend[0], "right")


def _compare_figure(timelines: Mapping[str, Sequence[Snapshot]], x_range, y_range):
    """tracemalloc's line of every timeline on the same axes, each peak marked; click the legend to hide one."""
    from bokeh.models import ColumnDataSource, HoverTool
    fig = _figure("tracemalloc's live bytes after each step, every strategy (click a legend entry to hide it)",
                  x_range, y_range)
    lines = []
    for index, (label, snapshots) in enumerate(timelines.items()):
        style = series_style(index)
        peak = _peak(snapshots)
        dash = style["linestyle"]
        dash = DASHES.get(dash, [2 * d for d in dash[1]] if isinstance(dash, tuple) else "solid")
        x, mb = _stepped([s.allocated_bytes / MB for s in snapshots])
        source = ColumnDataSource({"x": x, "mb": mb, "step": [f"{i}: {s.label or 'snapshot'}" for i, s in
                                                               enumerate(snapshots) for _ in range(2)],
                                   "strategy": [label] * len(x)})
        legend = f"{label}: peak {peak.text}"
        lines.append(fig.line("x", "mb", source=source, color=style["color"], line_dash=dash, line_width=2.5,
                              legend_label=legend))
        fig.scatter([peak.step], [peak.nbytes / MB], marker=MARKERS.get(style["marker"], "circle"), size=13,
                    color=style["color"], line_color="white", legend_label=legend)
    fig.add_tools(HoverTool(renderers=lines, tooltips=[("strategy", "@strategy"), ("step", "@step"),
                                                       ("tracemalloc", "@mb{0.0} MB")]))
    _style(fig, "step: each op, then each backward step")
    _legend(fig)
    return fig


def _header(title: str):
    """The title and how to read the page."""
    from bokeh.models import Div
    text = (f"<h2 style='margin:0 0 4px 0'>{html.escape(title)}</h2>"
            "<div style='font-size:15px;color:#333'>Measured by <code>ag.trace.tracing()</code>: bands are ag's "
            "count of every buffer alive after each step, stacked by category; the line is tracemalloc's count "
            "of NumPy's bytes. Hover a band to name the tensor; click a legend entry to hide it; scroll to zoom."
            "</div>")
    return Div(text=text, disable_math=True, sizing_mode="stretch_width")


def _x_range(steps: int):
    from bokeh.models import Range1d
    return Range1d(-0.5, steps - 0.5, bounds=(-0.5, steps - 0.5))


def _y_range(timelines: Mapping[str, Sequence[Snapshot]]):
    """One y range shared by every figure, so strategies compare at a glance."""
    from bokeh.models import Range1d
    top = max(max(s.peak_bytes, sum(s.categories.values())) for t in timelines.values() for s in t) / MB
    return Range1d(0, max(top, 1e-6) * 1.18)


def memory_html(timelines: Mapping[str, Sequence[Snapshot]], path, *,
                title: str = "Memory over one training step") -> str:
    """Write one self-contained HTML file (BokehJS inlined, no network) with the memory timelines.

    ``timelines`` maps a label (a strategy, say) to the snapshots of ``ag.trace.tracing()``. With more
    than one, the first tab compares tracemalloc's lines; then each timeline has a tab of its own, all
    on one shared MB axis. The peak printed is max(allocated_bytes) over the snapshots, in MB
    (10**6 B) to one decimal; a dotted line marks tracemalloc's high-water mark (max peak_bytes), which
    also counts what was allocated and freed between two snapshots. Returns the path written.
    """
    _check(timelines)
    _bokeh()
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import TabPanel, Tabs
    from bokeh.resources import INLINE
    y_range = _y_range(timelines)
    panels = [TabPanel(child=_strategy_figure(label, snapshots, _x_range(len(snapshots)), y_range),
                       title=f"{label}: {_peak(snapshots).text}")
              for label, snapshots in timelines.items()]
    if len(panels) > 1:
        steps = max(len(s) for s in timelines.values())
        panels.insert(0, TabPanel(child=_compare_figure(timelines, _x_range(steps), y_range), title="compare"))
    body = Tabs(tabs=panels, sizing_mode="stretch_width") if len(panels) > 1 else panels[0].child
    page = column(_header(title), body, sizing_mode="stretch_width")
    path = Path(path)
    path.write_text(file_html(page, INLINE, title), encoding="utf-8")
    return str(path)
