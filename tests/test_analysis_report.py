"""``analyze --report --format``'s figures (vitviz/figures/analysis_report.py): formats parsed with a sentence for a
wrong one, layers spread over the depth, the methods figure's groups (signed methods on one symmetric scale), and
the run-wide charts as SVG/PDF with their text as text."""
import io
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitviz.errors import VitvizError
from attribution_names import LABELS
from vitviz.figures.analysis_report import distance_file, methods_figure, parse_formats, spread_layers, tiles_file


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
    assert names[0] == "attention rollout" and names[-1] == "LeGrad" and len(names) == 3
    signed = fig.groups[1]
    assert signed.signed and signed.rows[0].titles == [LABELS["attnlrp"], LABELS["gradient"]]
    limit = np.percentile(np.abs(np.stack([arrays["attribution_attnlrp"][1], arrays["attribution_gradient"][1]])), 99)
    bar = fig.bars[1]
    # float64 relevance, numpy's percentile on both sides: <= 2 EPS64 apart
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


def test_format_is_checked_before_any_model_work(tmp_path, capsys):
    from vitviz.cli import main

    image = str(Path(__file__).resolve().parent.parent / "assets" / "coffee.jpg")
    assert main(["analyze", image, "--out", str(tmp_path / "o"), "--format", "svg"]) == 2
    assert "--format says which files --report writes: add --report." in capsys.readouterr().err
    assert main(["analyze", image, "--model", "not_a_model", "--out", str(tmp_path / "o"), "--report",
                 "--format", "svg,tiff"]) == 2  # the format's sentence comes first: no model was looked up
    assert "--format takes png, svg and pdf separated by commas (e.g. svg,pdf), not 'svg,tiff'." in \
        capsys.readouterr().err


@pytest.mark.slow
def test_analyze_report_writes_svg_and_pdf_with_one_scale_for_the_heads_figure(tmp_path, bundled):
    """``analyze --report --format svg,pdf`` on the bundled model: every figure as SVG and PDF (no PNG), text as text;
    the heads figure of layers 1, 5, 8 and 12 has one colour bar whose top is the 99th percentile of those layers'
    CLS rows over the patches (numpy on analysis.npz's attention, the sinks of each layer left out)."""
    from vitviz.analyses.tokens import attention_sinks
    from vitviz.cli import main

    out = tmp_path / "out"
    image = Path(__file__).resolve().parent.parent / "assets" / "coffee.jpg"
    assert main(["analyze", str(image), "--out", str(out), "--report", "--format", "svg,pdf"]) == 0
    names = sorted(p.name for p in out.iterdir())
    stems = ["filter_pca", "heads_layers_000_coffee", "last_layer_heads_000_coffee", "mean_distance",
             "posembed_similarity", "rollout_000_coffee"]
    assert [n for n in names if n.endswith((".svg", ".pdf", ".png"))] == sorted(
        f"{s}.{f}" for s in stems for f in ("svg", "pdf"))  # no maps_ figure: rollout alone, no head, no --attribution

    texts = _texts((out / "heads_layers_000_coffee.svg").read_bytes())
    assert "coffee.jpg: every head, CLS query" in texts
    assert {"layer 1", "layer 5", "layer 8", "layer 12", "head 6"} <= set(texts)
    assert sum(t.startswith("attention weight") for t in texts) == 1  # one colour bar for the four layers

    from vitviz.layout import TokenLayout

    attention = np.load(out / "analysis.npz")["attention"][0]  # (L, H, N, N): CLS, then the 16 x 16 patches
    layout = TokenLayout(("cls",), (16, 16), (14, 14), "token", 1)
    sinks, keep = attention_sinks(attention, layout), np.ones(256, bool)
    for layer in (0, 4, 7, 11):
        keep[sinks.patch_sinks(layout, [layer])] = False
    cls_rows = np.concatenate([attention[layer, :, 0, 1:] for layer in (0, 4, 7, 11)])  # (4 H, 256)
    top = np.percentile(cls_rows[:, keep], 99)
    assert f"{top:.3g}" in texts, (top, [t for t in texts if t[:1].isdigit()])

    from pypdf import PdfReader

    text = PdfReader(io.BytesIO((out / "mean_distance.pdf").read_bytes())).pages[0].extract_text()
    assert "mean attention distance (pixels)" in text and "network depth (layer)" in text
    assert "coffee.jpg: last layer, cls query" in _texts((out / "last_layer_heads_000_coffee.svg").read_bytes())
