"""Each analysis against a reference written here from its paper (numpy), or a peer library (scikit-learn's
k-means inertia, networkx's max-flow), on inputs asymmetric enough that a plausible wrong formula gives a
different answer: uneven prefix mass per row, non-square patches and grids, excluded tokens, position
tables with fewer rows than prefix tokens, real-size maps with many ties.

Every reference here is independent of the code under test: no vitviz function builds any part of it.
"""
import networkx as nx
import numpy as np
import pytest
import timm
import torch

from conftest import TINY
from vitviz.layout import TokenLayout

# CLS + 2 registers, a 3 x 5 grid of 14 x 16-pixel patches: prefix rows, non-square patches and grid.
LAYOUT = TokenLayout(prefix_tokens=("cls", "reg0", "reg1"), grid_size=(3, 5), patch_size=(14, 16),
                     global_pool="token", pos_embed_prefix_rows=1)
PREFIX, GH, GW, PH, PW = 3, 3, 5, 14, 16
N = PREFIX + GH * GW


def random_attention(layers=3, heads=4, n=N, seed=0, prefix_mass=None):
    """Row-stochastic (L, H, n, n) float64 with no two rows alike; ``prefix_mass``: (L, H, n) share of each row on
    the first PREFIX tokens (uneven per row, so a formula that assumes one share for all rows fails)."""
    rng = np.random.default_rng(seed)
    a = rng.random((layers, heads, n, n)) ** 3
    a /= a.sum(-1, keepdims=True)
    if prefix_mass is not None:
        patches = a[..., PREFIX:] / a[..., PREFIX:].sum(-1, keepdims=True)
        prefix = a[..., :PREFIX] / a[..., :PREFIX].sum(-1, keepdims=True)
        a = np.concatenate([prefix * prefix_mass[..., None], patches * (1 - prefix_mass[..., None])], -1)
    return a


# --- rollout (Abnar & Zuidema 2020) ----------------------------------------------------------------------------

def paper_rollout(attention, fusion="mean", discard=0.0, exclude=(), readout=0):
    """R = A'_L ... A'_1 with A' = rownorm(0.5 A + 0.5 I), A the fused heads with the lowest ``discard`` share of
    the entries zeroed (never the readout column) and the excluded tokens' columns zeroed. Returns R's readout
    row over the patches, (gh, gw)."""
    L, _, n, _ = attention.shape
    R = np.eye(n)
    for layer in range(L):
        A = {"mean": np.mean, "max": np.max, "min": np.min}[fusion](attention[layer], axis=0).astype(np.float64)
        if discard:
            spare = np.ones((n, n), bool)
            spare[:, readout] = False
            values = A[spare]
            values[np.argsort(values)[:int(discard * values.size)]] = 0
            A[spare] = values
        A[:, list(exclude)] = 0
        A = 0.5 * A + 0.5 * np.eye(n)
        A /= A.sum(1, keepdims=True)
        R = A @ R
    return R[readout, PREFIX:].reshape(GH, GW)


@pytest.mark.parametrize("fusion,discard,exclude", [("mean", 0.0, ()), ("max", 0.3, ()), ("min", 0.0, (1, 7)),
                                                    ("mean", 0.2, (2,))])
def test_rollout_equals_the_papers_matrix_product_written_in_numpy(fusion, discard, exclude):
    from vitviz.analyses.rollout import rollout

    attention = random_attention(layers=4)
    ours = rollout(attention, LAYOUT, fusion=fusion, discard=discard, exclude_tokens=exclude)
    # float64 rollout, 4 layers of 18-token products (3 prefix + 15 patches): summed(4 * 18, EPS64) = 1.6e-14 relative
    np.testing.assert_allclose(ours.map, paper_rollout(attention, fusion, discard, exclude), rtol=1e-10, atol=1e-15)


