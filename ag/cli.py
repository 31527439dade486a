"""The ``ag`` command line: ``ag demo memory`` and, as later parts land, more."""
from __future__ import annotations

import argparse
import sys

DEMOS = {
    "memory": "array sizes, tracemalloc, lazy and discarded grads (the lecture's tables)",
    "remat": "every checkpoint strategy on a 10-layer chain: peak MB, matmuls by phase, plots",
    "attention": "peak memory of naive and flash attention as N grows, with a log-log plot",
}


def _demo(args: argparse.Namespace) -> int:
    from . import demo
    if args.name == "memory":
        demo.memory()
    elif args.name == "remat":
        demo.remat_demo(args.out)
    elif args.name == "attention":
        demo.attention_demo(args.out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ag", description="ag: a NumPy autograd engine that teaches memory and IO in deep learning")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    demo = commands.add_parser("demo", help="run a lecture demo and print its measured tables",
                               description="Run a lecture demo: " + "; ".join(
                                   f"{k}: {v}" for k, v in DEMOS.items()))
    demo.add_argument("name", choices=sorted(DEMOS), help="which demo")
    demo.add_argument("--out", default="ag-plots", help="folder for the plots (default: ag-plots)")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
