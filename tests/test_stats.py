"""Per-head statistics over image sets (vitviz.stats) and the ``stats`` command."""
import numpy as np
import pytest

from vitviz.distance import patch_distances
from vitviz.layout import TokenLayout
from vitviz.stats import STATS_COLUMNS, LayerHeadSummary, sinks_table, statistics_table

CLS_LAYOUT = TokenLayout(prefix_tokens=("cls",), grid_size=(4, 4), patch_size=(16, 16), global_pool="token",
                         pos_embed_prefix_rows=1)
REG_LAYOUT = TokenLayout(prefix_tokens=("cls", "reg0", "reg1"), grid_size=(3, 5), patch_size=(14, 14),
                         global_pool="token", pos_embed_prefix_rows=1)
NO_CLS_LAYOUT = TokenLayout(prefix_tokens=(), grid_size=(4, 4), patch_size=(16, 16), global_pool="map",
                            pos_embed_prefix_rows=0)


def uniform(layout):
    n = layout.num_tokens
    return np.full((n, n), 1 / n)


def self_only(layout):
    a = np.eye(layout.num_tokens)
    if layout.has_class_token:  # the CLS row must reach a patch for CLS focus to be defined
        a[layout.cls_index] = 0
        a[layout.cls_index, layout.num_prefix_tokens + 5] = 1
    return a


def single_key(layout, key=6, on_prefix=0.0):
    """Every query puts ``on_prefix`` on the first token (when there is a prefix) and the rest on patch ``key``."""
    n, k = layout.num_tokens, layout.num_prefix_tokens + key
    a = np.zeros((n, n))
    a[:, k] = 1 - on_prefix
    a[:, 0] += on_prefix
    return a


def expected(layout, pattern):
    """The formulas of every column, written out for the hand-made patterns."""
    d, p = patch_distances(layout), layout.num_patches
    uniform_distance = d.mean()
    focus = 0.0 if layout.has_class_token else np.nan
    if pattern == "uniform":
        share = layout.num_prefix_tokens / layout.num_tokens
        return dict(mean_distance=uniform_distance, mean_distance_with_prefix=(1 - share) * uniform_distance,
                    entropy=np.log(p), cls_focus=focus, prefix_received=share)
    if pattern == "self":
        return dict(mean_distance=0.0, mean_distance_with_prefix=0.0, entropy=0.0,
                    cls_focus=1.0 if layout.has_class_token else np.nan, prefix_received=0.0)
    on_prefix = 0.25 if layout.num_prefix_tokens else 0.0
    key_distance = d[:, 6].mean()
    return dict(mean_distance=key_distance, mean_distance_with_prefix=(1 - on_prefix) * key_distance, entropy=0.0,
                cls_focus=1.0 if layout.has_class_token else np.nan, prefix_received=on_prefix)


@pytest.mark.parametrize("layout", [CLS_LAYOUT, REG_LAYOUT, NO_CLS_LAYOUT], ids=["cls", "registers", "no_cls"])
def test_statistics_of_hand_made_attention_equal_the_formulas(layout):
    patterns = {"uniform": uniform(layout), "self": self_only(layout),
                "key": single_key(layout, on_prefix=0.25 if layout.num_prefix_tokens else 0.0)}
    names = list(patterns)
    # Image b, layer l, head h gets pattern (b + l + h) % 3: a row in the wrong place fails.
    B, L, H = 3, 2, 4
    attention = np.empty((B, L, H, layout.num_tokens, layout.num_tokens), dtype=np.float32)
    for b in range(B):
        for l in range(L):
            for h in range(H):
                attention[b, l, h] = patterns[names[(b + l + h) % 3]]
    table = statistics_table(attention, layout, ["a.jpg", "sub/b.png", "c.jpg"], "tiny")

    assert list(table.columns) == list(STATS_COLUMNS)
    assert {c: str(t) for c, t in table.dtypes.items()} == {
        c: ("object" if t == "str" else t) for c, t in STATS_COLUMNS.items()}
    assert len(table) == B * L * H
    for row in table.itertuples():
        b = ["a.jpg", "sub/b.png", "c.jpg"].index(row.image)
        want = expected(layout, names[(b + row.layer + row.head) % 3])
        assert row.model == "tiny"
        for column, value in want.items():
            np.testing.assert_allclose(getattr(row, column), value, atol=1e-5, err_msg=f"{column} {row}")


def test_prefix_conventions_differ_by_the_share_on_prefix_tokens():
    # The pair a user compares with probing-vits: 40% on CLS scales the unrenormalised distance by 0.6.
    attention = single_key(CLS_LAYOUT, key=0, on_prefix=0.4)[None, None, None]
    row = statistics_table(attention, CLS_LAYOUT, ["x"], "m").iloc[0]
    far = patch_distances(CLS_LAYOUT)[:, 0].mean()
    assert row.mean_distance == pytest.approx(far)
    assert row.mean_distance_with_prefix == pytest.approx(0.6 * far)
    assert row.prefix_received == pytest.approx(0.4)


def test_sinks_table_names_the_token_that_takes_all_attention():
    attention = np.stack([uniform(CLS_LAYOUT), single_key(CLS_LAYOUT, key=6)])[None, :, None]  # (1, 2, 1, N, N)
    sinks = sinks_table(attention, CLS_LAYOUT, ["cat.jpg"], "m")
    assert sinks[["image", "layer", "token"]].values.tolist() == [["cat.jpg", 1, 7]]  # layer 0 (uniform) has none
    assert sinks.share.iloc[0] == pytest.approx(1.0)


def test_layer_head_summary_equals_pandas_mean_and_std_over_images():
    rng = np.random.default_rng(0)
    attention = rng.random((5, 2, 3, CLS_LAYOUT.num_tokens, CLS_LAYOUT.num_tokens)).astype(np.float32)
    attention /= attention.sum(-1, keepdims=True)
    table = statistics_table(attention, CLS_LAYOUT, list("abcde"), "m")
    summary = LayerHeadSummary()
    summary.add(table.iloc[:7])
    summary.add(table.iloc[7:])
    result = summary.result()
    grouped = table.groupby(["model", "layer", "head"])
    np.testing.assert_allclose(result["entropy_mean"], grouped.entropy.mean(), rtol=1e-12)
    np.testing.assert_allclose(result["mean_distance_std"], grouped.mean_distance.std(ddof=0), rtol=1e-6)
    assert (result["images"] == 5).all()
