"""The explanatory views on Hugging Face transformers ViTs: attention anatomy (and so key clusters) and
the faithfulness score, held against the models' own forwards.

Tiny random models of every family are saved and loaded as in test_hf_hybrid.py. The references are
independent of vitviz's adapter: the output projection's input is read with a hook on a freshly loaded
model with its default (SDPA) attention, and the scores come from that model's own outputs.
"""
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from vitviz.analyses.anatomy import attention_anatomy, layer_qkv, softmax  # noqa: E402
from vitviz.trace import trace_for_analysis as capture  # noqa: E402
from vitviz.perturbation.curves import perturbation_curves, perturbed_at, random_map  # noqa: E402
from vitviz.sources.preprocess import preprocess  # noqa: E402
from vitviz.sources.models import ModelSpec, load_model  # noqa: E402

from test_hf_hybrid import HF_FAMILIES, chelsea, hf_folders  # noqa: E402,F401  (shared fixtures)

HEADLESS = [f for f, spec in HF_FAMILIES.items() if "For" not in spec[1]]
WITH_HEAD = [f for f in HF_FAMILIES if f not in HEADLESS]


def _own_model(family: str, folder: str):
    """The family's class from the folder with transformers' default attention: vitviz's loader is not involved."""
    model = getattr(transformers, HF_FAMILIES[family][1]).from_pretrained(folder).eval()
    assert model.config._attn_implementation == "sdpa"
    return model


def _contexts(model, x: torch.Tensor) -> list[torch.Tensor]:
    """The input of every encoder layer's attention output projection, (B, N, H * d), by hooks on the modules."""
    projections = [m for n, m in model.named_modules()
                   if n.endswith(("o_proj", "out_proj")) and (".layers." in n or ".layer." in n)]
    seen = []
    handles = [p.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().clone()))
               for p in projections]
    try:
        with torch.no_grad():
            model(pixel_values=x)
    finally:
        for h in handles:
            h.remove()
    assert len(seen) == len(projections) == model.config.num_hidden_layers
    return seen


@pytest.mark.parametrize("family", list(HF_FAMILIES))
def test_hf_anatomy_rebuilds_the_captured_attention_and_the_heads_context(family, hf_folders, chelsea):
    folder = hf_folders[family]
    loaded = load_model(ModelSpec(name=folder))
    x = preprocess([chelsea], loaded.data_config).tensor
    attention = capture(loaded.model, x).stack("attn")[0].double().numpy()  # (L, H, N, N)
    contexts = _contexts(_own_model(family, folder), x)
    L, H, N, _ = attention.shape
    for layer in range(L):
        qkv = layer_qkv(loaded.model, x, layer)
        assert qkv.q.shape == qkv.k.shape == qkv.v.shape == (H, N, 16)
        assert qkv.scale == pytest.approx(16 ** -0.5)
        assert qkv.steps and "norm" in qkv.steps[0]
        # BEiT adds its relative position bias to the scaled scores; the other families have no such term.
        assert (qkv.bias is not None) == (family == "beit")
        bias = 0 if qkv.bias is None else qkv.bias
        rows = softmax(qkv.q @ qkv.k.transpose(0, 2, 1) * qkv.scale + bias)  # every row of every head
        np.testing.assert_allclose(rows, attention[layer], rtol=0, atol=1e-6)
        context = contexts[layer][0].double().numpy().reshape(N, H, 16)  # (N, H * d) -> (N, H, d)
        np.testing.assert_allclose(np.einsum("hqk,hkd->qhd", rows, qkv.v), context, rtol=0, atol=1e-5)
        for head, query in ((0, 0), (H - 1, N - 1)):  # the page's step-by-step numbers for one row
            a = attention_anatomy(qkv, head, query)
            np.testing.assert_allclose(a.weights, attention[layer, head, query], rtol=0, atol=1e-6)
            np.testing.assert_allclose(a.output, context[query, head], rtol=0, atol=1e-5)
            # Without the 1/sqrt(d) scaling the row is a different (sharper) distribution: the scale is used.
            assert np.abs(a.unscaled_weights - a.weights).max() > 1e-3


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1))


