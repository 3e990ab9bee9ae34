"""Attribution on Hugging Face transformers ViTs, loaded the way users load them (``save_pretrained`` folders,
test_hf_hybrid.py's fixtures), against references from outside vitviz: the library's own forward and autograd,
lxt 2.1's rules applied to a transformers ViT in its own process, and a planted model."""
import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attribution_names as A  # noqa: E402
from vitviz.adapters import Hooks, adapter_for, point_name, run  # noqa: E402
from vitviz.sources.models import ModelSpec, load_model  # noqa: E402

from test_hf_hybrid import HF_FAMILIES, _save_hf, hf_folders  # noqa: E402,F401  (shared fixtures)


def _models(folder: str, family: str):
    """(vitviz's model, the library's own copy with its default SDPA attention), both float64.

    The library's copy is frozen like vitviz's loaded models (gradients are taken with respect to the input only):
    with trainable weights, a backward through BEiT's relative position bias saves transformers' process-wide
    cached position index, which fails whenever another test first built that index under inference mode (found
    by a pytest-randomly order)."""
    ours = copy.deepcopy(load_model(ModelSpec(name=folder)).model).double()
    own = getattr(transformers, HF_FAMILIES[family][1]).from_pretrained(folder).double().eval().requires_grad_(False)
    assert own.config._attn_implementation == "sdpa"
    return ours, own


def _input(model, n: int = 2, seed: int = 2) -> torch.Tensor:
    side = model.config.image_size
    torch.manual_seed(seed)
    return torch.randn(n, 3, side, side, dtype=torch.float64)


@pytest.mark.parametrize("family", list(HF_FAMILIES))
def test_readout_of_the_last_layer_is_the_librarys_output(family, hf_folders):  # noqa: F811
    """readout (final norm and head) applied to the last block's tokens gives the library's own logits, or its
    pooler_output for a headless model; every method then runs and returns one map per image."""
    ours, own = _models(hf_folders[family], family)
    x = _input(own)
    adapter = adapter_for(ours)
    last = point_name("resid_post", adapter.num_layers(ours) - 1)
    point = "logits" if adapter.num_classes(ours) else "pooled"
    with torch.no_grad():
        tokens = run(ours, x, keep=(last,))[last]
        hooks = Hooks(keep=(point,))
        adapter.readout(ours, tokens, hooks)
        out = own(pixel_values=x)
    ref = out.logits if point == "logits" else out.pooler_output
    if family == "siglip":  # SiglipVisionModel's pooler_output is its attention-pooling head, as ours
        assert adapter.pooled_text(ours).startswith("pooler_output")
    # float64, the spelled-out forward vs the library's SDPA forward: rounding only (~1e-16 relative)
    assert float((hooks.kept[point] - ref).abs().max()) <= 1e-12 * float(ref.abs().max())
    assert A.why_not(ours) is None
    layout = adapter.layout(ours, tuple(x.shape[-2:]))
    for method in A.METHODS:
        assert A.attribute(ours, x, method).patches.shape == (2, *layout.grid_size)


@pytest.mark.parametrize("family", list(HF_FAMILIES))
def test_rules_off_equal_autograd_gradient_times_input_of_the_library(family, hf_folders):  # noqa: F811
    """Gradient × Input with the rules off equals autograd through the library's own model: the logit of the top-1
    class, or for a headless model the projection of pooler_output on its own direction.

    The library's model runs its default SDPA attention, which in float64 computes the softmax in float64: the two
    sides compute the same function in a different order, ~1e-15 of the largest relevance (measured up to 1.1e-14
    on DINOv2), asserted at 1e-12. Eager attention would not allow this: transformers' eager_attention_forward takes
    the softmax in float32 even in a float64 model, a relative error of 2^-24 ≈ 6e-8 on every probability, which
    bounds the agreement at ~1e-7 of the largest relevance."""
    ours, own = _models(hf_folders[family], family)
    x = _input(own)
    got = A.relevance(ours, x, "gradient")
    xr = x.clone().requires_grad_(True)
    out = own(pixel_values=xr)
    if hasattr(out, "logits"):
        score = out.logits.gather(1, out.logits.argmax(-1, keepdim=True))[:, 0]
    else:
        pooled = out.pooler_output
        score = (pooled * pooled.detach()).sum(-1) / pooled.detach().norm(dim=-1)
    (grad,) = torch.autograd.grad(score.sum(), xr)
    ref = (x * grad).sum(1).numpy()
    assert np.abs(got.pixels - ref).max() <= 1e-12 * np.abs(ref).max()
    np.testing.assert_allclose(got.target_value, score.detach().numpy(), rtol=1e-12)
    # the rules act on this family's forward: AttnLRP's map is not the plain gradient's
    lrp = A.relevance(ours, x, "attnlrp")
    np.testing.assert_allclose(lrp.target_value, got.target_value, rtol=1e-12)
    assert np.abs(lrp.pixels - got.pixels).max() > 1e-3 * np.abs(ref).max()


