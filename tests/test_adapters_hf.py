"""The adapter contract for every Hugging Face transformers family, against the library's own forward.

Each family's tiny random model is saved with ``save_pretrained`` and loaded the way users load it
(``load_model(ModelSpec(folder))``, test_hf_hybrid.py's fixtures). The reference is a second copy
built by transformers itself from the same folder with eager attention, run by its own forward:
``logits``, ``pooler_output``/``last_hidden_state`` and ``output_attentions``. Zeroing a head is done
inside the library's copy by hand: a forward pre-hook on that layer's attention output projection
zeroes the head's slice of its input, which is exactly what zero probabilities give (0 @ v = 0).
"""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import assert_edits_stay_in_their_thread  # noqa: E402
from vitviz.adapters import adapter_for, run  # noqa: E402
from vitviz.sources.preprocess import preprocess  # noqa: E402
from vitviz.lens import Lens  # noqa: E402
from vitviz.sources.models import ModelSpec, load_model  # noqa: E402

from test_hf_hybrid import HF_FAMILIES, chelsea, hf_folders  # noqa: E402,F401  (shared fixtures)

# adapter name -> the HF_FAMILIES examples it reads (test_adapters.py's registry test reads this too)
HF_EXAMPLES = {
    "hf-vit": ("vit", "deit_distilled"),
    "hf-dinov2": ("dinov2", "dinov2_registers"),
    "hf-clip": ("clip", "siglip"),
    "hf-beit": ("beit",),
    "hf-dinov3": ("dinov3",),
}
CASES = [(name, family) for name, families in HF_EXAMPLES.items() for family in families]
IDS = [f"{a}-{f}" for a, f in CASES]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


@pytest.fixture(scope="module")
def loaded_hf(hf_folders):  # noqa: F811
    return {family: load_model(ModelSpec(name=hf_folders[family])) for _, family in CASES}


def _library(family: str, folder: str):
    """The family's class built by transformers from the folder, eager attention: vitviz is not involved."""
    return getattr(transformers, HF_FAMILIES[family][1]).from_pretrained(folder, attn_implementation="eager").eval()


def _inputs(loaded, chelsea, n: int = 2) -> torch.Tensor:  # noqa: F811
    return preprocess([chelsea, chelsea.transpose(0)][:n], loaded.data_config).tensor


def _reference(model, x: torch.Tensor, zero_head: tuple[int, int] | None = None):
    """(logits or None, pooled, last_hidden_state, attention (B, L, H, N, N)) of the library's own forward on a
    copy; ``zero_head=(layer, head)`` zeroes that head's context where its output projection reads it."""
    model = copy.deepcopy(model)
    if zero_head is not None:
        layer, head = zero_head
        projection = [m for n, m in model.named_modules()
                      if n.endswith(("o_proj", "out_proj")) and (".layers." in n or ".layer." in n)][layer]
        d = projection.in_features // model.config.num_attention_heads

        def zero(module, args):
            z = args[0].clone()
            z[..., head * d:(head + 1) * d] = 0
            return (z,)
        projection.register_forward_pre_hook(zero)
    with torch.no_grad():
        out = model(pixel_values=x, output_attentions=True)
        base = out if getattr(out, "last_hidden_state", None) is not None else \
            model.base_model(pixel_values=x)
    pooled = base.pooler_output if getattr(base, "pooler_output", None) is not None else base.last_hidden_state[:, 0]
    return getattr(out, "logits", None), pooled, base.last_hidden_state, torch.stack(out.attentions, 1)


