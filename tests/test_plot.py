"""ag.plot draws for a slide: nothing overlaps, every series shows, every axis has a unit."""
import itertools
import re
from dataclasses import dataclass

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.category import StrCategoryFormatter  # noqa: E402

import ag  # noqa: E402
from ag import plot  # noqa: E402
from ag.palette import CATEGORY_COLOURS, OKABE_ITO, series_style  # noqa: E402
from ag.trace import CATEGORIES, MB  # noqa: E402

UNIT = re.compile(r"\b(MB|GB|kB|bytes|FLOPs?|MFLOP|GFLOP|TFLOP|tokens|step)\b|×")
ALLOWED_COLOURS = {c.lower() for c in OKABE_ITO.values()} | {plot.slides.GUIDE.lower(), "#444444", "#ffffff"}

# ag demo remat's strategies as measured: (peak bytes, recomputed FLOPs). uniform (2) and greedy
# keep the same outputs; optimal, greedy and sqrt land within 2 GFLOP of each other.
DEMO_POINTS = {"keep all": (28612911, 0), "uniform (2)": (18368412, 5120000000), "block (5)": (20412970, 4096000000),
               "sqrt": (18370124, 6144000000), "greedy": (18369916, 5120000000),
               "optimal": (18371873, 4096000000), "keep none": (10220698, 46080000000)}


@pytest.fixture(autouse=True)
def _close_figures():
    """Close the figures a test made (the module's shared figures stay open until its end)."""
    before = set(plt.get_fignums())
    yield
    for number in set(plt.get_fignums()) - before:
        plt.close(number)


def chain_timeline(n_layers: int, width: int = 64, batch: int = 32, seed: int = 0):
    """One forward and backward of x = x @ w, n_layers times, recorded by ag.trace.tracing()."""
    rng = np.random.default_rng(seed)
    weights = [ag.Tensor(rng.standard_normal((width, width)), requires_grad=True) for _ in range(n_layers)]
    x = ag.Tensor(rng.standard_normal((batch, width)))
    with ag.trace.tracing() as timeline:
        for w in weights:
            x = x @ w
        loss = ag.sum(x)
        del x
        loss.backward()
    return timeline


@pytest.fixture(scope="module")
def timelines():
    """Seven runs as in ag demo remat; "greedy" is "uniform (2)" exactly, as in the demo."""
    runs = {name: chain_timeline(n) for name, n in
            (("keep all", 6), ("uniform (2)", 4), ("block (5)", 5), ("sqrt", 3), ("optimal", 2), ("keep none", 1))}
    return {"keep all": runs["keep all"], "uniform (2)": runs["uniform (2)"], "block (5)": runs["block (5)"],
            "sqrt": runs["sqrt"], "greedy": runs["uniform (2)"], "optimal": runs["optimal"], "keep none": runs["keep none"]}


@dataclass(frozen=True)
class Point:
    """What remat_frontier reads of an ag.remat.sweep point."""

    planner: str
    budget_bytes: int | None
    peak_bytes: int
    recompute_flops: int


def sweep_points(scale: float = 1.0) -> list[Point]:
    budgets = [int(1e6 * scale), int(1.5e6 * scale), int(2e6 * scale)]
    points = [Point("MILP", b, b, int(4e6 * (2e6 * scale - b) / scale) + 1) for b in budgets]
    points += [Point("LP rounding", p.budget_bytes, p.peak_bytes, p.recompute_flops) for p in points]  # = MILP
    points += [Point("DTR", b, b + 50_000, int(6e6 * (2e6 * scale - b) / scale) + 2) for b in budgets]
    points += [Point("checkpoint all", None, int(2.1e6 * scale), 0), Point("recompute all", None, int(9e5 * scale), 10**7),
               Point("sqrt", None, int(1.3e6 * scale), 3 * 10**6)]
    return points


