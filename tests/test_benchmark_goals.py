"""The benchmarks' goal lines: the verdict a reader sees next to a ratio is the ratio's own."""
import sys
from pathlib import Path

import numpy as np
import pytest

import ag

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from _goals import goal, shown, verdict  # noqa: E402


@pytest.mark.parametrize("limit, resolution, digits", [(1.2, 0.0, 2), (1.0, 0.005, 3), (0.1, 0.0, 4), (1.1, 0.0, 2)])
def test_a_ratio_as_shown_gets_the_verdict_of_the_ratio_itself(limit, resolution, digits):
    """A table's goal line reads the ratio back from its text: 1.2038 shown as 1.20 read as met."""
    ratios = limit + resolution + np.random.default_rng(0).uniform(-0.01, 0.01, 2000)
    ratios = np.concatenate([ratios, [limit, limit + resolution, np.nextafter(limit + resolution, 2)]])
    for ratio in map(float, ratios):
        text = shown(ratio, limit, resolution, digits)
        assert verdict(float(text), limit, resolution) == verdict(ratio, limit, resolution), (ratio, text)
        assert len(text.split(".")[1]) >= digits and abs(float(text) - ratio) <= 0.5 * 10 ** -digits


def test_a_goal_line_just_over_its_goal_says_missed_with_the_digits_that_show_it():
    assert goal("flash / torch", 1.2038, 1.2).endswith("= 1.204 (goal <= 1.2): missed")
    assert goal("flash / torch", 1.1951, 1.2).endswith("= 1.20 (goal <= 1.2): met")


def test_a_ratio_shown_against_a_goal_and_its_stretch_goal_decides_both_as_the_ratio_does():
    """attention's flash/torch column is read back for the goal (1.2) and the stretch goal (1.0)."""
    ratios = np.concatenate([1.0 + np.random.default_rng(1).uniform(-0.01, 0.01, 2000),
                             1.2 + np.random.default_rng(2).uniform(-0.01, 0.01, 2000), [1.0, 1.2]])
    for ratio in map(float, ratios):
        text = shown(ratio, (1.2, 1.0))
        for limit in (1.2, 1.0):
            assert verdict(float(text), limit) == verdict(ratio, limit), (ratio, limit, text)
    assert shown(1.0038, (1.2, 1.0)) == "1.004" and shown(1.0038, 1.2) == "1.00"


def _attention_benchmark():
    """benchmarks/attention.py as a module (not run): its goal lines' reasons."""
    import importlib.util
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "attention.py"
    if "attention_benchmark" not in sys.modules:
        spec = importlib.util.spec_from_file_location("attention_benchmark", path)
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look it up there
        spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules["attention_benchmark"]


def test_a_missed_attention_goal_names_the_limit_that_table_2c_measured():
    """flash against torch SDPA names the passes outside the products when NumPy's products run at
    torch's matmul's speed on the same tiles; when they are slower, it says so, and that torch's
    matmul in their place saved nothing on an Intel Xeon; with the measured ms either way, what torch
    SDPA spends beyond the same products, and the exp a bounded tile takes here, NumPy's ns an
    element against torch's."""
    bench = _attention_benchmark()
    at_parity = {"flash": 4.35e-3, "numpy products": 3.0e-3, "torch products": 2.95e-3, "torch": 3.35e-3,
                 "numpy exp": 2.61, "torch exp": 1.08}
    text = bench.torch_limit(1024, at_parity)
    assert "flash 4.35 ms against torch SDPA's 3.35" in text and "1.02 x torch's matmul" in text
    assert "2.61 ns an element against torch's 1.08" in text and bench.exp_name() in text
    assert "the rest 1.35 ms (40% of torch SDPA's whole head), where torch SDPA spends 0.40 ms beyond" in text
    assert "passes outside them are the limit" in text and "slower than torch's" not in text
    assert "after the row max and the subtract of the running max" in text and "fixed shift" not in text
    with ag.lab.on():  # the lab's default runs the paper's loops; the fixed shift only when swapped in
        assert "fixed shift" not in bench.torch_limit(1024, at_parity)
        bench.seams.swap({"flash_passes": bench.lab_flash.fixed_shift_passes})
        assert "with the fixed shift, no max or subtract pass" in bench.torch_limit(1024, at_parity)
    slow_blas = dict(at_parity, **{"numpy products": 5.4e-3, "flash": 6.7e-3})
    text = bench.torch_limit(1024, slow_blas)
    assert "1.83 x torch's matmul" in text and "NumPy's BLAS is slower than torch's on these tiles" in text
    assert "saved nothing" in text and "passes outside them are the limit" not in text
    step = {name + " step": 2 * t for name, t in at_parity.items() if "exp" not in name}
    text = bench.torch_limit(1024, {**at_parity, **step}, step=True)
    assert "(2c, N = 1024, forward + backward): flash 8.70 ms against torch SDPA's 6.70" in text
    assert "its seven products a tile" in text and "the rest 2.70 ms" in text and "spends 0.80 ms beyond" in text