def test_kept_out_patches_are_their_tokens_and_hold_the_plain_rollouts_mass_on_them():
    from vitviz.analyses.rollout import mass_on, patch_tokens, rollout, token_patches

    # Patches 1, 8 and 11 of the 3 x 5 grid sit at (row, col) (0, 1), (1, 3) and (2, 1): after the 3 prefix tokens.
    assert patch_tokens(LAYOUT, np.array([8, 1, 11])) == (11, 4, 14)
    # Prefix tokens (CLS 0, register 2) are no patches; repeats count once; the patches come back sorted.
    assert token_patches(LAYOUT, (14, 0, 11, 2, 11, 4)) == [1, 8, 11]
    attention = random_attention(layers=4, prefix_mass=np.random.default_rng(3).random((4, 4, N)) * 0.6)
    R = paper_rollout(attention)  # the CLS row over the patches, (gh, gw)
    held = R[0, 1] + R[1, 3] + R[2, 1]
    ours = rollout(attention, LAYOUT).map
    # float64 rollout as in the test above (rtol 1e-10 covers its 1.6e-14), and a sum of 3 of its values
    np.testing.assert_allclose(mass_on(ours, [1, 8, 11]), held, rtol=1e-10)
    assert mass_on(ours, []) == 0.0
    # Kept out, they hold none of it: their columns are zeroed in every A' (only their own 0.5 I remains).
    kept_out = rollout(attention, LAYOUT, exclude_tokens=patch_tokens(LAYOUT, [1, 8, 11])).map
    assert mass_on(kept_out, [1, 8, 11]) == 0.0


def test_the_readout_is_named_once_for_files_and_once_for_pages():
    from vitviz.analyses.rollout import readout_label, readout_name

    pooled = TokenLayout(prefix_tokens=("reg0",), grid_size=(3, 5), patch_size=(14, 16), global_pool="avg",
                         pos_embed_prefix_rows=0)
    assert [readout_name(LAYOUT), readout_name(pooled), readout_name(LAYOUT, 7)] == [
        "cls", "mean over patch rows", "patch 7 (raster order, 0-based)"]  # what results and files record
    assert [readout_label(LAYOUT), readout_label(pooled), readout_label(pooled, 7)] == [
        "CLS", "mean over patch rows", "patch 7"]  # what the pages and the explorer show


def test_mean_head_map_is_the_heads_mean_of_the_query_row_over_patch_keys():
    from vitviz.analyses.maps import mean_head_map

    attention = random_attention(layers=3, heads=4)
    for query, row in (("cls", attention[1, :, 0]), (7, attention[1, :, PREFIX + 7]),
                       ("mean", attention[1, :, PREFIX:].mean(axis=1))):
        want = row[:, PREFIX:].mean(axis=0).reshape(GH, GW)  # not renormalised: the prefix keys' mass is left out
        # float64 means of 4 (and 15) values: a few ulps
        np.testing.assert_allclose(mean_head_map(attention, LAYOUT, 1, query), want, rtol=1e-14)


# --- attention flow (Abnar & Zuidema 2020), against networkx ---------------------------------------------------

def paper_capacities(attention, exclude=()):
    """The layered graph's capacities as the paper defines them: A'[j, i] from token i below to token j above."""
    caps = []
    for layer in attention:
        A = layer.mean(0)
        A[:, list(exclude)] = 0
        A = 0.5 * A + 0.5 * np.eye(len(A))
        caps.append(A / A.sum(1, keepdims=True))
    return caps


def networkx_flow(caps, source_token, sink_token=0):
    graph = nx.DiGraph()
    for k, A in enumerate(caps):
        for i in range(A.shape[1]):
            for j in range(A.shape[0]):
                if A[j, i] > 0:
                    graph.add_edge((k, i), (k + 1, j), capacity=float(A[j, i]))
    return nx.maximum_flow_value(graph, (0, source_token), (len(caps), sink_token))


@pytest.mark.parametrize("exclude", [(), (1, 5)], ids=["all tokens", "register and a patch excluded"])
def test_attention_flow_equals_networkx_max_flow_on_capacities_built_here(exclude):
    from vitviz.analyses.flow import attention_flow

    layout = TokenLayout(prefix_tokens=("cls", "reg0"), grid_size=(2, 3), patch_size=(16, 16), global_pool="token",
                         pos_embed_prefix_rows=1)
    attention = np.random.default_rng(5).random((3, 2, 8, 8)) ** 4
    attention /= attention.sum(-1, keepdims=True)
    ours = attention_flow(attention, layout, exclude_tokens=exclude)
    caps = paper_capacities(attention, exclude)
    exact = np.array([networkx_flow(caps, 2 + p) for p in range(6)])
    lower, bound = ours.map.ravel(), ours.error_bound.ravel()
    # Integer capacities floor(S·c) make a flow no larger than the true one and at most the bound below it.
    assert (lower <= exact + 1e-9).all() and (exact <= lower + bound + 1e-9).all(), (lower, exact, bound)
    assert bound.max() < 1e-3


