"""Issue 42's walk items that a function shows without the app (the app's side: tests/test_walk42_app.py)."""
import numpy as np
from PIL import Image

from vitviz.layout import TokenLayout


def test_the_contact_sheet_names_each_patch_as_every_page_does(monkeypatch):
    import vitviz.figures.overlay as overlay
    from vitviz.features.figures import contact_sheet

    layout = TokenLayout(("cls",), (16, 16), (14, 14), "token", 1)
    seen = {}
    monkeypatch.setattr(overlay, "panel_png", lambda tiles, titles, title, bar, **kw: seen.update(titles=titles, **kw))
    image = Image.new("RGB", (224, 224), "grey")
    contact_sheet([image, image], np.ones((2, 16, 16)), [147, 0], [2.0, 1.0], ["a.jpg", "b.jpg"], 7, layout)
    assert seen["titles"] == ["a.jpg · 2", "b.jpg · 1"]
    assert seen["notes"] == ["patch 147 (row 10, col 4)", "patch 0 (row 1, col 1)"]


def _tiles(fig) -> list[np.ndarray]:
    import base64
    import io

    return [np.asarray(Image.open(io.BytesIO(base64.b64decode(t.source.split(",", 1)[1]))).convert("RGB"))
            for t in fig.data if t.type == "image"]


def test_four_attribution_panels_fill_two_rows_of_two_and_pixel_maps_carry_no_outlines():
    import attribution_names as A
    from vitviz.figures.attribution_figures import maps_figure
    from vitviz.figures.overlay import CLIPPED_COLOUR

    rng = np.random.default_rng(0)
    pixels = rng.normal(size=(1, 32, 32))
    pixels[0, 3, :5] = 50.0  # 5 of 1024 pixels, above the 99th percentile of |value|: clipped
    results = [A.Attribution(m, rng.normal(size=(1, 2, 2)), pixels, np.array([1.0]), A.Projection())
               for m in ("attnlrp", "gradient", "cp-lrp")]
    photo = Image.new("RGB", (32, 32), (90, 160, 40))
    fig = maps_figure(photo, results, pixels=True)
    domains = {(fig.layout[a].domain[0], fig.layout[a].domain[1]) for a in fig.layout if a.startswith("xaxis")}
    assert len(domains) == 2  # the model input and three maps: 2 columns x 2 rows, no empty slot
    assert "pixels beyond" in fig.layout.title.text  # the title's note still counts them
    for tile in _tiles(fig)[1:]:
        assert not (tile == CLIPPED_COLOUR).all(-1).any()
    patches = maps_figure(photo, [A.Attribution("attnlrp", np.array([[[0.0, 0.1], [0.2, 9.0]]]), None, np.array([1.0]),
                                                A.Projection())], pixels=False)
    assert (_tiles(patches)[1] == CLIPPED_COLOUR).all(-1).any()  # a clipped patch keeps its outline


def test_the_registers_faithfulness_table_names_methods_as_the_faithfulness_page_does():
    from vitviz.figures.registers_figures import repair_faithfulness_table

    row = {"side": "before", "deletion_auc": 0.1, "insertion_auc": 0.2, "deletion_vs_random": "better",
           "insertion_vs_random": "better"}
    table = repair_faithfulness_table([row | {"method": "attnlrp"}, row | {"method": "random (5 seeds, mean ± s.d.)"}])
    assert table["method"].tolist() == ["AttnLRP", "random (5 seeds, mean ± s.d.)"]


def test_the_gradcam_colour_bar_says_its_unit_in_words():
    import attribution_names as A
    from vitviz.figures.attribution_figures import maps_figure

    grid = np.array([[[0.0, 0.5], [1.0, 2.0]]])
    fig = maps_figure(Image.new("RGB", (32, 32)), [A.Attribution("gradcam", grid, None, np.array([1.0]),
                                                                 A.Projection())], pixels=False)
    bars = [t.colorbar.title.text for t in fig.data if t.type == "heatmap" and t.colorbar.title.text]
    assert bars == ["weighted activation (≥ 0)"]
