"""Window adapters (timm Swin; Hugging Face Swin V1 and V2) against their libraries' own forwards.

Each model is tiny and random (every weight moved, so a wrong forward shows) and saved the way users
save it: timm as a safetensors state dict loaded by name plus ``--checkpoint``, Hugging Face as a
``save_pretrained`` folder. The references are the libraries' modules run by the libraries: timm's
forward with its unfused window attention on a deep copy (probabilities read, or changed, where timm
applies ``attn_drop`` to them), transformers' eager forward with ``output_attentions``. Inputs whose
grids are not whole windows exercise the padding; every second block is shifted.

Tolerances: float32 end to end, the spelled-out forward and the library's run the same operations
(sums in another order at most): 1e-5 relative on the outputs, 1e-5 absolute on probabilities.
"""
import copy
import threading

import numpy as np
import pytest
import torch

from vitviz.adapters import adapter_for, run
from vitviz.adapters.windows import WindowGeometry
from vitviz.sources.models import ModelSpec, load_model

from test_swin import TINY_SWIN  # noqa: F401  (registers the tiny timm Swin)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _perturbed(model):
    with torch.no_grad():  # random init leaves the bias tables near 0: make a wrong forward show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


# ---------------------------------------------------------------------------------------------
# timm Swin


def timm_swin_checkpoint(folder) -> str:
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = _perturbed(timm.create_model(TINY_SWIN, pretrained=False))
    path = folder / "swin.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return str(path)


def load_timm_swin(tmp_path_factory, img_size: int | None = None):
    return load_model(ModelSpec(name=TINY_SWIN, checkpoint=timm_swin_checkpoint(tmp_path_factory.mktemp("swin")),
                                img_size=img_size))


def timm_swin_reference(model, x, zero_head: tuple[int, int] | None = None):
    """(output, attention per block (B, nW, H, T, T)) of timm's own unfused forward on a copy; ``zero_head=(block,
    head)`` zeroes that head's probabilities where timm applies dropout to them."""
    reference = copy.deepcopy(model)
    seen = []
    for i, blk in enumerate(b for stage in reference.layers for b in stage.blocks):
        blk.attn.fused_attn = False

        def keep(module, inputs, out, i=i):
            if zero_head is not None and zero_head[0] == i:
                out = out.clone()
                out[:, zero_head[1]] = 0
            seen.append(out)
            return out
        blk.attn.attn_drop.register_forward_hook(keep)
    with torch.no_grad():
        out = reference(x)
    return out, [a.view(x.shape[0], -1, *a.shape[1:]) for a in seen]


@pytest.fixture(scope="module")
def timm_swin(tmp_path_factory):
    return {size: load_timm_swin(tmp_path_factory, size) for size in (None, 72)}


def _inputs(size: int, n: int = 2) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(n, 3, size, size)


@pytest.mark.parametrize("size", [None, 72])
def test_timm_swin_logits_and_every_blocks_attention_equal_timms_unfused_forward(timm_swin, size):
    model = timm_swin[size].model
    x = _inputs(size or 64)
    with torch.no_grad():
        out = run(model, x, keep=("logits", "blocks.*.attn", "blocks.*.scores"))
    expected, attention = timm_swin_reference(model, x)
    assert _rel(out["logits"], expected) <= 1e-5
    geometry = adapter_for(model).geometry(model, tuple(x.shape[-2:]))
    assert [g.shifted for g in geometry] == [False, True, False, True]
    if size == 72:  # 18x18 and 9x9 grids in 4x4 windows: padded
        assert [g.padded_size for g in geometry] == [(20, 20), (20, 20), (12, 12), (12, 12)]
    for i, (ref, g) in enumerate(zip(attention, geometry)):
        assert out[f"blocks.{i}.attn"].shape == (2, g.num_windows, (2, 4)[g.stage], 16, 16)
        assert float((out[f"blocks.{i}.attn"] - ref).abs().max()) <= 1e-5
        # The shift mask is in the scores: masked pairs are -100 below their unmasked score.
        if g.shifted:
            hidden = torch.as_tensor(~g.allowed)[None, :, None].expand_as(out[f"blocks.{i}.scores"])
            assert float(out[f"blocks.{i}.scores"][hidden].max()) < -50


