"""Plots of what tracing recorded (needs the ``plot`` extra: matplotlib).

Each function takes measurements, returns a matplotlib Figure and, given ``path``,
writes it as a PNG. Nothing here measures: plotting draws what tracing recorded.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from .trace import CATEGORIES, MB, Snapshot


def _pyplot():
    try:
        import matplotlib.pyplot as plt  # its own backend choice: inline in Jupyter, Agg when headless
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("ag.plot needs matplotlib: pip install 'ag[plot]'") from error
    return plt


def memory_timeline(timelines: Mapping[str, Sequence[Snapshot]], *, title: str = "Memory over one step",
                    path: str | None = None):
    """Allocated MB after each op (forward) and each backward step, one line per run.

    ``timelines`` maps a label (a strategy, say) to the snapshots of ``ag.trace.tracing()``.
    The dashed line at the first backward step marks where backward starts.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, snapshots in timelines.items():
        ax.plot([s.allocated_bytes / MB for s in snapshots], label=label, linewidth=1.5)
        start = next((i for i, s in enumerate(snapshots) if s.phase == "backward"), None)
        if start is not None:
            ax.axvline(start, color="grey", linestyle=":", linewidth=0.8)
    return _finish(fig, ax, "op (forward), then backward step", "NumPy memory allocated (MB)", title, path)


