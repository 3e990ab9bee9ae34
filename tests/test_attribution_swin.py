"""Grad-CAM and LeGrad on window attention (timm Swin, transformers Swin V1 and V2) against outside references:
pytorch-grad-cam itself with its Swin recipe, and a transcription of LeGrad's window definition computed from
autograd gradients of the libraries' own attention (forward hooks on their modules, their own window partition
and shift mask), plus a planted model."""
import copy
import json

import numpy as np
import pytest
import torch

from test_attribution import _hf_swin
from test_adapters_swin import load_timm_swin
import attribution_names as A


@pytest.fixture(scope="module")
def timm_swin(tmp_path_factory):
    """The tiny timm Swin (4 px patches, 4x4 windows, two stages) saved to safetensors and loaded as a user loads
    it, at 64 px (16x16 patches, 8x8 in stage 2) and 72 px (18x18: padded windows in both stages), in float64."""
    return {size: load_timm_swin(tmp_path_factory, size).model.double() for size in (64, 72)}


def _hf(version: str, size: int):
    model = _hf_swin(version, size)
    model.set_attn_implementation("eager")  # the library's softmax, whose output the hooks read
    return model


# ---------------------------------------------------------------------------------------------
# Grad-CAM: pytorch-grad-cam's Swin recipe


class _Logits(torch.nn.Module):
    """A transformers classifier as pytorch-grad-cam calls models: pixels in, logits out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(pixel_values=x).logits


def _grad_cam_reference(model, layer, x, cls, grid, size):
    """pytorch-grad-cam's GradCAM with its ``swinT_reshape_transform`` (timm 1.x gives norm1 tokens as (B, h, w, C):
    flattened to the (B, N, C) its transform expects), resized to ``size`` (w, h) instead of the image. ``layer``
    picks the target layer from a copy whose weights require gradients (the loader freezes them; grad-cam's
    backward needs a graph, vitviz's makes one from the input)."""
    gc = pytest.importorskip("pytorch_grad_cam", reason="grad-cam 1.5.7 is a test dependency")
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
    from pytorch_grad_cam.utils.reshape_transforms import swinT_reshape_transform

    def reshape(tensor):
        return swinT_reshape_transform(tensor.flatten(1, 2) if tensor.ndim == 4 else tensor, *grid)

    model = copy.deepcopy(model).requires_grad_(True)
    cam = gc.GradCAM(model=model, target_layers=[layer(model)], reshape_transform=reshape)
    cam.get_target_width_height = lambda input_tensor: size
    return cam(input_tensor=x, targets=[ClassifierOutputTarget(cls)] * len(x))


def _scaled_twice(maps: np.ndarray) -> np.ndarray:
    """pytorch-grad-cam's min-max (eps 1e-7) per layer and again over the layers' aggregate."""
    for _ in range(2):
        maps = maps - maps.reshape(len(maps), -1).min(-1)[:, None, None]
        maps = maps / (1e-7 + maps.reshape(len(maps), -1).max(-1)[:, None, None])
    return maps


@pytest.mark.parametrize("family,size", [("timm", 64), ("timm", 72), ("hf-v1", 56), ("hf-v1", 72)])
def test_swin_gradcam_equals_pytorch_grad_cam(timm_swin, family, size):
    """Its docs' Swin target layer, the last stage's last block's norm1 (transformers: layernorm_before), on the
    library's own forward. On the stage grid (target size = that grid, so cv2's resize is the identity) the map
    equals ours before upsampling; at the patch grid (cv2's bilinear resize, half-pixel centres) it equals ours
    brought there bilinearly. Float64 models; grad-cam casts to float32 before and after its resize: ~6e-8 of
    values <= 1, plus its 1e-7 epsilon applied once vs twice on a rescaled map: asserted 1e-6."""
    if family == "timm":
        model = timm_swin[size]
        reference, layer = model, lambda m: m.layers[-1].blocks[-1].norm1
    else:
        model = _hf(family[-2:], size).requires_grad_(False)  # frozen, as loaded
        reference, layer = _Logits(model), lambda m: m.model.swin.encoder.layers[-1].blocks[-1].layernorm_before
    torch.manual_seed(3)
    x = torch.randn(2, 3, size, size, dtype=torch.float64)
    got = A.gradcam(model, x, A.ClassLogit(2))
    patch, coarse = size // 4, size // 8
    assert got.patches.shape == (2, patch, patch) and got.coarse.shape == (2, coarse, coarse)
    assert got.coarse_layout.patch_size == (8, 8)
    ref = _grad_cam_reference(reference, layer, x, 2, (coarse, coarse), (coarse, coarse))
    np.testing.assert_allclose(_scaled_twice(got.coarse), ref, atol=1e-6)
    ref = _grad_cam_reference(reference, layer, x, 2, (coarse, coarse), (patch, patch))
    np.testing.assert_allclose(_scaled_twice(got.patches), ref, atol=1e-6)


def test_swin_v2_gradcam_reads_the_post_norm_blocks_input():
    """Swin V2 is post-norm: the block's ln1 point is its input (the previous block's output), which pytorch-grad-cam
    cannot hook (transformers' layers return tuples). The recipe written out from a forward pre-hook on transformers'
    own last layer, autograd's gradient there and cv2's bilinear resize (grad-cam's) equals ours. Float64 throughout
    (cv2 resizes float64 in float64): rounding only, asserted 1e-12 of the largest value."""
    import cv2

    model = _hf("v2", 72)
    ref_model = copy.deepcopy(model)
    seen = []
    ref_model.swinv2.encoder.layers[-1].blocks[-1].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    torch.manual_seed(4)
    x = torch.randn(2, 3, 72, 72, dtype=torch.float64)
    logits = ref_model(pixel_values=x.clone().requires_grad_(True)).logits
    (grad,) = torch.autograd.grad(logits[:, 1].sum(), seen[0])
    acts = seen[0].detach()  # (B, 9 * 9, C): stage 2 of 18x18 patches
    cam = (grad.mean(dim=1, keepdim=True) * acts).sum(-1).clamp_min(0).reshape(2, 9, 9).numpy()
    got = A.gradcam(model, x, A.ClassLogit(1))
    np.testing.assert_allclose(got.coarse, cam, rtol=0, atol=1e-12 * cam.max())
    up = np.stack([cv2.resize(c, (18, 18), interpolation=cv2.INTER_LINEAR) for c in cam])
    np.testing.assert_allclose(got.patches, up, rtol=0, atol=1e-12 * cam.max())


def test_to_patch_grid_gives_each_token_the_patches_it_merges_and_crops_padding():
    """A 3x3 stage grid of 8 px tokens over a 5x5 grid of 4 px patches (patch merging padded 5 to 6): nearest
    repeats each value on its 2x2 patches, bilinear uses half-pixel centres; both crop the padded row and column."""
    from vitviz.layout import TokenLayout

    coarse = TokenLayout((), (3, 3), (8, 8), "avg", 0)
    fine = TokenLayout((), (5, 5), (4, 4), "avg", 0)
    maps = torch.arange(9, dtype=torch.float64).reshape(1, 3, 3)
    near = A.to_patch_grid(maps, coarse, fine, "nearest")[0].numpy()
    np.testing.assert_array_equal(near, np.kron(maps[0].numpy(), np.ones((2, 2)))[:5, :5])
    bil = A.to_patch_grid(maps, coarse, fine, "bilinear")[0].numpy()
    # The map is 3r + c, linear: bilinear returns it at each patch centre's coarse coordinate, (i + 0.5) / 2 - 0.5,
    # clamped at the edge (-0.25 -> 0). Stretching 3 tokens over 5 patches instead would give 8.8 at (4, 4).
    assert bil[0, 0] == 0 and bil[1, 0] == pytest.approx(3 * 0.25) and bil[4, 4] == pytest.approx(3 * 1.75 + 1.75)


# ---------------------------------------------------------------------------------------------
# LeGrad on windows: a transcription


def _timm_blocks(model, x):
    """Per block of timm's own unfused forward on a copy: (attention (B*nW, H, T, T) in the graph of x, the slot
    positions (nW, T) as flat grid indices with -1 for padding, the allowed pairs (nW, T, T), stage grid, stage)."""
    from timm.models.swin_transformer import window_partition

    ref = copy.deepcopy(model)
    seen, grids = [], []
    blocks = [(s, b) for s, stage in enumerate(ref.layers) for b in stage.blocks]
    for _, blk in blocks:
        blk.attn.fused_attn = False
        blk.attn.attn_drop.register_forward_hook(lambda m, i, out: seen.append(out))
        blk.register_forward_pre_hook(lambda m, args: grids.append(tuple(args[0].shape[1:3])))
    out = ref(x)
    result = []
    for (s, blk), attn, (gh, gw) in zip(blocks, seen, grids):
        wh, ww = blk.window_size
        index = torch.arange(gh * gw, dtype=torch.float64).reshape(1, gh, gw, 1)
        index = torch.roll(index, shifts=(-blk.shift_size[0], -blk.shift_size[1]), dims=(1, 2))  # timm: roll, pad
        index = torch.nn.functional.pad(index, (0, 0, 0, -gw % ww, 0, -gh % wh), value=-1)
        pos = window_partition(index, (wh, ww)).reshape(-1, wh * ww).long()
        mask = blk.get_attn_mask(torch.zeros(1, gh + -gh % wh, gw + -gw % ww, 1)) if any(blk.shift_size) else None
        allowed = torch.ones(len(pos), wh * ww, wh * ww, dtype=torch.bool) if mask is None else mask == 0
        result.append((attn, pos, allowed, (gh, gw), s))
    return out, result


def _hf_blocks(model, x):
    """The same from transformers' eager forward: its attention weights (V1: what its attention returns; V2: what its
    dropout passes on), its pad-then-roll partition and its shift mask."""
    from transformers.models.swin.modeling_swin import window_partition

    ref = copy.deepcopy(model)
    base = getattr(ref, "swin", None) or ref.swinv2
    seen, grids = [], []
    blocks = [(s, b) for s, stage in enumerate(base.encoder.layers) for b in stage.blocks]
    for _, blk in blocks:
        if hasattr(blk.attention, "self"):  # V2
            blk.attention.self.dropout.register_forward_hook(lambda m, i, out: seen.append(out))
        else:
            blk.attention.register_forward_hook(lambda m, i, out: seen.append(out[1]))
        blk.register_forward_pre_hook(lambda m, args, kwargs: grids.append(tuple(
            kwargs.get("input_dimensions") or args[1])), with_kwargs=True)
    out = ref(pixel_values=x).logits
    result = []
    for (s, blk), attn, (gh, gw) in zip(blocks, seen, grids):
        w, shift = int(blk.window_size), int(blk.shift_size)
        index = torch.arange(gh * gw, dtype=torch.float64).reshape(1, gh, gw, 1)
        index = torch.nn.functional.pad(index, (0, 0, 0, -gw % w, 0, -gh % w), value=-1)  # HF: pad, then roll
        index = torch.roll(index, shifts=(-shift, -shift), dims=(1, 2))
        pos = window_partition(index, w).reshape(-1, w * w).long()
        mask = blk.get_attn_mask(gh + -gh % w, gw + -gw % w, torch.float64, "cpu")
        allowed = torch.ones(len(pos), w * w, w * w, dtype=torch.bool) if mask is None else mask == 0
        result.append((attn, pos, allowed, (gh, gw), s))
    return out, result


def _legrad_transcribed(model, x, cls: int, layers, library: str) -> np.ndarray:
    """LeGrad on windows as the issue defines it, in numpy from autograd gradients of the library's attention: per
    layer, d(logit)/d(attention) (B, nW, H, T, T), ReLU, mean over heads; per key slot the mean over the real query
    slots allowed to reach it; put at the key's grid position (padding dropped); a stage-s grid given to its
    2^s x 2^s patches (np.kron) and cropped; summed over layers; min-max per image."""
    x = x.clone().requires_grad_(True)
    out, blocks = (_timm_blocks if library == "timm" else _hf_blocks)(model, x)
    B = len(x)
    grads = torch.autograd.grad(out[:, cls].sum(), [blocks[i][0] for i in layers])
    patch_grid = blocks[0][3]
    total = np.zeros((B,) + patch_grid)
    for i, grad in zip(layers, grads):
        _, pos, allowed, (gh, gw), stage = blocks[i]
        g = grad.detach().numpy().reshape(B, len(pos), *grad.shape[1:]).clip(min=0).mean(axis=2)  # (B, nW, Tq, Tk)
        pos, allowed = pos.numpy(), allowed.numpy() & (pos.numpy() >= 0)[:, :, None]
        grid = np.zeros((B, gh * gw))
        for w in range(len(pos)):
            for k in range(pos.shape[1]):
                if pos[w, k] >= 0:
                    grid[:, pos[w, k]] = g[:, w, allowed[w, :, k], k].mean(axis=1)
        f = 2 ** stage
        up = np.stack([np.kron(m.reshape(gh, gw), np.ones((f, f))) for m in grid])
        total += up[:, :patch_grid[0], :patch_grid[1]]
    flat = total.reshape(B, -1)
    flat = (flat - flat.min(1, keepdims=True)) / (flat.max(1, keepdims=True) - flat.min(1, keepdims=True))
    return flat.reshape(total.shape)


@pytest.mark.parametrize("family,size,layers", [
    ("timm", 64, None), ("timm", 72, range(0, 4)), ("hf-v1", 72, range(0, 4)), ("hf-v2", 72, range(0, 4)),
    ("hf-v1", 56, range(1, 3)), ("hf-v1", 60, range(0, 4))])
def test_swin_legrad_equals_the_transcribed_window_definition(timm_swin, family, size, layers):
    """Every block (regular and shifted windows, padded windows at 72 px, both stages; at 60 px a 15x15 patch grid whose
    stage-2 tokens cover a padded 16th row and column, cropped) or the default last two;
    timm rolls then pads, transformers pads then rolls. Float64, the same sums in another order: ~1e-15 of values
    in [0, 1], asserted 1e-12; transformers' V1 eager softmax rounds its probabilities to float32 (2^-24 ~ 6e-8
    relative) and every later value, so the gradients, move by ~1e-7 relative: 1e-6 there (measured 3e-10)."""
    model = timm_swin[size] if family == "timm" else _hf(family[-2:], size)
    torch.manual_seed(5)
    x = torch.randn(2, 3, size, size, dtype=torch.float64)
    got = A.legrad(model, x, A.ClassLogit(1), layers=layers)
    ref = _legrad_transcribed(model, x, 1, layers or range(2, 4), "timm" if family == "timm" else "hf")
    assert got.patches.shape == ref.shape == (2, -(-size // 4), -(-size // 4))
    np.testing.assert_allclose(got.patches, ref, atol=1e-6 if family == "hf-v1" else 1e-12)


def test_cli_writes_swin_attribution_with_gradcam_on_both_grids(tmp_path, capsys):
    """analyze --attribution attnlrp,legrad,gradcam --target-class 3 on the tiny timm Swin saved to safetensors (as the
    README's Swin line loads one): the patch maps (16x16 at 64 px), AttnLRP's pixels and Grad-CAM's stage-2 map (8x8)
    equal the library's on the npz's exact input (float32 arrays of float32 maps: 1e-6 of the largest value), and
    settings.json states the target; --target-class without --attribution is still refused with a sentence."""
    from conftest import ASSETS
    from test_adapters_swin import timm_swin_checkpoint
    from test_swin import TINY_SWIN
    from vitviz.cli import main
    from vitviz.sources.models import ModelSpec, load_model

    checkpoint = timm_swin_checkpoint(tmp_path)
    out = tmp_path / "out"
    argv = ["analyze", str(ASSETS / "chelsea.jpg"), str(ASSETS / "coffee.jpg"), "--model", TINY_SWIN, "--checkpoint",
            checkpoint, "--out", str(out), "--target-class", "3", "--no-attention"]
    assert main(argv) == 2 and "--target-class do not apply" in capsys.readouterr().err
    assert main(argv + ["--attribution", "attnlrp,legrad,gradcam"]) == 0
    data = np.load(out / "analysis.npz")
    assert data["attribution_legrad"].shape == data["attribution_gradcam"].shape == (2, 16, 16)
    assert data["attribution_gradcam_coarse"].shape == (2, 8, 8) and "attribution_legrad_coarse" not in data.files
    assert data["window_distance"].shape == (2, 4, 4)  # the window analyses are still written beside them
    model = load_model(ModelSpec(name=TINY_SWIN, checkpoint=checkpoint)).model
    x, target = torch.from_numpy(data["input"]), A.ClassLogit(3)
    lrp, cam, legrad = A.relevance(model, x, "attnlrp", target), A.gradcam(model, x, target), A.legrad(model, x, target)
    for key, ref in (("attribution_attnlrp", lrp.patches), ("attribution_attnlrp_pixels", lrp.pixels),
                     ("attribution_gradcam", cam.patches), ("attribution_gradcam_coarse", cam.coarse),
                     ("attribution_legrad", legrad.patches)):
        np.testing.assert_allclose(data[key], ref, rtol=0, atol=1e-6 * np.abs(ref).max())
    settings = json.loads((out / "settings.json").read_text())["analysis"]["attribution"]
    assert settings["target"]["class"] == 3 and settings["target"]["classes"] == [3, 3]
    assert len(settings["conservation"]["attnlrp"]) == 2
