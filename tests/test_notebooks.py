"""Every lecture notebook runs top to bottom, headless, and draws its plots.

The notebooks are Jupytext percent files (``notebooks/*.py``): each is converted in memory and
executed in a fresh ``python3`` kernel with nbclient, in a temporary directory, so nothing is
written next to the sources. CI sets AG_REQUIRE_NOTEBOOKS=1 so that a missing jupytext,
nbclient or ipykernel fails the run instead of skipping it.
"""
import importlib.util
import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.py"))
CELL_TIMEOUT_S = 240
# The notebooks' matrices are small: on a busy runner, BLAS threads only wait on each other
# (a 10x slowdown on 2 shared cores). One thread each, unless the caller chose otherwise.
KERNEL_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **os.environ}

_missing = [m for m in ("jupytext", "nbclient", "ipykernel") if importlib.util.find_spec(m) is None]
if _missing and os.environ.get("AG_REQUIRE_NOTEBOOKS") is None:
    pytest.skip(f"running the notebooks needs {', '.join(_missing)}: pip install -e '.[notebooks]' "
                "(CI sets AG_REQUIRE_NOTEBOOKS=1 to make this a failure)", allow_module_level=True)


def test_the_lecture_notebooks_are_there():
    assert NOTEBOOKS, "no notebooks/*.py found"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom_and_draws_its_plots(path, tmp_path):
    import jupytext
    import nbclient

    notebook = jupytext.read(path)
    assert notebook.metadata.get("kernelspec", {}).get("name") == "python3", \
        f"{path.name}: the jupytext header must name the python3 kernel"
    # raises CellExecutionError, with the cell and its traceback, if any cell fails
    nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(tmp_path)}}).execute(env=KERNEL_ENV)
    images = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.outputs if "image/png" in output.get("data", {})]
    assert images, f"{path.name} ran but displayed no plot"
