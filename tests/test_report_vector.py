"""``analyze --report --format``'s figures (vitviz/figures/report_vector.py): formats parsed with a sentence for a
wrong one, layers spread over the depth, the methods figure's groups (signed methods on one symmetric scale), and
the run-wide charts as SVG/PDF with their text as text."""
import io
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from PIL import Image

from vitviz.errors import VitvizError
from vitviz.explainers.attribution import LABELS
from vitviz.figures.report_vector import distance_file, methods_figure, parse_formats, spread_layers, tiles_file


def _texts(svg: bytes) -> list[str]:
    return ["".join(t.itertext()).strip() for t in ET.fromstring(svg).iter() if t.tag.endswith("text")]


def test_formats_are_parsed_and_a_wrong_one_gets_a_sentence():
    assert parse_formats("svg,pdf") == ("svg", "pdf")
    assert parse_formats(" PNG, svg ,png") == ("png", "svg")
    with pytest.raises(VitvizError, match="--format takes png, svg and pdf.*'svg,eps'"):
        parse_formats("svg,eps")


def test_layers_spread_from_first_to_last():
    assert spread_layers(12) == [0, 4, 7, 11]
    assert spread_layers(2) == [0, 1]


def test_methods_figure_puts_signed_methods_on_one_symmetric_scale():
    rng = np.random.default_rng(0)
    arrays = {"rollout": rng.random((2, 4, 4)), "attribution_attnlrp": rng.normal(size=(2, 4, 4)),
              "attribution_gradient": 3 * rng.normal(size=(2, 4, 4)), "attribution_legrad": rng.random((2, 4, 4))}
    fig = methods_figure(Image.new("RGB", (32, 32)), arrays, 1, "cat.jpg")
    names = [g.name for g in fig.groups]
    assert names[0] == "rollout" and names[-1] == "LeGrad" and len(names) == 3
    signed = fig.groups[1]
    assert signed.signed and signed.rows[0].titles == [LABELS["attnlrp"], LABELS["gradient"]]
    limit = np.percentile(np.abs(np.stack([arrays["attribution_attnlrp"][1], arrays["attribution_gradient"][1]])), 99)
    bar = fig.bars[1]
    assert (bar.mappable.norm.vmin, bar.mappable.norm.vmax) == pytest.approx((-limit, limit), rel=1e-12)
    assert methods_figure(Image.new("RGB", (32, 32)), {"rollout": arrays["rollout"]}, 0, "x") is None


def test_distance_and_tile_charts_are_vector_text():
    distance = np.array([[20.0, 40.0], [60.0, 90.0], [100.0, 116.0]])
    texts = _texts(distance_file(distance, np.array([14.0, 28.0, 42.0]), "svg"))
    assert "mean attention distance (pixels)" in texts and "network depth (layer)" in texts
    assert {"1", "2", "3", "head 2"} <= set(texts)
    from pypdf import PdfReader

    pdf = distance_file(distance, None, "pdf")
    assert "Mean attention distance per head" in PdfReader(io.BytesIO(pdf)).pages[0].extract_text()
    from vitviz.figures.colour import DIVERGING, ColourScale

    svg = tiles_file(Image.new("RGB", (40, 40)), "Position-embedding similarity", "svg",
                     bar=(ColourScale(-1.0, 1.0), DIVERGING, "cosine similarity"))
    texts = _texts(svg)
    assert "Position-embedding similarity" in texts and "cosine similarity" in texts
    assert "−1.00" in texts and "1.00" in texts  # the bar's ends (matplotlib writes a true minus sign)