def test_timm_swin_with_a_dynamic_size_builds_masks_per_input_as_timm_does():
    import timm

    torch.manual_seed(1)
    model = _perturbed(timm.create_model(TINY_SWIN, pretrained=False, dynamic_img_size=True)).eval()
    x = torch.randn(1, 3, 80, 96)  # not the 64 px it was built for: timm builds masks from get_attn_mask(x)
    with torch.no_grad():
        out = run(model, x, keep=("logits", "blocks.*.attn"))
    expected, attention = timm_swin_reference(model, x)
    assert _rel(out["logits"], expected) <= 1e-5
    for i, ref in enumerate(attention):
        assert float((out[f"blocks.{i}.attn"] - ref).abs().max()) <= 1e-5


def test_the_shared_shift_mask_is_timms_mask_of_every_shifted_block(timm_swin):
    model = timm_swin[72].model
    geometry = adapter_for(model).geometry(model, (72, 72))
    blocks = [b for stage in model.layers for b in stage.blocks]
    for g, blk in zip(geometry, blocks):
        if blk.attn_mask is None:
            assert g.shift_mask() is None
        else:
            torch.testing.assert_close(g.shift_mask(), blk.attn_mask, rtol=0, atol=0)


def test_timm_swin_zeroing_one_head_of_a_shifted_block_matches_timm_and_reaches_later_blocks(timm_swin):
    model = timm_swin[72].model
    x = _inputs(72)
    layer, head = 1, 0  # a shifted block

    def zero(a, p):
        a = a.clone()
        a[..., head, :, :] = 0
        return a
    with torch.no_grad():
        plain = run(model, x, keep=("logits", "blocks.3.attn"))
        same = run(model, x, keep=("logits",), edit={"blocks.*.attn": lambda a, p: a})
        edited = run(model, x, keep=("logits", "blocks.1.attn", "blocks.3.attn"), edit={f"blocks.{layer}.attn": zero})
    assert torch.equal(plain["logits"], same["logits"])
    expected, attention = timm_swin_reference(model, x, zero_head=(layer, head))
    assert _rel(edited["logits"], expected) <= 1e-5
    assert _rel(edited["logits"], plain["logits"]) > 1e-4
    assert float((edited["blocks.3.attn"] - attention[3]).abs().max()) <= 1e-5
    assert not torch.equal(edited["blocks.3.attn"], plain["blocks.3.attn"])  # the edit reached the next stage