def figures(timelines):
    """Every plot ag.plot draws, on data shaped like its demo's."""
    sweeps = {"residual MLP": sweep_points(), "U-Net": sweep_points(1.3)}
    return {
        "memory_timeline": plot.memory_timeline(timelines),
        "memory_stack": plot.memory_stack(timelines),
        "tradeoff": plot.tradeoff(DEMO_POINTS, budget_bytes=14336000, budget_label="budget"),
        "scaling": plot.scaling({"naive": [(512, 5.7e6), (1024, 21.8e6), (2048, 85.5e6), (4096, 338.7e6)],
                                 "flash": [(512, 1.4e6), (1024, 2.4e6), (2048, 4.7e6), (4096, 9.5e6), (8192, 18.9e6)]}),
        "measured_vs_predicted": plot.measured_vs_predicted(
            {"none": [(6.4e6, 6.4e6), (7.5e6, 7.5e6)], "selective": [(1.1e6, 1.1e6)], "full": [(65536, 65536)],
             "full uniform n=1": [(65536, 65536)], "flash": [(1.1e6, 1.1e6)]}),
        "activation_breakdown": plot.activation_breakdown(
            {f"s={s}, b=1, h=64, a=4" + ("\nselective" if sel else ""): {f"tensor {i}": (i + 1) * 10**5 * s // 512
                                                                       for i in range(10 if sel else 15)}
             for s, sel in itertools.product((512, 256, 32), (False, True))}),
        "remat_frontier": plot.remat_frontier(sweeps, {"residual MLP": 10**6, "U-Net": 10**6}),
    }


@pytest.fixture(scope="module")
def every_figure(timelines):
    drawn = figures(timelines)
    yield drawn
    for fig in drawn.values():
        plt.close(fig)


def drawn_texts(fig) -> list:
    """Every piece of text the figure shows: titles, axis labels, tick labels in view, texts, legends."""
    fig.canvas.draw()
    texts = [t for t in (fig._suptitle,) if t is not None]
    for ax in fig.axes:
        texts += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        texts += [*ax.get_xticklabels(which="both"), *ax.get_yticklabels(which="both")]
    for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes)]:
        if legend is not None:
            texts += [*legend.get_texts(), legend.get_title()]
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


def overlapping_pairs(fig) -> list[tuple[str, str]]:
    texts = drawn_texts(fig)
    renderer = plot.labels.figure_renderer(fig)
    boxes = [(t.get_text(), matplotlib.text.Text.get_window_extent(t, renderer)) for t in texts]
    return [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
            if box_a.overlaps(box_b) and box_a.width * box_a.height and box_b.width * box_b.height]


# ---- no text on top of other text ----

def test_tradeoff_of_the_remat_demo_prints_no_label_on_another(every_figure):
    fig = every_figure["tradeoff"]
    assert overlapping_pairs(fig) == []
    shown = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert all(label in shown for label in DEMO_POINTS)


def test_labels_of_points_at_one_spot_are_stacked_into_one_text(every_figure):
    texts = [t.get_text() for t in every_figure["tradeoff"].axes[0].texts]
    assert "uniform (2)\ngreedy" in texts
    assert "optimal" in texts and "sqrt" in texts


def test_a_dense_cluster_of_labels_is_placed_without_overlap():
    rng = np.random.default_rng(0)
    points = {f"strategy {i}": (int(rng.uniform(18e6, 19e6)), int(rng.uniform(4e9, 7e9))) for i in range(9)}
    points |= {"far": (10e6, 46e9), "top": (28e6, 0)}
    fig = plot.tradeoff(points)
    assert overlapping_pairs(fig) == []


def test_label_placement_is_deterministic():
    first = [t.get_position() for t in plot.tradeoff(DEMO_POINTS).axes[0].texts]
    second = [t.get_position() for t in plot.tradeoff(DEMO_POINTS).axes[0].texts]
    assert first == second


@pytest.mark.parametrize("name", ["memory_timeline", "memory_stack", "tradeoff", "scaling", "measured_vs_predicted",
                                  "activation_breakdown", "remat_frontier"])
def test_no_two_texts_of_a_plot_overlap(every_figure, name):
    assert overlapping_pairs(every_figure[name]) == []


# ---- every series visible, told apart by more than colour ----

def series_lines(ax):
    return [line for line in ax.get_lines() if not line.get_label().startswith("_") and len(line.get_xdata())]


def test_each_line_of_a_timeline_has_its_own_colour_line_style_and_marker(every_figure, timelines):
    lines = series_lines(every_figure["memory_timeline"].axes[0])
    runs = [line for line in lines if line.get_label().split(":")[0] in timelines]
    assert len(runs) == len(timelines)
    assert len({(to_hex(line.get_color()), str(line.get_linestyle())) for line in runs}) == len(runs)
    assert len({line.get_marker() for line in runs}) == len(runs)


def test_a_run_equal_to_an_earlier_one_is_named_same_as_it_and_drawn_thinner_on_top(every_figure):
    lines = series_lines(every_figure["memory_timeline"].axes[0])
    uniform = next(line for line in lines if line.get_label().startswith("uniform (2)"))
    greedy = next(line for line in lines if line.get_label().startswith("greedy"))
    assert "same as uniform (2)" in greedy.get_label()
    assert greedy.get_zorder() > uniform.get_zorder() and greedy.get_linewidth() < uniform.get_linewidth()
    assert greedy.get_markevery() != uniform.get_markevery()  # markers at different steps


def test_series_style_gives_forty_distinct_styles_and_eight_distinct_colours():
    styles = [series_style(i) for i in range(40)]
    assert len({(s["color"], str(s["linestyle"]), s["marker"]) for s in styles}) == 40
    assert len({s["color"] for s in styles[:8]}) == 8


def test_points_at_one_spot_are_drawn_largest_first(every_figure):
    ax = every_figure["measured_vs_predicted"].axes[0]
    full, uniform = (next(c for c in ax.collections if c.get_label().startswith(label))
                     for label in ("full", "full uniform n=1"))
    assert full.get_sizes()[0] > uniform.get_sizes()[0] and uniform.get_zorder() > full.get_zorder()


# ---- units, peaks, budgets ----

@pytest.mark.parametrize("name", ["memory_timeline", "memory_stack", "tradeoff", "scaling", "measured_vs_predicted",
                                  "activation_breakdown", "remat_frontier"])
def test_every_axis_label_names_a_unit(every_figure, name):
    fig = every_figure[name]
    axes = [ax for ax in fig.axes if ax.axison]
    labels = [ax.get_xlabel() for ax in axes if not isinstance(ax.xaxis.get_major_formatter(), StrCategoryFormatter)]
    labels += [ax.get_ylabel() for ax in axes]
    assert any(ax.get_xlabel() for ax in axes) or name == "activation_breakdown"
    assert any(ax.get_ylabel() for ax in axes)
    assert all(UNIT.search(label) for label in labels if label), labels


def test_the_timeline_writes_the_measured_peak_in_mb(every_figure, timelines):
    peak = max(s.peak_bytes for s in timelines["keep all"])
    texts = [t.get_text() for t in drawn_texts(every_figure["memory_timeline"])]
    assert any(f"keep all: peak {peak / MB:.1f} MB" == t for t in texts), texts
    for label, snapshots in timelines.items():  # and each run's peak in the legend
        assert any(t.startswith(label) and f"{max(s.peak_bytes for s in snapshots) / MB:.1f} MB" in t for t in texts)


def test_each_panel_of_the_stack_writes_its_peak(every_figure, timelines):
    axes = [ax for ax in every_figure["memory_stack"].axes if ax.axison]
    for ax, snapshots in zip(axes, timelines.values()):
        peak = max(s.peak_bytes for s in snapshots)
        assert f"peak {peak / MB:.1f} MB" in [t.get_text() for t in ax.texts]


def test_the_tradeoff_marks_the_budget(every_figure):
    texts = [t.get_text() for t in every_figure["tradeoff"].axes[0].get_legend().get_texts()]
    assert "budget: 14.3 MB" in texts
    assert any(line.get_label() == "budget: 14.3 MB" and set(line.get_ydata()) == {14.336}
               for line in every_figure["tradeoff"].axes[0].get_lines())


