"""Slide plots of what tracing recorded, as PNGs (needs the ``plot`` extra: matplotlib).

Each function takes measurements, returns a matplotlib Figure and, given ``path``,
writes it as a PNG. Nothing here measures: plotting draws what tracing recorded.

Every plot is drawn for a 16:9 slide: a 10 x 5.6 inch figure, text of 12 points or more,
the colour-blind-safe palette of ``ag.palette`` (each memory category in its own colour
everywhere), a line style and a marker per series as well as a colour, a unit on every
axis, legends outside the data, and labels placed so that no two overlap.
"""
from __future__ import annotations

import functools
import textwrap
from typing import Mapping, Sequence

from ..palette import CATEGORY_COLOURS, OKABE_ITO, SERIES_COLOURS, TRACEMALLOC_COLOUR, series_style
from ..trace import CATEGORIES, MB, Snapshot
from .labels import figure_renderer, place_labels

SLIDE = (10, 5.6)  # inches: 16:9, the size a slide shows a figure at
DPI = 150
GUIDE = "#777777"  # reference lines (y = x, Pareto front, backward starts): grey, behind the data
SLIDE_STYLE = {
    "font.size": 13, "axes.titlesize": 15, "axes.labelsize": 14, "xtick.labelsize": 12, "ytick.labelsize": 12,
    "legend.fontsize": 12, "legend.title_fontsize": 12, "figure.titlesize": 16, "lines.linewidth": 2,
    "lines.markersize": 7, "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
    "axes.spines.right": False, "savefig.bbox": "tight", "savefig.pad_inches": 0.1,
}


def _pyplot():
    try:
        import matplotlib.pyplot as plt  # its own backend choice: inline in Jupyter, Agg when headless
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("ag.plot needs matplotlib: pip install 'ag[plot]'") from error
    return plt


def _slide(draw):
    """Draw inside the slide style, with the palette as the colour cycle (never matplotlib's default)."""
    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        import matplotlib
        from cycler import cycler
        style = {**SLIDE_STYLE, "axes.prop_cycle": cycler(color=SERIES_COLOURS)}
        with matplotlib.rc_context(style):
            return draw(*args, **kwargs)
    return drawn


def _save(fig, path: str | None):
    if path:
        fig.savefig(path, dpi=DPI)
    return fig


def _same_as(series: Mapping[str, object]) -> dict[str, str]:
    """Each label whose data equal an earlier label's exactly, mapped to that earlier label."""
    same, seen = {}, {}
    for label, data in series.items():
        key = repr(data)
        if key in seen:
            same[label] = seen[key]
        else:
            seen[key] = label
    return same


def _legend_label(label: str, same: Mapping[str, str]) -> str:
    return f"{label} (same as {same[label]})" if label in same else label


def _layered(index: int, count: int, widest: float = 3.6, thinnest: float = 1.4) -> tuple[float, int]:
    """Line width and draw order of the ``index``-th of ``count`` series: each later one thinner
    and on top, so a series that coincides with an earlier one still shows it underneath."""
    width = widest - (widest - thinnest) * index / max(1, count - 1)
    return width, 3 + index


def _outside_legend(ax, **options):
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0, frameon=False, **options)


def _peak(snapshots: Sequence[Snapshot]) -> tuple[int, int]:
    """tracemalloc's peak over the run, and the first step by which it was reached."""
    peak = max(s.peak_bytes for s in snapshots)
    return next(i for i, s in enumerate(snapshots) if s.peak_bytes == peak), peak


def _mb(nbytes: float) -> str:
    return f"{nbytes / MB:.1f} MB"


