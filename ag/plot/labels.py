"""Labels beside their points, placed so that no two overlap, in the figure's pixels."""
from __future__ import annotations

import math
from typing import Sequence


def figure_renderer(fig):
    """The renderer that measures text: the canvas's own (Agg, inline), else one made for the figure."""
    canvas = fig.canvas
    return canvas.get_renderer() if hasattr(canvas, "get_renderer") else fig._get_renderer()


# Spots tried for a label around its point, in offset points, nearest first; among spots at one
# distance: right, above right, below right, above, below, left, above left, below left.
_DIRECTIONS = ((1, 0), (0.7, 0.7), (0.7, -0.7), (0, 1), (0, -1), (-1, 0), (-0.7, 0.7), (-0.7, -0.7))
_DISTANCES = (1, 13, 27, 43, 63, 88)  # points beyond the marker's edge; past the first, with a leader line


def _overlap(a, b) -> float:
    """Area (pixels²) two display boxes share."""
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(0.0, width) * max(0.0, height)


def _outside(box, frame) -> float:
    """Area of ``box`` that lies outside ``frame``."""
    return box.width * box.height - _overlap(box, frame)


def place_labels(ax, points: Sequence[tuple[float, float]], labels: Sequence[str], *,
                 marker_points: float = 7, avoid: Sequence = ()) -> list:
    """Write ``labels`` beside their ``points`` (data coordinates) so that no two overlap.

    Labels of points whose markers cover each other are stacked into one text. Each text, in
    order, takes the first spot around its point, nearest first, that overlaps no label placed
    before it, no marker (a square of ``marker_points`` around each point), nothing in ``avoid``
    (display boxes: a legend, say) and stays inside the axes; next to its point, no other point
    may be as near it; further out, its leader line may cross no other marker or label. If no
    spot is free, the one that overlaps least. The result depends on the points alone: the same
    chart is laid out the same way every time. Lay the figure out first (``tight_layout``): this
    works in pixels.
    """
    from matplotlib.transforms import Bbox
    fig = ax.figure
    renderer = figure_renderer(fig)
    half = marker_points * fig.dpi / 72
    groups = _crowds(ax, points, labels, half)
    centres = [tuple(c) for c in ax.transData.transform(list(groups))]
    markers = [Bbox.from_extents(x - half, y - half, x + half, y + half) for x, y in centres]
    frame, taken, texts = ax.get_window_extent(renderer), list(avoid), []
    for (xy, names), centre in zip(groups.items(), centres):
        text = ax.annotate("\n".join(names), xy, xytext=(0, 0), textcoords="offset points", fontsize=13,
                           zorder=30, annotation_clip=False)
        text.set_in_layout(False)
        others = [c for c in centres if c != centre]
        best = None
        spots = [((marker_points + d) * ux, (marker_points + d) * uy) for d in _DISTANCES for ux, uy in _DIRECTIONS]
        for order, (dx, dy) in enumerate(spots):
            _aim(text, dx, dy)
            box = text.get_window_extent(renderer)
            clash = sum(_overlap(box, other) for other in taken + markers) + 10 * _outside(box, frame)
            if order < len(_DIRECTIONS):
                unclear = _nearer(box, others, centre)
            else:  # a leader line must not run through another marker or label
                unclear = _crosses(centre, (dx, dy), fig.dpi / 72,
                                   [m for m, c in zip(markers, centres) if c != centre] + taken)
            cost = (clash, unclear, order)
            best = min(best or cost, cost)
            if cost[:2] == (0, False):
                break
        dx, dy = spots[best[2]]
        _aim(text, dx, dy)
        taken.append(text.get_window_extent(renderer))
        texts.append(text)
        if best[2] >= len(_DIRECTIONS):
            _leader(ax, xy, (dx, dy), half)
    return texts


def _aim(text, dx: float, dy: float) -> None:
    """Put ``text`` at offset (dx, dy) points, aligned so that it grows away from its point."""
    text.set_position((dx, dy))
    text.set_horizontalalignment("left" if dx > 0 else "right" if dx < 0 else "center")
    text.set_verticalalignment("bottom" if dy > 0 else "top" if dy < 0 else "center")


def _crosses(centre, offset, pixels: float, boxes) -> bool:
    """Whether the leader from ``centre`` to ``offset`` points away passes through one of ``boxes``."""
    x, y = centre
    dx, dy = offset[0] * pixels, offset[1] * pixels
    return any(box.contains(x + dx * t / 20, y + dy * t / 20) for t in range(3, 21) for box in boxes)


def _nearer(box, others, centre) -> bool:
    """Whether another point lies as near ``box`` as its own (``centre``): a reader could pair them."""
    def distance(point):
        x, y = point
        return math.hypot(max(box.x0 - x, 0, x - box.x1), max(box.y0 - y, 0, y - box.y1))
    own = distance(centre)
    return any(distance(other) <= own + 4 for other in others)


def _crowds(ax, points, labels, radius: float) -> dict[tuple[float, float], list[str]]:
    """Labels grouped by the first point within ``radius`` pixels of theirs: markers that cover
    each other share one label."""
    groups: dict[tuple[float, float], list[str]] = {}
    for xy, label in zip(points, labels):
        x, y = ax.transData.transform(xy)
        near = (first for first in groups if math.dist(ax.transData.transform(first), (x, y)) < radius)
        groups.setdefault(next(near, tuple(xy)), []).append(label)
    return groups


def _leader(ax, xy, offset, gap: float) -> None:
    """A thin grey line from just outside a point's marker to its label, drawn in data coordinates."""
    x, y = ax.transData.transform(xy)
    dx, dy = offset
    length = math.hypot(dx, dy)
    pixels = ax.figure.dpi / 72
    start = (x + dx / length * gap, y + dy / length * gap)
    end = (x + dx * pixels, y + dy * pixels)
    (x0, y0), (x1, y1) = ax.transData.inverted().transform([start, end])
    ax.plot([x0, x1], [y0, y1], color="#444444", linewidth=1.2, zorder=2, scalex=False, scaley=False)
