"""Graded tests run under the judge (`ag grade`, or `python -m ag.course.judge`), never as plain
pytest: each test's check runs in the judge and asks the `worker` fixture for data that a probe
(a function marked `@probe` in a public test file) collects in a sandboxed worker from the
student's code. The judge's plugin provides `worker` and reads `points(n)` and `hidden`; plain
pytest, which has no worker to ask, skips them saying how to run them."""
from pathlib import Path

import pytest

JUDGE = "ag.course.judge"
HOW = ("graded tests run under the judge, not plain pytest: `ag grade solutions --tests tests/grading` "
       "gives full marks, `ag grade exercises --tests tests/grading` none")


def pytest_collection_modifyitems(config, items) -> None:
    if config.pluginmanager.has_plugin(JUDGE):
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.skip(reason=HOW))