# --- mean attention distance (ViT paper Fig. 7 right; probing-vits) ------------------------------------------

def paper_distance(attention, renormalise=True):
    """Per layer and head: for each patch query, Σ_k a(q, k)·‖p_q − p_k‖ over patch keys, with p the patch centre
    in pixels ((row + ½)·14, (col + ½)·16); renormalised over patch keys or not (probing-vits); mean over queries."""
    centres = np.array([((r + 0.5) * PH, (c + 0.5) * PW) for r in range(GH) for c in range(GW)])
    d = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
    L, H = attention.shape[:2]
    out = np.zeros((L, H))
    for layer in range(L):
        for head in range(H):
            values = []
            for q in range(GH * GW):
                a = attention[layer, head, PREFIX + q, PREFIX:]
                values.append(a @ d[q] / (a.sum() if renormalise else 1.0))
            out[layer, head] = np.mean(values)
    return out


def test_mean_distance_both_conventions_equal_the_paper_on_non_square_patches_and_uneven_prefix_mass():
    from vitviz.analyses.distance import mean_attention_distance, mean_attention_distance_conventions
    from vitviz.analyses.stats import per_head_statistics

    mass = np.random.default_rng(1).uniform(0.0, 0.6, size=(2, 3, N))  # every row its own prefix share
    attention = random_attention(layers=2, heads=3, prefix_mass=mass)
    renormalised, probing = mean_attention_distance_conventions(attention[None], LAYOUT)
    # float64 distances, 18-token rows: summed(18, EPS64) = 4e-15 relative per row, then means over rows;
    # 1e-12 leaves room
    np.testing.assert_allclose(renormalised[0], paper_distance(attention), rtol=1e-12)
    np.testing.assert_allclose(probing[0], paper_distance(attention, renormalise=False), rtol=1e-12)
    np.testing.assert_allclose(mean_attention_distance(attention[None], LAYOUT)[0], paper_distance(attention),
                               rtol=1e-12)
    stats = per_head_statistics(attention[None], LAYOUT)
    np.testing.assert_allclose(stats["mean_distance"][0], paper_distance(attention), rtol=1e-12)
    np.testing.assert_allclose(stats["mean_distance_with_prefix"][0], paper_distance(attention, False), rtol=1e-12)


# --- position-embedding rows of tables with fewer prefix rows than prefix tokens ------------------------------

@pytest.mark.parametrize("name,extra,rows", [
    ("deit3_small_patch16_224", {}, 0),                          # no_embed_class: no prefix row at all
    ("vit_small_patch14_reg4_dinov2", {"img_size": 70}, 0),      # CLS + 4 registers, no prefix row
    ("vit_base_patch16_224", {}, 1),
])
def test_patch_position_rows_are_the_tables_last_grid_rows(name, extra, rows):
    from vitviz.adapters import adapter_for
    from vitviz.analyses.posembed import patch_position_embeddings

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **(TINY | extra)).eval()
    with torch.no_grad():
        model.pos_embed.normal_()  # every row distinct: an offset of one row shows
    layout = adapter_for(model).layout(model)
    P = layout.num_patches
    assert model.pos_embed.shape[1] == rows + P  # the table this case is about
    np.testing.assert_array_equal(patch_position_embeddings(model, layout), model.pos_embed[0, rows:].detach().numpy())


def test_hf_registers_position_rows_skip_the_one_cls_row_not_five_prefix_rows():
    """transformers' DINOv2 with registers: 5 prefix tokens (CLS + 4 registers) but one prefix row (CLS)."""
    import transformers

    from vitviz.adapters import adapter_for
    from vitviz.analyses.posembed import patch_position_embeddings

    config = transformers.Dinov2WithRegistersConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                    intermediate_size=64, image_size=42, patch_size=14,
                                                    num_register_tokens=4)
    torch.manual_seed(0)
    model = transformers.Dinov2WithRegistersModel(config).eval()
    table = model.embeddings.position_embeddings
    with torch.no_grad():
        table.normal_()
    layout = adapter_for(model).layout(model)
    assert layout.num_prefix_tokens == 5 and table.shape[1] == 1 + 9
    np.testing.assert_array_equal(patch_position_embeddings(model, layout), table[0, 1:].detach().numpy())


