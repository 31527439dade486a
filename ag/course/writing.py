"""Writing the grader's files (results.json, the gradebook): whole or not at all, never through a link.

The text goes to a new temporary file beside the target, which is then renamed over it. A rename
replaces a symbolic link instead of writing where it points, so a link planted where the results
go (say, inside a student's folder) cannot redirect them; it is refused with a clear error.
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


class UnsafeTarget(OSError):
    """The place a result file should go is a link or not a regular file: nothing is written."""


def check_target(path: Path | str) -> Path:
    """``path``, if a result file may be written there: absent, or a regular file (not a link)."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeTarget(f"{path} is a symbolic link (to {os.readlink(path)}): refusing to write results "
                           "through it; remove it or choose another path")
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeTarget(f"{path} exists and is not a regular file: refusing to write results there")
    return path


def write_new(path: Path | str, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (a temporary file renamed into place), mode 0644."""
    path = check_target(path)
    # O_EXCL: a fresh file of ours; its name clipped, so that any name that fits fits its temporary file too
    fd, temp = tempfile.mkstemp(prefix=f".{path.name[:40]}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
    return path
