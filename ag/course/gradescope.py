"""Gradescope's autograder bundle."""
from __future__ import annotations

import zipfile
from pathlib import Path

from .exercises import REPO

# Gradescope builds the image from its Ubuntu base (22.04 or 24.04; a Debian 12 root behaves the same): it
# unzips the bundle into /autograder/source, copies run_autograder to /autograder/run_autograder and runs
# setup.sh as root. Those systems mark their Python "externally managed" (PEP 668), so a bare `pip install`
# stops; ag and pytest go into a virtual environment of their own instead, at /autograder/venv: outside
# /autograder/source, which the grader hides from the student's code.
VENV = "/autograder/venv"

SETUP_SH = f"""#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# python3-venv: venv and its pip; ca-certificates: pip's HTTPS. The grader sandboxes each test as root
# with unshare (util-linux), mount (mount) and useradd (passwd): minimal images have them, make sure.
apt-get install -y -qq --no-install-recommends \\
    python3 python3-venv ca-certificates util-linux mount passwd > /dev/null
rm -rf {VENV}
python3 -m venv {VENV}
{VENV}/bin/python -m pip install --quiet --disable-pip-version-check "/autograder/source/ag-src[grade]"
{VENV}/bin/python -c "import ag, pytest"
"""

RUN_AUTOGRADER = f"""#!/usr/bin/env bash
# Gradescope runs this for every submission; the student's files are in /autograder/submission, which
# ag grade copies through its intake (regular files only, no link followed) before anything reads them.
set -uo pipefail
mkdir -p /autograder/results
cd /autograder/source  # the grader runs each test from here (tests/grading/..)
{VENV}/bin/python -m ag grade /autograder/submission --tests /autograder/source/tests/grading \\
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
