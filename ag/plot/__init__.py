"""Plots of what tracing recorded: slides as PNGs (``slides``, matplotlib) and an interactive page
that works offline (``html``, Bokeh), both in the ``plot`` extra. Nothing here measures.

- ``slides``: ``memory_timeline``, ``memory_stack``, ``tradeoff``, ``scaling``,
  ``measured_vs_predicted``, ``activation_breakdown``, ``remat_frontier``, ``memory_wall``, ``loss_curves``, ``show``;
- ``labels``: ``place_labels``, which keeps the slides' labels from overlapping;
- ``html``: ``memory_html``, the step's memory as one self-contained page.
"""
from .html import memory_html
from .labels import place_labels
from .slides import (activation_breakdown, loss_curves, measured_vs_predicted, memory_stack, memory_timeline,
                     memory_wall, remat_frontier, scaling, show, tradeoff)

__all__ = ["activation_breakdown", "loss_curves", "measured_vs_predicted", "memory_html", "memory_stack", "memory_timeline", "memory_wall",
           "place_labels", "remat_frontier", "scaling", "show", "tradeoff"]