def _classroom_head() -> dict[str, float]:
    """Table 2c's figures on the classroom path, in seconds (ns for the exp)."""
    head = {"flash": 4.0e-3, "numpy products": 2.0e-3, "float32 products": 1.25e-3, "torch products": 1.2e-3,
            "torch": 2.0e-3, "numpy exp": 0.6, "torch exp": 0.3}
    return head | {name + " step": 3 * t for name, t in head.items() if "exp" not in name}


def _row(n: int, mask: str, to_naive: float, to_torch: float) -> list[str]:
    return [str(n), mask, "1", "1", "1", "1", "1", "1", f"{to_naive}", "", f"{to_torch}", "", "", "", ""]


def test_classroom_goal_lines_judge_the_classrooms_goals_on_the_rows_they_are_set_for(capsys):
    """``--classroom``: flash <= 2 x torch SDPA on every row; flash faster than naive only from N = 1024,
    forward and step alike (issue 49), not against the lab's 1.2, 1.3 and stretch 1.0."""
    bench = _attention_benchmark()
    rows = [_row(256, "causal", 1.9, 2.5), _row(1024, "non-causal", 0.4, 1.5), _row(1024, "causal", 0.9, 1.8)]
    bench.print_classroom_goals(rows, rows, 1024, _classroom_head())
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("goal")]
    assert len(lines) == 4 and not any("stretch" in line for line in lines)
    naive = "goal: classroom flash / naive, forward, worst of 2 rows from N = 1024 (N = 1024, causal) = 0.90"
    assert lines[0].startswith(naive) and lines[0].endswith("(goal <= 1): met")
    assert lines[1].startswith("goal: classroom flash / torch SDPA, forward, worst of 3 rows (N = 256, causal) = 2.50 "
                               "(goal <= 2): missed; limited by ")
    assert lines[3].startswith("goal: classroom flash / torch SDPA, forward + backward")
    rows = [_row(512, "causal", 1.9, 1.5)]
    bench.print_classroom_goals(rows, rows, 512, _classroom_head())
    out = capsys.readouterr().out
    assert "goal: classroom flash / naive" not in out and "no row from N = 1024, where the goal is set" in out


def test_a_missed_classroom_goal_names_the_classrooms_limits_from_table_2c(torch_or_skip):
    """The classroom's limit: one thread against torch's threads (or naive's BLAS threads), the float64
    products with 2c's figures, the unfused passes; nothing of the lab (fixed shift, exp2, its threads)."""
    bench = _attention_benchmark()
    head = _classroom_head()
    text = bench.classroom_limit(1024, head, False, "torch SDPA")
    assert text.startswith("flash runs on one thread with BLAS held to one, torch SDPA on its "
                           f"{torch_or_skip.get_num_threads()} threads (2a, 2b)")
    assert "(2c, N = 1024) flash takes 4.00 ms against torch SDPA's 2.00 (2.00 x)" in text
    assert ("its products 2.00 ms with S = QK^T in float64 for float32 inputs (lecture 4.5), 1.60 x the same "
            "products in float32 (1.25 ms; torch's matmul 1.20), and the rest 2.00 ms") in text
    assert "spends 0.80 beyond the same products: the unfused passes over each tile" in text
    assert text.endswith("NumPy's exp takes 0.60 ns an element on one thread, torch's 0.30")
    assert not any(word in text for word in ("fixed shift", "exp2", "GIL", "Two threads"))
    text = bench.classroom_limit(1024, head, True, "naive")
    assert "naive's products on NumPy's BLAS's" in text and "S = QK^T and dP = dO V^T in float64" in text
    assert "(2c, N = 1024, forward + backward) flash takes 12.00 ms" in text and "D = rowsum(dO * O)" in text


