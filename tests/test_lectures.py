"""Every Python snippet in the lecture notes runs, in order, against the current ag."""
import re
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
LECTURES = sorted((Path(__file__).resolve().parent.parent / "lectures").glob("0*.md"))


@pytest.mark.parametrize("note", LECTURES, ids=lambda p: p.stem)
def test_the_snippets_of_a_note_run(note, tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", note.read_text(), re.S)
    monkeypatch.chdir(tmp_path)  # snippets that write plots write them here
    namespace = {}
    for number, block in enumerate(blocks, 1):
        try:
            exec(compile(block, f"{note.name} snippet {number}", "exec"), namespace)
        except Exception as error:  # noqa: BLE001 - report which snippet broke
            pytest.fail(f"{note.name}, snippet {number} raised {type(error).__name__}: {error}")
