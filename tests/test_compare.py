"""Comparing models from stats tables: reading and checking them, averages over images and heads, the figure."""
import io

import numpy as np
import pandas as pd
import pytest

from vitviz.analyses import stats
from vitviz.analyses.compare import (DTYPES, STATISTICS, StatsTableError, combine, head_summary, layer_summary,
                            model_overview, read_stats_table)
from vitviz.figures.compare_figures import depth_comparison


def stats_table(model: str, values: np.ndarray, images: list[str] | None = None) -> pd.DataFrame:
    """A table as `vitviz stats` writes it: values (B, L, H) become mean_distance; the rest derived from it."""
    B, L, H = values.shape
    images = images or [f"img{b}.jpg" for b in range(B)]
    b, layer, head = (a.ravel() for a in np.indices((B, L, H)))
    v = values.ravel().astype(np.float64)
    return pd.DataFrame({
        "image": [images[i] for i in b], "model": model, "layer": layer.astype(np.int32),
        "head": head.astype(np.int32), "mean_distance": v, "mean_distance_with_prefix": v * 0.5,
        "entropy": v / 100, "cls_focus": np.full(v.shape, np.nan), "prefix_received": v / 1000})


def parquet_bytes(table: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    table.to_parquet(buf, index=False)
    return buf.getvalue()


# Two images, 2 layers, 2 heads: per head the images are a and a + 2d, so mean a + d and std |d|.
TWO = np.array([[[10.0, 20.0], [30.0, 40.0]],
                [[14.0, 20.0], [36.0, 50.0]]])


def test_head_summary_is_the_mean_and_std_over_images():
    heads = head_summary(read_stats_table(parquet_bytes(stats_table("m", TWO)), "s.parquet"), "mean_distance")
    assert heads[["layer", "head"]].values.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    np.testing.assert_allclose(heads["mean"], [12, 20, 33, 45])
    np.testing.assert_allclose(heads["std"], [2, 0, 3, 5])  # ddof=0: half the difference of two images
    assert heads["n_images"].tolist() == [2, 2, 2, 2]


def test_layer_summary_averages_heads_and_knows_each_models_depth():
    deep = np.arange(3 * 4 * 2, dtype=float).reshape(3, 4, 2)
    table = combine({"a.parquet": stats_table("shallow", TWO), "b.parquet": stats_table("deep", deep)})
    layers = layer_summary(head_summary(table, "entropy"))
    assert layers["model"].tolist() == ["shallow"] * 2 + ["deep"] * 4  # first seen first
    np.testing.assert_allclose(layers["mean"][:2], [16 / 100, 39 / 100])
    np.testing.assert_allclose(layers["mean"][2:], deep.mean(axis=(0, 2)) / 100)
    assert layers["depth"].tolist() == [2, 2, 4, 4, 4, 4]


def test_nan_statistics_are_left_out_of_counts():
    table = stats_table("m", TWO)
    table.loc[0, "mean_distance"] = np.nan  # image 0, layer 0, head 0
    heads = head_summary(read_stats_table(parquet_bytes(table)), "mean_distance")
    assert heads.loc[0, "n_images"] == 1 and heads.loc[0, "mean"] == 14.0 and heads.loc[0, "std"] == 0.0
    assert head_summary(table, "cls_focus")["n_images"].tolist() == [0] * 4
    deeper = combine({"a": table, "b": stats_table("deep", np.ones((3, 5, 2)))})
    for statistic, images in (("mean_distance", [2, 3]), ("cls_focus", [0, 0])):
        heads = head_summary(deeper, statistic)
        overview = model_overview(heads, layer_summary(heads))
        assert overview.to_dict(orient="index") == {"m": {"layers": 2, "images": images[0]},
                                                    "deep": {"layers": 5, "images": images[1]}}


def test_the_same_model_in_two_files_is_told_apart():
    table = combine({"run1.parquet": stats_table("vit", TWO), "run2.parquet": stats_table("vit", TWO + 1),
                     "other.parquet": stats_table("deit", TWO)})
    assert table["model"].unique().tolist() == ["vit (run1.parquet)", "vit (run2.parquet)", "deit"]
    means = layer_summary(head_summary(table, "mean_distance")).groupby("model", sort=False)["mean"].first()
    np.testing.assert_allclose(means.to_numpy(), [16, 17, 16])


def test_every_statistic_of_the_stats_table_has_a_label_and_unit():
    assert list(STATISTICS) == list(stats.STATISTICS)


def test_a_stats_folder_is_read_by_its_path(tmp_path):
    stats_table("m", TWO).to_parquet(tmp_path / "stats.parquet")
    table = read_stats_table(tmp_path)
    assert dict(table.dtypes) == DTYPES
    with pytest.raises(StatsTableError, match=r"nowhere: no such file"):
        read_stats_table(tmp_path / "nowhere", "nowhere")


@pytest.mark.parametrize("data, sentence", [
    (b"PK\x03\x04 a zip, not parquet", r"^notes\.parquet: not a Parquet file \(ArrowInvalid"),
    (parquet_bytes(stats_table("m", TWO).drop(columns=["head", "entropy"])),
     r"^notes\.parquet: not a vitviz stats table: it lacks the columns head, entropy"),
    # No text column at all: pyarrow's dictionary reader used to raise a bare KeyError(b'image') first.
    (parquet_bytes(pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]})),
     r"^notes\.parquet: not a vitviz stats table: it lacks the columns image, model, layer, head, mean_distance, "),
    (parquet_bytes(stats_table("m", TWO).assign(layer=lambda t: t["layer"].astype(str))),
     r"^notes\.parquet: column layer holds .*, not integers"),
    (parquet_bytes(stats_table("m", TWO).assign(head=lambda t: t["head"] - 1)),
     r"^notes\.parquet: column head has negative values"),
    (parquet_bytes(pd.concat([stats_table("m", TWO)] * 2)), r"^notes\.parquet: 8 rows repeat"),
])
def test_a_file_that_is_not_a_stats_table_gets_one_sentence_naming_it(data, sentence):
    with pytest.raises(StatsTableError, match=sentence):
        read_stats_table(data, "notes.parquet")