def test_classroom_rows_and_tiles_are_the_classrooms(capsys):
    """A classroom row's verdicts are the classroom's (none for naive below N = 1024), and its tiles
    are ``tiled_passes``'s: 256 x 256, 64 query rows in backward, no wider unmasked forward."""
    bench = _attention_benchmark()
    times = {f"{name} step": [t] for name, t in (("flash", 1.0), ("naive", 0.5), ("torch", 0.45))}
    small, large = (bench.time_row(n, False, "step", times, 3.5, classroom=True) for n in (512, 1024))
    assert small[8:12] == ["2.00", "-", "2.22", "missed"] and large[8:12] == ["2.00", "missed", "2.22", "missed"]
    assert bench.time_row(1024, False, "step", times, 3.5)[8:12] == ["2.00", "missed", "2.22", "missed"]
    assert len(bench.CLASSROOM_TIME_HEADER) == len(bench.TIME_HEADER) == len(large)
    defaults = {"block_q": None, "block_k": None}
    assert bench.tiles_label(defaults, classroom=True) == "256 x 256 (64 x 256 in backward)"
    assert bench.tiles_label(defaults) == "256 x 256 (512 x 512 in a forward without a mask)"
    assert bench.flash_tiles_of({"block_q": None, "block_k": 128}, True, True) == ((256, 128), (64, 128))


def test_table_2c_on_the_classroom_path_times_its_products_also_in_float32(torch_or_skip):
    bench = _attention_benchmark()
    head = bench.one_head(200, {"block_q": 64, "block_k": 128}, repeats=1, classroom=True)
    names = {"flash", "numpy products", "float32 products", "torch products", "torch"}
    assert set(head) == names | {name + " step" for name in names} | {"numpy exp", "torch exp"}
    assert all(t > 0 for t in head.values())


def test_table_2c_times_one_head_with_edge_tiles(torch_or_skip):
    """The one-head measurement runs on sizes that leave partial tiles, and restores torch's threads."""
    bench = _attention_benchmark()
    threads = torch_or_skip.get_num_threads()
    head = bench.one_head(200, {"block_q": 64, "block_k": 128}, repeats=1)
    names = {"flash", "numpy products", "torch products", "torch"}
    assert set(head) == names | {name + " step" for name in names} | {"numpy exp", "torch exp"}
    assert all(t > 0 for t in head.values())
    assert torch_or_skip.get_num_threads() == threads


def test_the_anatomy_times_every_step_of_a_tile(capsys):
    """Table 4 runs every step ag writes and each alternative (it once called a helper that had moved)."""
    bench = _attention_benchmark()
    bench.anatomy(256, {"block_q": 64, "block_k": 64}, number=1)
    out = capsys.readouterr().out
    assert "4. One tile of flash (64 x 64" in out and "diagonal tile: S = fmin(S, NaN/-inf tile)" in out
    assert "fwd: sum of the steps" in out and "bwd: sum of the steps" in out
    exp = "exp2(log2 e · S, out=S)" if bench.flash_tiles.EXP2_FAST else "exp(S, out=S)"
    assert f"default forward: P = {exp}" in out  # the exp this machine's bounded tiles take


