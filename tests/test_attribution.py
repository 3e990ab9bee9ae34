"""Attribution (vitviz.explainers.attribution) against outside references: lxt 2.1 in its own process, pytorch-grad-cam,
a transcription of LeGrad's reference formula, autograd, finite differences and a planted model."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch

from conftest import tiny_model
import attribution_names as A
from vitviz.adapters import adapter_for, run

TV_CONFIG = dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=10)


def _randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # torchvision zeroes the head and class token: randomise so a wrong rule shows
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.fixture(scope="module")
def tv_vit():
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return _randomise(VisionTransformer(**TV_CONFIG)).double()


@pytest.fixture(scope="module")
def vit64():
    return tiny_model("vit_augreg").double()


def _lxt_pixels(model, x: torch.Tensor, classes: list[int], method: str, tmp_path: Path) -> torch.Tensor:
    """lxt's relevance per pixel, computed in a fresh interpreter (lxt patches torch classes globally)."""
    pytest.importorskip("lxt", reason="lxt 2.1 is a test dependency (scripts/ensure_venv.sh --dev installs it)")
    src, dst = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({"config": TV_CONFIG, "state_dict": model.state_dict(), "input": x, "classes": torch.tensor(classes)},
               src)
    subprocess.run([sys.executable, str(Path(__file__).with_name("lxt_reference.py")), method, str(src), str(dst)],
                   check=True, timeout=600)
    return torch.load(dst, weights_only=True)["pixels"]


def test_torchvision_adapter_equals_torchvision_forward(tv_vit):
    """Logits equal torchvision's forward; each layer's probabilities equal its MultiheadAttention's per-head
    weights (need_weights=True) on the same block input; an identity edit changes nothing."""
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        ref = tv_vit(x)
        out = run(tv_vit, x, keep=("logits", "blocks.*.resid_pre", "blocks.*.attn"))
        edited = run(tv_vit, x, keep=("logits",), edit={"blocks.*.attn": lambda v, p: v})["logits"]
        for i, blk in enumerate(tv_vit.encoder.layers):
            h = blk.ln_1(out[f"blocks.{i}.resid_pre"])
            _, weights = blk.self_attention(h, h, h, need_weights=True, average_attn_weights=False)
            assert torch.allclose(out[f"blocks.{i}.attn"], weights, rtol=0, atol=1e-12)
    # float64, the same operations in another order: rounding ~1e-16 of the logits' scale
    assert torch.allclose(out["logits"], ref, rtol=0, atol=1e-12 * ref.abs().max().item())
    assert torch.equal(edited, out["logits"])


@pytest.mark.parametrize("method", ["cp-lrp", "attnlrp"])
def test_relevance_equals_lxt(tv_vit, method, tmp_path):
    """CP-LRP against lxt's own map for torchvision's ViT; AttnLRP against lxt's rules (its LayerNorm, GELU and
    attention q/k/v patches) on the same model. Float64 on both sides: the two compute the same products in a
    different order, so they agree to ~1e-15 of the largest relevance; 1e-5 is the issue's bound."""
    torch.manual_seed(1)
    x, classes = torch.randn(2, 3, 32, 32, dtype=torch.float64), [3, 5]
    ref = _lxt_pixels(tv_vit, x, classes, method, tmp_path)
    got = torch.cat([torch.from_numpy(A.relevance(tv_vit, x[i:i + 1], method, A.ClassLogit(c)).pixels)
                     for i, c in enumerate(classes)])
    scale = ref.abs().max().item()
    assert (got - ref).abs().max().item() <= 1e-5 * scale
    plain = torch.cat([torch.from_numpy(A.relevance(tv_vit, x[i:i + 1], "gradient", A.ClassLogit(c)).pixels)
                       for i, c in enumerate(classes)])
    assert (plain - ref).abs().max().item() > 1e-2 * scale  # the rules matter: the plain gradient is far off