@pytest.mark.parametrize("adapter_name,family", CASES, ids=IDS)
def test_spelled_out_forward_equals_the_library_forward_and_its_eager_attention(adapter_name, family, loaded_hf,
                                                                                hf_folders, chelsea):  # noqa: F811
    loaded = loaded_hf[family]
    model, x = loaded.model, _inputs(loaded, chelsea)
    adapter = adapter_for(model)
    assert adapter.name == adapter_name
    # Through the front door: vitviz.Lens.trace is the one way every consumer reads a forward.
    out = Lens(loaded).trace(x, keep=("pooled", "final_norm", "attn") + (("logits",) if loaded.has_head else ()))
    logits, pooled, last, attention = _reference(_library(family, hf_folders[family]), x)
    # float32 end to end in the same order of operations: equal to the last bit here; 1e-5 allows another BLAS.
    if logits is not None:
        assert _rel(out["logits"], logits) <= 1e-5
    else:
        assert "logits" not in out and adapter.num_classes(model) == 0
    assert _rel(out["pooled"], pooled) <= 1e-5
    assert _rel(out["final_norm"], last) <= 1e-5
    ours = out.stack("attn")
    assert ours.shape[1] == adapter.num_layers(model)
    assert ours.dtype == torch.float32 and float((ours - attention).abs().max()) <= 1e-5


@pytest.mark.parametrize("adapter_name,family", CASES, ids=IDS)
def test_an_identity_edit_is_bit_identical_and_zeroing_a_head_matches_the_library(adapter_name, family, loaded_hf,
                                                                                  hf_folders, chelsea):  # noqa: F811
    loaded = loaded_hf[family]
    model, x = loaded.model, _inputs(loaded, chelsea)
    point = "logits" if adapter_for(model).num_classes(model) else "pooled"
    layer, head = 1, 2
    with torch.no_grad():
        plain = run(model, x, keep=(point, "final_norm"))
        same = run(model, x, keep=(point, "final_norm"), edit={"blocks.*.attn": lambda a, p: a})

        def zero(a, p):
            a = a.clone()
            a[:, head] = 0
            return a
        edited = run(model, x, keep=(point, "final_norm", "blocks.*.attn"), edit={f"blocks.{layer}.attn": zero})
    assert torch.equal(plain[point], same[point]) and torch.equal(plain["final_norm"], same["final_norm"])
    logits, pooled, last, attention = _reference(_library(family, hf_folders[family]), x, zero_head=(layer, head))
    assert _rel(edited[point], logits if point == "logits" else pooled) <= 1e-5
    assert _rel(edited["final_norm"], last) <= 1e-5
    assert _rel(edited["final_norm"], plain["final_norm"]) > 1e-4  # the head mattered: the edit reached the output
    # Later layers see the change (the attention of the next layer moves); the edited layer's other heads do not.
    unedited = run(model, x, keep=("blocks.*.attn",))
    others = [h for h in range(attention.shape[2]) if h != head]
    assert torch.equal(edited[f"blocks.{layer}.attn"][:, others], unedited[f"blocks.{layer}.attn"][:, others])
    assert float((edited[f"blocks.{layer + 1}.attn"] - unedited[f"blocks.{layer + 1}.attn"]).abs().max()) > 1e-6
    assert float((edited[f"blocks.{layer + 1}.attn"] - attention[:, layer + 1]).abs().max()) <= 1e-5


@pytest.mark.parametrize("family", ["beit", "clip", "dinov3"])
def test_two_threads_with_different_edits_on_one_hf_model_get_their_own_results(family, loaded_hf,
                                                                                chelsea):  # noqa: F811
    loaded = loaded_hf[family]
    model, x = loaded.model, _inputs(loaded, chelsea, 1)
    point = "logits" if adapter_for(model).num_classes(model) else "pooled"

    assert_edits_stay_in_their_thread(run, model, x, point)


