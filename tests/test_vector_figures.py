"""SVG and PDF of a map panel (vitviz/vector_figures.py): the files parse (an XML parser; the PDF's own text
operators read back), the titles and colour-bar labels are text in them, not paths, and the tiles are embedded."""
import re
import xml.etree.ElementTree as ET
import zlib

import numpy as np
import pytest
from PIL import Image

from vitviz.figures.overlay import render_maps
from vitviz.figures.vector_figures import panel_vector

TITLE = "Layer 12, every head, CLS query"


def _panel(fmt: str, **kwargs) -> bytes:
    rng = np.random.default_rng(0)
    rendered = render_maps(Image.new("RGB", (64, 64), (90, 160, 40)), rng.random((3, 4, 4)),
                           scale_mode="shared across heads")
    return panel_vector(rendered.tiles, ["head 1", "head 2", "head 3"], TITLE, rendered.scales[0], "Inferno",
                        value_name="attention weight", fmt=fmt, **kwargs)


def _pdf_text(data: bytes) -> list[str]:
    """Every text-showing operation of the PDF's content streams as a string (a small PDF reader: inflate each
    stream, read the strings of each TJ array, matplotlib's TrueType text being 2-byte codes = Unicode)."""
    out = []
    for body in re.findall(rb"stream\r?\n(.*?)\r?\nendstream", data, re.S):
        try:
            content = zlib.decompress(body)
        except zlib.error:  # an embedded image or font, not a content stream
            continue
        for array in re.findall(rb"\[(.*?)\]\s*TJ", content, re.S):
            parts = re.findall(rb"\(((?:\\.|[^\\)])*)\)", array, re.S)
            raw = b"".join(re.sub(rb"\\(.)", rb"\1", p, flags=re.S) for p in parts)
            out.append(raw.decode("utf-16-be", errors="replace"))
    return out


def test_the_svg_parses_and_its_titles_and_colour_bar_are_text():
    root = ET.fromstring(_panel("svg"))
    assert root.tag.endswith("svg")
    texts = ["".join(t.itertext()).strip() for t in root.iter() if t.tag.endswith("text")]
    assert TITLE in texts and {"head 1", "head 2", "head 3"} <= set(texts)
    assert "attention weight" in texts  # the colour bar's label
    assert len([e for e in root.iter() if e.tag.endswith("image")]) >= 4  # three tiles and the bar's colours


def test_the_pdf_holds_its_title_as_text():
    data = _panel("pdf")
    assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF")
    text = _pdf_text(data)
    assert TITLE in text and "head 2" in text and "attention weight" in text, text


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="svg"):
        _panel("eps")


def test_a_pages_map_panel_offers_svg_and_pdf_and_they_carry_its_title():
    """ui.display.PanelImage, what every map panel's download row gets: its SVG and PDF are the panel's (title, tile
    titles) and a signed map's bar is the diverging one's labels (centred on 0)."""
    from ui.display import Display, PanelImage
    from vitviz.layout import TokenLayout  # noqa: F401  (the pages' layout type; the panel needs none)

    grid = np.array([[[-2.0, 0.0], [1.0, 2.0]]])
    panel = PanelImage(Image.new("RGB", (32, 32)), grid, Display(), ["AttnLRP"], "Attribution of the logit",
                       value_name="relevance", signed=True)
    texts = ["".join(t.itertext()).strip() for t in ET.fromstring(panel.vector("svg")).iter() if t.tag.endswith("text")]
    assert "Attribution of the logit" in texts and "AttnLRP" in texts and "0" in texts and "relevance" in texts
    assert "Attribution of the logit" in _pdf_text(panel.vector("pdf"))
    assert panel().size[0] > 64  # the PNG as before


@pytest.mark.slow
def test_the_heads_page_offers_svg_and_pdf_beside_the_png():
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"), default_timeout=240).run()
    at.switch_page("pages/2_heads.py").run()
    assert not at.exception, [e.message for e in at.exception]
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels.count("Image (svg)") == labels.count("Image (pdf)") == labels.count("Image (png)") >= 2
    # "Figure for a paper": several layers' heads as PNG, SVG and PDF (vitviz/figures/paper_figure.py)
    assert labels.count("Figure (png)") == labels.count("Figure (svg)") == labels.count("Figure (pdf)") == 1
    assert at.multiselect(key="paper_layers").value == [12]  # the layer shown
