"""Plain-text tables, as the demos, the notebooks and the lecture notes print them."""
from __future__ import annotations

from typing import Iterable, Sequence


def format_table(header: Sequence, rows: Iterable[Sequence], *, left: int = 0) -> str:
    """Rows under a header and a rule of dashes, each column padded to its widest cell:
    right-aligned (numbers), except the first ``left`` columns, left-aligned (names)."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    rule = ["-" * w for w in widths]
    return "\n".join(_line(row, widths, left) for row in [cells[0], rule, *cells[1:]])


def table(header: Sequence, rows: Iterable[Sequence], *, left: int = 0) -> None:
    """Print ``format_table(header, rows, left=left)``."""
    print(format_table(header, rows, left=left))


def _line(cells: list[str], widths: list[int], left: int) -> str:
    return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
