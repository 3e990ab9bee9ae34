"""timm ``VisionTransformerRelPos`` (relative position bias, no absolute table) read by the ViT adapter.

Tiny random models (2 blocks, 64 wide, 2 heads, 64 px) are registered with timm under their own names,
one per variant (a bias MLP per block; one shared by all blocks; residual post-norm; a CLS token), and
saved the way users save them (``torch.save(model.state_dict())`` and safetensors) for ``--checkpoint``.
The parity, edit and zero-head tests run in ``test_adapters.py`` (``EXAMPLES``); this file loads them,
checks what the views read, threads and ``analyze`` end to end.

Tolerances: float32, the same operations as timm's unfused forward: 1e-5 relative.
"""
import copy
import threading

import numpy as np
import pytest
import timm
import torch
from timm.models._registry import register_model
from timm.models.vision_transformer_relpos import ResPostRelPosBlock, _create_vision_transformer_relpos

from vitviz.adapters import adapter_for, run
from vitviz.sources.models import ModelSpec, load_model

from conftest import ASSETS

TINY = dict(patch_size=16, embed_dim=64, depth=2, num_heads=2, img_size=64, num_classes=7, qkv_bias=False)
VARIANTS = {  # name -> timm arguments
    "relpos_vitviz_tiny_test": dict(fc_norm=True),
    "srelpos_vitviz_tiny_test": dict(shared_rel_pos=True, rel_pos_dim=32),
    "relpos_rpn_vitviz_tiny_test": dict(block_fn=ResPostRelPosBlock),
    "relpos_cls_vitviz_tiny_test": dict(class_token=True, global_pool="token", rel_pos_dim=16),
    "relpos_bias_vitviz_tiny_test": dict(rel_pos_type="bias"),
}


def _register(name, args):
    def build(pretrained=False, **kwargs):
        return _create_vision_transformer_relpos(name, pretrained=pretrained, **dict(TINY, **args, **kwargs))
    build.__name__ = name
    register_model(build)


for _name, _args in VARIANTS.items():
    if not timm.is_model(_name):
        _register(_name, _args)


def relpos_checkpoint(folder, name: str, fmt: str = "safetensors") -> str:
    """A perturbed random model of ``name`` saved as a state dict (``fmt``: safetensors or pth)."""
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False)
    with torch.no_grad():  # the bias MLPs start near 0: make a wrong forward show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = folder / f"{name}.{fmt}"
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    else:
        torch.save(model.state_dict(), path)
    return str(path)


def load_relpos(tmp_path_factory, name: str = "relpos_vitviz_tiny_test", fmt: str = "safetensors"):
    return load_model(ModelSpec(name=name, checkpoint=relpos_checkpoint(tmp_path_factory.mktemp("relpos"), name, fmt)))


def loader(name: str):
    return lambda tmp_path_factory: load_relpos(tmp_path_factory, name)


@pytest.fixture(scope="module")
def relpos(tmp_path_factory):
    return load_relpos(tmp_path_factory)


def test_a_relpos_checkpoint_saved_with_torch_save_loads_and_equals_timms_own_model(tmp_path):
    path = relpos_checkpoint(tmp_path, "relpos_vitviz_tiny_test", "pth")
    loaded = load_model(ModelSpec(name="relpos_vitviz_tiny_test", checkpoint=path))
    own = timm.create_model("relpos_vitviz_tiny_test", pretrained=False).eval()
    own.load_state_dict(torch.load(path, weights_only=True))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        out = run(loaded.model, x, keep=("logits",))["logits"]
        expected = own(x)
    assert out.shape == (2, 7)
    assert float((out - expected).abs().max() / expected.abs().max()) <= 1e-5