@_slide
def memory_timeline(timelines: Mapping[str, Sequence[Snapshot]], *, title: str = "Memory over one step",
                    path: str | None = None):
    """Allocated MB after each op (forward) and each backward step, one line per run.

    ``timelines`` maps a label (a strategy, say) to the snapshots of ``ag.trace.tracing()``.
    Each run's peak (tracemalloc's high-water mark, reached inside an op, so above the line)
    is a large marker, its value in the legend; the highest is also written on the plot.
    Grey dotted lines mark where backward starts.
    """
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=SLIDE)
    same = _same_as({label: [s.allocated_bytes for s in snapshots] for label, snapshots in timelines.items()})
    peaks = {}
    for i, (label, snapshots) in enumerate(timelines.items()):
        style, (width, order) = series_style(i), _layered(i, len(timelines))
        every = max(2, len(snapshots) // 8)
        ys = [s.allocated_bytes / MB for s in snapshots]
        step, peak = peaks[label] = _peak(snapshots)
        ax.plot(ys, **style, linewidth=width, zorder=order, markersize=8, markeredgecolor="white",
                markevery=(i * every // len(timelines) % every, every),
                label=f"{label}: {_mb(peak)}" + (f"\n(same as {same[label]})" if label in same else ""))
        ax.plot([step, step], [ys[step], peak / MB], color=style["color"], linestyle=":", linewidth=1.2, zorder=order)
        ax.plot(step, peak / MB, marker=style["marker"], color=style["color"], markersize=15 - 0.6 * i,
                markeredgecolor="black", linestyle="none", zorder=20 + i)  # later ones smaller, on top
    starts = sorted({next(i for i, s in enumerate(snapshots) if s.phase == "backward")
                     for snapshots in timelines.values() if any(s.phase == "backward" for s in snapshots)})
    for n, start in enumerate(starts):
        ax.axvline(start, color=GUIDE, linestyle=":", linewidth=1, zorder=1,
                   label="backward starts" if n == 0 else None)
    ax.plot([], [], marker="o", markersize=12, color="white", markeredgecolor="black", linestyle="none",
            label="large marker: the peak,\nreached inside an op")
    top_label = max(peaks, key=lambda label: peaks[label][1])
    step, peak = peaks[top_label]
    ax.set_ylim(0, peak / MB * 1.12)
    ax.set_xlim(-0.5, max(len(snapshots) for snapshots in timelines.values()) - 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.set_xlabel("step: each op of forward, then each backward step")
    ax.set_ylabel("allocated after the step (MB)")
    ax.set_title(title)
    _outside_legend(ax, title="peak (tracemalloc)", alignment="left")
    fig.tight_layout()
    label = f"{top_label}: peak {_mb(peak)}" if len(timelines) > 1 else f"peak {_mb(peak)}"
    text, = place_labels(ax, [(step, peak / MB)], [label], marker_points=10)
    text.set_bbox(dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor="none", alpha=0.85))
    return _save(fig, path)


def _grid(n: int) -> tuple[int, int]:
    """Columns and rows for ``n`` panels and, past one, a spare slot for the legend."""
    cols = {1: 1, 2: 3, 3: 2, 4: 3, 5: 3}.get(n, 4)
    return cols, -(-(n + (n > 1)) // cols)


@_slide
def memory_stack(timelines: Mapping[str, Sequence[Snapshot]], *, title: str = "What the memory holds",
                 path: str | None = None):
    """One panel per run: ag's live bytes stacked by category (inputs, parameters, activations
    kept, activations recomputed, gradients), with tracemalloc's count drawn over the stack and
    its peak marked and written in each panel.

    The snapshots must come from ``ag.trace.tracing()``, which records the categories.
    """
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator
    for label, snapshots in timelines.items():
        if any(s.categories is None for s in snapshots):
            raise ValueError(f"memory_stack: the snapshots of {label!r} carry no categories; "
                             "record them with ag.trace.tracing()")
    n = len(timelines)
    cols, rows = _grid(n)
    height = 3.1 * rows + 1.0
    size = SLIDE if rows == 1 else (16 / 9 * height, height)
    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False, sharey=True)
    top = max(_peak(snapshots)[1] for snapshots in timelines.values()) / MB
    for ax, (label, snapshots) in zip(axes.flat, timelines.items()):
        steps = range(len(snapshots))
        layers = [[s.categories[c] / MB for s in snapshots] for c in CATEGORIES]
        ax.stackplot(steps, layers, labels=CATEGORIES, colors=[CATEGORY_COLOURS[c] for c in CATEGORIES], alpha=0.85)
        ax.plot(steps, [s.allocated_bytes / MB for s in snapshots], color=TRACEMALLOC_COLOUR, linestyle="--",
                linewidth=2, label="tracemalloc")
        step, peak = _peak(snapshots)
        ax.plot(step, peak / MB, marker="v", markersize=11, color=TRACEMALLOC_COLOUR, markeredgecolor="black",
                linestyle="none", label="tracemalloc's peak", zorder=5, clip_on=False)
        ax.set_xlim(0, len(snapshots) - 1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
        ax.text(0.97, 0.95, f"peak {_mb(peak)}", transform=ax.transAxes, ha="right", va="top", fontsize=12)
        ax.set_title(label, fontsize=13)
        ax.set_ylim(0, top * 1.25)
        ax.grid(False)
    for ax in axes.flat[max(0, n - cols):n]:  # the lowest panel of each column
        ax.set_xlabel("step (op, then backward)", fontsize=12)
    for ax in axes[:, 0]:
        ax.set_ylabel("live memory (MB)", fontsize=12)
    spare = list(axes.flat[n:])
    for ax in spare:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    if spare:
        spare[0].legend(handles, names, loc="center", frameon=False)
    else:
        _outside_legend(axes.flat[0], handles=handles, labels=names)
    fig.suptitle(title)
    fig.tight_layout(w_pad=2)  # room between panels for their edge tick labels
    return _save(fig, path)


def _flop_unit(flops: float) -> tuple[str, float]:
    """The unit (FLOP, MFLOP, GFLOP, TFLOP) that writes ``flops`` with at most three digits."""
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if flops >= scale:
            return unit, scale
    return "FLOP", 1.0


@_slide
def tradeoff(points: Mapping[str, tuple[float, float]], *, budget_bytes: float | None = None,
             budget_label: str = "budget", title: str = "Memory against recompute", path: str | None = None):
    """Peak MB against recomputed FLOPs, one labelled point per strategy (a Pareto chart).

    ``points`` maps a label to ``(peak_bytes, recompute_flops)``; the Pareto front is drawn, and
    ``budget_bytes``, if given, as a horizontal line named ``budget_label``. Points at one spot
    are drawn largest first (each marker still shows) and share one stacked label.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=SLIDE)
    unit, scale = _flop_unit(max(flops for _, flops in points.values()))
    coords = {label: (flops / scale, peak / MB) for label, (peak, flops) in points.items()}
    for i, (label, (x, y)) in enumerate(coords.items()):
        style = series_style(i)
        ax.scatter(x, y, marker=style["marker"], color=style["color"], s=190 - 14 * i, edgecolors="black",
                   linewidths=0.7, zorder=4 + i)
    front, best = [], float("inf")
    for x, y in sorted(coords.values()):
        if y < best:
            front.append((x, y))
            best = y
    ax.plot(*zip(*front), color=GUIDE, linestyle="--", linewidth=1.2, zorder=2, label="Pareto front")
    if budget_bytes is not None:
        ax.axhline(budget_bytes / MB, color=OKABE_ITO["vermillion"], linestyle=(0, (6, 3)), linewidth=1.5, zorder=2,
                   label=f"{budget_label}: {_mb(budget_bytes)}")
    ax.margins(x=0.08, y=0.12)
    if budget_bytes is not None:
        low, high = ax.get_ylim()
        ax.set_ylim(min(low, budget_bytes / MB - 0.08 * (high - low)), high)
    ax.set_xlabel(f"recomputed {unit}")
    ax.set_ylabel("peak memory (MB)")
    ax.set_title(title)
    legend = ax.legend(loc="upper right", framealpha=0.9)
    fig.tight_layout()
    place_labels(ax, list(coords.values()), list(coords), marker_points=7,
                 avoid=[legend.get_window_extent(figure_renderer(fig))])
    return _save(fig, path)


@_slide
def scaling(series: Mapping[str, Sequence[tuple[int, int]]], *, title: str = "Peak memory against N",
            path: str | None = None):
    """Peak bytes against sequence length on log-log axes, one line per method, its last value
    written beside it, with a reference slope through each line's last point: N² for "naive", N
    for the others (the slopes they reach once N is large enough to hide fixed costs)."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    fig, ax = plt.subplots(figsize=SLIDE)
    references = {2: ("-.", "∝ N² (reference)"), 1: (":", "∝ N (reference)")}
    for i, (label, points) in enumerate(series.items()):
        ns, peaks = zip(*points)
        ax.plot(ns, [p / MB for p in peaks], **series_style(i), markersize=9, label=label, zorder=3 + i)
        linestyle, reference = references[2 if label == "naive" else 1]
        slope = 2 if label == "naive" else 1
        drawn = reference in ax.get_legend_handles_labels()[1]
        ax.plot(ns, [peaks[-1] / MB * (n / ns[-1]) ** slope for n in ns], color=GUIDE, linestyle=linestyle,
                linewidth=1.3, zorder=2, label=None if drawn else reference)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted({n for points in series.values() for n, _ in points}))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    _plain_numbers(ax.yaxis)
    ax.margins(x=0.1, y=0.12)
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel("peak memory (MB)")
    ax.set_title(title)
    legend = ax.legend(loc="upper left")
    fig.tight_layout()
    ends = [points[-1] for points in series.values()]
    place_labels(ax, [(n, peak / MB) for n, peak in ends], [_mb(peak) for _, peak in ends],
                 avoid=[legend.get_window_extent(figure_renderer(fig))])
    return _save(fig, path)


def _plain_numbers(*axes) -> None:
    """Log-axis ticks written 0.1, 1, 10 (not 10⁻¹, 10⁰, 10¹), minor ticks unlabelled."""
    from matplotlib.ticker import FuncFormatter, NullFormatter
    for axis in axes:
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))
        axis.set_minor_formatter(NullFormatter())