ABSORBING = ("cls_token", "class_embedding", "distillation_token", "register_tokens", "position_embedding", "mask_token")


@pytest.mark.parametrize("family", list(HF_FAMILIES))
def test_cp_lrp_conserves_the_target_when_nothing_absorbs_it(family, hf_folders):  # noqa: F811
    """With every bias, the prefix tokens and the position table zeroed, only the pixels can receive relevance (BEiT's
    relative position biases and DINOv3's rotary embedding act inside the softmax, which CP-LRP holds constant; the
    target, a logit or the projection of the pooled vector, is linear in the head's input): CP-LRP's pixel relevance
    then sums to the target, which holds only if every norm (CLIP's pre_layrnorm, the blocks', the final and the
    pooling heads') and every activation runs through the rules. Float64; the identity rule's 1e-10 epsilon moves
    each activation's share by ~1e-10 relative (measured up to 3.4e-10), asserted at 1e-8."""
    ours, _ = _models(hf_folders[family], family)
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith("bias") or any(k in name for k in ABSORBING):
                p.zero_()
    r = A.relevance(ours, _input(ours, seed=3), "cp-lrp")
    np.testing.assert_allclose(r.pixel_sum, r.target_value, rtol=1e-8)


@pytest.mark.parametrize("method", ["attnlrp", "cp-lrp"])
def test_relevance_equals_lxt_on_a_transformers_vit(method, hf_folders, tmp_path):  # noqa: F811
    """AttnLRP and CP-LRP on a transformers ViT against lxt 2.1's own rules patched into the same library model
    (its LayerNorm, GELU and attention wrappers), run in a fresh interpreter (lxt patches classes globally).
    Float64 on both sides with SDPA attention (softmax in float64): the same products in another order, ~1e-15 of
    the largest relevance; 1e-5 is the issue's bound."""
    pytest.importorskip("lxt", reason="lxt 2.1 is a test dependency (scripts/ensure_venv.sh --dev installs it)")
    folder = hf_folders["vit"]
    ours, _ = _models(folder, "vit")
    x, classes = _input(ours), [3, 1]
    src, dst = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({"folder": folder, "input": x, "classes": torch.tensor(classes)}, src)
    subprocess.run([sys.executable, str(Path(__file__).with_name("lxt_reference.py")), method, str(src), str(dst)],
                   check=True, timeout=600)
    ref = torch.load(dst, weights_only=True)["pixels"]
    got = torch.cat([torch.from_numpy(A.relevance(ours, x[i:i + 1], method, A.ClassLogit(c)).pixels)
                     for i, c in enumerate(classes)])
    scale = ref.abs().max().item()
    assert (got - ref).abs().max().item() <= 1e-5 * scale
    plain = torch.cat([torch.from_numpy(A.relevance(ours, x[i:i + 1], "gradient", A.ClassLogit(c)).pixels)
                       for i, c in enumerate(classes)])
    assert (plain - ref).abs().max().item() > 1e-2 * scale  # the rules matter: the plain gradient is far off


