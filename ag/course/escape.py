"""Text from a submission made safe to show: on a terminal, and in a spreadsheet's cell.

A terminal obeys control characters (ESC clears the screen, CR overwrites a line, bidi overrides
reorder it), so each one is shown as its escape (``\\x1b``, ``\\u202e``). A spreadsheet reads a
cell that starts with ``= + - @``, TAB or CR as a formula, so such a cell gets a ``'`` first
(OWASP's CSV injection rule, which spreadsheets show as plain text).
"""
from __future__ import annotations

import re

# C0 and C1 controls, DEL, and the Unicode marks that reorder or hide text (bidi, zero width)
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def for_terminal(text: object, *, lines: bool = False) -> str:
    """``text`` with every control character shown as its escape; ``lines=True`` keeps newlines
    (and tabs), for a message of several lines."""
    kept = "\n\t" if lines else ""
    return CONTROL.sub(lambda m: m.group() if m.group() in kept else _escaped(m.group()), str(text))


def for_csv(text: object) -> str:
    """A CSV cell a spreadsheet shows as text: controls escaped, a would-be formula behind a ``'``."""
    cell = str(text)
    if cell.startswith(FORMULA_START):
        cell = "'" + cell
    return for_terminal(cell)