def memory_stack(timelines: Mapping[str, Sequence[Snapshot]], *, title: str = "What the memory holds",
                 path: str | None = None):
    """One panel per run: ag's live bytes stacked by category (inputs, parameters, activations
    kept, activations recomputed, gradients), with tracemalloc's count drawn over the stack.

    The snapshots must come from ``ag.trace.tracing()``, which records the categories.
    """
    plt = _pyplot()
    n = len(timelines)
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False, sharey=True)
    for ax, (label, snapshots) in zip(axes.flat, timelines.items()):
        if any(s.categories is None for s in snapshots):
            raise ValueError(f"memory_stack: the snapshots of {label!r} carry no categories; "
                             "record them with ag.trace.tracing()")
        steps = range(len(snapshots))
        layers = [[s.categories[c] / MB for s in snapshots] for c in CATEGORIES]
        ax.stackplot(steps, layers, labels=CATEGORIES, alpha=0.8)
        ax.plot(steps, [s.allocated_bytes / MB for s in snapshots], color="black", linewidth=1,
                label="tracemalloc")
        ax.set_title(label)
        ax.set_xlabel("op, then backward step")
    for ax in axes.flat[n:]:
        ax.axis("off")
    axes[0][0].set_ylabel("MB")
    axes[0][0].legend(loc="upper left", fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig


def tradeoff(points: Mapping[str, tuple[float, float]], *, title: str = "Memory against recompute",
             path: str | None = None):
    """Peak MB against recomputed FLOPs, one labelled point per strategy (a Pareto chart).

    ``points`` maps a label to ``(peak_bytes, recompute_flops)``; the Pareto front is drawn.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    items = sorted(points.items(), key=lambda kv: (kv[1][1], kv[1][0]))
    for i, (label, (peak, flops)) in enumerate(items):
        ax.scatter(flops / 1e9, peak / MB, s=30)
        # stagger the labels: strategies often land on the same point
        ax.annotate(label, (flops / 1e9, peak / MB), textcoords="offset points", xytext=(6, 4 + 11 * (i % 3)))
    front, best = [], float("inf")
    for _, (peak, flops) in items:
        if peak < best:
            front.append((flops / 1e9, peak / MB))
            best = peak
    ax.plot(*zip(*front), color="grey", linestyle="--", linewidth=0.8, label="Pareto front")
    return _finish(fig, ax, "recomputed GFLOP", "peak memory (MB)", title, path)


def _finish(fig, ax, xlabel: str, ylabel: str, title: str, path: str | None):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig


def scaling(series: Mapping[str, Sequence[tuple[int, int]]], *, title: str = "Peak memory against N",
            path: str | None = None):
    """Peak bytes against sequence length on log-log axes, one line per method, with
    reference slopes for linear and quadratic growth through each line's first point."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for label, points in series.items():
        ns, peaks = zip(*points)
        ax.plot(ns, [p / MB for p in peaks], marker="o", label=label)
        slope = 2 if label == "naive" else 1
        ax.plot(ns, [peaks[0] / MB * (n / ns[0]) ** slope for n in ns], color="grey", linestyle=":",
                linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    return _finish(fig, ax, "sequence length N", "peak memory (MB)", title + " (dotted: N and N²)", path)


def show(fig) -> None:
    """Display a figure in a notebook as a PNG, whatever matplotlib's backend (headless Agg too)."""
    import io

    from IPython.display import Image, display
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    _pyplot().close(fig)
    display(Image(buffer.getvalue()))


def measured_vs_predicted(series: Mapping[str, Sequence[tuple[float, float]]], *,
                          title: str = "Measured against predicted", path: str | None = None):
    """Measured MB against predicted MB on log-log axes, one marker style per series, with the
    line y = x: a point on it is a formula that holds.

    ``series`` maps a label to ``(predicted_bytes, measured_bytes)`` pairs.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 5))
    markers = "osD^v<>ph*"
    values = [v / MB for points in series.values() for pair in points for v in pair]
    for i, (label, points) in enumerate(series.items()):
        predicted, measured = zip(*points)
        ax.scatter([p / MB for p in predicted], [m / MB for m in measured], marker=markers[i % len(markers)],
                   s=40, alpha=0.8, label=label)
    low, high = min(values) / 1.5, max(values) * 1.5
    ax.plot([low, high], [low, high], color="grey", linestyle="--", linewidth=0.8, label="y = x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    return _finish(fig, ax, "predicted (MB)", "measured (MB)", title, path)


def activation_breakdown(terms: Mapping[str, Mapping[str, int]], *, title: str = "What a layer keeps",
                         path: str | None = None):
    """One stacked bar per setting: the bytes of each tensor kept for backward, in MB.

    ``terms`` maps a setting to ``{tensor name: bytes}``, as ``ag.memory_model.activation_terms``
    gives them; a name missing from a setting counts 0 there.
    """
    plt = _pyplot()
    names = list(dict.fromkeys(name for parts in terms.values() for name in parts))
    colors = plt.get_cmap("tab20").colors
    fig, ax = plt.subplots(figsize=(1.3 * len(terms) + 5, 4.8))
    labels = list(terms)
    bottom = [0.0] * len(labels)
    for i, name in enumerate(names):
        heights = [terms[label].get(name, 0) / MB for label in labels]
        ax.bar(labels, heights, bottom=bottom, label=name, color=colors[i % len(colors)])
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_ylabel("kept for backward (MB)")
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=20)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig


def remat_frontier(sweeps: Mapping[str, Sequence], forward_flops: Mapping[str, int], *,
                   title: str = "Recompute against memory, every planner", path: str | None = None):
    """Checkmate's Figure 4: one panel per graph, measured peak (MB) against recomputed FLOPs as a
    share of one forward. ``sweeps`` maps a graph's name to ``ag.remat.sweep`` points; planners
    with a budget are lines, fixed plans single markers (named in the legend, never on the plot)."""
    plt = _pyplot()
    n = len(sweeps)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.2), squeeze=False)
    markers = dict(zip(("checkpoint all", "recompute all", "sqrt", "uniform (2)", "block (half)", "selective", "full"),
                       ("s", "X", "^", "<", ">", "D", "v")))
    styles = dict(zip(("MILP", "LP rounding", "DTR", "greedy", "one-level optimal"), ("-", "--", "-.", ":", "-")))
    colours = dict(zip((*styles, *markers), plt.get_cmap("tab20").colors[::2] + plt.get_cmap("tab20").colors[1::2]))
    for ax, (name, points) in zip(axes.flat, sweeps.items()):
        flops = max(1, forward_flops[name])
        for planner in dict.fromkeys(p.planner for p in points):
            mine = sorted((p for p in points if p.planner == planner), key=lambda p: p.peak_bytes)
            xs = [p.peak_bytes / MB for p in mine]
            ys = [p.recompute_flops / flops for p in mine]
            if planner in markers:
                ax.scatter(xs, ys, marker=markers[planner], s=60, zorder=3, label=planner, color=colours[planner])
            else:
                ax.plot(xs, ys, styles.get(planner, "-"), marker="o", markersize=4, linewidth=1.6, label=planner,
                        color=colours.get(planner))
        ax.set_title(name)
        ax.set_xlabel("measured peak (MB)")
        ax.grid(alpha=0.3)
    axes.flat[0].set_ylabel("recomputed FLOPs / one forward's")
    handles = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    if path is not None:
        fig.savefig(path, dpi=150)
    return fig

