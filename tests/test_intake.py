"""The intake station: what it copies out of a student's upload, and everything it refuses to follow or read."""
import json
import os
import shutil
import time
import tracemalloc

import pytest

from ag import course
from ag.course import extract, intake

REPO = course.REPO
SOLUTIONS = REPO / "solutions"
EX = {e.number: e for e in course.EXERCISES}
IS_ROOT = os.geteuid() == 0


def upload(tmp_path, name="up"):
    """A student's upload: the solutions' exercise files at its top."""
    folder = tmp_path / name
    folder.mkdir(parents=True)
    for e in course.EXERCISES:
        shutil.copy(SOLUTIONS / e.filename, folder)
    return folder


def secret(tmp_path, text="SECRET-MARKER"):
    path = tmp_path / "outside" / "secret.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"# {text}\n")
    return path


def notebook(path, *sources, **extra):
    cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": s}
             for s in sources]
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells, **extra}))
    return path


def ex3_source():
    return (SOLUTIONS / EX[3].filename).read_text().split('if __name__ == "__main__":')[0]


def note_about(taken, name):
    return [n for n in taken.notes if n.startswith(name)]


def test_only_regular_files_named_as_exercises_or_notebooks_are_copied(tmp_path):
    up = upload(tmp_path)
    (up / "README.md").write_text("hello")
    (up / "helpers.py").write_text("x = 1")
    taken = intake.take(up, tmp_path / "copy")
    assert sorted(p.name for p in taken.folder.iterdir()) == sorted(e.filename for e in course.EXERCISES)
    assert taken.files == sorted(e.filename for e in course.EXERCISES) and taken.notes == []
    for e in course.EXERCISES:
        assert (taken.folder / e.filename).read_bytes() == (SOLUTIONS / e.filename).read_bytes()


def test_the_copy_goes_into_a_fresh_folder_only(tmp_path):
    (tmp_path / "copy").mkdir()
    with pytest.raises(FileExistsError):
        intake.take(upload(tmp_path), tmp_path / "copy")


@pytest.mark.parametrize("target", ["secret", "/proc/self/environ", "/proc/self/fd/0", "/etc/shadow"])
def test_a_symlinked_exercise_file_is_not_followed(tmp_path, target):
    up = upload(tmp_path)
    link = up / EX[3].filename
    link.unlink()
    link.symlink_to(secret(tmp_path) if target == "secret" else target)
    taken = intake.take(up, tmp_path / "copy")
    assert not (taken.folder / EX[3].filename).exists()
    assert note_about(taken, EX[3].filename) == [f"{EX[3].filename}: not graded, {intake.LINK}"]
    assert str(tmp_path) not in " ".join(taken.notes) and target not in " ".join(taken.notes)
    assert len(taken.files) == len(course.EXERCISES) - 1


def test_a_fifo_named_as_an_exercise_is_skipped_at_once(tmp_path):
    up = upload(tmp_path)
    (up / EX[4].filename).unlink()
    os.mkfifo(up / EX[4].filename)  # opening it to read would block until a writer came
    started = time.monotonic()
    taken = intake.take(up, tmp_path / "copy")
    assert time.monotonic() - started < 2
    assert note_about(taken, EX[4].filename) == [f"{EX[4].filename}: not graded, {intake.NOT_A_FILE}"]


def test_a_read_that_never_ends_stops_at_its_deadline():
    read_end, write_end = os.pipe()  # a writer that never writes nor closes: what /proc/kmsg does
    os.set_blocking(read_end, False)
    try:
        started = time.monotonic()
        with pytest.raises(intake.Refused, match="could not be read within"):
            intake._read_capped(read_end, 1000, time.monotonic() + 0.3)
        assert time.monotonic() - started < 2
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_hard_link_inside_the_upload_is_refused(tmp_path):
    up = upload(tmp_path)
    (up / EX[5].filename).unlink()
    os.link(secret(tmp_path), up / EX[5].filename)
    taken = intake.take(up, tmp_path / "copy")
    assert not (taken.folder / EX[5].filename).exists()
    assert note_about(taken, EX[5].filename) == [f"{EX[5].filename}: not graded, a file with other hard links "
                                                 "(upload a plain copy of it)"]


@pytest.mark.skipif(not IS_ROOT, reason="giving a file to another user needs root")
def test_a_file_owned_by_someone_else_than_the_uploads_owner_is_refused(tmp_path):
    up = upload(tmp_path)
    os.chown(up / EX[6].filename, 65534, 65534)
    taken = intake.take(up, tmp_path / "copy")
    assert not (taken.folder / EX[6].filename).exists()
    assert note_about(taken, EX[6].filename) == [f"{EX[6].filename}: not graded, a file not owned by the "
                                                 "upload's owner"]