# --- patch order with ties on a real-size map --------------------------------------------------------------------

def test_patch_order_breaks_ties_by_raster_index_on_a_real_size_map():
    from vitviz.perturbation.curves import patch_order

    # 16 x 16 with four levels: 64-way ties, where an unstable sort (numpy's default for n > 16) reorders.
    grid = np.random.default_rng(2).integers(0, 4, size=(16, 16)).astype(np.float32) / 4
    values = grid.ravel()
    expected = sorted(range(values.size), key=lambda p: (-values[p], p))
    np.testing.assert_array_equal(patch_order(grid), expected)


# --- k-means inertia against scikit-learn ----------------------------------------------------------------------

def numpy_inertia(points, labels):
    return sum(((points[labels == c] - points[labels == c].mean(0)) ** 2).sum() for c in np.unique(labels))


def test_cluster_inertia_is_scikit_learns_inertia_and_the_labels_its_partition():
    from sklearn.cluster import KMeans

    from vitviz.analyses.clusters import N_INIT, SEED, token_clusters

    rng = np.random.default_rng(4)
    points = np.concatenate([rng.normal(size=(n, 6)) + 4 * rng.normal(size=6) for n in (50, 30, 20)])
    points = points[rng.permutation(len(points))]
    ours = token_clusters(points, (10, 10), 3)
    km = KMeans(n_clusters=3, n_init=N_INIT, random_state=SEED).fit(points)
    # Same partition (labels up to renaming) and the same sum of squared distances (not a mean, not a root).
    pairs = set(zip(ours.labels.ravel().tolist(), km.labels_.tolist()))
    assert len(pairs) == 3, pairs
    # float64 inertia over 100 points x 6 dims, two summation orders: summed(600, EPS64) = 1.3e-13 relative
    assert ours.inertia == pytest.approx(km.inertia_, rel=1e-9)
    assert ours.inertia == pytest.approx(numpy_inertia(points, km.labels_), rel=1e-12)
    np.testing.assert_array_equal(ours.sizes, sorted(np.bincount(km.labels_), reverse=True))


def test_the_overviews_token_maps_are_timms_block_outputs_and_the_received_share_over_uniform(bundled, sample_images):
    """The Overview page's three maps of one image: the patch tokens' output norms of a layer (against timm's own
    blocks run here by hand), the artifact patches and the attention received as a multiple of 1/N (from the
    analysis's own shares: the page's arithmetic only)."""
    from vitviz.analyses.per_image import analyse_images
    from vitviz.sources.preprocess import preprocess

    r = analyse_images(bundled, [sample_images[2].image]).image(0)
    layout, layer = r.layout, 4
    x = preprocess([sample_images[2].image], bundled.data_config).tensor
    with torch.no_grad():
        m = bundled.model
        h = m.norm_pre(m._pos_embed(m.patch_embed(x)))
        for blk in m.blocks[:layer + 1]:
            h = blk(h)
    expected = h[0, layout.num_prefix_tokens:].norm(dim=-1).double().numpy().reshape(layout.grid_size)
    # two float32 forwards of the same blocks (a fused and a hooked path): 1e-5 relative covers their summation orders
    np.testing.assert_allclose(r.norm_map(layer)[0], expected, rtol=1e-5)
    # the artifact patches by their definition: last-layer patch norms above 10x the median (none on this photo; the
    # token-to-patch step is token_patches, tested above)
    last = r.norm_map(len(r.token_norms) - 1)[0].reshape(-1)
    np.testing.assert_array_equal(r.artifact_patches, np.flatnonzero(last > 10 * np.median(last)))
    received = r.sinks.received_map(layout, layer)[0]
    np.testing.assert_allclose(received.reshape(-1), r.sinks.received[layer, layout.num_prefix_tokens:] * layout.num_tokens,
                               rtol=1e-15)
    assert received.shape == layout.grid_size