@pytest.mark.parametrize("family", HEADLESS)
def test_hf_headless_faithfulness_scores_the_pooled_vector_of_the_models_own_forward(family, hf_folders, chelsea):
    """Headless families: cosine of ``pooler_output`` (DINOv2: the CLS token after the final layernorm; CLIP: after
    post_layernorm; SigLIP: its attention-pooling head) with the original's."""
    folder = hf_folders[family]
    loaded = load_model(ModelSpec(name=folder))
    image = preprocess([chelsea], loaded.data_config).tensor[0]
    layout = capture(loaded.model, image[None]).layout
    grid_map = random_map(layout.grid_size, seed=3)
    result = perturbation_curves(loaded.model, image, {"m": grid_map}, layout, fractions=np.array([0.0, 0.4, 1.0]))
    named = "CLS token after the final layernorm" if "dinov2" in family else "pooler_output"
    assert result.target is None and "pre-logits" in result.score and named in result.score
    # The unperturbed input scores 1: cosine of a vector with itself.
    assert result.deletion[0, 0] == pytest.approx(1.0, abs=1e-6)
    assert result.insertion[0, -1] == pytest.approx(1.0, abs=1e-6)

    own = _own_model(family, folder)
    with torch.no_grad():
        reference = own(pixel_values=image[None]).pooler_output[0]
        if "dinov2" in family:  # DINOv2's pooler_output is its CLS token after the final layernorm
            torch.testing.assert_close(reference, own(pixel_values=image[None]).last_hidden_state[0, 0])
        for m, mode in enumerate(("deletion", "insertion")):
            perturbed = perturbed_at(image, grid_map, layout, 0.4)[mode]
            expected = _cosine(own(pixel_values=perturbed[None]).pooler_output[0], reference)
            curve = result.deletion if mode == "deletion" else result.insertion
            assert curve[0, 1] == pytest.approx(expected, abs=1e-5)
            assert expected < 0.9999  # the perturbation moved the vector: the check can fail


@pytest.mark.parametrize("family", WITH_HEAD)
def test_hf_faithfulness_with_a_head_scores_the_class_probability_of_the_models_own_forward(family, hf_folders,
                                                                                         chelsea):
    folder = hf_folders[family]
    loaded = load_model(ModelSpec(name=folder))
    image = preprocess([chelsea], loaded.data_config).tensor[0]
    layout = capture(loaded.model, image[None]).layout
    grid_map = random_map(layout.grid_size, seed=5)
    own = _own_model(family, folder)
    with torch.no_grad():
        probs = own(pixel_values=image[None]).logits[0].softmax(-1)
    target = int(probs.argmin())  # not the default top-1: the target is passed through
    result = perturbation_curves(loaded.model, image, {"m": grid_map}, layout, fractions=np.array([0.0, 0.4, 1.0]),
                                 target=target)
    assert result.target == target and "probability" in result.score
    assert result.deletion[0, 0] == pytest.approx(float(probs[target]), abs=1e-6)
    with torch.no_grad():
        perturbed = perturbed_at(image, grid_map, layout, 0.4)["deletion"]
        expected = float(own(pixel_values=perturbed[None]).logits[0].softmax(-1)[target])
    assert result.deletion[0, 1] == pytest.approx(expected, abs=1e-6)
    assert abs(expected - float(probs[target])) > 1e-6


@pytest.mark.slow
def test_app_explanations_of_an_hf_model_key_clusters_and_its_own_class_names(hf_folders):
    from streamlit.testing.v1 import AppTest

    from test_app import APP

    at = AppTest.from_file(APP, default_timeout=180).run()
    at.sidebar.selectbox(key="model_choice").set_value("Hugging Face (hub id or local folder)").run()
    at.sidebar.text_input(key="hf_name").input(hf_folders["vit"]).run()  # id2label: "thing 0" ... "thing 4"
    at.switch_page("pages/1_overview.py").run()
    at.selectbox(key="cluster_source").set_value("keys of one head").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    for page, key in (("pages/3_rollout.py", "target"), ("pages/8_faithfulness.py", "faith_target")):
        at.switch_page(page).run()
        assert not at.exception, (page, [e.message for e in at.exception])
        options = at.selectbox(key=key).options
        assert len(options) == 5 and all(": thing " in o for o in options), (page, options)
