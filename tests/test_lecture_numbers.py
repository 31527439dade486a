"""Every number the memory lecture puts on a slide, measured with tracemalloc."""
import ast
import subprocess
import sys

import numpy as np

import ag
from ag import demo


def test_float64_1000x1000_array_holds_8_MB_of_data_plus_a_small_header():
    a = np.zeros((1000, 1000))
    assert a.nbytes == 8_000_000
    assert 0 < sys.getsizeof(a) - a.nbytes <= 200


def test_tracing_a_b_c_prints_16_MB(capsys):
    ag.trace.print_trace_stats(demo.numpy_trace())
    assert capsys.readouterr().out == "memory allocated: 16 MB\n"


def test_tracing_with_b_set_to_none_prints_8_MB(capsys):
    ag.trace.print_trace_stats(demo.numpy_trace(drop_b=True))
    assert capsys.readouterr().out == "memory allocated: 8 MB\n"


def test_eager_grads_add_64_MB_per_layer_at_batch_4000():
    run = demo.matmul_chain(4000, 3, eager=True)
    assert [s.allocated_mb for s in run.forward] == [64, 128, 192]
    assert [s.allocated_bytes for s in run.forward] == [64_000_000 * k for k in (1, 2, 3)]


def test_lazy_grads_add_only_the_value_per_layer_at_batch_4096():
    run = demo.matmul_chain(4096, 5, eager=False)
    assert [s.allocated_mb for s in run.forward] == [32, 65, 98, 131, 163]
    assert [s.allocated_bytes for s in run.forward] == [32_768_000 * k for k in range(1, 6)]


def test_lazy_backward_ends_holding_only_the_weight_grads():
    run = demo.matmul_chain(4096, 5, eager=False)
    weight_grads = 5 * 8_000_000
    assert weight_grads <= run.backward[-1].allocated_bytes < weight_grads + 100  # + the loss scalar
    # each step frees the grad and value of the layer it just finished
    sizes = [s.allocated_bytes for s in run.backward]
    assert sizes[1:] == sorted(sizes[1:], reverse=True)


def test_eager_backward_keeps_every_value_and_grad():
    run = demo.matmul_chain(4000, 3, eager=True)
    sizes = {s.allocated_bytes for s in run.backward}
    assert len(sizes) == 1
    assert 192_000_000 <= sizes.pop() < 192_000_000 + 100  # + the loss scalar and its grad


def test_lecture_4s_scaling_table_is_what_attention_scaling_measures_now():
    """Note 4's table of peaks, to the 0.1 MB it prints, for the rows cheap enough to rerun; in a
    process of its own (``ag demo attention``'s case) as after other tests."""
    import re
    from pathlib import Path
    note = (Path(__file__).resolve().parent.parent / "lectures" / "04-io-and-flash-attention.md").read_text()
    note = note.split("## 4.9")[0]  # 4.9's table is the GPU's (tests/test_gpu_engine.py)
    quoted = {int(n): (naive, flash, ratio) for n, naive, flash, ratio in
              re.findall(r"^\s*(\d+)\s+([\d.]+|\(skipped\))\s+([\d.]+)\s+([\d.]*)", note, re.M)}
    assert set(quoted) == {512, 1024, 2048, 4096, 8192, 16384}
    script = "from ag import demo; print([(p.n, p.naive_bytes, p.flash_bytes) for p in " \
             "demo.attention_scaling(sizes=(512, 1024, 2048), naive_up_to=2048)])"
    fresh = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    here = demo.attention_scaling(sizes=(512, 1024, 2048, 4096), naive_up_to=2048)
    for peak in [demo.AttentionPeak(*row) for row in ast.literal_eval(fresh)] + here:
        naive, flash, ratio = quoted[peak.n]
        assert f"{peak.flash_bytes / ag.trace.MB:.1f}" == flash, peak
        if peak.naive_bytes is not None:
            assert f"{peak.naive_bytes / ag.trace.MB:.1f}" == naive, peak
            # a ratio can sit on a rounding edge (17.449 here, 17.451 after other tests: 700 bytes
            # of Python objects), so it is checked to its printed digit, not its rounding
            assert abs(peak.naive_bytes / peak.flash_bytes - float(ratio)) < 0.06, peak


# ---- note 7: every snippet prints what the note quotes under it, and the wall's table ----

def _note_7() -> str:
    from pathlib import Path
    return (Path(__file__).resolve().parent.parent / "lectures" / "07-the-whole-wall.md").read_text()


def test_note_7s_snippets_print_what_the_note_quotes_under_them(capsys):
    import re
    pairs = re.findall(r"```python\n(.*?)```\n\n((?:    [^\n]*\n)+)", _note_7(), re.S)
    assert len(pairs) == 4
    namespace = {}
    for number, (code, quoted) in enumerate(pairs, 1):
        exec(compile(code, f"07 snippet {number}", "exec"), namespace)
        printed = capsys.readouterr().out
        assert printed == "".join(line[4:] + "\n" for line in quoted.splitlines()), f"snippet {number}"


def _wall_rows() -> list[tuple[str, list[str]]]:
    import re
    rows = re.findall(r"^    (L=\d+ h=\d+ s=\d+ b=\d+(?: \+mixed precision)?)\s+(.*)$", _note_7(), re.M)
    return [(label, re.findall(r"[\d.]+ \([\d.]+\)|[\d.]+$", rest)) for label, rest in rows]


def _config_of(label: str):
    import re
    from ag import wall
    L, h, s, b = map(int, re.findall(r"=(\d+)", label))
    heads = {(layers, hidden): a for layers, hidden, a in wall.SIZES}[L, h]
    config = wall.WallConfig(L, h, heads, s, b)
    return wall.LEVERS["mixed precision"].apply(config) if "mixed" in label else config


def test_note_7s_wall_table_is_the_demos_formulas_and_its_small_rows_are_measured_now():
    from ag import wall
    rows = _wall_rows()
    assert len(rows) == 12
    bars = wall.wall(sizes=wall.SIZES[:1], batches=(1, 4))  # the four rows of the smallest size
    measured = {bar.label: bar for bar in bars}
    for label, cells in rows:
        predicted = wall.predict(_config_of(label))
        expected = [f"{predicted[s] / ag.trace.MB:.2f} ({predicted[s] / ag.trace.MB:.2f})" for s in wall.SLICES]
        assert cells[:4] == expected, label
        if label in measured:
            bar = measured[label]
            assert bar.measured == bar.predicted, label
            assert cells[4] == f"{bar.peak_bytes / ag.trace.MB:.2f}", label
    assert set(measured) <= {label for label, _ in rows}