@pytest.mark.parametrize("family", ["vit_augreg", "dinov2_reg"])
def test_rules_off_equal_autograd_gradient_times_input(family):
    model = tiny_model(family).double()
    torch.manual_seed(2)
    x = torch.randn(2, 3, *model.patch_embed.img_size, dtype=torch.float64)
    got = A.relevance(model, x, "gradient")
    xr = x.clone().requires_grad_(True)
    out = model(xr)  # timm's own (fused) forward
    if model.num_classes:
        score = out.gather(1, out.argmax(-1, keepdim=True))[:, 0]
    else:
        pooled = model.forward_head(model.forward_features(xr), pre_logits=True)
        score = (pooled * pooled.detach()).sum(-1) / pooled.detach().norm(dim=-1)
    (grad,) = torch.autograd.grad(score.sum(), xr)
    ref = (x * grad).sum(1).numpy()
    # float64; timm's fused attention vs the spelled-out softmax differ by rounding only (~1e-16 relative)
    assert np.abs(got.pixels - ref).max() <= 1e-12 * np.abs(ref).max()
    np.testing.assert_allclose(got.target_value, score.detach().numpy(), rtol=1e-12)


def test_rules_change_gradients_not_values(vit64):
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    values = [A.relevance(vit64, x, m).target_value for m in ("gradient", "attnlrp", "cp-lrp")]
    np.testing.assert_allclose(values[1], values[0], rtol=1e-12)
    np.testing.assert_allclose(values[2], values[0], rtol=1e-12)


def test_patch_map_is_the_pixel_sum_per_patch(vit64):
    r = A.relevance(vit64, torch.randn(1, 3, 64, 64, dtype=torch.float64), "attnlrp")
    p = r.pixels[0]
    assert r.patches.shape == (1, 4, 4)
    assert r.patches[0, 1, 2] == pytest.approx(p[16:32, 32:48].sum(), rel=1e-12)
    assert r.patches.sum() == pytest.approx(r.pixel_sum[0], rel=1e-12)


def test_gradcam_equals_pytorch_grad_cam(vit64):
    """pytorch-grad-cam's ViT recipe (target layer blocks[-1].norm1, reshape_transform dropping the CLS token)
    on timm's own forward. Its output is min-max scaled twice (eps 1e-7 in the denominator) and cast to
    float32: compare ours scaled the same way, to float32 rounding (~6e-8 of values <= 1)."""
    gc = pytest.importorskip("pytorch_grad_cam", reason="grad-cam 1.5.7 is a test dependency")
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    def reshape_transform(tensor, height=4, width=4):
        result = tensor[:, 1:, :].reshape(tensor.size(0), height, width, tensor.size(2))
        return result.transpose(2, 3).transpose(1, 2)

    torch.manual_seed(3)
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    cam = gc.GradCAM(model=vit64, target_layers=[vit64.blocks[-1].norm1], reshape_transform=reshape_transform)
    cam.get_target_width_height = lambda input_tensor: (4, 4)  # stay on the grid (cv2 resizes to the same size)
    ref = cam(input_tensor=x, targets=[ClassifierOutputTarget(7), ClassifierOutputTarget(7)])
    got = A.gradcam(vit64, x, A.ClassLogit(7)).patches
    for _ in range(2):  # scale_cam_image per layer, then again over the (one) layer's aggregate
        got = got - got.reshape(2, -1).min(-1)[:, None, None]
        got = got / (1e-7 + got.reshape(2, -1).max(-1)[:, None, None])
    np.testing.assert_allclose(got, ref, atol=1e-6)


