"""The intake station: a student's upload, copied once into a fresh folder, following no link.

Everything downstream (the judge, its workers, Gradescope's run) reads only this copy, never the
upload. The copy holds regular files named as exercises (``ex3_online_softmax.py``), taken from
the upload's top or from its one enclosing folder (a zipped folder), and the exercises written
from its notebooks (``extract``); a .py file wins over a notebook, an earlier notebook (by name)
over a later one. Each file is opened by name inside an open folder with ``O_NOFOLLOW |
O_NONBLOCK`` and checked with ``fstat``: a link, a FIFO, a device, a socket or a folder is
skipped with a note, never read. Bytes are capped as they are read (a file's size is not
trusted), over all files too, and every read has a deadline.

As root, a hard link inside the upload is a regular file that can be anything on the same file
system (/etc/shadow, a classmate's work, a hidden test): a file with other links, or not owned by
the upload's owner, is refused too (both names of a hard link are, so one between two uploads, which
only someone who can write the class folder can make, costs both). Notes are for the student: they name files by their name in
the upload, escaped, never by a path on the grading machine.
"""
from __future__ import annotations

import errno
import os
import select
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from .exercises import EXERCISES
from .extract import MAX_CODE, NotebookError, code_cells, from_code

EXERCISE_FILES = frozenset(e.filename for e in EXERCISES)
MAX_FILE = 2 * 2**20  # an exercise file
MAX_NOTEBOOK = 16 * 2**20  # notebooks carry their outputs' images
MAX_TOTAL = 32 * 2**20  # all files of one upload together
READ_SECONDS = 5.0  # each file
TAKE_SECONDS = 30.0  # the whole upload
MAX_ENTRIES = 10_000  # names looked at in one folder
MAX_NOTES = 20
CHUNK = 1 << 16
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
LINK = "a link (links are not followed: upload the file itself)"
NOT_A_FILE = "not a regular file (a folder, a FIFO, a device or a socket)"


@dataclass
class Intake:
    """The fresh copy (``folder``), the exercise files written into it, and what was skipped and why."""

    folder: Path
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Refused(Exception):
    """A file of the upload that is not taken; the message says what it is ("a link ...")."""


class TooLarge(Refused):
    """A file with more bytes than it may have."""


