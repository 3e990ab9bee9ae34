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
from vitviz.models import ModelSpec, load_model

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
    assert applies == {"heads", "distance", "filters"}
    for view in set(VIEWS) - applies:
        why = loaded.why_not(view)
        assert why.endswith(".") and why.count(". ") == 0 and "Swin" in why, (view, why)
    assert np.isfinite(loaded.adapter.architecture(loaded.model).attention_bytes(64))