def test_the_benchmarks_name_the_cpu_by_family_and_model(tmp_path):
    """Machines of one kind share a model name ("AMD EPYC") and still differ: family and model say which."""
    from mlp import cpu_name
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
                    "flags\t\t: fpu avx2 avx512f\n\nprocessor\t: 1\ncpu family\t: 99\n")
    assert cpu_name(str(info)) == "AMD EPYC (family 25, model 17, AVX-512)"
    info.write_text("model name\t: Intel Xeon\ncpu family\t: 6\nmodel\t\t: 85\nflags\t\t: fpu avx2\n")
    assert cpu_name(str(info)) == "Intel Xeon (family 6, model 85, no AVX-512)"


@pytest.mark.parametrize("argv, repeats, naive", [
    ([], [15, 11, 7, 5], [3, 2, 1, 1]),
    (["--sizes", "4096"], [7], [1]),  # the command for a new user: it stopped at a usage error
    (["--sizes", "512,16384", "--naive-repeats", "4,2"], [15, 5], [4, 2]),
])
def test_attention_runs_per_size_follow_the_sizes_given(monkeypatch, argv, repeats, naive):
    bench = _attention_benchmark()
    monkeypatch.setattr(sys, "argv", ["attention.py", *argv])
    args = bench.parse_args()
    assert (args.repeats, args.naive_repeats) == (repeats, naive)