def _legrad_transcribed(model, x, cls: int, layers) -> np.ndarray:
    """LeGrad as its reference code writes it (WalBouss/LeGrad wrapper.py compute_legrad_clip), on timm's own
    unfused attention: per layer, the block's output through the final norm and head, the gradient w.r.t. that
    block's attention map, clamp(min=0), mean over heads then over query rows, [:, 1:], summed; min-max."""
    import copy

    ref = copy.deepcopy(model)
    maps, feats = {}, {}
    for i, blk in enumerate(ref.blocks):
        blk.attn.fused_attn = False
        blk.attn.attn_drop.register_forward_hook(lambda m, inp, out, i=i: maps.__setitem__(i, out))
        blk.register_forward_hook(lambda m, inp, out, i=i: feats.__setitem__(i, out))
    x = x.clone().requires_grad_(True)
    ref(x)
    accum = 0
    for layer in layers:
        score = ref.forward_head(ref.norm(feats[layer]))[:, cls].sum()
        grad = torch.autograd.grad(score, [maps[layer]], retain_graph=True)[0]
        grad = torch.clamp(grad, min=0.)
        accum = accum + grad.mean(dim=1).mean(dim=1)[:, 1:]
    accum = (accum - accum.min()) / (accum.max() - accum.min())
    return accum.reshape(-1, 4, 4).detach().numpy()


@pytest.mark.parametrize("layers", [None, range(0, 2)])
def test_legrad_equals_reference_formula(vit64, layers):
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    ref = _legrad_transcribed(vit64, x, 5, layers or range(0, 2))  # depth 2: the default last two = both
    got = A.legrad(vit64, x, A.ClassLogit(5), layers=layers).patches
    np.testing.assert_allclose(got, ref, atol=1e-12)  # float64, values in [0, 1]


def test_legrad_last_layer_only_differs(vit64):
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    both = A.legrad(vit64, x, A.ClassLogit(5)).patches
    last = A.legrad(vit64, x, A.ClassLogit(5), layers=range(1, 2)).patches
    np.testing.assert_allclose(last, _legrad_transcribed(vit64, x, 5, range(1, 2)), atol=1e-12)
    assert np.abs(both - last).max() > 1e-3


def test_projection_gradient_matches_finite_differences():
    """Headless model: s(x) = <p(x), p(x0)>/||p(x0)||. The pixels' total Gradient x Input is the derivative
    of s along the input itself, d/dh s((1 + h) x0) at h = 0; a central difference with h = 1e-5 in float64 has
    truncation error ~h^2 * s''' and rounding ~1e-16 * s / h, both far below 1e-7 of s."""
    model = tiny_model("dino").double()
    torch.manual_seed(4)
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    r = A.relevance(model, x, "gradient")
    assert isinstance(r.target, A.Projection) and r.target.describe()["kind"] == "projection"
    h = 1e-5
    with torch.no_grad():
        s = [r.target(run(model, (1 + d) * x, keep=("pooled",))).item() for d in (h, -h)]
    fd = (s[0] - s[1]) / (2 * h)
    assert r.pixel_sum[0] == pytest.approx(fd, rel=1e-7)
    assert r.target_value[0] == pytest.approx(torch.linalg.vector_norm(r.target.reference).item(), rel=1e-12)


def _planted_model():
    """A tiny ViT whose tokens start as zero vectors wherever the input is zero (no position embedding, no
    patch-embedding bias): with a zero background, only the planted patches carry anything into the output."""
    model = tiny_model("vit_augreg", seed=5).double()
    with torch.no_grad():
        model.pos_embed.zero_()
        model.patch_embed.proj.bias.zero_()
    return model


PLANTED = [(0, 1), (2, 3), (3, 0)]


def _planted_input():
    torch.manual_seed(6)
    x = torch.zeros(1, 3, 64, 64, dtype=torch.float64)
    pattern = torch.randn(3, 16, 16, dtype=torch.float64) * 2
    for r, c in PLANTED:
        x[0, :, 16 * r:16 * r + 16, 16 * c:16 * c + 16] = pattern
    return x


@pytest.mark.parametrize("method", A.METHODS)
def test_every_method_ranks_the_planted_patches_first(method):
    model, x = _planted_model(), _planted_input()
    with torch.no_grad():  # the class the planted patches push up the most
        cls = int((model(x) - model(torch.zeros_like(x))).argmax())
    grid = A.attribute(model, x, method, A.ClassLogit(cls)).patches[0]
    top = {divmod(int(i), 4) for i in np.argsort(-grid.ravel(), kind="stable")[:len(PLANTED)]}
    assert top == set(PLANTED)


