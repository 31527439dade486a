"""Text from a submission made safe to show: on a terminal, and in a spreadsheet's cell.

A terminal obeys control characters (ESC clears the screen, CR overwrites a line, bidi overrides
reorder it), so each one is shown as its escape (``\\x1b``, ``\\u202e``). A spreadsheet reads a
cell that starts with ``= + - @``, TAB or CR as a formula, so such a cell gets a ``'`` first
(OWASP's CSV injection rule, which spreadsheets show as plain text). A check's Markdown message
reads as plain text on a terminal or in a notebook's traceback (``plain_text``).
"""
from __future__ import annotations

import re

# C0 and C1 controls, DEL, the Unicode marks that reorder or hide text (bidi, zero width), and lone
# surrogates (a file name's undecodable bytes): no UTF-8 stream or file can write one, so it would stop the writer
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]")
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


def plain_text(markdown: str) -> str:
    """A check's Markdown message as plain text: code fences become indented lines, a table one line
    per row ("at index (0, 0): expected 1, got 2"), code spans and bold marks go."""
    out, fence, header = [], None, None
    for line in markdown.split("\n"):
        opened = re.match(r"^(`{3,})", line)
        if fence is not None:
            if line.startswith(fence) and not line.strip("`"):
                fence = None
            else:
                out.append("    " + line)
        elif opened:
            fence = opened.group(1)
        elif line.startswith("|") and line.endswith("|"):
            cells = [_inline(c.strip()) for c in line.strip("|").split("|")]
            if header is None:
                header = cells
            elif not all(set(c) <= set("-: ") for c in cells):
                first, *rest = zip(header, cells)
                out.append(f"{first[0]} {first[1]}: " + ", ".join(f"{h} {c}" for h, c in rest))
        else:
            header = None
            out.append(_inline(line))
    return "\n".join(out).strip()


def _inline(text: str) -> str:
    """``text`` without Markdown's inline marks: code spans keep their content, bold and escapes go."""
    text = re.sub(r"(`+) ?(.*?) ?\1", lambda m: m.group(2), text)
    return re.sub(r"\\([\\`*_{}\[\]()#+\-.!|])", r"\1", text.replace("**", ""))