PLANTED = [(0, 1), (2, 3), (3, 0)]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A tiny transformers ViT whose patch tokens start as zero vectors wherever the input is zero (position
    embedding and patch-embedding bias zeroed, saved with save_pretrained and loaded as users load it): with a
    zero background, only the planted patches carry anything into the output."""
    folder = tmp_path_factory.mktemp("planted")
    _save_hf(folder, "vit", seed=5)
    model = transformers.ViTForImageClassification.from_pretrained(folder)
    with torch.no_grad():
        model.vit.embeddings.position_embeddings.zero_()
        model.vit.embeddings.patch_embeddings.projection.bias.zero_()
    model.save_pretrained(folder)
    model = copy.deepcopy(load_model(ModelSpec(name=str(folder))).model).double()
    torch.manual_seed(6)
    x = torch.zeros(1, 3, 64, 64, dtype=torch.float64)
    pattern = torch.randn(3, 16, 16, dtype=torch.float64) * 2
    for r, c in PLANTED:
        x[0, :, 16 * r:16 * r + 16, 16 * c:16 * c + 16] = pattern
    return model, x


@pytest.mark.parametrize("method", A.METHODS)
def test_every_method_ranks_the_planted_patches_first(method, planted):
    model, x = planted
    with torch.no_grad():  # the class the planted patches push up the most
        cls = int((model(pixel_values=x).logits - model(pixel_values=torch.zeros_like(x)).logits).argmax())
    grid = A.attribute(model, x, method, A.ClassLogit(cls)).patches[0]
    top = {divmod(int(i), 4) for i in np.argsort(-grid.ravel(), kind="stable")[:len(PLANTED)]}
    assert top == set(PLANTED)


@pytest.mark.slow
def test_attribution_page_with_an_hf_folder_shows_the_librarys_maps(hf_folders):  # noqa: F811
    """The Attribution page through AppTest with a transformers ViT folder chosen in the sidebar: no exception or
    sentence of refusal, the title states the logit target, and the AttnLRP and LeGrad maps drawn equal the library's
    on the same input (float32 model: the page and this call run the same code, 1e-5 of the largest value)."""
    import base64
    import json

    from streamlit.testing.v1 import AppTest

    from conftest import ASSETS
    from test_app import APP
    from ui.state import SAMPLES
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess

    at = AppTest.from_file(APP, default_timeout=300).run()
    at.sidebar.selectbox(key="model_choice").set_value("Hugging Face (hub id or local folder)").run()
    at.sidebar.text_input(key="hf_name").input(hf_folders["vit"]).run()
    at.switch_page("pages/10_attribution.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert not [i.value for i in at.info], "the page refused the model"
    charts = {c.proto.id: json.loads(c.proto.spec) for c in at.get("plotly_chart")}
    maps = next(spec for key, spec in charts.items() if "attr_maps" in key)
    assert "logit of class" in maps["layout"]["title"]["text"]
    assert any("attr_conservation" in key for key in charts)

    def z(trace):
        v = trace["z"]
        if isinstance(v, dict):
            shape = [int(n) for n in str(v["shape"]).split(",")]
            return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).reshape(shape)
        return np.array(v, dtype=float)

    heatmaps = [t for t in maps["data"] if t["type"] == "heatmap"]
    assert len(heatmaps) == 3  # attnlrp, legrad, gradcam by default
    loaded = load_model(ModelSpec(name=hf_folders["vit"]))
    x = preprocess([load_image(ASSETS / SAMPLES[0]).image], loaded.data_config).tensor
    ref = A.relevance(loaded.model, x, "attnlrp").patches[0]  # default target: the top-1 logit, as the page's
    np.testing.assert_allclose(z(heatmaps[0])[::-1], ref, atol=1e-5 * np.abs(ref).max())
    ref = A.legrad(loaded.model, x).patches[0]
    np.testing.assert_allclose(z(heatmaps[1])[::-1], ref, atol=1e-5)


def test_beit_attribution_after_an_inference_mode_analysis_in_the_same_process(hf_folders):  # noqa: F811
    """The app analyses an image under ``torch.inference_mode`` and later runs attribution on the same model in the
    same server process. transformers caches BEiT's relative position index per window size, process-wide
    (``lru_cache``): an index first built under inference mode is an inference tensor, and a later backward through
    the bias indexing fails ("Inference tensors cannot be saved for backward"). A window size no other test uses
    (6 x 9 patches), so the inference-mode run is the first to build its index; the attribution that follows must run
    and read out the same logit (float64: the two forwards are the same arithmetic, ~1e-15 apart). It runs because
    loaded models are frozen (no weight needs the index for its gradient): loading with trainable weights fails it."""
    ours, _ = _models(hf_folders["beit"], "beit")
    torch.manual_seed(3)
    x = torch.randn(1, 3, 96, 144, dtype=torch.float64)
    with torch.inference_mode():
        logits = run(ours, x, keep=("logits",))["logits"]
    got = A.relevance(ours, x, "gradient")
    assert got.pixels.shape == (1, 96, 144) and np.isfinite(got.pixels).all()
    np.testing.assert_allclose(got.target_value, logits.max(-1).values.numpy(), rtol=1e-12)
