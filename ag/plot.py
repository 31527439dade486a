"""Plots of what tracing recorded (needs the ``plot`` extra: matplotlib).

Each function takes measurements, returns a matplotlib Figure and, given ``path``,
writes it as a PNG. Nothing here measures: plotting draws what tracing recorded.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from .trace import MB, Snapshot


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
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
    ax.set_xlabel("op (forward), then backward step")
    ax.set_ylabel("NumPy memory allocated (MB)")
    ax.set_title(title)
    ax.legend()
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
    ax.set_xlabel("recomputed GFLOP")
    ax.set_ylabel("peak memory (MB)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig
