"""What the new user's walk (issue 42) left open: counts in plain singular and plural, Attribution's colour bars beside
their maps, and a cold server's sidebar that lists the pages' titles, not their file names. (Heading == sidebar label
for every page: tests/test_navigation.py::test_every_page_opens_with_its_title_and_its_question.)"""
import ast
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitviz.explainers.base import Map
from vitviz.figures.attribution_figures import maps_figure

ROOT = Path(__file__).resolve().parent.parent


def test_counts_are_singular_for_one_and_plural_otherwise():
    from ui.words import counted, part_of

    assert counted(1, "image") == "1 image" and counted(0, "image") == "0 images" and counted(2, "image") == "2 images"
    assert counted(3, "patch") == "3 patches" and counted(1, "patch") == "1 patch"
    assert counted(2, "timm model") == "2 timm models" and counted(2, "datum", "data") == "2 data"
    assert part_of(1, 3, "image") == "1 of 3 images has" and part_of(2, 3, "image") == "2 of 3 images have"
    assert part_of(1, 1, "image") == "1 of 1 image has"


@pytest.mark.parametrize("methods, with_input", [(("attnlrp", "legrad", "gradcam"), True), (("attnlrp",), True),
                                                 (("legrad",), False), (("attnlrp", "legrad"), True)])
def test_each_attribution_colour_bar_sits_beside_its_map(methods, with_input):
    """The figure is as wide as its tiles and their bars (shown at ``layout.width``): every map fills its subplot's
    width, so its colour bar, at the subplot's right edge, starts within a few px of the map. In a full-width figure
    (the page before) each 2 x 2 tile sat centred in a ~630 px column, its bar ~100 px or more to its right."""
    rng = np.random.default_rng(0)
    W, H = 224, 224
    results = [Map(m, rng.normal(size=(1, 16, 16)), None, np.array([1.0]), None, signed=m == "attnlrp") for m in methods]
    fig = maps_figure(Image.new("RGB", (W, H)), results, pixels=False, target_text="class 1", plot_height=270,
                      with_input=with_input)
    margin = fig.layout.margin
    plot_w, plot_h = fig.layout.width - margin.l - margin.r, fig.layout.height - margin.t - margin.b
    bars = [t for t in fig.data if t.type == "heatmap"]
    assert len(bars) == len(methods)
    for t in bars:
        x, y = fig.layout[t.xaxis.replace("x", "xaxis")].domain, fig.layout[t.yaxis.replace("y", "yaxis")].domain
        tile_w = min((x[1] - x[0]) * plot_w, (y[1] - y[0]) * plot_h * W / H)  # scaleanchor: the tile keeps W:H
        tile_right = (x[0] + x[1]) / 2 * plot_w + tile_w / 2  # constrain="domain": centred in its domain
        gap = t.colorbar.x * plot_w - tile_right
        assert 0 <= gap <= 5, (t.xaxis, gap)
        assert t.colorbar.x * plot_w + 80 <= fig.layout.width - margin.l  # the bar and its ticks fit in the figure
    assert fig.layout.width <= 1380  # within the page's main column at 1440 px


def test_the_sidebar_gets_the_page_titles_before_the_slow_imports():
    """app.py calls st.navigation before importing PyTorch, timm and Plotly (ui.warmup): until that call a cold
    server's sidebar listed the pages/ folder's file names ("overview", "heads") for the ~10 s the imports take."""
    tree = ast.parse((ROOT / "app.py").read_text())
    navigation = min(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Attribute) and n.func.attr == "navigation")
    warmup = min(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Import)
                 and any(a.name == "ui.warmup" for a in n.names))
    assert navigation < warmup
    heavy = {"torch", "timm", "plotly", "vitviz", "pandas", "numpy"}
    before = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and n.lineno < navigation]
    names = {a.name.split(".")[0] for n in before for a in n.names} | {
        (n.module or "").split(".")[0] for n in before if isinstance(n, ast.ImportFrom)}
    assert not names & heavy, names
    source = (ROOT / "ui" / "navigation.py").read_text()
    assert not any(f"import {m}" in source for m in heavy)


@pytest.mark.slow
def test_the_distance_page_says_one_image_with_one_image_in_the_set():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600).run()
    at.switch_page("pages/4_distance.py").run()
    assert not at.exception, [e.message for e in at.exception]
    scope = at.radio(key="distance_scope")
    assert scope.options[1] == "the whole set (1 image)"
    scope.set_value(scope.options[1]).run()
    assert not at.exception, [e.message for e in at.exception]
    assert not any(" 1 images" in c.value for c in at.caption)