def show(fig) -> None:
    """Display a figure in a notebook as a PNG, whatever matplotlib's backend (headless Agg too)."""
    import io

    from IPython.display import Image, display
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    _pyplot().close(fig)
    display(Image(buffer.getvalue()))


@_slide
def measured_vs_predicted(series: Mapping[str, Sequence[tuple[float, float]]], *,
                          title: str = "Measured against predicted", path: str | None = None):
    """Measured MB against predicted MB on log-log axes, one marker style per series, with the
    line y = x: a point on it is a formula that holds.

    ``series`` maps a label to ``(predicted_bytes, measured_bytes)`` pairs. Points of different
    series often fall on one spot; each series is drawn smaller than the one before and on top of
    it, so every marker still shows around the next.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=SLIDE)
    same = _same_as(series)
    values = [v / MB for points in series.values() for pair in points for v in pair]
    for i, (label, points) in enumerate(series.items()):
        predicted, measured = zip(*points)
        style = series_style(i)
        ax.scatter([p / MB for p in predicted], [m / MB for m in measured], marker=style["marker"],
                   color=style["color"], s=230 - 16 * i, edgecolors="black", linewidths=0.7, zorder=3 + i,
                   label=_legend_label(label, same))
    low, high = min(values) / 1.5, max(values) * 1.5
    ax.plot([low, high], [low, high], color=GUIDE, linestyle="--", linewidth=1.2, zorder=2, label="y = x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_numbers(ax.xaxis, ax.yaxis)
    ax.set_xlabel("predicted (MB)")
    ax.set_ylabel("measured (MB)")
    ax.set_title(title)
    _outside_legend(ax)
    fig.tight_layout()
    return _save(fig, path)


HATCHES = ("", "//", "..", "xx")  # past the palette's eight colours, bars repeat a colour with a hatch


@_slide
def activation_breakdown(terms: Mapping[str, Mapping[str, int]], *, title: str = "What a layer keeps",
                         path: str | None = None):
    """One stacked bar per setting: the bytes of each tensor kept for backward, in MB.

    ``terms`` maps a setting to ``{tensor name: bytes}``, as ``ag.memory_model.activation_terms``
    gives them; a name missing from a setting counts 0 there.
    """
    plt = _pyplot()
    names = list(dict.fromkeys(name for parts in terms.values() for name in parts))
    fig, ax = plt.subplots(figsize=(max(11, 1.4 * len(terms) + 4.5), 6.2))
    labels = list(terms)
    ticks = ["\n".join(textwrap.fill(line, 12, break_long_words=False) for line in label.split("\n"))
             for label in labels]  # narrow enough that neighbours never touch
    bottom = [0.0] * len(labels)
    for i, name in enumerate(names):
        heights = [terms[label].get(name, 0) / MB for label in labels]
        hatch = HATCHES[i // len(SERIES_COLOURS) % len(HATCHES)]
        ax.bar(ticks, heights, bottom=bottom, label=name, color=SERIES_COLOURS[i % len(SERIES_COLOURS)],
               hatch=hatch, edgecolor="white", linewidth=0.6)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for x, total in enumerate(bottom):
        ax.annotate(f"{total:,.0f} MB" if total >= 100 else f"{total:.3g} MB", (x, total), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=12)
    ax.set_ylim(0, max(bottom) * 1.1)
    ax.set_ylabel("kept for backward (MB)")
    ax.set_title(title)
    ax.grid(axis="x", visible=False)
    handles, names_ = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names_[::-1], loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0,
              frameon=False)  # reversed: the legend's top is the stack's top
    fig.tight_layout()
    return _save(fig, path)


def _budgets(points: Sequence) -> list[float]:
    return sorted({p.budget_bytes for p in points if p.budget_bytes is not None})


@_slide
def remat_frontier(sweeps: Mapping[str, Sequence], forward_flops: Mapping[str, int], *,
                   title: str = "Recompute against memory, every planner", path: str | None = None):
    """Checkmate's Figure 4: one panel per graph, measured peak (MB) against recomputed FLOPs as a
    share of one forward. ``sweeps`` maps a graph's name to ``ag.remat.graphs.sweep`` points; planners
    with a budget are lines (each point one budget, the budgets grey ticks along the top), fixed
    plans single markers (named in the legend, never on the plot). Each planner keeps its style
    in every panel; a planner whose points equal another's is named "same as" it in the legend."""
    plt = _pyplot()
    n = len(sweeps)
    planners = list(dict.fromkeys(p.planner for points in sweeps.values()
                                  for p in sorted(points, key=lambda p: p.budget_bytes is None)))
    size = SLIDE if n == 1 else (max(SLIDE[0], 4.4 * n), SLIDE[1] + 1.2)
    fig, axes = plt.subplots(1, n, figsize=size, squeeze=False)
    same: dict[str, set] = {}  # planner -> what it equals in each panel it is drawn in (None: itself)
    for ax, (name, points) in zip(axes.flat, sweeps.items()):
        flops = max(1, forward_flops[name])
        mine = {planner: sorted((p for p in points if p.planner == planner), key=lambda p: p.peak_bytes)
                for planner in planners}
        mine = {planner: ps for planner, ps in mine.items() if ps}
        here = _same_as({planner: [(p.peak_bytes, p.recompute_flops) for p in ps] for planner, ps in mine.items()})
        for planner, ps in mine.items():
            same.setdefault(planner, set()).add(here.get(planner))
            i = planners.index(planner)
            style = series_style(i)
            xs, ys = [p.peak_bytes / MB for p in ps], [p.recompute_flops / flops for p in ps]
            if all(p.budget_bytes is None for p in ps):
                ax.scatter(xs, ys, marker=style["marker"], color=style["color"], s=170 - 8 * i, edgecolors="black",
                           linewidths=0.7, zorder=4 + i, label=planner)
            else:
                width, order = _layered(i, len(planners))
                ax.plot(xs, ys, **style, linewidth=width, markersize=max(6, 12.5 - 1.2 * i), markeredgecolor="black",
                        markeredgewidth=0.6, zorder=order, label=planner)
        for budget in _budgets(points):
            ax.axvline(budget / MB, ymin=0.96, ymax=1, color=GUIDE, linewidth=2.5, zorder=1)
        ax.set_title(name)
        ax.set_xlabel("measured peak (MB)")
        ax.margins(x=0.06, y=0.08)
    axes.flat[0].set_ylabel("recomputed FLOPs (× one forward)")
    handles = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    from matplotlib.lines import Line2D
    handles["budgets (on the predicted peak)"] = Line2D([], [], color=GUIDE, linewidth=2.5)
    labels = [f"{label} (same as {next(iter(same[label]))})" if same.get(label, {None}) != {None}
              and len(same[label]) == 1 else label for label in handles]
    fig.suptitle(title)
    if n == 1:
        _outside_legend(axes.flat[0], handles=list(handles.values()), labels=labels)
        fig.tight_layout()
        return _save(fig, path)
    columns = min(5, len(handles))
    fig.legend(handles.values(), labels, loc="lower center", ncol=columns, frameon=False)
    legend_inches = 0.3 * -(-len(handles) // columns) + 0.2
    fig.tight_layout(rect=(0, legend_inches / size[1], 1, 1), w_pad=2.5)
    return _save(fig, path)


@_slide
def memory_wall(bars: Sequence[tuple[str, Mapping[str, int], Mapping[str, int]]], *,
                title: str = "One training step, by slice", path: str | None = None):
    """The wall as stacked bars, one per (label, measured, predicted) with bytes by slice; a black
    tick beside each slice marks the formula's prediction of its top. Labels are short, in lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=SLIDE)
    slices = list(bars[0][1])
    for i, (_, measured, predicted) in enumerate(bars):
        bottom = predicted_bottom = 0.0
        for name in slices:
            colour = CATEGORY_COLOURS.get(name, CATEGORY_COLOURS["activations kept"])
            ax.bar(i, measured[name] / MB, bottom=bottom, color=colour, width=0.6,
                   label=name if i == 0 else None, edgecolor="white", linewidth=0.5)
            bottom += measured[name] / MB
            predicted_bottom += predicted[name] / MB
            ax.plot([i + 0.32, i + 0.42], [predicted_bottom] * 2, color=OKABE_ITO["black"], linewidth=2,
                    label="formula" if i == 0 and name == slices[-1] else None)
    ax.set_xticks(range(len(bars)), [label for label, _, _ in bars], fontsize=10)
    ax.set_ylabel("bytes alive (MB)")
    ax.set_title(title)
    _outside_legend(ax)
    return _save(fig, path)


@_slide
def loss_curves(series: Mapping[str, Sequence[float]], *, title: str = "Training loss", path: str | None = None):
    """The loss at each step, one line per run (ag, torch, a setting), its last value written beside it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=SLIDE)
    for i, (label, losses) in enumerate(series.items()):
        style = {**series_style(i), "marker": None}
        ax.plot(range(1, len(losses) + 1), losses, **style, label=label, zorder=3 + i)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats)")
    ax.set_title(title)
    ax.legend(loc="upper right")  # a falling loss leaves the upper right empty
    return _save(fig, path)
