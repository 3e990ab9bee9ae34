"""SVG and PDF of the pages' Plotly charts (vitviz/figures/chart_export.py, Plotly's export through kaleido and Debian's
Chromium): the files parse (an XML parser; pypdf), the title and tick labels are text in them (not paths, not a
picture of the chart), and a server without a browser gets a sentence instead of a traceback."""
import io
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from vitviz.figures import chart_export
from vitviz.figures.chart_export import ChartExportError, chart_file
from vitviz.figures.core import distance_scatter

needs_browser = pytest.mark.skipif(chart_export.unavailable_reason() is not None,
                                   reason="no kaleido or no Chrome/Chromium for Plotly's export")
TITLE = "Mean attention distance, coffee.jpg"


def _chart():
    distance = np.array([[20.0, 35.0, 50.0], [60.0, 80.0, 95.0], [100.0, 110.0, 117.0]])  # (L=3, H=3) px
    fig = distance_scatter(distance, np.array([14.0, 28.0, 42.0]))
    fig.update_layout(title=TITLE, margin=dict(t=40))
    return fig


def _svg_texts(data: bytes) -> list[str]:
    root = ET.fromstring(data)
    assert root.tag.endswith("svg")
    return ["".join(t.itertext()).strip() for t in root.iter() if t.tag.endswith("text")]


@pytest.mark.slow  # starts the browser twice (2.5-8 s each, with the machine's load)
@needs_browser
def test_a_chart_exports_as_svg_and_pdf_with_its_title_and_ticks_as_text():
    fig = _chart()
    texts = _svg_texts(chart_file(fig, "svg"))
    # The title, an axis title and the layer ticks 1..3 are <text> elements: a chart saved as a picture inside the
    # SVG (or drawn as paths) has none of them.
    assert TITLE in texts and "network depth (layer)" in texts and {"1", "2", "3"} <= set(texts), texts
    assert "head 2" in texts  # the legend

    from pypdf import PdfReader

    pdf = chart_file(fig, "pdf")
    reader = PdfReader(io.BytesIO(pdf))
    assert len(reader.pages) == 1
    text = reader.pages[0].extract_text()
    assert TITLE in text and "network depth (layer)" in text and "mean attention distance (pixels)" in text, text
    fonts = reader.pages[0]["/Resources"]["/Font"]
    assert len(fonts) >= 1  # text drawn with embedded fonts, not outlines
    # The page is the chart's size: 1090 (the default, the page's main column) x 460 CSS px at 96 per inch, in pt.
    box = reader.pages[0].mediabox
    assert abs(float(box.width) - 1090 * 72 / 96) < 2 and abs(float(box.height) - 460 * 72 / 96) < 2


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="svg"):
        chart_file(_chart(), "eps")


def test_without_a_browser_the_export_says_what_to_install(monkeypatch):
    monkeypatch.setattr(chart_export, "browser_path", lambda: None)
    with pytest.raises(ChartExportError, match="Chrome or Chromium.*apt-get install chromium.*BROWSER_PATH"):
        chart_file(_chart(), "svg")


@pytest.mark.slow
@needs_browser
def test_the_filter_grid_exports_with_its_title_and_labels_as_text_and_tiles_as_one_image():
    from vitviz.figures.core import tile_grid_figure

    tiles = np.random.default_rng(0).random((9, 14, 14, 3))
    fig = tile_grid_figure(tiles, [f"PC{i + 1} · {9 - i}.0%" for i in range(9)],
                           "First 9 principal components of the 384 patch filters (14×14 RGB)", columns=7, tile_px=126)
    data = chart_file(fig, "svg")
    texts = _svg_texts(data)
    assert "First 9 principal components of the 384 patch filters (14×14 RGB)" in texts
    assert "PC1 · 9.0%" in texts and "PC9 · 1.0%" in texts  # the last row's label too
    root = ET.fromstring(data)
    assert len([e for e in root.iter() if e.tag.endswith("image")]) == 1


@pytest.mark.slow
@needs_browser
def test_the_pdf_page_is_the_chart_with_no_print_margin():
    """kaleido prints with 0.1 in margins inside a page the chart's size: everything moved 0.1 in (7.2 pt) right and
    down and the bottom and right edges were cut (the distance plot lost its x-axis title). A word at the chart's
    left edge must start at x ~ 0 of the page."""
    import plotly.graph_objects as go
    from pypdf import PdfReader

    fig = go.Figure()
    fig.add_annotation(text="LEFTEDGE", x=0, y=0.5, xref="paper", yref="paper", xanchor="left", showarrow=False,
                       borderpad=0, font=dict(size=20))
    fig.update_layout(width=400, height=300, margin=dict(l=0, r=0, t=0, b=0), xaxis=dict(visible=False),
                      yaxis=dict(visible=False))
    page = PdfReader(io.BytesIO(chart_file(fig, "pdf"))).pages[0]
    xs = []
    page.extract_text(visitor_text=lambda text, cm, tm, *_: xs.append(cm[4] + tm[4] * cm[0]) if "LEFT" in text else None)
    assert xs and min(xs) < 3.0, xs  # pt; the 0.1 in margin put it at 7.2 pt or more