def test_timm_swin_threads_with_different_edits_get_their_own_results(timm_swin):
    model = timm_swin[None].model
    x = _inputs(64, 1)

    def scaled(factor):
        return lambda h, p: h * factor

    with torch.no_grad():
        serial = {f: run(model, x, keep=("logits",), edit={"blocks.1.mlp_hidden": scaled(f)})["logits"]
                  for f in (0.0, 2.0)}
    results = {}

    def work(factor):
        with torch.no_grad():
            for _ in range(4):
                results.setdefault(factor, []).append(
                    run(model, x, keep=("logits",), edit={"blocks.1.mlp_hidden": scaled(factor)})["logits"])

    threads = [threading.Thread(target=work, args=(f,)) for f in (0.0, 2.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _rel(serial[0.0], serial[2.0]) > 1e-3
    for factor, outs in results.items():
        assert all(torch.equal(o, serial[factor]) for o in outs)


def test_timm_swin_points_have_the_documented_window_shapes_and_add_up(timm_swin):
    model = timm_swin[72].model
    x = _inputs(72, 1)
    with torch.no_grad():
        out = run(model, x, keep=("embed", "blocks.1.*", "final_norm", "pooled", "logits"))
    b = {k.split(".")[-1]: v for k, v in out.items() if k.startswith("blocks.1.")}
    nW, H, T, D = 25, 2, 16, 32
    assert out["embed"].shape == (1, 18, 18, D)
    assert b["attn"].shape == b["scores"].shape == (1, nW, H, T, T)
    assert b["q"].shape == b["k"].shape == b["v"].shape == b["z"].shape == (1, nW, H, T, D // H)
    for p in ("resid_pre", "ln1", "attn_out", "resid_mid", "ln2", "mlp_out", "resid_post"):
        assert b[p].shape == (1, 18, 18, D), p
    assert b["mlp_hidden"].shape == (1, 18, 18, 4 * D)
    torch.testing.assert_close(b["resid_mid"], b["resid_pre"] + b["attn_out"], rtol=0, atol=0)
    torch.testing.assert_close(b["resid_post"], b["resid_mid"] + b["mlp_out"], rtol=0, atol=0)
    torch.testing.assert_close(b["attn"], b["scores"].softmax(-1), rtol=1e-6, atol=1e-7)
    assert out["final_norm"].shape == (1, 9, 9, 2 * D) and out["pooled"].shape == (1, 2 * D)


def test_window_geometry_partition_and_reverse_are_inverse_in_both_orders():
    x = torch.arange(2 * 7 * 9 * 3, dtype=torch.float32).view(2, 7, 9, 3)
    for pad_first in (False, True):
        g = WindowGeometry.build(1, 0, 1, (7, 9), (4, 4), (2, 2), (4, 4), pad_first=pad_first)
        windows = g.partition(x)
        assert windows.shape == (2, 6, 16, 3)
        torch.testing.assert_close(g.reverse(windows), x, rtol=0, atol=0)
        # Every slot holds the token token_positions says it holds (padding: zeros).
        pos = g.token_positions()
        real = pos[..., 0] >= 0
        expected = x[:, pos[..., 0].clip(0), pos[..., 1].clip(0)] * torch.as_tensor(real)[None, ..., None]
        torch.testing.assert_close(windows, expected, rtol=0, atol=0)


def test_every_view_that_does_not_apply_to_a_window_model_says_so_in_one_sentence(timm_swin):
    from vitviz.adapters import VIEWS

    loaded = timm_swin[None]
    applies = {v for v in VIEWS if loaded.why_not(v) is None}
    assert applies == {"heads", "distance", "filters", "attribution"}
    for view in set(VIEWS) - applies:
        why = loaded.why_not(view)
        assert why.endswith(".") and why.count(". ") == 0 and "Swin" in why, (view, why)
    assert np.isfinite(loaded.adapter.architecture(loaded.model).attention_bytes(64))


# ---------------------------------------------------------------------------------------------
# Hugging Face Swin (V1)


def hf_swin_folder(folder, image_size: int = 64, absolute: bool = False, version: str = "swin") -> str:
    """A tiny random transformers Swin with a classifier head and its image processor, saved with save_pretrained."""
    import transformers
    from transformers import ViTImageProcessor

    config_cls, model_cls = {"swin": ("SwinConfig", "SwinForImageClassification"),
                             "swinv2": ("Swinv2Config", "Swinv2ForImageClassification")}[version]
    config = getattr(transformers, config_cls)(image_size=image_size, patch_size=4, embed_dim=32, depths=[2, 2],
                                               num_heads=[2, 4], window_size=4, num_labels=5,
                                               use_absolute_embeddings=absolute,
                                               id2label={i: f"class {i}" for i in range(5)})
    torch.manual_seed(0)
    model = _perturbed(getattr(transformers, model_cls)(config).eval())
    model.save_pretrained(folder)
    ViTImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(folder)
    return str(folder)


def load_hf_swin(tmp_path_factory, image_size: int = 64, absolute: bool = False, version: str = "swin"):
    return load_model(ModelSpec(name=hf_swin_folder(tmp_path_factory.mktemp(version), image_size, absolute, version)))


def _hf_blocks(model) -> list:
    base = getattr(model, "swin", None) or getattr(model, "swinv2", None) or model
    return [blk for stage in base.encoder.layers for blk in stage.blocks]


def hf_swin_reference(model, x, zero_head: tuple[int, int] | None = None):
    """(logits, attention per block (B, nW, H, T, T)) of transformers' own forward on a copy, whose attention
    function is transformers' ``eager_attention_forward`` with its probabilities read; ``zero_head=(block, head)``
    zeroes that head's probabilities (and so its context, probabilities @ v) in that block."""
    from transformers import AttentionInterface
    from transformers.models.swin import modeling_swin

    reference = copy.deepcopy(model)
    index = {id(blk.attention): i for i, blk in enumerate(_hf_blocks(reference))}
    seen = {}

    def probe(module, *args, **kwargs):
        out, weights = modeling_swin.eager_attention_forward(module, *args, **kwargs)
        i = index[id(module)]
        if zero_head is not None and zero_head[0] == i:
            weights, out = weights.clone(), out.clone()
            weights[:, zero_head[1]] = 0
            out[:, :, zero_head[1]] = 0  # (B * nW, T, H, d): what zero probabilities give
        seen[i] = weights
        return out, weights

    AttentionInterface.register("vitviz_probe", probe)
    reference.set_attn_implementation("vitviz_probe")
    with torch.no_grad():
        logits = reference(pixel_values=x).logits
    return logits, [seen[i].view(x.shape[0], -1, *seen[i].shape[1:]) for i in range(len(seen))]


@pytest.fixture(scope="module")
def hf_swin(tmp_path_factory):
    return {72: load_hf_swin(tmp_path_factory, 72, absolute=True), 64: load_hf_swin(tmp_path_factory, 64)}


def _hf_images(loaded, n: int = 2) -> torch.Tensor:
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess

    from conftest import ASSETS

    image = load_image(ASSETS / "chelsea.jpg").image
    return preprocess([image, image.transpose(0)][:n], loaded.data_config).tensor


@pytest.mark.parametrize("size", [64, 72])
def test_hf_swin_logits_and_every_blocks_attention_equal_transformers_eager_forward(hf_swin, size):
    loaded = hf_swin[size]
    model, x = loaded.model, _hf_images(loaded)
    assert loaded.adapter.name == "hf-swin" and loaded.attention_scope == "window"
    assert x.shape[-2:] == (size, size)  # the model's own image processor
    with torch.no_grad():
        out = run(model, x, keep=("logits", "blocks.*.attn"))
    expected, attention = hf_swin_reference(model, x)
    assert _rel(out["logits"], expected) <= 1e-5
    geometry = adapter_for(model).geometry(model, (size, size))
    assert [g.shifted for g in geometry] == [False, True, False, True]
    if size == 72:  # 18x18 and 9x9 grids in 4x4 windows: padded (before the roll, as transformers does)
        assert [g.padded_size for g in geometry] == [(20, 20), (20, 20), (12, 12), (12, 12)]
    assert len(attention) == 4
    for i, ref in enumerate(attention):
        assert float((out[f"blocks.{i}.attn"] - ref).abs().max()) <= 1e-5, i


def test_the_shared_shift_mask_is_transformers_mask_which_pads_before_rolling(hf_swin):
    model = hf_swin[72].model
    geometry = adapter_for(model).geometry(model, (72, 72))
    for g, blk in zip(geometry, _hf_blocks(model)):
        expected = blk.get_attn_mask(*g.padded_size, dtype=torch.float32, device="cpu")
        if expected is None:
            assert g.shift_mask() is None
        else:
            torch.testing.assert_close(g.shift_mask(), expected, rtol=0, atol=0)
    # Padding is rolled too: the first window of the shifted 18x18 grid starts at token (2, 2), the last slot of
    # the last window holds token (1, 1), and the padding rows 18, 19 sit at rows 16, 17 of the rolled grid: the
    # first two slot rows of the last row of windows (timm would put them at rows 18, 19, after the roll).
    positions = geometry[1].token_positions()
    assert tuple(positions[0, 0]) == (2, 2) and tuple(positions[-1, -1]) == (1, 1)
    windows_ = positions.reshape(5, 5, 4, 4, 2)  # (window row, window col, slot row, slot col, 2)
    assert (windows_[4, :, :2, :, 0] == -1).all() and (windows_[4, :4, 2:, :, 0] >= 0).all()


def test_hf_swin_zeroing_one_head_of_a_shifted_block_matches_transformers(hf_swin):
    loaded = hf_swin[72]
    model, x = loaded.model, _hf_images(loaded)

    def zero(a, p):
        a = a.clone()
        a[..., 1, :, :] = 0
        return a
    with torch.no_grad():
        plain = run(model, x, keep=("logits",))["logits"]
        same = run(model, x, keep=("logits",), edit={"blocks.*.attn": lambda a, p: a})["logits"]
        edited = run(model, x, keep=("logits", "blocks.3.attn"), edit={"blocks.1.attn": zero})
    assert torch.equal(plain, same)
    expected, attention = hf_swin_reference(model, x, zero_head=(1, 1))
    assert _rel(edited["logits"], expected) <= 1e-5 and _rel(edited["logits"], plain) > 1e-4
    assert float((edited["blocks.3.attn"] - attention[3]).abs().max()) <= 1e-5


def test_hf_swin_threads_with_different_edits_get_their_own_results(hf_swin):
    loaded = hf_swin[64]
    model, x = loaded.model, _hf_images(loaded, 1)

    def scaled(f):
        return lambda h, p: h * f
    with torch.no_grad():
        serial = {f: run(model, x, keep=("logits",), edit={"blocks.2.mlp_hidden": scaled(f)})["logits"]
                  for f in (0.0, 2.0)}
    results = {}

    def work(f):
        with torch.no_grad():
            for _ in range(4):
                results.setdefault(f, []).append(
                    run(model, x, keep=("logits",), edit={"blocks.2.mlp_hidden": scaled(f)})["logits"])
    threads = [threading.Thread(target=work, args=(f,)) for f in (0.0, 2.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _rel(serial[0.0], serial[2.0]) > 1e-3
    for f, outs in results.items():
        assert all(torch.equal(o, serial[f]) for o in outs)


def test_hf_swin_budget_counts_the_window_attention_it_captures(hf_swin):
    from vitviz.trace import trace_for_analysis as capture
    from vitviz.sources.budget import architecture

    for size, loaded in hf_swin.items():
        arch = architecture(loaded.spec.name)
        assert arch is not None and arch.default_size == size
        out = capture(loaded.model, _hf_images(loaded, 1))
        assert arch.attention_bytes(size) == sum(a.numel() * 4 for a in out.each("attn"))


def test_hf_swin_views_say_why_not_and_the_card_names_the_family(hf_swin):
    from vitviz.adapters import VIEWS

    plain, absolute = hf_swin[64], hf_swin[72]
    assert {v for v in VIEWS if plain.why_not(v) is None} == {"heads", "distance", "filters", "attribution"}
    assert {v for v in VIEWS if absolute.why_not(v) is None} == {"heads", "distance", "filters", "position",
                                                                  "attribution"}
    assert "Swin, transformers" in plain.why_not("rollout")
    assert plain.position_encoding == "relative position bias per window"
    assert absolute.position_encoding.startswith("learned absolute position embedding + ")
    assert absolute.native_pos_embed is not None and absolute.native_pos_embed.grid_size == (18, 18)
    card = plain.card()
    assert card["family"] == "Swin" and card["heads"] == "2, 4 (per stage)" and card["layers"] == 4
    assert plain.class_labels == tuple(f"class {i}" for i in range(5))
    assert plain.adapter.patch_filters(plain.model).shape == (32, 3, 4, 4)


def test_analyze_runs_end_to_end_for_a_hf_swin_folder(hf_swin, tmp_path):
    import json

    from vitviz import swin
    from vitviz.trace import trace_for_analysis as capture
    from vitviz.cli import main

    from conftest import ASSETS

    loaded = hf_swin[72]
    assert main(["analyze", str(ASSETS / "chelsea.jpg"), "--out", str(tmp_path), "--model", loaded.spec.name]) == 0
    data = np.load(tmp_path / "analysis.npz")
    out = capture(loaded.model, _hf_images(loaded, 1))
    np.testing.assert_allclose(data["logits"][0], out.logits[0].numpy(), rtol=1e-5, atol=1e-6)
    assert data["window_distance"].shape == (1, 4, 4) and np.isnan(data["window_distance"][:, :2, 2:]).all()
    np.testing.assert_allclose(data["window_distance"][0, 1, :2],
                               swin.mean_window_attention_distance(out.each("attn")[1], out.geometry[1])[0], rtol=1e-6)
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["model"]["family"] == "Swin"
    assert [g["padded_size"] for g in settings["window_geometry"]] == [[20, 20], [20, 20], [12, 12], [12, 12]]


# ---------------------------------------------------------------------------------------------
# Hugging Face Swin V2


def hf_swinv2_reference(model, x, zero_head: tuple[int, int] | None = None):
    """(logits, attention per block (B, nW, H, T, T)) of transformers' own Swin V2 forward on a copy, the
    probabilities read (or one head zeroed) where ``Swinv2SelfAttention`` applies its dropout to them."""
    reference = copy.deepcopy(model)
    seen = []
    for i, blk in enumerate(_hf_blocks(reference)):
        def keep(module, inputs, out, i=i):
            if zero_head is not None and zero_head[0] == i:
                out = out.clone()
                out[:, zero_head[1]] = 0
            seen.append(out)
            return out
        blk.attention.self.dropout.register_forward_hook(keep)
    with torch.no_grad():
        logits = reference(pixel_values=x).logits
    return logits, [a.view(x.shape[0], -1, *a.shape[1:]) for a in seen]


@pytest.fixture(scope="module")
def hf_swinv2(tmp_path_factory):
    return {size: load_hf_swin(tmp_path_factory, size, version="swinv2") for size in (64, 72)}


@pytest.mark.parametrize("size", [64, 72])
def test_hf_swinv2_logits_and_every_blocks_attention_equal_transformers_forward(hf_swinv2, size):
    loaded = hf_swinv2[size]
    model, x = loaded.model, _hf_images(loaded)
    assert loaded.adapter.name == "hf-swinv2" and loaded.attention_scope == "window"
    with torch.no_grad():
        out = run(model, x, keep=("logits", "blocks.*.attn", "blocks.1.q", "blocks.1.k"))
    expected, attention = hf_swinv2_reference(model, x)
    assert _rel(out["logits"], expected) <= 1e-5
    assert len(attention) == 4
    for i, ref in enumerate(attention):
        assert float((out[f"blocks.{i}.attn"] - ref).abs().max()) <= 1e-5, i
    # Cosine attention: q and k as the dot product sees them are unit vectors (padding slots: the key has no
    # bias, so its zero vector stays zero).
    real = torch.as_tensor(adapter_for(model).geometry(model, (size, size))[1].token_positions()[..., 0] >= 0)
    for p in ("q", "k"):
        norms = out[f"blocks.1.{p}"].norm(dim=-1).permute(0, 2, 1, 3)[:, :, real]  # (B, H, real slots)
        torch.testing.assert_close(norms, torch.ones_like(norms))


def test_hf_swinv2_zeroing_one_head_of_a_shifted_block_matches_transformers(hf_swinv2):
    loaded = hf_swinv2[72]
    model, x = loaded.model, _hf_images(loaded)

    def zero(a, p):
        a = a.clone()
        a[..., 0, :, :] = 0
        return a
    with torch.no_grad():
        plain = run(model, x, keep=("logits",))["logits"]
        same = run(model, x, keep=("logits",), edit={"blocks.*.attn": lambda a, p: a})["logits"]
        edited = run(model, x, keep=("logits",), edit={"blocks.1.attn": zero})["logits"]
    assert torch.equal(plain, same)
    expected, _ = hf_swinv2_reference(model, x, zero_head=(1, 0))
    assert _rel(edited, expected) <= 1e-5 and _rel(edited, plain) > 1e-4


def test_analyze_and_the_budget_work_for_a_hf_swinv2_folder(hf_swinv2, tmp_path):
    from vitviz.trace import trace_for_analysis as capture
    from vitviz.sources.budget import architecture
    from vitviz.cli import main

    from conftest import ASSETS

    loaded = hf_swinv2[72]
    assert loaded.position_encoding.startswith("continuous relative position bias")
    assert loaded.card()["family"] == "Swin V2" and "Swin V2, transformers" in loaded.why_not("overview")
    assert main(["analyze", str(ASSETS / "chelsea.jpg"), "--out", str(tmp_path), "--model", loaded.spec.name]) == 0
    data = np.load(tmp_path / "analysis.npz")
    out = capture(loaded.model, _hf_images(loaded, 1))
    np.testing.assert_allclose(data["logits"][0], out.logits[0].numpy(), rtol=1e-5, atol=1e-6)
    assert architecture(loaded.spec.name).attention_bytes(72) == sum(a.numel() * 4 for a in out.each("attn"))