def test_attention_heads_reach_the_memory_worker_and_must_be_positive(monkeypatch):
    bench = _attention_benchmark()
    monkeypatch.setattr(sys, "argv", ["attention.py", "--heads", "1"])
    monkeypatch.setattr(bench, "H", bench.parse_args().heads)
    command = bench.memory_command("flash", 1024, True, {"block_q": 128, "block_k": None})
    monkeypatch.setattr(sys, "argv", command[1:])
    args = bench.parse_args()
    assert (args.heads, args.memory_worker, args.block_q) == (1, ["flash", "1024", "1"], 128)
    monkeypatch.setattr(sys, "argv", ["attention.py", "--heads", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args()


def test_a_missed_mlp_time_goal_names_the_blas_only_when_its_products_are_slower_than_torchs():
    import mlp
    slow_blas = mlp.time_limit(29, 19.0, 15.0, 16.2, 12.1, 16.5)
    assert "the step's 29 products alone take 16.2 ms of ag's 19 on NumPy's BLAS" in slow_blas
    assert "1.34 x: the BLAS first (16.5 ms as ag runs them; 2.5 ms outside them against torch's 2.9)" in slow_blas
    same_blas = mlp.time_limit(29, 19.0, 15.0, 12.0, 12.1, 12.2)
    assert "no slower than torch's matmul (12.1 ms), 12.2 ms as ag runs them: the rest of ag's step, 6.8 ms" in same_blas


def test_a_missed_mlp_time_goal_names_ags_matmul_when_slower_than_one_call():
    """The classroom's step (the row its time goal judges) makes each product one np.matmul: where ag's
    products take longer than one call each, the limit is ag's op around the product, never the lab's
    row blocks, and the rest of the step is not blamed for it."""
    import mlp
    text = mlp.time_limit(29, 1073.0, 1008.0, 840.0, 850.0, 1000.0)
    assert "but 1000.0 ms as ag's matmul runs them, one np.matmul each on Tensors" in text
    assert ("(1.19 x one call on NumPy's BLAS): ag's op around the product first "
            "(73.0 ms outside them against torch's 158.0)") in text
    assert "blocks" not in text and "threads" not in text


def test_the_mlp_time_rows_limit_quotes_the_products_its_row_shows(torch_or_skip):
    """One tiny step of each: the limit's ms are the row's own columns (they were once read from the wrong ones)."""
    import argparse

    import mlp
    row, limit = mlp.time_row("float64", argparse.Namespace(batch=64, width=32, layers=3, repeats=1))
    numpy_ms, ag_ms, torch_ms = row[8], row[9], row[10]
    assert f"the step's 8 products alone take {numpy_ms} ms of ag's {row[1]} on NumPy's BLAS" in limit
    assert f"({torch_ms} ms)" in limit or f"and {torch_ms} ms on torch's matmul" in limit
    assert f"{ag_ms} ms as ag runs them" in limit


def test_mlp_products_alone_runs_the_same_products_three_ways(torch_or_skip):
    """The ag route makes as many products as NumPy's, through ag's own matmul (the one its ops use)."""
    import mlp
    x, params = mlp.make_data(64, 32, 3, np.dtype("float64"))
    runs = mlp.products(x, params)
    assert set(runs) == {"numpy products", "ag products", "torch products"}
    with ag.count_ops() as counted:
        runs["ag products"]()
    assert (counted.total_matmuls, sum(counted.flops.values())) == (8, 8 * 2 * 64 * 32 * 32)


def test_a_missed_transformer_time_goal_names_the_blas_only_when_the_products_alone_are_slower():
    import transformer
    med = {"ag none": 1.656, "torch none": 1.199, "numpy products": 1.30, "torch products": 0.95,
           "ag products": 1.31}
    text = transformer.time_limit(72, "full", med)
    assert text.startswith("NumPy's BLAS first: the 72 products of a step without recomputation take 1300 ms")
    assert "against 950 on torch's matmul (1.37 x), the same shapes, and 1310 as ag runs them" in text
    assert "ag's step without recomputation takes 346 ms" in text
    assert text.endswith("full reruns some of them")
    text = transformer.time_limit(72, "none", dict(med, **{"numpy products": 0.94, "ag products": 0.95}), lab=True)
    assert text.startswith("the passes outside the products (outside them ag's step without recomputation takes 706 ms")
    assert text.endswith(transformer.LIMITS["time"])
    text = transformer.time_limit(72, "selective", dict(med, **{"numpy products": 0.94}), lab=True)
    assert text.startswith("ag's blocks first: the 72 products of a step without recomputation take 1310 ms as ag runs")
    assert "against 940 in one call each on NumPy's BLAS and 950 on torch's matmul" in text


def test_a_missed_classroom_transformer_time_goal_names_the_classrooms_limits():
    """On the classroom path (the default) the step's goal is 1.5 x torch (issue 49), and its limit
    speaks of one np.matmul a product and passes on one core, never of the lab's blocks or threads."""
    import transformer
    assert not ag.lab.enabled() and transformer.time_goal() == 1.5
    with ag.lab.on():
        assert transformer.time_goal() == 1.10
    med = {"ag none": 1.656, "torch none": 1.199, "numpy products": 0.94, "torch products": 0.95,
           "ag products": 0.95}
    text = transformer.time_limit(72, "none", med)
    assert text.endswith(transformer.CLASSROOM_TIME_LIMIT) and "ag.set_workers" not in text
    text = transformer.time_limit(72, "selective", dict(med, **{"ag products": 1.31}))
    assert text.startswith("ag's ops around the products first: the 72 products of a step without recomputation "
                           "take 1310 ms as ag's matmul runs them (one np.matmul each, on Tensors)")
    assert "blocks" not in text


def test_blas_swap_runs_every_tile_product_on_torch_and_puts_numpy_back(torch_or_skip, monkeypatch):
    """benchmarks/blas_swap.py's diagnosis is only as good as its swap: with it, flash's loops make
    every product on torch's matmul and none on NumPy's, as many as they make on NumPy's without
    it; the answer differs from NumPy's only in rounding; flash's modules get NumPy back."""
    import importlib.util
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "blas_swap.py"
    spec = importlib.util.spec_from_file_location("blas_swap_benchmark", path)
    swap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(swap)
    swapped, on_torch, on_numpy = swap.torch_numpy(torch_or_skip), [], []
    torch_matmul, numpy_matmul = swapped.matmul, np.matmul
    swapped.matmul = lambda *a, **kw: on_torch.append(1) or torch_matmul(*a, **kw)
    monkeypatch.setattr(np, "matmul", lambda *a, **kw: on_numpy.append(1) or numpy_matmul(*a, **kw))
    rng = np.random.default_rng(0)
    inputs = tuple(rng.standard_normal((1, 2, 600, 16), dtype=np.float32) for _ in range(4))  # 3 x 3 tiles
    threads = torch_or_skip.get_num_threads()
    try:
        got = swap.flash_times(swapped, inputs, True, 1)[2]
    finally:
        torch_or_skip.set_num_threads(threads)
    assert all(module.np is np for module in swap.LOOP_MODULES)
    assert len(on_torch) > 20 and on_numpy == []
    want = swap.flash_times(np, inputs, True, 1)[2]
    assert len(on_numpy) == len(on_torch)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_exp_floors_c_loops_compute_exp_to_float32s_precision(tmp_path):
    """benchmarks/exp_floor.py's AVX2 loops are the floor BENCHMARKS.md sets NumPy's exp against:
    they must be a real exp, plain and masked alike, not a fast wrong answer: to float32's precision
    from e^-87 to e^88, 0 below (a causal mask's -inf), inf above, NaN kept."""
    from exp_floor import ELEMENTS, build_loops
    loops, why = build_loops(str(tmp_path))
    if loops is None:
        pytest.skip(f"exp_floor's C loops cannot run here: {why}")
    x = np.linspace(-87.0, 88.0, ELEMENTS, dtype=np.float32)
    x[:8] = [-np.inf, -100.0, -87.5, np.nan, np.inf, 88.5, 100.0, -0.0]
    exact = np.exp(x.astype(np.float64))
    for name, fn in loops.items():
        y = np.full_like(x, 7.0)
        fn(x.ctypes.data, y.ctypes.data, ELEMENTS)
        assert np.max(np.abs(y[8:] / exact[8:] - 1)) < 3e-7, name
        np.testing.assert_array_equal(y[:8], np.array([0, 0, 0, np.nan, np.inf, np.inf, np.inf, 1], np.float32))


def test_blas_swap_exp_runs_every_score_tiles_exp_in_the_c_loop_and_puts_numpy_back(monkeypatch, tmp_path):
    """``blas_swap.py --swap exp``: with it, flash's loops take no in-place float32 exp from NumPy,
    the answer (causal: masked scores are -inf) differs from NumPy's only in rounding, and flash's
    modules get NumPy back."""
    import importlib.util
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "blas_swap.py"
    spec = importlib.util.spec_from_file_location("blas_swap_benchmark", path)
    swap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(swap)
    from exp_floor import build_loops
    loops, why = build_loops(str(tmp_path))
    if loops is None:
        pytest.skip(f"exp_floor's C loops cannot run here: {why}")
    swapped = swap.c_exp_numpy()
    numpy_exp, in_place = np.exp, []
    monkeypatch.setattr(np, "exp", lambda x, *a, **kw: (kw.get("out") is x and in_place.append(x.dtype))
                        or numpy_exp(x, *a, **kw))
    rng = np.random.default_rng(0)
    inputs = tuple(rng.standard_normal((1, 2, 600, 16), dtype=np.float32) for _ in range(4))  # 3 x 3 tiles
    want = swap.flash_times(np, inputs, True, 1)[2]
    on_numpy, in_place[:] = in_place.count(np.float32), []
    got = swap.flash_times(swapped, inputs, True, 1)[2]
    assert all(module.np is np for module in swap.LOOP_MODULES)
    assert on_numpy > 0  # how many depends on the CPU (exp2 takes the bounded tiles where it is SVML's)
    assert np.float32 not in in_place
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_run_all_runs_attention_on_both_paths_each_against_its_goals():
    """``run_all.py`` gathers the classroom's attention goals too: attention.py runs once with the lab
    on (its default) and once with ``--classroom``, which skips the lab's tile tables."""
    import run_all
    lab, classroom = (run_all.command_for(script, quick, False)[1:] for script, quick in
                      (("attention.py", True), ("attention.py --classroom", True)))
    assert lab[1:] == ["--quick", "--skip", "sweep,anatomy"] and "--classroom" not in lab
    assert classroom[1:] == ["--classroom", "--quick", "--skip", "sweep,memory,anatomy,variants"]
    assert lab[0] == classroom[0] and lab[0].endswith("attention.py")
    assert run_all.command_for("attention.py --classroom", False, False)[2:] == [
        "--classroom", "--skip", "sweep,anatomy,variants"]
    assert run_all.command_for("mlp.py", False, True)[2:] == ["--busy", "--dtypes", "float32"]