def test_default_target_is_top1_logit(vit64):
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    r = A.relevance(vit64, x, "attnlrp")
    with torch.no_grad():
        logits = vit64(x)
    assert list(r.target.classes) == logits.argmax(-1).tolist()
    np.testing.assert_allclose(r.target_value, logits.max(-1).values.numpy(), rtol=1e-12)
    assert r.target.describe()["kind"] == "logit"


def _swin(seed: int = 0, num_classes: int = 5) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, depths=(2, 2), num_heads=(2, 4),
                              embed_dim=32, img_size=56, window_size=7, num_classes=num_classes)
    with torch.no_grad():  # random init leaves biases at 0: make a wrong forward show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval().double()


def test_swin_rules_off_equal_autograd_gradient_times_input():
    """timm Swin (two stages: shifted windows, patch merging): Gradient x Input with the rules off equals autograd
    through timm's own forward. Float64, the same operations: rounding only, asserted at 1e-12 (measured 0)."""
    model = _swin()
    torch.manual_seed(2)
    x = torch.randn(2, 3, 56, 56, dtype=torch.float64)
    got = A.relevance(model, x, "gradient")
    xr = x.clone().requires_grad_(True)
    out = model(xr)
    score = out.gather(1, out.argmax(-1, keepdim=True))[:, 0]
    (grad,) = torch.autograd.grad(score.sum(), xr)
    ref = (x * grad).sum(1).numpy()
    assert np.abs(got.pixels - ref).max() <= 1e-12 * np.abs(ref).max()
    np.testing.assert_allclose(got.target_value, score.detach().numpy(), rtol=1e-12)
    assert got.patches.shape == (2, 14, 14)  # the stage-1 patch grid: 4-pixel patches of the 56-pixel input
    np.testing.assert_allclose(got.patches, A.patch_sums(torch.from_numpy(got.pixels), adapter_for(model).layout(
        model, (56, 56))).numpy(), rtol=0, atol=1e-15)


