"""The figures the lecture notes show are the demos' own plots, stored and regenerable."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LECTURES = ROOT / "lectures"
FIGURES_DIR = LECTURES / "figures"


def _make_figures():
    spec = importlib.util.spec_from_file_location("make_figures", LECTURES / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_figures = _make_figures()


def _shown() -> dict[str, set[str]]:
    """Each figure a note embeds, and the notes that embed it."""
    shown: dict[str, set[str]] = {}
    for note in LECTURES.glob("0*.md"):
        for name in re.findall(r"!\[[^\]]+\]\(figures/([^)]+)\)", note.read_text()):
            shown.setdefault(name, set()).add(note.name)
    return shown


def test_every_figure_the_script_makes_is_shown_by_the_note_it_names():
    shown = _shown()
    for name, (_, note) in make_figures.FIGURES.items():
        assert note in shown.get(name, set()), f"{note} does not show figures/{name}"


def test_every_figure_a_note_shows_is_one_the_script_makes():
    assert set(_shown()) <= set(make_figures.FIGURES), set(_shown()) - set(make_figures.FIGURES)


def test_the_stored_figures_are_exactly_the_scripts():
    assert {p.name for p in FIGURES_DIR.iterdir()} == set(make_figures.FIGURES)


@pytest.mark.parametrize("name", sorted(make_figures.FIGURES))
def test_a_stored_figure_is_a_small_slide_shaped_palette_png(name):
    from PIL import Image
    path = FIGURES_DIR / name
    assert path.stat().st_size < 100_000, f"{name}: {path.stat().st_size:,} B"
    with Image.open(path) as image:
        assert image.format == "PNG" and image.mode == "P", (image.format, image.mode)
        width, height = image.size
    assert width >= 1200 and 1.6 <= width / height <= 2.0, image.size


@pytest.mark.parametrize("name", sorted(make_figures.FIGURES))
def test_the_demo_the_script_names_draws_the_figure(name):
    demo_source = (ROOT / "ag" / "demo.py").read_text()
    assert re.search(rf'_save_plot\(\s*out_dir,\s*"{re.escape(name)}"', demo_source), name


def test_a_regenerated_figure_matches_the_stored_one_in_size(tmp_path):
    from PIL import Image
    name = "lazy_grads_stack.png"
    make_figures.make([name], str(tmp_path))
    with Image.open(tmp_path / name) as fresh, Image.open(FIGURES_DIR / name) as stored:
        assert fresh.size == stored.size and fresh.mode == stored.mode


def test_an_unknown_figure_is_refused_with_the_names_there_are():
    with pytest.raises(ValueError, match="remat_timeline.png"):
        make_figures.make(["nope.png"], "/nonexistent")
