"""Capture reproduces the model's own forward and its attention, on every supported family."""
import threading

import numpy as np
import pytest
import torch

from conftest import FAMILIES, tiny_model
from vitviz.trace import trace_for_analysis as capture
from vitviz.layout import TokenLayout
from vitviz.sources.models import check_supported


def _images(model, batch=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    h, w = model.patch_embed.img_size
    return torch.randn(batch, 3, h, w, generator=g)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_capture_reproduces_fused_forward(family):
    model = tiny_model(family)
    check_supported(model, family)
    x = _images(model)
    with torch.inference_mode():
        features = model.forward_features(x)
        logits = model(x)
    out = capture(model, x)

    def rel(a, b):
        return float((a - b).abs().max() / b.abs().max())

    assert rel(out["final_norm"], features) < 1e-5
    if model.num_classes:
        assert rel(out.logits, logits) < 1e-5
    else:
        assert out.logits is None
    layout = out.layout
    B, L, H, N, N2 = out.stack("attn").shape
    assert (B, L, H) == (3, len(model.blocks), model.blocks[0].attn.num_heads)
    assert N == N2 == layout.num_tokens == features.shape[1]
    assert torch.allclose(out.stack("attn").sum(-1), torch.ones(B, L, H, N), atol=1e-5)


def test_capture_attention_equals_unfused_softmax_hook():
    """Independent check: timm's own non-fused path, hooked at attn_drop, on a copy of the model."""
    import copy

    model = tiny_model("deit_distilled")
    x = _images(model, batch=2)
    reference = copy.deepcopy(model)
    seen = []
    for blk in reference.blocks:
        blk.attn.fused_attn = False
        blk.attn.attn_drop.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    with torch.inference_mode():
        reference(x)
    out = capture(model, x)
    assert torch.allclose(out.stack("attn"), torch.stack(seen, dim=1), atol=1e-6)
    # The shared model was not touched: still fused, no hooks left behind.
    assert all(blk.attn.fused_attn for blk in model.blocks)
    assert not any(blk.attn.attn_drop._forward_hooks for blk in model.blocks)


@pytest.mark.parametrize("family,prefix,grid", [
    ("deit_distilled", ("cls", "dist"), (4, 4)),
    ("deit3", ("cls",), (4, 4)),
    ("dinov2_reg", ("cls", "reg0", "reg1", "reg2", "reg3"), (5, 5)),
    ("siglip", (), (4, 4)),
    ("gap", (), (4, 4)),
    ("patch32_rect", ("cls",), (2, 3)),
])
def test_layout_is_read_from_the_model(family, prefix, grid):
    layout = TokenLayout.from_model(tiny_model(family))
    assert layout.prefix_tokens == prefix
    assert layout.grid_size == grid
    assert layout.num_tokens == len(prefix) + grid[0] * grid[1]


def test_layout_pos_embed_rows_follow_no_embed_class():
    assert TokenLayout.from_model(tiny_model("deit3")).pos_embed_prefix_rows == 0
    assert TokenLayout.from_model(tiny_model("dinov2_reg")).pos_embed_prefix_rows == 0
    assert TokenLayout.from_model(tiny_model("deit_distilled")).pos_embed_prefix_rows == 2


def test_patch_centres_are_in_pixels_in_raster_order():
    layout = TokenLayout(("cls",), (2, 3), (16, 16), "token", 1)
    np.testing.assert_array_equal(layout.patch_centres(),
                                  [[8, 8], [8, 24], [8, 40], [24, 8], [24, 24], [24, 40]])
    assert layout.token_name(0) == "cls" and layout.token_name(5) == "patch 4 (row 2, col 2)"  # rows/cols 1-based


def test_capture_is_thread_safe_and_matches_serial_bit_for_bit():
    model = tiny_model("dinov2_reg")
    inputs = [_images(model, batch=1, seed=s) for s in range(8)]
    serial = [capture(model, x) for x in inputs]
    results = [None] * 8
    barrier = threading.Barrier(8)

    def work(i):
        barrier.wait()
        for _ in range(3):
            results[i] = capture(model, inputs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, serial):
        assert torch.equal(got.stack("attn"), want.stack("attn"))
        assert torch.equal(got["final_norm"], want["final_norm"])
    # Different images gave different attention: the comparison above is not vacuous.
    assert not torch.equal(serial[0].stack("attn"), serial[1].stack("attn"))


def test_unsupported_model_is_named_in_the_error():
    import timm

    from vitviz.errors import ModelError

    # CaiT's class-attention blocks are read by no adapter (VisionTransformerRelPos, this test's model
    # before issue 18, now is).
    model = timm.create_model("cait_xxs24_224", pretrained=False, depth=1, depth_token_only=1)
    with pytest.raises(ModelError, match="cait_xxs24_224.*not supported yet.*Cait"):
        check_supported(model, "cait_xxs24_224")
    check_supported(timm.create_model("vit_tiny_r_s16_p8_224", pretrained=False, depth=1), "hybrid")
    check_supported(timm.create_model("eva02_tiny_patch14_224", pretrained=False, depth=1), "eva02")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_capture_on_gpu_matches_cpu():
    model = tiny_model("dinov2_reg")
    x = _images(model)
    cpu = capture(model, x)
    gpu = capture(model.to("cuda"), x)
    assert gpu.stack("attn").is_cuda and gpu.stack("resid_post.norm").is_cuda  # left where the model ran (issue 10)
    assert torch.allclose(gpu.stack("attn").cpu(), cpu.stack("attn"), atol=1e-4)
    assert torch.allclose(gpu["final_norm"], cpu["final_norm"], rtol=1e-3, atol=1e-3)
