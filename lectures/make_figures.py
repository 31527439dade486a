"""Regenerate the figures the lecture notes show, from the demos' own measurements.

    python lectures/make_figures.py            # every figure (about 6 minutes: the MILP sweep is 5)
    python lectures/make_figures.py --skip-graph
    python lectures/make_figures.py --only lazy_grads_stack.png

Each demo draws its plots into a scratch folder exactly as ``ag demo NAME --out DIR`` does; this
script then stores them in ``lectures/figures/`` as palette PNGs (64 colours, no dithering) so the
repository stays small. Needs the ``plot`` extra.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile

FIGURES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "figures")
COLOURS = 64

# figure -> (the demo that draws it, the lecture that shows it)
FIGURES = {
    "lazy_grads_stack.png": ("memory", "02-lazy-and-discarded-grads.md"),
    "remat_timeline.png": ("remat", "03-rematerialization.md"),
    "remat_stack.png": ("remat", "03-rematerialization.md"),
    "remat_tradeoff.png": ("remat", "03-rematerialization.md"),
    "attention_scaling.png": ("attention", "04-io-and-flash-attention.md"),
    "transformer_memory.png": ("transformer", "05-transformer-activation-memory.md"),
    "remat_frontier.png": ("remat --graph", "06-remat-on-graphs.md"),
    "memory_wall.png": ("wall", "07-the-whole-wall.md"),
    "train_loss.png": ("train", "07-the-whole-wall.md"),
}


def run_demo(name: str, out_dir: str) -> None:
    """Run one demo with its plots going to ``out_dir``; its printed tables are dropped."""
    from ag import demo
    runs = {
        "memory": lambda: demo.memory(out_dir),
        "remat": lambda: demo.remat_demo(out_dir),
        "remat --graph": lambda: demo.remat_graph_demo(out_dir),
        "attention": lambda: demo.attention_demo(out_dir),
        "transformer": lambda: demo.transformer_demo(out_dir),
        "wall": lambda: demo.wall_demo(out_dir),
        "train": lambda: demo.train_demo(out_dir),
    }
    with contextlib.redirect_stdout(io.StringIO()):
        runs[name]()


def store(source: str, target: str) -> int:
    """Write ``source`` to ``target`` as a palette PNG; returns its size in bytes."""
    from PIL import Image
    with Image.open(source) as image:
        image.convert("RGB").quantize(colors=COLOURS, dither=Image.Dither.NONE).save(target, optimize=True)
    return os.path.getsize(target)


def make(names: list[str], figures_dir: str = FIGURES_DIR) -> dict[str, int]:
    """Regenerate ``names`` into ``figures_dir``; returns each figure's size in bytes."""
    unknown = sorted(set(names) - set(FIGURES))
    if unknown:
        raise ValueError(f"make_figures: no figure named {unknown}; the figures are {sorted(FIGURES)}")
    os.makedirs(figures_dir, exist_ok=True)
    sizes = {}
    with tempfile.TemporaryDirectory() as scratch:
        for demo_name in dict.fromkeys(FIGURES[name][0] for name in names):
            run_demo(demo_name, scratch)
        for name in names:
            sizes[name] = store(os.path.join(scratch, name), os.path.join(figures_dir, name))
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="just this figure (repeatable)")
    parser.add_argument("--skip-graph", action="store_true",
                        help="leave out remat_frontier.png (its MILP sweep takes about 5 minutes)")
    parser.add_argument("--out", default=FIGURES_DIR, help="folder to write into (default: lectures/figures)")
    args = parser.parse_args(argv)
    names = args.only or [n for n in FIGURES if not (args.skip_graph and FIGURES[n][0] == "remat --graph")]
    for name, size in make(names, args.out).items():
        print(f"{os.path.join(args.out, name)}: {size:,} B (shown in lectures/{FIGURES[name][1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
