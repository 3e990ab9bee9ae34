"""The Compare models page through AppTest: uploaded stats tables and an in-app run, values against the tables."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from conftest import ASSETS
from test_app import _decode
from test_compare import parquet_bytes, stats_table
from test_shared_safety import operator_env  # noqa: F401  (a fixture)
from vitviz.cli import main as cli_main
from vitviz.io.images import load_image
from vitviz.analyses.stats import table_for_images

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parent.parent / "app.py")
PAGE = "pages/9_compare.py"


def _figure(at):
    chart = next((c for c in at.get("plotly_chart") if "compare_plot" in (c.proto.id or "")), None)
    assert chart is not None, "no compare chart"
    return json.loads(chart.proto.spec)


def _layer_means(spec) -> dict[str, np.ndarray]:
    """The plotted line of each model: its mean over heads per layer."""
    return {t["name"].removesuffix(": mean over heads"): _decode(t["y"])
            for t in spec["data"] if t.get("mode") == "lines" and t["name"].endswith(": mean over heads")}


def _upload(at, files):
    at.file_uploader(key="compare_uploads").set_value(files).run()
    assert not at.exception, [e.message for e in at.exception]
    return at


@pytest.fixture
def page():
    at = AppTest.from_file(APP, default_timeout=180).run()
    at.switch_page(PAGE).run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_two_uploaded_models_are_plotted_with_their_parquet_means(page):
    rng = np.random.default_rng(0)
    vit, deep = stats_table("vit_b", rng.random((3, 4, 2)) * 100), stats_table("vit_l", rng.random((2, 6, 3)) * 100)
    # Both named as `vitviz stats` names every table.
    at = _upload(page, [("stats.parquet", parquet_bytes(vit), "application/octet-stream"),
                        ("stats.parquet", parquet_bytes(deep), "application/octet-stream")])
    for statistic in ("mean_distance", "entropy"):
        at.selectbox(key="compare_statistic").set_value(statistic).run()
        means = _layer_means(_figure(at))
        assert list(means) == ["vit_b", "vit_l"]
        for name, table in (("vit_b", vit), ("vit_l", deep)):
            # Every head has every image, so the mean over heads of image means is the plain mean per layer.
            # float64 statistics, means of <= 6 heads x 3 images in another order: summed(18, EPS64) = 4e-15
            np.testing.assert_allclose(means[name], table.groupby("layer")[statistic].mean(), rtol=1e-12)
        shown, digits = at.dataframe[0].value, 1 if statistic == "mean_distance" else 3
        assert shown["vit_l"].tolist() == [f"{v:.{digits}f}" for v in deep.groupby("layer")[statistic].mean()]
        assert shown["vit_b"].tolist()[4:] == ["–", "–"]  # vit_b has 4 layers
        assert shown.index.tolist() == [1, 2, 3, 4, 5, 6]  # 1-based on screen
    spec = _figure(at)
    assert spec["layout"]["yaxis"]["title"]["text"] == "attention entropy (nats)"
    at.selectbox(key="compare_statistic").set_value("cls_focus").run()
    assert any(w.value.startswith("No CLS focus for vit_b, vit_l") for w in at.warning)
    dots = [t for t in spec["data"] if t.get("mode") == "markers" and t.get("customdata")]
    assert [t["name"] for t in dots] == ["vit_b (4 layers, 3 images)", "vit_l (6 layers, 2 images)"]


def test_a_file_that_is_not_a_stats_table_gets_a_sentence_and_the_good_one_is_plotted(page):
    good = stats_table("vit_b", np.arange(8.0).reshape(1, 4, 2))
    at = _upload(page, [("notes.parquet", b"not parquet at all", "application/octet-stream"),
                        ("other.parquet", parquet_bytes(good.drop(columns=["entropy"])), "application/octet-stream"),
                        ("ab.parquet", parquet_bytes(pd.DataFrame({"a": [1, 2], "b": [3.0, 4.0]})),
                         "application/octet-stream"),
                        ("vit_b.parquet", parquet_bytes(good), "application/octet-stream"),
                        ("copy.parquet", parquet_bytes(good), "application/octet-stream")])
    errors = [e.value for e in at.error]
    assert any(i.value == "copy.parquet: the same file as vit_b.parquet; shown once." for i in at.info)
    assert any(e.startswith("notes.parquet: not a Parquet file") for e in errors), errors
    assert any(e.startswith("other.parquet: not a vitviz stats table: it lacks the column entropy") for e in errors)
    assert any(e.startswith("ab.parquet: not a vitviz stats table: it lacks the columns image, model, layer, head")
               for e in errors), errors
    assert list(_layer_means(_figure(at))) == ["vit_b"]


def test_this_sessions_images_run_with_the_current_model_join_the_plot(page, bundled):
    at = page
    at.button(key="compare_run").click().run()
    assert not at.exception, [e.message for e in at.exception]
    image = load_image(ASSETS / "astronaut.jpg")  # the sidebar's default sample
    expected = table_for_images(bundled, [image.image], [image.name])
    means = _layer_means(_figure(at))
    assert list(means) == ["bundled"]  # the name `vitviz stats --model bundled` writes, not the long label
    np.testing.assert_allclose(means["bundled"], expected.groupby("layer")["mean_distance"].mean(), rtol=1e-6)
    # The run stays across reruns and sits beside an uploaded table.
    other = stats_table("vit_b", np.full((1, 4, 2), 50.0))
    at = _upload(at, [("vit_b.parquet", parquet_bytes(other), "application/octet-stream")])
    assert list(_layer_means(_figure(at))) == ["vit_b", "bundled"]


def test_the_stats_commands_folder_by_path_equals_its_own_summary_and_no_path_box_when_shared(
        page, tmp_path, operator_env):
    images = [str(ASSETS / "chelsea.jpg"), str(ASSETS / "coffee.jpg")]
    assert cli_main(["stats", *images, "--workers", "0", "--out", str(tmp_path)]) == 0
    summary = pd.DataFrame(json.loads((tmp_path / "summary.json").read_text())["layer_head"]["bundled"])
    page.text_input(key="compare_path").input(str(tmp_path)).run()
    # The command's own streamed summary (sums of squares) against the page's pandas over the Parquet rows.
    np.testing.assert_allclose(_layer_means(_figure(page))["bundled"],
                               summary.groupby("layer")["mean_distance_mean"].mean(), rtol=1e-9)
    dots = next(t for t in _figure(page)["data"] if t.get("mode") == "markers" and t.get("customdata"))
    np.testing.assert_allclose(_decode(dots["error_y"]["array"]), summary["mean_distance_std"], rtol=1e-6, atol=1e-9)
    assert dots["name"] == "bundled (12 layers, 2 images)"
    page.text_input(key="compare_path").input(str(tmp_path / "missing")).run()
    assert any(e.value.startswith(f"{tmp_path / 'missing'}: no such file") for e in page.error)

    operator_env(VITVIZ_SHARED="1")
    at = AppTest.from_file(APP, default_timeout=180).run()
    at.switch_page(PAGE).run()
    assert not at.exception and not any(t.key == "compare_path" for t in at.text_input)
    assert at.file_uploader(key="compare_uploads") is not None


def test_the_cka_tab_draws_the_front_doors_map_of_the_sidebars_images(page, bundled):
    import vitviz
    from vitviz.lens import Lens

    names = sorted(p.name for p in ASSETS.glob("*.jpg"))
    page.sidebar.multiselect(key="samples").set_value(names[:3]).run()
    assert any("needs 4 or more images" in i.value for i in page.info)  # three images: a sentence, no button
    page.sidebar.multiselect(key="samples").set_value(names).run()
    page.button(key="cka_run").click().run()
    assert not page.exception, [e.message for e in page.exception]
    chart = next(c for c in page.get("plotly_chart") if "cka_map" in (c.proto.id or ""))
    drawn = _decode(json.loads(chart.proto.spec)["data"][0]["z"])
    lens = Lens(bundled)
    want = vitviz.similarity(lens, lens, [load_image(ASSETS / n).image for n in names], batch_size=32)
    np.testing.assert_array_equal(drawn, want.cka)  # the page draws vitviz's numbers, computed nowhere else
    spec = json.loads(chart.proto.spec)
    assert all(str(c).startswith("rgb(") for _, c in spec["data"][0]["colorscale"])  # no theme placeholder colour
    assert (spec["data"][0]["zmin"], spec["data"][0]["zmax"]) == (0, 1)
    assert any(d.proto.label == "Data (csv)" for d in page.get("download_button"))
    assert spec["data"][0]["colorbar"]["title"]["text"] == "CKA"
    assert spec["layout"]["xaxis"]["ticktext"][0] == "1" and spec["layout"]["yaxis"]["ticktext"][-1] == "12"
    labels = [d.proto.label for d in page.get("download_button")]
    assert {"Chart (svg)", "Chart (pdf)"} <= set(labels)
    caption = next(c.value for c in page.caption if "minibatch" in c.value)
    assert caption.startswith("4 images in 1 minibatch;") and "95 % percentile Bayesian bootstrap" in caption

    # The cell's two layers, clustered side by side: first the curve's middle pair (layer 6 with layer 7, for one
    # model the curve pairs each layer with the next), then the cell a click picks.
    def clusters(tag):
        chart = next(c for c in page.get("plotly_chart") if f"cka_clusters_{tag}" in (c.proto.id or ""))
        spec = json.loads(chart.proto.spec)
        return spec["layout"]["title"]["text"], _decode(spec["data"][1]["z"]) - 1

    assert clusters("a")[0].endswith("layer 6, resid_post, 4 clusters")
    assert clusters("b")[0].endswith("layer 7, resid_post, 4 clusters")
    page.session_state["cka_cell"] = (2, 9)
    page.run()
    assert not page.exception, [e.message for e in page.exception]
    from vitviz.analyses.clusters import token_clusters

    image = load_image(ASSETS / names[0]).image  # the sidebar's current image: the first of the set
    trace = lens.trace(lens.preprocess([image]), keep="resid_post")
    for tag, layer in (("a", 2), ("b", 9)):
        title, drawn = clusters(tag)
        assert title.endswith(f"layer {layer + 1}, resid_post, 4 clusters")
        tokens = trace.each("resid_post")[layer][0, trace.layout.num_prefix_tokens:].numpy()
        np.testing.assert_array_equal(drawn, token_clusters(tokens, trace.layout.grid_size, 4).labels)
