"""The README's and docs/api.md's Python examples run as written, and print what their comments say."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def python_blocks(page: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (REPO / page).read_text(), re.S)
    assert blocks, f"{page} has no Python example"
    return "\n".join(blocks)


def test_readme_tour_runs_and_prints_the_figures_it_quotes(capsys):
    exec(compile(python_blocks("README.md"), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "memory allocated: 32 MB" in out
    assert "(1000, 1000) [65, 32, 32, 8]" in out


def test_api_page_examples_run_after_the_tour_and_print_the_figures_they_quote(capsys):
    namespace = {}
    exec(compile(python_blocks("README.md"), "README.md", "exec"), namespace)
    exec(compile(python_blocks("docs/api.md"), "docs/api.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "\nTrue\n" in out  # flash equals naive
    assert "3735552 3735552\n1114112 1114112\n65536 65536\n0.7" in out
    assert "32768.0\nTrue\n" in out  # the training section: a skipped float16 step, the wall to the byte