def take(upload: Path | str, dest: Path | str) -> Intake:
    """Copy the student's ``upload`` into ``dest``, a folder this makes (it must not exist yet).

    ``upload`` itself is the TA's argument and is opened as named; nothing below it is followed.
    """
    dest = Path(dest)
    dest.mkdir(mode=0o700)
    top = os.open(upload, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        notes, later = [], []  # the exercise files' notes first: a clipped list still shows them
        owner = os.fstat(top).st_uid
        root = _open_root(top, later)
        try:
            found = _read_all(root, owner, notes)
        finally:
            os.close(root)
    finally:
        os.close(top)
    files = _write(dest, found, notes)
    notes += later
    if not files and not notes:
        notes.append("no exercise file (exN_name.py) or notebook (.ipynb) was found in your upload")
    return Intake(dest, files, _clipped(notes))


def locate(folder: Path | str) -> str | None:
    """Where in ``folder`` one student's files are: ``""`` at its top, a subfolder's name for an
    upload's one enclosing folder, None for a class (several subfolders hold them, or some
    subfolders and none does). A folder holding nothing at all is one (empty) upload."""
    top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _locate(top)
    finally:
        os.close(top)


def _locate(top: int) -> str | None:
    entries = _entries(top)
    if any(_wanted(e.name) for e in entries):
        return ""
    folders = [e.name for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith((".", "__"))]
    holding = [name for name in folders if _holds_files(top, name)]
    if len(holding) == 1:
        return holding[0]
    return "" if not folders else None


def _holds_files(top: int, name: str) -> bool:
    try:
        fd = os.open(name, FOLDER_FLAGS, dir_fd=top)
    except OSError:
        return False
    try:
        return any(_wanted(e.name) for e in _entries(fd))
    finally:
        os.close(fd)


def _open_root(top: int, notes: list[str]) -> int:
    """The folder to take files from: the top, or the one enclosing folder (opened without following it)."""
    where = _locate(top)
    links = [e.name for e in _entries(top) if e.is_symlink() and not _wanted(e.name)]
    notes += [f"{shown(name)}: not graded, {LINK}" for name in links]
    if where is None:
        notes.append("your upload holds several folders: put your files at its top, or in one folder")
    if not where:
        return os.dup(top)
    return os.open(where, FOLDER_FLAGS, dir_fd=top)


def _read_all(root: int, owner: int, notes: list[str]) -> dict[str, bytes]:
    """Every wanted file of the folder ``root``, by name, as bytes; the others noted."""
    found: dict[str, bytes] = {}
    budget = MAX_TOTAL
    deadline = time.monotonic() + TAKE_SECONDS
    for entry in sorted(_entries(root), key=lambda e: (e.name not in EXERCISE_FILES, e.name)):
        if not _wanted(entry.name):
            continue
        cap = MAX_FILE if entry.name in EXERCISE_FILES else MAX_NOTEBOOK
        try:
            data = _read(root, entry, owner, min(cap, budget), min(deadline, time.monotonic() + READ_SECONDS))
        except TooLarge as why:
            reason = str(why) if budget >= cap else f"over the {_mb(MAX_TOTAL)} one upload may hold in all"
            notes.append(f"{shown(entry.name)}: not graded, {reason}")
            continue
        except Refused as why:
            notes.append(f"{shown(entry.name)}: not graded, {why}")
            continue
        budget -= len(data)
        found[entry.name] = data
    return found


def _read(root: int, entry: os.DirEntry, owner: int, cap: int, deadline: float) -> bytes:
    """The file's bytes, read through a descriptor that followed no link; Refused if it is not a
    regular file of the upload's owner with no other link, larger than ``cap``, or slow."""
    if entry.is_symlink():
        raise Refused(LINK)
    if not entry.is_file(follow_symlinks=False):
        raise Refused(NOT_A_FILE)
    try:
        fd = os.open(entry.name, FILE_FLAGS, dir_fd=root)
    except OSError as error:  # ELOOP: it became a link since it was listed
        why = LINK if error.errno == errno.ELOOP else f"it could not be opened ({os.strerror(error.errno)})"
        raise Refused(why) from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise Refused(NOT_A_FILE)
        if status.st_nlink > 1:
            raise Refused("a file with other hard links (upload a plain copy of it)")
        if status.st_uid != owner:
            raise Refused("a file not owned by the upload's owner")
        return _read_capped(fd, cap, deadline)
    finally:
        os.close(fd)


def _read_capped(fd: int, cap: int, deadline: float) -> bytes:
    """At most ``cap`` bytes, or Refused: reads ``cap + 1`` at most, and never past ``deadline``."""
    chunks, size = [], 0
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    while size <= cap:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Refused(f"it could not be read within {READ_SECONDS:g} s")
        if not poll.poll(left * 1000):
            continue
        try:
            chunk = os.read(fd, min(CHUNK, cap + 1 - size))
        except BlockingIOError:
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    raise TooLarge(f"larger than {_mb(cap)}")


def _write(dest: Path, found: dict[str, bytes], notes: list[str]) -> list[str]:
    """Write the exercise files, then each notebook's exercises that no file gave yet."""
    files = {name: data for name, data in found.items() if name in EXERCISE_FILES}
    code_left = MAX_CODE  # for all notebooks together: parsing is the costliest step of the intake
    for name, data in found.items():
        if name in EXERCISE_FILES:
            continue
        try:
            cells = code_cells(shown(name), data, code_left)
            extracted = from_code(shown(name), cells)
        except NotebookError as error:
            notes.append(f"{error}; its exercises are not graded")
            continue
        code_left -= sum(map(len, cells))
        if not extracted:
            notes.append(f"{shown(name)}: nothing taken, it does not define all the functions of any exercise")
        for filename, source in extracted.items():  # each under MAX_FILE: a notebook holds at most MAX_CODE
            files.setdefault(filename, source.encode())
    for filename, data in files.items():
        (dest / filename).write_bytes(data)
    return sorted(files)


def _entries(fd: int) -> list[os.DirEntry]:
    """The first MAX_ENTRIES entries of the open folder ``fd``."""
    entries = []
    with os.scandir(fd) as scan:
        for entry in scan:
            entries.append(entry)
            if len(entries) >= MAX_ENTRIES:
                break
    return entries


def _wanted(name: str) -> bool:
    return name in EXERCISE_FILES or name.endswith(".ipynb")


def shown(name: str, limit: int = 80) -> str:
    """A student's file name as a note may show it: control and invisible characters escaped, clipped."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)
    return text if len(text) <= limit else text[:limit] + "..."


def _mb(size: int) -> str:
    return f"{size / 2**20:g} MB"


def _clipped(notes: list[str]) -> list[str]:
    if len(notes) <= MAX_NOTES:
        return notes
    return notes[:MAX_NOTES] + [f"... and {len(notes) - MAX_NOTES} more notes like these"]