def test_swin_cp_lrp_conserves_the_target_when_nothing_absorbs_it():
    """With every bias zeroed a Swin has nothing but the pixels to give relevance to (no CLS token, no absolute
    position table; the relative position bias and shift mask sit inside the softmax, which CP-LRP holds constant):
    CP-LRP's pixel relevance then sums to the logit exactly, which it does only if every LayerNorm (patch embedding,
    blocks, patch merging, final) and GELU runs through the rules. Float64; the identity rule's 1e-10 epsilon moves
    each GELU's share by ~1e-10 relative, asserted at 1e-8. The plain gradient does not conserve (measured ~1e-6 of
    the logit on the pixels)."""
    model = _swin(seed=3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    torch.manual_seed(4)
    x = torch.randn(2, 3, 56, 56, dtype=torch.float64)
    r = A.relevance(model, x, "cp-lrp")
    np.testing.assert_allclose(r.pixel_sum, r.target_value, rtol=1e-8)
    plain = A.relevance(model, x, "gradient")
    assert np.all(np.abs(plain.pixel_sum - plain.target_value) > 0.1 * np.abs(plain.target_value))
    lrp = A.relevance(model, x, "attnlrp")  # the softmax's true Jacobian does not conserve: close, not equal
    assert np.all(np.abs(lrp.pixel_sum - lrp.target_value) < 0.5 * np.abs(lrp.target_value))


def _hf_swin(version: str, size: int) -> torch.nn.Module:
    """A tiny random transformers Swin V1 or V2 classifier (two stages, 4x4 windows; 72 px: padded windows)."""
    import transformers

    config, model = {"v1": ("SwinConfig", "SwinForImageClassification"),
                     "v2": ("Swinv2Config", "Swinv2ForImageClassification")}[version]
    torch.manual_seed(0)
    model = getattr(transformers, model)(getattr(transformers, config)(
        image_size=size, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4, num_labels=3))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval().double()


@pytest.mark.parametrize("version,size", [("v1", 56), ("v1", 72), ("v2", 72)])
def test_hf_swin_rules_off_equal_autograd_and_cp_lrp_conserves(version, size):
    """transformers Swin V1/V2 (patch merging spelled out; V2: reduction before its norm): Gradient x Input with the
    rules off equals autograd through the library's forward (float64, rounding only: measured <= 3e-15, asserted
    1e-12); with every bias and the position terms zeroed, CP-LRP's pixel relevance sums to the logit (as for timm's
    Swin: every norm through the rules; 1e-8 for the identity rule's epsilon)."""
    model = _hf_swin(version, size)
    torch.manual_seed(2)
    x = torch.randn(2, 3, size, size, dtype=torch.float64)
    got = A.relevance(model, x, "gradient")
    xr = x.clone().requires_grad_(True)
    out = model(pixel_values=xr).logits
    score = out.gather(1, out.argmax(-1, keepdim=True))[:, 0]
    (grad,) = torch.autograd.grad(score.sum(), xr)
    ref = (x * grad).sum(1).numpy()
    assert np.abs(got.pixels - ref).max() <= 1e-12 * np.abs(ref).max()
    assert got.patches.shape == (2, size // 4, size // 4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "position_embeddings" in name:
                p.zero_()
    r = A.relevance(model, x, "cp-lrp")
    np.testing.assert_allclose(r.pixel_sum, r.target_value, rtol=1e-8)


def test_window_models_offer_every_method():
    """Swin (timm and transformers V1/V2): every method applies (LeGrad and Grad-CAM on windows:
    tests/test_attribution_swin.py), with no refusal sentence."""
    for model in (_swin(), _hf_swin("v1", 56), _hf_swin("v2", 72)):
        assert A.why_not(model) is None
        assert A.methods_for(model) == (list(A.METHODS), {})


def test_unknown_method_is_one_sentence():
    from vitviz.explainers import parse_methods

    with pytest.raises(ValueError, match="choose from"):
        parse_methods("attnlrp,shap")
    assert parse_methods("AttnLRP, cp-lrp,attnlrp") == ["attnlrp", "cp-lrp"]


def test_cli_writes_attribution_arrays_and_target(tmp_path):
    """analyze --attribution on a classifier saved the way users save it: the npz's maps equal the library's own
    call on the npz's exact input, and settings.json states the target."""
    import json

    from safetensors.torch import save_file

    from conftest import ASSETS
    from vitviz.cli import main

    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=64).eval()
    weights = tmp_path / "deit.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    out = tmp_path / "out"
    assert main(["analyze", str(ASSETS / "rocket.jpg"), str(ASSETS / "coffee.jpg"), "--model",
                 "deit_tiny_distilled_patch16_224", "--checkpoint", str(weights), "--img-size", "64", "--out", str(out),
                 "--attribution", "attnlrp,cp-lrp,legrad,gradcam", "--target-class", "3", "--no-attention"]) == 0
    data = np.load(out / "analysis.npz")
    for key in ("attribution_attnlrp", "attribution_cp_lrp", "attribution_legrad", "attribution_gradcam"):
        assert data[key].shape == (2, 4, 4)
    assert data["attribution_attnlrp_pixels"].shape == data["attribution_cp_lrp_pixels"].shape == (2, 64, 64)
    assert "attribution_legrad_pixels" not in data.files
    ref = A.relevance(model, torch.from_numpy(data["input"]), "attnlrp", A.ClassLogit(3)).pixels
    np.testing.assert_allclose(data["attribution_attnlrp_pixels"], ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    settings = json.loads((out / "settings.json").read_text())["analysis"]["attribution"]
    assert settings["target"]["kind"] == "logit" and settings["target"]["class"] == 3
    assert settings["target"]["classes"] == [3, 3]
    assert len(settings["conservation"]["attnlrp"]) == 2


def test_cli_headless_target_is_the_projection(tmp_path, bundled):
    import json

    from conftest import ASSETS
    from vitviz.cli import main

    out = tmp_path / "out"
    assert main(["analyze", str(ASSETS / "chelsea.jpg"), "--out", str(out), "--attribution", "attnlrp",
                 "--no-attention"]) == 0
    data = np.load(out / "analysis.npz")
    assert data["attribution_attnlrp"].shape == (1, 16, 16)
    assert data["attribution_attnlrp_pixels"].shape == (1, 224, 224)
    target = json.loads((out / "settings.json").read_text())["analysis"]["attribution"]["target"]
    assert target["kind"] == "projection"


def test_cli_unknown_attribution_method_is_one_sentence(tmp_path, capsys):
    from conftest import ASSETS
    from vitviz.cli import main

    assert main(["analyze", str(ASSETS / "chelsea.jpg"), "--out", str(tmp_path / "o"), "--attribution", "shap"]) == 2
    err = capsys.readouterr().err
    assert "unknown method shap" in err and "Traceback" not in err


@pytest.mark.slow
def test_attribution_page_shows_the_librarys_maps_and_the_target(bundled, sample_images):
    """The page through AppTest on the bundled model and the default image: the maps drawn equal the library's
    on the same input, the title states the target, the conservation figure is there."""
    import base64
    import json

    from streamlit.testing.v1 import AppTest

    from vitviz.sources.preprocess import preprocess

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"), default_timeout=300).run()
    at.switch_page("pages/10_attribution.py").run()
    assert not at.exception, [e.message for e in at.exception]
    charts = {c.proto.id: json.loads(c.proto.spec) for c in at.get("plotly_chart")}
    maps = next(spec for key, spec in charts.items() if "attr_maps" in key)
    assert "projection" in maps["layout"]["title"]["text"]
    assert any("attr_conservation" in key for key in charts)
    labels = [b.proto.label for b in at.get("download_button")]
    assert {"Figure (png)", "Figure (svg)", "Figure (pdf)", "Chart (svg)", "Chart (pdf)"} <= set(labels)

    def z(trace):
        v = trace["z"]
        if isinstance(v, dict):
            shape = [int(n) for n in str(v["shape"]).split(",")]
            return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).reshape(shape)
        return np.array(v, dtype=float)

    heatmaps = [t for t in maps["data"] if t["type"] == "heatmap"]
    assert len(heatmaps) == 3  # attnlrp, legrad, gradcam by default
    from ui.state import SAMPLES  # the page's image when nothing is uploaded: the first sample photo

    first = next(im for im in sample_images if im.name == SAMPLES[0])
    x = preprocess([first.image], bundled.data_config).tensor
    ref = A.legrad(bundled.model, x).patches[0]
    np.testing.assert_allclose(z(heatmaps[1])[::-1], ref, atol=1e-6)
    ref = A.relevance(bundled.model, x, "attnlrp").patches[0]  # the page's default: patch maps
    np.testing.assert_allclose(z(heatmaps[0])[::-1], ref, atol=1e-5 * np.abs(ref).max())


def test_families_without_a_readout_are_refused_with_a_sentence(monkeypatch):
    """A family whose head cannot read a layer's tokens (no readout) is refused with a sentence instead of returning
    a plain gradient under AttnLRP's name; Hugging Face ViTs now have one (tests/test_attribution_hf.py)."""
    from transformers import ViTConfig, ViTForImageClassification

    from vitviz.adapters import Adapter, adapter_for

    model = ViTForImageClassification(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                intermediate_size=64, image_size=32, patch_size=8,
                                                num_labels=3)).eval()
    assert A.why_not(model) is None and A.why_not(tiny_model("vit_augreg")) is None
    monkeypatch.setattr(type(adapter_for(model)), "readout", Adapter.readout)
    assert "not supported yet" in A.why_not(model)
    with pytest.raises(ValueError, match="not supported yet"):
        A.relevance(model, torch.randn(1, 3, 32, 32), "attnlrp")
