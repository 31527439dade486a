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
    assert "\nTrue\n" in out  # flash equals naive
    assert "3735552 3735552\n1114112 1114112\n65536 65536\n0.7" in out