@pytest.mark.parametrize("adapter_name,family", CASES, ids=IDS)
def test_every_block_point_of_an_hf_model_has_its_documented_shape_and_the_residual_adds_up(adapter_name, family,
                                                                                           loaded_hf,
                                                                                           chelsea):  # noqa: F811
    from vitviz.adapters import BLOCK_POINTS

    loaded = loaded_hf[family]
    model, x = loaded.model, _inputs(loaded, chelsea, 1)
    N, H = loaded.layout.num_tokens, adapter_for(model).num_heads(model)
    with torch.no_grad():
        out = run(model, x, keep=("embed", "blocks.1.*"))
    b = {k.split(".")[-1]: v for k, v in out.items() if k.startswith("blocks.1.")}
    assert set(b) == set(BLOCK_POINTS)
    D = out["embed"].shape[-1]
    assert b["attn"].shape == b["scores"].shape == (1, H, N, N)
    assert b["q"].shape == b["k"].shape == b["v"].shape == b["z"].shape == (1, H, N, D // H)
    assert b["mlp_hidden"].shape[:2] == (1, N)
    torch.testing.assert_close(b["resid_mid"], b["resid_pre"] + b["attn_out"], rtol=0, atol=0)
    torch.testing.assert_close(b["resid_post"], b["resid_mid"] + b["mlp_out"], rtol=0, atol=0)
    torch.testing.assert_close(b["attn"], b["scores"].softmax(-1), rtol=1e-6, atol=1e-7)


def test_dinov3_rotates_only_the_patch_tokens_q_and_k_with_the_libraries_rope(loaded_hf, chelsea):  # noqa: F811
    """The ``q`` point is the projection rotated as the paper's RoPE says: each patch's pairs of features
    (i, i + d/2) turn by its centre's angles (cos, sin of ``rope_embeddings``); CLS and registers do not turn."""
    loaded = loaded_hf["dinov3"]
    model, x = loaded.model, _inputs(loaded, chelsea, 1)
    with torch.no_grad():
        out = run(model, x, keep=("blocks.0.ln1", "blocks.0.q"))
        attn = model.model.layer[0].attention
        raw = attn.q_proj(out["blocks.0.ln1"]).view(1, -1, attn.num_heads, attn.head_dim).transpose(1, 2)
        cos, sin = model.rope_embeddings(x)
    prefix = len(loaded.layout.prefix_tokens)
    assert prefix == 5 and cos.shape[0] == loaded.layout.num_patches
    half = attn.head_dim // 2
    p = raw[:, :, prefix:]
    by_hand = p * cos + torch.cat([-p[..., half:], p[..., :half]], dim=-1) * sin
    torch.testing.assert_close(out["blocks.0.q"][:, :, :prefix], raw[:, :, :prefix], rtol=0, atol=0)
    torch.testing.assert_close(out["blocks.0.q"][:, :, prefix:], by_hand, rtol=1e-6, atol=1e-6)
    assert float((out["blocks.0.q"][:, :, prefix:] - p).abs().max()) > 1e-3  # the rotation is not the identity


def test_dinov3_folder_reads_like_dinov2_in_analyze_filters_and_the_position_view(hf_folders, tmp_path):  # noqa: F811
    import json

    import numpy as np

    from test_hf_hybrid import ASSETS
    from vitviz.cli import main
    from vitviz.errors import ViewNotApplicable
    from vitviz.analyses.filters import patch_filters
    from vitviz.analyses.posembed import patch_position_embeddings

    folder = hf_folders["dinov3"]
    assert main(["analyze", str(ASSETS / "chelsea.jpg"), "--out", str(tmp_path), "--model", folder]) == 0
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["model"]["library"] == "transformers" and settings["model"]["family"] == "DINOv3"
    assert settings["model"]["token_layout"]["prefix_tokens"] == ["cls", "reg0", "reg1", "reg2", "reg3"]
    attention = np.load(tmp_path / "analysis.npz")["attention"]
    assert attention.shape[-2:] == (5 + 16, 5 + 16)  # CLS + 4 registers + 4x4 patches
    np.testing.assert_allclose(attention.sum(-1), 1, atol=1e-5)
    loaded = load_model(ModelSpec(name=folder))
    np.testing.assert_array_equal(patch_filters(loaded.model), loaded.model.embeddings.patch_embeddings.weight.numpy())
    assert "rotary" in loaded.position_encoding and loaded.native_pos_embed is None
    with pytest.raises(ViewNotApplicable, match="rotary position embedding"):
        patch_position_embeddings(loaded.model, loaded.layout)
