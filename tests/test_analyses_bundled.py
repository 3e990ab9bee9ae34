"""The analyses on the real bundled model: what the ViT paper's figures show should show here too."""
import numpy as np
import pytest
from PIL import Image

from conftest import ASSETS
from vitviz.trace import trace_for_analysis as capture
from vitviz.analyses.distance import mean_attention_distance
from vitviz.analyses.filters import patch_filter_pca, patch_filters
from vitviz.sources.preprocess import preprocess
from vitviz.analyses.maps import query_attention_map
from vitviz.analyses.posembed import patch_position_embeddings, position_embedding_similarity
from vitviz.analyses.rollout import rollout

pytestmark = pytest.mark.slow


def test_position_embedding_similarity_is_one_on_the_diagonal_and_falls_with_distance(bundled):
    layout = bundled.layout
    sim = position_embedding_similarity(patch_position_embeddings(bundled.model, layout), layout.grid_size)
    gh, gw = layout.grid_size
    flat = sim.reshape(gh * gw, gh * gw)
    np.testing.assert_allclose(np.diag(flat), 1.0, atol=1e-9)
    c = layout.patch_centres() / layout.patch_size[0]
    dist = np.sqrt(((c[:, None] - c[None]) ** 2).sum(-1))
    # Mean similarity in rings [d, d + 1) patches wide falls ring after ring up to 8 patches away.
    by_distance = [flat[(dist >= d) & (dist < d + 1)].mean() for d in range(0, 9)]
    assert all(a > b for a, b in zip(by_distance, by_distance[1:])), by_distance
    assert np.corrcoef(dist.ravel(), flat.ravel())[0, 1] < -0.3


def test_position_embeddings_resample_to_a_larger_grid(bundled):
    emb = patch_position_embeddings(bundled.model, bundled.layout, grid_size=(24, 24))
    assert emb.shape == (576, 384)
    sim = position_embedding_similarity(emb, (24, 24))
    assert sim[5, 5, 5, 6] > sim[5, 5, 5, 20]


def test_filter_principal_components_explain_decreasing_variance(bundled):
    filters = patch_filters(bundled.model)
    assert filters.shape == (384, 3, 14, 14)
    pca = patch_filter_pca(filters)
    ratios = pca.explained_variance_ratio
    assert len(ratios) == 28 and np.all(np.diff(ratios) < 0)
    assert 0.3 < ratios.sum() < 1.0


@pytest.fixture(scope="module")
def cat_on_flat_background(bundled):
    """The cat photo pasted in the middle of a flat grey square, and which patches it covers."""
    cat = Image.open(ASSETS / "chelsea.jpg").convert("RGB").resize((224, 149))
    canvas = Image.new("RGB", (448, 448), (128, 128, 128))
    mask = Image.new("RGB", (448, 448), (0, 0, 0))
    canvas.paste(cat, (112, 150))
    mask.paste((255, 255, 255), (112, 150, 336, 299))
    batch = preprocess([canvas, mask], bundled.data_config)
    m = np.asarray(batch.images[1], np.float64)[..., 0] / 255
    gh, gw = bundled.layout.grid_size
    ph, pw = bundled.layout.patch_size
    on_object = m.reshape(gh, ph, gw, pw).mean(axis=(1, 3)) > 0.5
    return capture(bundled.model, batch.tensor[:1]), on_object


def test_last_layer_cls_attention_of_most_heads_is_on_the_object(bundled, cat_on_flat_background):
    out, on_object = cat_on_flat_background
    attention = out.stack("attn")[0].numpy()
    assert 0.1 < on_object.mean() < 0.3  # the object is a minority of the image
    heads_on_object = 0
    for head in range(attention.shape[1]):
        grid = query_attention_map(attention, bundled.layout, layer=11, head=head, query="cls")
        heads_on_object += grid[on_object].sum() > grid[~on_object].sum()
    assert heads_on_object >= 4, heads_on_object


def test_real_rollout_and_distance_are_well_formed(bundled, cat_on_flat_background):
    out, _ = cat_on_flat_background
    attention = out.stack("attn")[0].numpy()
    result = rollout(attention, bundled.layout, discard=0.5)
    assert result.per_layer.shape == (12, 16, 16)
    assert result.map.sum() + result.prefix_share["cls"] == pytest.approx(1.0)
    distance = mean_attention_distance(out.stack("attn").numpy(), bundled.layout)[0]
    assert distance.shape == (12, 6) and distance.min() > 0 and distance.max() < 224 * np.sqrt(2)
