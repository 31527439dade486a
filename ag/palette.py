"""One colour-blind-safe palette for every plot ag draws, static or interactive.

The colours are Okabe and Ito's eight (2008), safe for the common forms of colour blindness.
Each memory category keeps its colour in every plot, PNG or HTML; series that are not
categories (strategies, runs) take the rest in order, each with its own line style too, so
they stay apart in grey print.
"""
from __future__ import annotations

from .trace import CATEGORIES

OKABE_ITO = {
    "black": "#000000", "orange": "#E69F00", "sky blue": "#56B4E9", "bluish green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "reddish purple": "#CC79A7",
}

CATEGORY_COLOURS = dict(zip(CATEGORIES, (OKABE_ITO["sky blue"], OKABE_ITO["black"], OKABE_ITO["orange"],
                                          OKABE_ITO["reddish purple"], OKABE_ITO["bluish green"],
                                          OKABE_ITO["blue"], OKABE_ITO["yellow"])))
SERIES_COLOURS = tuple(OKABE_ITO[c] for c in ("blue", "vermillion", "bluish green", "orange",
                                                "reddish purple", "sky blue", "black", "yellow"))
LINE_STYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 1)), (0, (8, 2)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h")  # eleven: past eight series, the marker tells apart
TRACEMALLOC_COLOUR = OKABE_ITO["vermillion"]  # no category has it: tracemalloc's line stands out over every band


def series_style(index: int) -> dict:
    """The colour, line style and marker of the ``index``-th series of a plot: no two of the
    first 88 series share all three, and no two of the first eight share any."""
    return {"color": SERIES_COLOURS[index % len(SERIES_COLOURS)],
            "linestyle": LINE_STYLES[index % len(LINE_STYLES)],
            "marker": MARKERS[index % len(MARKERS)]}
