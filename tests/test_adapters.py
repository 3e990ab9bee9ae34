"""The adapter contract, checked for every registered family against the library's own forward.

Each adapter gets at least one tiny random model loaded the way users load it (timm: a safetensors
checkpoint through ``ModelSpec(name, checkpoint=...)``; Hugging Face: a ``save_pretrained`` folder; torchvision:
a ``torch.save(model.state_dict())`` file through ``ModelSpec("torchvision:...", checkpoint=...)``).
The references are the library's modules run by the library: timm's forward, and its unfused
attention on a deep copy (``fused_attn`` off) with the probabilities read, or changed, where timm
applies ``attn_drop`` to them. A new adapter fails :func:`test_every_registered_adapter_has_an_example`
until it is given an example here, so it is tested the moment it is registered.
"""
import copy

import pytest
import torch

from conftest import assert_edits_stay_in_their_thread  # noqa: E402
from vitviz.adapters import ADAPTERS, adapter_for, load_all, run
from vitviz.lens import Lens

from test_adapters_relpos import VARIANTS as RELPOS_VARIANTS, loader as relpos_loader
from test_adapters_swin import (hf_swin_reference, hf_swinv2_reference, load_hf_swin, load_timm_swin,
                                timm_swin_reference)
from test_families import _images, _load, checkpoints  # noqa: F401  (the saved timm EVA/BEiT/rotary models)
from test_adapters_hf import HF_EXAMPLES  # the transformers families' examples (save_pretrained folders)
from test_torchvision_vit import load_tiny as load_torchvision, torchvision_reference
from test_probe_head import load_probed, probe_reference


def _timm_reference(model, x, zero_head: tuple[int, int] | None = None):
    """(output, attention (B, L, H, N, N)) of timm's own unfused forward on a copy; ``zero_head=(layer, head)``
    zeroes that head's probabilities where timm applies dropout to them."""
    reference = copy.deepcopy(model)
    seen = []
    for i, blk in enumerate(reference.blocks):
        blk.attn.fused_attn = False

        def keep(module, inputs, out, i=i):
            if zero_head is not None and zero_head[0] == i:
                out = out.clone()
                out[:, zero_head[1]] = 0
            seen.append(out)
            return out
        blk.attn.attn_drop.register_forward_hook(keep)
    with torch.no_grad():
        features = reference.forward_features(x)
        out = reference.forward_head(features) if reference.num_classes else \
            reference.forward_head(features, pre_logits=True)
    return out, torch.stack(seen, 1)


# adapter name -> examples: (id, reference fn). A reference returns (output, attention): (B, L, H, N, N) or one
# tensor per layer (window models: (B, nW, H, T, T)). Ids in LOADERS are loaded by their function
# (tmp_path_factory -> LoadedModel), the others from test_families' checkpoints.
TIMM_FAMILIES = ("eva02", "rope_register_gap", "dinov3", "beit", "beit_shared_bias", "pe_attention_pool")
EXAMPLES = {"timm-vit": [(f, _timm_reference) for f in (*TIMM_FAMILIES, *RELPOS_VARIANTS)],
            "timm-swin": [("swin", timm_swin_reference)],
            "hf-swin": [("hf_swin", hf_swin_reference)],
            "hf-swinv2": [("hf_swinv2", hf_swinv2_reference)],
            "torchvision-vit": [("torchvision", torchvision_reference)],
            "probe-head": [("probe_head", probe_reference)]}
LOADERS = {"swin": load_timm_swin, **{name: relpos_loader(name) for name in RELPOS_VARIANTS},
           "hf_swin": lambda tmp_path_factory: load_hf_swin(tmp_path_factory, 72),
           "hf_swinv2": lambda tmp_path_factory: load_hf_swin(tmp_path_factory, 72, version="swinv2"),
           "torchvision": load_torchvision, "probe_head": load_probed}
CASES = [(name, family, ref) for name, cases in EXAMPLES.items() for family, ref in cases]


def _output_point(model) -> str:
    return "logits" if adapter_for(model).num_classes(model) else "pooled"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


@pytest.fixture(scope="module")
def loaded_cases(checkpoints, tmp_path_factory):  # noqa: F811
    return {family: LOADERS[family](tmp_path_factory) if family in LOADERS else _load(family, checkpoints)
            for _, family, _ in CASES}


def _per_layer(attention) -> list[torch.Tensor]:
    return list(attention.unbind(1)) if isinstance(attention, torch.Tensor) else list(attention)