def test_a_file_is_capped_as_it_is_read_whatever_its_size_says(tmp_path):
    up = upload(tmp_path)
    with open(up / EX[1].filename, "wb") as sparse:  # 8 GB by its size, read no further than the cap
        sparse.truncate(8 << 30)
    (up / EX[2].filename).write_bytes(b"#" * intake.MAX_FILE)  # exactly at the cap: taken
    started = time.monotonic()
    taken = intake.take(up, tmp_path / "copy")
    assert time.monotonic() - started < 5
    assert note_about(taken, EX[1].filename) == [f"{EX[1].filename}: not graded, larger than 2 MB"]
    assert (taken.folder / EX[2].filename).stat().st_size == intake.MAX_FILE


def test_the_upload_as_a_whole_is_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(intake, "MAX_TOTAL", 3 << 20)
    up = tmp_path / "up"
    up.mkdir()
    for i in range(4):  # 1 MB each: the fourth is over the upload's 3 MB
        (up / f"nb{i}.ipynb").write_bytes(b" " * (1 << 20))
    taken = intake.take(up, tmp_path / "copy")
    assert note_about(taken, "nb3.ipynb") == ["nb3.ipynb: not graded, over the 3 MB one upload may hold in all"]
    assert all("not valid JSON" in note_about(taken, f"nb{i}.ipynb")[0] for i in range(3))


@pytest.mark.parametrize("kind", ["symlinks", "hard links"])
def test_400_links_to_one_big_notebook_are_refused_fast_in_bounded_memory(tmp_path, kind):
    big = notebook(tmp_path / "big.ipynb", "x = '" + "a" * (2 << 20) + "'\n")
    up = upload(tmp_path)
    for i in range(400):
        link = up / f"copy{i:03}.ipynb"
        link.symlink_to(big) if kind == "symlinks" else os.link(big, link)
    tracemalloc.start()
    started = time.monotonic()
    try:
        taken = intake.take(up, tmp_path / "copy")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 5
    assert peak < 1 << 20, f"the intake held {peak:,} bytes at its peak: it read the links"
    assert len(taken.files) == len(course.EXERCISES)
    assert len(taken.notes) == intake.MAX_NOTES + 1 and taken.notes[-1] == "... and 380 more notes like these"


def test_a_zipped_folder_is_taken_from_its_one_enclosing_folder(tmp_path):
    top = tmp_path / "up"
    upload(top, "homework")
    (top / "__MACOSX").mkdir()  # what macOS's zip adds beside it
    (top / "__MACOSX" / f"._{EX[1].filename}").write_text("resource fork")
    assert intake.locate(top) == "homework"
    taken = intake.take(top, tmp_path / "copy")
    assert taken.files == sorted(e.filename for e in course.EXERCISES) and taken.notes == []


def test_files_at_the_top_win_over_a_subfolder(tmp_path):
    up = upload(tmp_path)
    upload(up, "old")
    assert intake.locate(up) == ""


def test_a_class_folder_is_not_one_upload(tmp_path):
    upload(tmp_path / "class", "alice")
    upload(tmp_path / "class", "bob")
    assert intake.locate(tmp_path / "class") is None
    (tmp_path / "class" / "carol").mkdir()  # a class in which no one has handed in yet is a class too
    assert intake.locate(tmp_path / "class" / "carol") == ""
    for name in ("alice", "bob"):
        shutil.rmtree(tmp_path / "class" / name)
    (tmp_path / "class" / "dave").mkdir()
    assert intake.locate(tmp_path / "class") is None


def test_a_symlinked_enclosing_folder_is_not_followed(tmp_path):
    solutions = upload(tmp_path, "someone-else")
    top = tmp_path / "up"
    top.mkdir()
    (top / "homework").symlink_to(solutions, target_is_directory=True)
    assert intake.locate(top) == ""  # a link is no folder of the upload's
    taken = intake.take(top, tmp_path / "copy")
    assert taken.files == [] and list(taken.folder.iterdir()) == []
    assert taken.notes == [f"homework: not graded, {intake.LINK}"]


def test_an_empty_upload_says_what_was_expected(tmp_path):
    (tmp_path / "up").mkdir()
    taken = intake.take(tmp_path / "up", tmp_path / "copy")
    assert taken.notes == ["no exercise file (exN_name.py) or notebook (.ipynb) was found in your upload"]


