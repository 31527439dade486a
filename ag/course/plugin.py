"""A pytest plugin for graded tests: the ``points(n)`` and ``hidden`` markers, and the
collection dump that ``ag grade`` reads (written when AG_GRADING_COLLECT names a file)."""
from __future__ import annotations

import json
import os


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "points(n): what the test is worth in a graded run")
    config.addinivalue_line("markers", "hidden: a test students do not see before grades are published")


def pytest_collection_modifyitems(session, config, items) -> None:
    target = os.environ.get("AG_GRADING_COLLECT")
    if not target:
        return
    collected = []
    for item in items:
        points = item.get_closest_marker("points")
        if points is None:
            raise ValueError(f"graded test {item.nodeid} has no points(n) marker")
        collected.append({
            "nodeid": item.nodeid,
            "name": item.nodeid.split("/")[-1].replace(".py::", ": "),
            "points": points.args[0],
            "visibility": "after_published" if item.get_closest_marker("hidden") else "visible",
        })
    with open(target, "w") as out:
        json.dump(collected, out)
