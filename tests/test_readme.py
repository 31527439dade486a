"""The README's Python examples run as written, and print what their comments say."""
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_blocks_run_and_print_the_figures_they_quote(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks
    exec(compile("\n".join(blocks), str(README), "exec"), {})
    out = capsys.readouterr().out
    assert "memory allocated: 98 MB" in out
    assert "(1000, 1000) [131, 98, 65, 8]" in out
    assert out.rstrip().endswith("True")  # flash equals naive