def test_each_malformed_notebook_costs_only_its_own_exercises(tmp_path):
    up = upload(tmp_path)
    (up / EX[3].filename).unlink()
    notebook(up / "a_good.ipynb", ex3_source())
    notebook(up / "list_of_numbers.ipynb", [1, 2, 3])
    notebook(up / "cells_not_objects.ipynb").write_text(json.dumps({"nbformat": 4, "cells": ["print(1)"]}))
    (up / "deep.ipynb").write_text("[" * 100_000 + "]" * 100_000)
    (up / "not_json.ipynb").write_text("{'nbformat': 4")
    (up / "nested_code.ipynb").write_text(json.dumps({"nbformat": 4, "cells": [
        {"cell_type": "code", "source": "x = " + "(" * 10_000 + ")" * 10_000}]}))
    (up / "x.ipynb").mkdir()
    taken = intake.take(up, tmp_path / "copy")
    assert taken.files == sorted(e.filename for e in course.EXERCISES)
    assert "merge_softmax_blocks" in (taken.folder / EX[3].filename).read_text()
    expected = {"list_of_numbers.ipynb": "code cell 1's source is not text",
                "cells_not_objects.ipynb": "cell 1 is not a cell (a JSON object)",
                "deep.ipynb": "is not a notebook: its JSON is nested too deeply",
                "not_json.ipynb": "is not a notebook: not valid JSON",
                "nested_code.ipynb": "the code cell starting",
                "x.ipynb": intake.NOT_A_FILE}
    for name, says in expected.items():
        notes = note_about(taken, name)
        assert len(notes) == 1 and says in notes[0], (name, taken.notes)
    assert len(taken.notes) == len(expected)
    assert all("Traceback" not in n and str(tmp_path) not in n for n in taken.notes)


def test_a_py_file_wins_over_a_notebook_and_the_first_notebook_over_the_next(tmp_path):
    up = tmp_path / "up"
    up.mkdir()
    notebook(up / "a.ipynb", "def merge_softmax_blocks(a, b):\n    return 'a'\n")
    notebook(up / "b.ipynb", "def merge_softmax_blocks(a, b):\n    return 'b'\n")
    taken = intake.take(up, tmp_path / "copy")
    assert "return 'a'" in (taken.folder / EX[3].filename).read_text()
    (up / EX[3].filename).write_text("def merge_softmax_blocks(a, b):\n    return 'py'\n")
    taken = intake.take(up, tmp_path / "copy2")
    assert "return 'py'" in (taken.folder / EX[3].filename).read_text()


def test_a_file_name_with_terminal_escapes_is_shown_escaped(tmp_path):
    up = tmp_path / "up"
    up.mkdir()
    (up / "\x1b[2J\x1b[Hscore 68 of 68\u202e.ipynb").write_text("not json")
    taken = intake.take(up, tmp_path / "copy")
    assert len(taken.notes) == 1 and taken.notes[0].startswith("\\x1b[2J\\x1b[Hscore 68 of 68\\u202e.ipynb")
    assert all(c.isprintable() for c in taken.notes[0])


def test_a_notebook_without_any_exercise_says_so(tmp_path):
    up = tmp_path / "up"
    up.mkdir()
    notebook(up / "scratch.ipynb", "def helper():\n    return 1\n")
    taken = intake.take(up, tmp_path / "copy")
    assert taken.notes == ["scratch.ipynb: nothing taken, it does not define all the functions of any exercise"]


def test_a_missing_exercise_file_is_named_without_the_sandbox_path(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        course.load_submission(tmp_path, EX[5])
    assert str(error.value) == f"no {EX[5].filename} in your submission"


def test_extract_reads_a_source_given_as_a_list_of_lines():
    files = extract.exercise_files("nb.ipynb", json.dumps({"nbformat": 4, "cells": [
        {"cell_type": "code", "source": ["def merge_softmax_blocks(a, b):\n", "    return a\n"]}]}).encode())
    assert list(files) == [EX[3].filename] and "    return a\n" in files[EX[3].filename]


def test_a_notebook_with_more_code_than_the_cap_gives_no_file_and_says_so(tmp_path):
    up = tmp_path / "up"
    up.mkdir()
    padding = "padding = '" + "x" * extract.MAX_CODE + "'\n"
    notebook(up / "huge.ipynb", "def merge_softmax_blocks(a, b):\n    return a\n", padding)
    taken = intake.take(up, tmp_path / "copy")
    assert taken.files == [] and taken.notes == ["huge.ipynb: not read, an upload's notebooks may hold 256 KB of code "
                                                 "in all, the most the grader parses (put data in files, not in "
                                                 "cells); its exercises are not graded"]
    assert 4 * extract.MAX_CODE < intake.MAX_FILE  # so a notebook's exercise file is never over the file cap


def test_a_notebook_named_to_close_a_docstring_adds_no_code_to_its_exercise_file(tmp_path):
    up = tmp_path / "up"
    up.mkdir()
    name = 'x"""\nimport os; os.system("touch pwned")\n""".ipynb'
    notebook(up / name, "def merge_softmax_blocks(a, b):\n    return 'a'\n")
    taken = intake.take(up, tmp_path / "copy")
    source = (taken.folder / EX[3].filename).read_text()
    module = compile(source, EX[3].filename, "exec")
    assert "system" not in module.co_names