def test_relpos_is_read_by_the_vit_adapter_with_its_bias_in_the_scores(relpos):
    model = relpos.model
    adapter = adapter_for(model)
    assert adapter.name == "timm-vit" and adapter.why_unsupported(model) is None
    assert relpos.layout.prefix_tokens == () and relpos.layout.grid_size == (4, 4)
    assert relpos.position_encoding == "relative position bias per block (RelPosMlp)"
    assert relpos.native_pos_embed is None and adapter.position_table(model) is None
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        out = run(model, x, keep=("blocks.0.q", "blocks.0.k", "blocks.0.scores"))
    bias = model.blocks[0].attn.rel_pos.get_bias()
    plain = out["blocks.0.q"] @ out["blocks.0.k"].transpose(-2, -1) * model.blocks[0].attn.scale
    torch.testing.assert_close(out["blocks.0.scores"], plain + bias, rtol=1e-5, atol=1e-6)
    assert float(bias.abs().max()) > 1e-2  # the bias is not negligible: leaving it out would fail above
    q, k, v, scale, steps, qkv_bias = adapter.layer_qkv(model, x, 1)
    assert qkv_bias is not None and any("relative position bias" in s for s in steps)


def test_the_shared_bias_variant_adds_one_bias_in_every_block(tmp_path_factory):
    loaded = load_relpos(tmp_path_factory, "srelpos_vitviz_tiny_test")
    model = loaded.model
    assert "shared by all blocks" in loaded.position_encoding
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        out = run(model, x, keep=("blocks.*.q", "blocks.*.k", "blocks.*.scores"))
    shared = model.shared_rel_pos.get_bias()
    for i in range(2):
        plain = out[f"blocks.{i}.q"] @ out[f"blocks.{i}.k"].transpose(-2, -1) * model.blocks[i].attn.scale
        torch.testing.assert_close(out[f"blocks.{i}.scores"], plain + shared, rtol=1e-5, atol=1e-6)


def test_relpos_threads_with_different_edits_get_their_own_results(relpos):
    model = relpos.model
    x = torch.randn(1, 3, 64, 64)

    def zero_head(h):
        def edit(a, p):
            a = a.clone()
            a[:, h] = 0
            return a
        return edit

    with torch.no_grad():
        serial = {h: run(model, x, keep=("logits",), edit={"blocks.0.attn": zero_head(h)})["logits"] for h in (0, 1)}
    results = {}

    def work(h):
        with torch.no_grad():
            for _ in range(4):
                results.setdefault(h, []).append(run(model, x, keep=("logits",),
                                                     edit={"blocks.0.attn": zero_head(h)})["logits"])

    threads = [threading.Thread(target=work, args=(h,)) for h in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not torch.equal(serial[0], serial[1])
    for h, outs in results.items():
        assert all(torch.equal(o, serial[h]) for o in outs)


def test_relpos_zeroing_a_head_matches_doing_it_in_timms_module(relpos):
    model = relpos.model
    x = torch.randn(2, 3, 64, 64)
    reference = copy.deepcopy(model)
    for blk in reference.blocks:
        blk.attn.fused_attn = False

    def zero(module, inputs, out):
        out = out.clone()
        out[:, 1] = 0
        return out
    reference.blocks[1].attn.attn_drop.register_forward_hook(zero)

    def edit(a, p):
        a = a.clone()
        a[:, 1] = 0
        return a
    with torch.no_grad():
        expected = reference(x)
        out = run(model, x, keep=("logits",), edit={"blocks.1.attn": edit})["logits"]
        plain = run(model, x, keep=("logits",))["logits"]
    assert float((out - expected).abs().max() / expected.abs().max()) <= 1e-5
    assert float((out - plain).abs().max()) > 1e-4


def test_analyze_runs_end_to_end_for_a_relpos_checkpoint(tmp_path):
    from vitviz.cli import main

    path = relpos_checkpoint(tmp_path, "relpos_cls_vitviz_tiny_test")
    out = tmp_path / "out"
    assert main(["analyze", str(ASSETS / "chelsea.jpg"), "--out", str(out), "--model", "relpos_cls_vitviz_tiny_test",
                 "--checkpoint", path]) == 0
    data = np.load(out / "analysis.npz")
    loaded = load_model(ModelSpec(name="relpos_cls_vitviz_tiny_test", checkpoint=path))
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess

    x = preprocess([load_image(ASSETS / "chelsea.jpg").image], loaded.data_config).tensor
    with torch.no_grad():
        logits = loaded.model(x)
    np.testing.assert_allclose(data["logits"][0], logits[0].numpy(), rtol=1e-5, atol=1e-6)