def test_depth_figure_lines_are_the_layer_means_and_dots_the_head_means():
    deep = np.arange(2 * 4 * 3, dtype=float).reshape(2, 4, 3)
    table = combine({"a": stats_table("shallow", TWO), "b": stats_table("deep", deep)})
    heads = head_summary(table, "mean_distance")
    layers = layer_summary(heads)
    fig = depth_comparison(heads, layers, STATISTICS["mean_distance"])
    lines = {t.name: t for t in fig.data if t.mode == "lines" and t.x[0] is not None}
    np.testing.assert_allclose(lines["deep: mean over heads"].y, deep.mean(axis=(0, 2)))
    np.testing.assert_allclose(lines["shallow: mean over heads"].y, [16, 39])
    dots = [t for t in fig.data if t.mode == "markers"]
    assert [t.name for t in dots] == ["shallow (2 layers, 2 images)", "deep (4 layers, 2 images)"]
    np.testing.assert_allclose(dots[0].error_y.array, [2, 0, 3, 5])
    # The lower bar stops at 0: mean - arrayminus >= 0 (a share or a distance is never negative).
    means = heads[heads["model"] == "shallow"]["mean"].to_numpy()
    np.testing.assert_allclose(dots[0].error_y.arrayminus, np.minimum([2, 0, 3, 5], means))
    # 1-based layers on x, each model shifted the same small amount to its own side of the layer.
    shift = np.asarray(dots[0].x) - np.repeat([1, 2], 2)
    assert np.allclose(shift, shift[0]) and -0.2 < shift[0] < 0
    assert np.allclose(np.asarray(dots[1].x) - np.repeat([1, 2, 3, 4], 3), -shift[0])
    assert all(t.marker.color.startswith("rgb(") for t in dots)
    assert fig.layout.yaxis.title.text == "mean attention distance (pixels)"
    assert fig.layout.xaxis.title.text == "network depth (layer, 1-based)"


def test_relative_depth_puts_every_models_last_layer_at_one():
    deep = np.ones((1, 4, 2))
    table = combine({"a": stats_table("shallow", TWO[:1]), "b": stats_table("deep", deep)})
    heads = head_summary(table, "mean_distance")
    fig = depth_comparison(heads, layer_summary(heads), STATISTICS["mean_distance"], relative=True)
    lines = [t for t in fig.data if t.mode == "lines" and t.x[0] is not None]
    ends = [t.x[-1] for t in lines]
    assert np.isclose(np.mean(ends), 1.0) and abs(ends[0] - ends[1]) < 0.1  # shifted apart by the jitter only
    np.testing.assert_allclose(np.diff(lines[1].x), 0.25)
    np.testing.assert_allclose(np.diff(lines[0].x), 0.5)


def test_the_shared_store_weighs_a_stats_table_by_its_columns():
    from ui.memo import nbytes

    table = read_stats_table(parquet_bytes(stats_table("m", np.ones((100, 12, 12)))))
    # 5 float64 + 2 int32 columns = 48 bytes a row, plus the two category code columns (1 byte each).
    assert 48 * len(table) <= nbytes(table) <= 52 * len(table) + 10_000


def test_error_bars_stop_at_zero_for_a_statistic_that_cannot_be_negative():
    values = np.array([[[0.0, 0.5]], [[0.0, 0.5]], [[0.3, 0.5]]])  # 3 images, 1 layer, 2 heads
    heads = head_summary(combine({"a": stats_table("m", values)}), "mean_distance")
    fig = depth_comparison(heads, layer_summary(heads), STATISTICS["mean_distance"])
    dots = next(t for t in fig.data if t.mode == "markers")
    low = np.asarray(dots.y) - np.asarray(dots.error_y.arrayminus)
    assert low[0] == 0 and heads["std"].to_numpy()[0] > heads["mean"].to_numpy()[0]  # clipped, not 0.1 - 0.17
    assert np.asarray(dots.error_y.arrayminus)[1] == heads["std"].to_numpy()[1]