@pytest.mark.parametrize("adapter_name,family,reference", CASES, ids=[f"{a}-{f}" for a, f, _ in CASES])
def test_spelled_out_forward_equals_the_library_forward_and_its_eager_attention(adapter_name, family, reference,
                                                                                loaded_cases):
    loaded = loaded_cases[family]
    model, x = loaded.model, _images(loaded, 2)
    assert adapter_for(model).name == adapter_name
    depth = adapter_for(model).num_layers(model)
    point = _output_point(model)
    # Through the front door: vitviz.Lens.trace is the one way every consumer reads a forward.
    out = Lens(loaded).trace(x, keep=(point, "attn"))
    expected, attention = reference(model, x)
    # float32 end to end: the spelled-out and the library's sums differ in order only.
    assert _rel(out[point], expected) <= 1e-5
    reference_layers = _per_layer(attention)
    assert len(reference_layers) == depth
    for i, ref in enumerate(reference_layers):
        assert float((out["attn", i] - ref).abs().max()) <= 1e-5, i


@pytest.mark.parametrize("adapter_name,family,reference", CASES, ids=[f"{a}-{f}" for a, f, _ in CASES])
def test_an_identity_edit_is_bit_identical_and_zeroing_a_head_matches_the_library(adapter_name, family, reference,
                                                                                  loaded_cases):
    loaded = loaded_cases[family]
    model, x = loaded.model, _images(loaded, 2)
    point = _output_point(model)
    layer, head = 0, 1
    with torch.no_grad():
        plain = run(model, x, keep=(point,))[point]
        same = run(model, x, keep=(point,), edit={"blocks.*.attn": lambda a, p: a})[point]

        def zero(a, p):  # heads are dim -3: (B, H, N, N) and window (B, nW, H, T, T) alike
            a = a.clone()
            a[..., head, :, :] = 0
            return a
        edited = run(model, x, keep=(point, "blocks.*.attn"), edit={f"blocks.{layer}.attn": zero})
    assert torch.equal(plain, same)
    expected, attention = reference(model, x, zero_head=(layer, head))
    assert _rel(edited[point], expected) <= 1e-5
    assert _rel(edited[point], plain) > 1e-4  # the head mattered: the equality above is not the unedited output
    # Only what depends on the head changed: the edited layer's other heads are untouched.
    untouched = run(model, x, keep=(f"blocks.{layer}.attn",))[f"blocks.{layer}.attn"]
    others = [h for h in range(untouched.shape[-3]) if h != head]
    assert torch.equal(edited[f"blocks.{layer}.attn"][..., others, :, :], untouched[..., others, :, :])


def test_two_threads_with_different_edits_on_one_model_get_their_own_results(loaded_cases):
    loaded = loaded_cases["eva02"]
    model, x = loaded.model, _images(loaded, 1)
    point = _output_point(model)

    assert_edits_stay_in_their_thread(run, model, x, point)


def test_keep_reads_every_named_point_with_the_documented_shapes_and_stop_after_ends_the_run(loaded_cases):
    loaded = loaded_cases["beit"]
    model, x = loaded.model, _images(loaded, 1)
    layout = loaded.layout
    N, H = layout.num_tokens, adapter_for(model).num_heads(model)
    with torch.no_grad():
        out = run(model, x, keep=("embed", "blocks.1.*", "final_norm", "pooled", "logits"))
        stopped = run(model, x, keep=("blocks.*.attn",), stop_after="blocks.0.attn")
    shapes = {k.split(".")[-1]: tuple(v.shape) for k, v in out.items() if k.startswith("blocks.1.")}
    D = out["embed"].shape[-1]
    assert shapes["attn"] == shapes["scores"] == (1, H, N, N)
    assert shapes["q"] == shapes["k"] == shapes["v"] == shapes["z"] == (1, H, N, D // H)
    for p in ("resid_pre", "ln1", "attn_out", "resid_mid", "ln2", "mlp_out", "resid_post"):
        assert shapes[p] == (1, N, D), p
    assert shapes["mlp_hidden"][:2] == (1, N) and shapes["mlp_hidden"][2] > D
    # The residual stream adds up: resid_mid = resid_pre + attn_out, resid_post = resid_mid + mlp_out.
    b = {k.split(".")[-1]: v for k, v in out.items() if k.startswith("blocks.1.")}
    torch.testing.assert_close(b["resid_mid"], b["resid_pre"] + b["attn_out"], rtol=0, atol=0)
    torch.testing.assert_close(b["resid_post"], b["resid_mid"] + b["mlp_out"], rtol=0, atol=0)
    torch.testing.assert_close(b["attn"], b["scores"].softmax(-1), rtol=1e-6, atol=1e-7)
    assert out["logits"].shape == (1, adapter_for(model).num_classes(model))
    assert list(stopped) == ["blocks.0.attn"]


def test_every_registered_adapter_has_an_example():
    load_all()
    test_only = {name for name, a in ADAPTERS.items() if type(a).__module__.startswith(("test_", "tests."))}
    missing = set(ADAPTERS) - set(EXAMPLES) - set(HF_EXAMPLES) - test_only
    assert not missing, f"adapters without a parity example: {sorted(missing)}"
