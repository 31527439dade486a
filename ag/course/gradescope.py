"""Gradescope's autograder bundle."""
from __future__ import annotations

import zipfile
from pathlib import Path

from .exercises import REPO

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once when it builds the autograder image.
set -euo pipefail
apt-get update -qq && apt-get install -y -qq python3 python3-pip > /dev/null
python3 -m pip install --quiet /autograder/source/ag-src pytest pytest-timeout
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission; the student's files are in /autograder/submission.
set -uo pipefail
mkdir -p /autograder/results
cd /autograder/source
python3 -m ag grade /autograder/submission --tests /autograder/source/tests/grading \\
    --json /autograder/results/results.json
"""


def autograder_bundle(path: Path | str, *, root: Path | str = REPO) -> Path:
    """Write Gradescope's autograder zip: setup.sh, run_autograder, ag's source and the graded tests."""
    root, path = Path(root), Path(path)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name, text in (("setup.sh", SETUP_SH), ("run_autograder", RUN_AUTOGRADER)):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16
            bundle.writestr(info, text)
        for file in sorted((root / "ag").rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts:
                bundle.write(file, Path("ag-src") / file.relative_to(root))
        for extra in ("pyproject.toml", "README.md"):
            bundle.write(root / extra, Path("ag-src") / extra)
        for file in sorted((root / "tests" / "grading").rglob("*.py")):
            bundle.write(file, file.relative_to(root))
    return path