def test_the_frontier_marks_every_budget_and_names_coinciding_planners(every_figure):
    fig = every_figure["remat_frontier"]
    first = fig.axes[0]
    marked = sorted({line.get_xdata()[0] for line in first.get_lines() if line.get_label().startswith("_")
                     and len(set(line.get_xdata())) == 1})
    assert marked == [1.0, 1.5, 2.0]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "LP rounding (same as MILP)" in legend and "MILP" in legend
    assert any("budget" in t for t in legend)


def test_the_tradeoff_legend_covers_no_point(every_figure):
    fig = every_figure["tradeoff"]
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(plot.labels.figure_renderer(fig))
    points = ax.transData.transform([(f / 1e9, p / MB) for p, f in DEMO_POINTS.values()])
    assert not any(legend.contains(x, y) for x, y in points)


def test_the_timeline_legend_is_outside_the_data(every_figure):
    fig = every_figure["memory_timeline"]
    ax = fig.axes[0]
    renderer = plot.labels.figure_renderer(fig)
    assert not ax.get_legend().get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))


# ---- colours ----

def test_memory_categories_take_their_colours_from_the_palette(every_figure):
    ax = every_figure["memory_stack"].axes[0]
    bands = [c for c in ax.collections if c.get_label() in CATEGORIES]
    assert [c.get_label() for c in bands] == list(CATEGORIES)
    assert [to_hex(c.get_facecolor()[0]) for c in bands] == [CATEGORY_COLOURS[c].lower() for c in CATEGORIES]


@pytest.mark.parametrize("name", ["memory_timeline", "memory_stack", "tradeoff", "scaling", "measured_vs_predicted",
                                  "activation_breakdown", "remat_frontier"])
def test_every_colour_comes_from_the_colour_blind_safe_palette(every_figure, name):
    colours = set()
    for ax in every_figure[name].axes:
        colours |= {to_hex(line.get_color()) for line in ax.get_lines()}
        for artist in [*ax.collections, *ax.patches]:
            colours |= {to_hex(c) for c in artist.get_facecolor().reshape(-1, 4)} if hasattr(
                artist.get_facecolor(), "reshape") else {to_hex(artist.get_facecolor())}
    assert colours <= ALLOWED_COLOURS, colours - ALLOWED_COLOURS


# ---- slide size ----

@pytest.mark.parametrize("name", ["memory_timeline", "memory_stack", "tradeoff", "scaling", "measured_vs_predicted",
                                  "activation_breakdown", "remat_frontier"])
def test_text_is_legible_at_slide_size(every_figure, name):
    fig = every_figure[name]
    width, height = fig.get_size_inches()
    assert width >= 10 and 1.4 <= width / height <= 2.3
    small = [(t.get_text(), t.get_fontsize()) for t in drawn_texts(fig) if t.get_fontsize() < 12]
    assert small == []


def test_a_saved_plot_is_a_small_png(tmp_path, timelines):
    path = tmp_path / "timeline.png"
    plot.memory_timeline(timelines, path=str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size < 300_000


# ---- the whole wall and training curves ----

def test_the_wall_stacks_each_slice_in_its_category_colour_with_a_formula_tick_per_slice():
    slices = {"parameters": 4 * MB, "gradients": 4 * MB, "optimizer state": 8 * MB, "activations": 10 * MB}
    fig = plot.memory_wall([("float32", slices, slices), ("mixed", {**slices, "activations": 5 * MB}, slices)])
    ax = fig.axes[0]
    assert len(ax.patches) == 8
    assert to_hex(ax.patches[2].get_facecolor()) == CATEGORY_COLOURS["optimizer state"].lower()
    ticks = [line for line in ax.lines if line.get_color() == "#000000"]
    assert len(ticks) == 8 and ticks[3].get_ydata()[0] == pytest.approx(26)
    assert "MB" in ax.get_ylabel()


def test_loss_curves_draw_one_line_a_run_with_units():
    fig = plot.loss_curves({"ag": [2.3, 1.2, 0.7], "torch": [2.3, 1.2, 0.7]})
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == ["ag", "torch"]
    assert "nats" in ax.get_ylabel() and ax.get_xlabel() == "step"
