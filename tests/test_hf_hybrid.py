"""Hugging Face transformers ViTs and timm hybrid ResNet+ViT models, loaded the way users load them.

Tiny random models of each family are saved as users save them (``save_pretrained`` folders,
safetensors checkpoints) and loaded through ``load_model`` / the CLI. Their captured attention is
held against the libraries' own references: transformers' eager ``output_attentions`` and the
models' default (SDPA) forward for the outputs.
"""
import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from vitviz.trace import trace_for_analysis as capture  # noqa: E402
from vitviz.errors import ModelError  # noqa: E402
from vitviz.io.images import load_image  # noqa: E402
from vitviz.sources.preprocess import preprocess  # noqa: E402
from vitviz.sources.models import ModelSpec, load_model  # noqa: E402

from conftest import ASSETS, capture_in_threads, timm_unfused_attention  # noqa: E402

SMALL = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
             image_size=64, patch_size=16)

# family: (config class, model class, config overrides, image processor class, processor kwargs,
#          expected prefix tokens)
HF_FAMILIES = {
    "vit": ("ViTConfig", "ViTForImageClassification", {"num_labels": 5, "id2label": {i: f"thing {i}" for i in range(5)}},
            "ViTImageProcessor", {"size": {"height": 64, "width": 64}}, ("cls",)),
    "deit_distilled": ("DeiTConfig", "DeiTForImageClassificationWithTeacher", {"num_labels": 3},
                       "DeiTImageProcessor", {"size": {"height": 80, "width": 80},
                                              "crop_size": {"height": 64, "width": 64}}, ("cls", "dist")),
    "dinov2": ("Dinov2Config", "Dinov2Model", {"patch_size": 14, "image_size": 70},
               "BitImageProcessor", {"size": {"shortest_edge": 80}, "crop_size": {"height": 70, "width": 70},
                                     "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]},
               ("cls",)),
    "dinov2_registers": ("Dinov2WithRegistersConfig", "Dinov2WithRegistersModel",
                         {"patch_size": 14, "image_size": 70, "num_register_tokens": 4},
                         "BitImageProcessor", {"size": {"shortest_edge": 70}, "crop_size": {"height": 70, "width": 70}},
                         ("cls", "reg0", "reg1", "reg2", "reg3")),
    "clip": ("CLIPVisionConfig", "CLIPVisionModel", {}, "CLIPImageProcessor",
             {"size": {"shortest_edge": 64}, "crop_size": {"height": 64, "width": 64}}, ("cls",)),
    "siglip": ("SiglipVisionConfig", "SiglipVisionModel", {}, "SiglipImageProcessor",
               {"size": {"height": 64, "width": 64}}, ()),
    # Relative position biases, each layer's own and a shared one, and no absolute embedding.
    "beit": ("BeitConfig", "BeitForImageClassification",
             {"num_labels": 4, "use_relative_position_bias": True, "use_shared_relative_position_bias": True,
              "use_absolute_position_embeddings": False, "use_mean_pooling": True, "layer_scale_init_value": 0.1},
             "BeitImageProcessor", {"size": {"height": 64, "width": 64}, "do_center_crop": False}, ("cls",)),
    # Rotary embeddings on the patch tokens (no absolute table), CLS + 4 registers, layer scale.
    "dinov3": ("DINOv3ViTConfig", "DINOv3ViTModel", {"num_register_tokens": 4, "layerscale_value": 0.1},
               "DINOv3ViTImageProcessor", {"size": {"height": 64, "width": 64}}, ("cls", "reg0", "reg1", "reg2", "reg3")),
}


def _save_hf(folder, family: str, seed: int = 0, processor: bool = True):
    config_cls, model_cls, extra, proc_cls, proc_kwargs, _ = HF_FAMILIES[family]
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**(SMALL | extra)))
    with torch.no_grad():  # random init leaves biases and layer scales at 0/1: make a wrong forward show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)
    if processor:
        getattr(transformers, proc_cls)(**proc_kwargs).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    return {f: str(_save_hf(tmp_path_factory.mktemp(f), f)) for f in HF_FAMILIES}


@pytest.fixture(scope="module")
def chelsea():
    return load_image(ASSETS / "chelsea.jpg").image


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("family", list(HF_FAMILIES))
def test_hf_capture_equals_the_models_own_forward_and_eager_attention(family, hf_folders, chelsea):
    folder = hf_folders[family]
    loaded = load_model(ModelSpec(name=folder))
    batch = preprocess([chelsea, chelsea.transpose(0)], loaded.data_config)
    out = capture(loaded.model, batch.tensor)

    cls = getattr(transformers, HF_FAMILIES[family][1])
    default = cls.from_pretrained(folder).eval()  # the model's own default attention (SDPA)
    assert default.config._attn_implementation == "sdpa"
    eager = cls.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        own = default(pixel_values=batch.tensor)
        ref = eager(pixel_values=batch.tensor, output_attentions=True)
        base = default.base_model(pixel_values=batch.tensor) if hasattr(own, "logits") else own
    if hasattr(own, "logits"):
        logits = own.logits
        assert out.logits is not None and _rel(out.logits, logits) < 1e-5
        assert loaded.num_classes == logits.shape[-1]
    else:
        assert out.logits is None and not loaded.has_head
    assert _rel(out["final_norm"], base.last_hidden_state) < 1e-5
    assert torch.equal(out.stack("attn"), torch.stack(ref.attentions, 1))
    assert torch.allclose(out.stack("attn").sum(-1), torch.ones(()), atol=1e-5)

    prefix = HF_FAMILIES[family][5]
    config = default.config
    layout = out.layout
    assert layout.prefix_tokens == prefix
    assert layout.patch_size == (config.patch_size, config.patch_size)
    assert layout.grid_size == (config.image_size // config.patch_size,) * 2
    assert out.stack("attn").shape == (2, 3, 4, layout.num_tokens, layout.num_tokens)
    assert batch.tensor.shape[-2:] == (config.image_size, config.image_size)


def test_vit_attention_is_softmax_of_scaled_queries_and_keys(hf_folders, chelsea):
    """Layer 1's attention by hand from the weights: softmax(q k^T / sqrt(d)) of the layer-normed embeddings."""
    loaded = load_model(ModelSpec(name=hf_folders["vit"]))
    x = preprocess([chelsea], loaded.data_config).tensor
    out = capture(loaded.model, x)
    vit = loaded.model.vit
    with torch.no_grad():
        layer = vit.layers[0]  # transformers 5.x names (q_proj, k_proj)
        tokens = layer.layernorm_before(vit.embeddings(x))
        B, N, _ = tokens.shape
        q = layer.attention.q_proj(tokens).view(B, N, 4, 16).transpose(1, 2)
        k = layer.attention.k_proj(tokens).view(B, N, 4, 16).transpose(1, 2)
        probs = (q @ k.transpose(-1, -2) / 4.0).softmax(-1)
    assert torch.allclose(out.stack("attn")[:, 0], probs, atol=1e-6)


def test_hf_preprocessing_keeps_the_exact_model_input_image(hf_folders, chelsea):
    """The kept image, normalised with the processor's mean/std, is the tensor the model saw (to rounding)."""
    loaded = load_model(ModelSpec(name=hf_folders["dinov2"]))
    assert loaded.data_config["crop_mode"] == "center"
    assert loaded.data_config["crop_pct"] == pytest.approx(70 / 80)
    batch = preprocess([chelsea], loaded.data_config)
    image = batch.images[0]
    assert image.size == (70, 70)
    mean = torch.tensor(loaded.data_config["mean"]).view(3, 1, 1)
    std = torch.tensor(loaded.data_config["std"]).view(3, 1, 1)
    pixels = torch.as_tensor(np.array(image), dtype=torch.float32).permute(2, 0, 1) / 255
    # Rounding the processor's float pixels to 8 bits moves each by at most half a step.
    assert float(((pixels - mean) / std - batch.tensor[0]).abs().max()) <= 0.5 / 255 / min(std) + 1e-5


def test_hf_labels_and_settings_record_library_family_and_layout(hf_folders):
    loaded = load_model(ModelSpec(name=hf_folders["vit"]))
    card = json.loads(json.dumps(loaded.card(), default=str))
    assert card["library"] == "transformers"
    assert card["family"] == "ViT"
    assert card["attn_implementation"] == "eager"
    assert card["token_layout"]["prefix_tokens"] == ["cls"]
    assert card["layers"] == 3 and card["heads"] == 4 and card["num_classes"] == 5
    from vitviz.adapters import adapter_for

    class_labels = adapter_for(loaded.model).class_labels
    assert class_labels(loaded.model) == tuple(f"thing {i}" for i in range(5))
    from vitviz.analyses.tokens import top_classes

    assert loaded.class_labels == class_labels(loaded.model)
    assert top_classes(np.array([0.0, 0, 3, 0, 0]), 1, loaded.class_labels)[0][:2] == (2, "thing 2")


def test_threads_sharing_one_hf_model_match_serial_bit_for_bit(hf_folders, chelsea):
    loaded = load_model(ModelSpec(name=hf_folders["deit_distilled"]))
    inputs = [preprocess([chelsea.rotate(a)], loaded.data_config).tensor for a in range(0, 80, 10)]
    serial = [capture(loaded.model, x) for x in inputs]
    results = capture_in_threads(loaded.model, inputs)
    for s, r in zip(serial, results):
        assert torch.equal(s.stack("attn"), r.stack("attn")) and torch.equal(s.logits, r.logits)
    assert loaded.model.config._attn_implementation == "eager"


def test_cli_analyzes_with_an_hf_folder(hf_folders, tmp_path):
    from vitviz.cli import main

    assert main(["analyze", str(ASSETS / "chelsea.jpg"), "--out", str(tmp_path), "--model", hf_folders["siglip"]]) == 0
    arrays = np.load(tmp_path / "analysis.npz")
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["model"]["library"] == "transformers"
    assert settings["model"]["token_layout"]["prefix_tokens"] == []
    assert arrays["attention"].shape[-1] == 16  # SigLIP: 4x4 patches, no CLS


def test_offline_uncached_hub_id_fails_at_once_with_a_sentence(network_calls):
    with pytest.raises(ModelError, match="not in the local Hugging Face cache and the hub cannot be reached"):
        load_model(ModelSpec(name="hf:nobody-here/vit-tiny-does-not-exist"))
    assert network_calls == []  # at once: offline mode asks no one


def test_bad_hf_inputs_get_sentences_naming_the_folder(tmp_path, hf_folders):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelError, match=r"empty: it has no config.json"):
        load_model(ModelSpec(name=str(empty)))
    with pytest.raises(ModelError, match="no such folder"):
        load_model(ModelSpec(name=str(tmp_path / "missing")))
    bert = tmp_path / "bert"
    transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64).save_pretrained(bert)
    with pytest.raises(ModelError, match=r"not supported yet: its config is a 'bert'"):
        load_model(ModelSpec(name=str(bert)))
    # Weights of a 64-wide model under a config that says 32 wide.
    wrong = tmp_path / "wrong"
    _save_hf(wrong, "vit")
    config = json.loads((wrong / "config.json").read_text())
    config.update(hidden_size=32, intermediate_size=64)
    (wrong / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=r"wrong.*weights"):
        load_model(ModelSpec(name=str(wrong)))


def test_gradient_rollout_reads_an_hf_models_head(hf_folders, chelsea):
    from vitviz.analyses.rollout import attention_gradients

    loaded = load_model(ModelSpec(name=hf_folders["vit"]))
    x = preprocess([chelsea], loaded.data_config).tensor
    out = capture(loaded.model, x)
    attention, grads, target = attention_gradients(loaded.model, x)
    assert target == int(out.logits[0].argmax())
    assert np.allclose(attention, out.stack("attn")[0].double().numpy(), atol=1e-6)
    assert grads.shape == attention.shape and np.abs(grads).max() > 0


# --- timm hybrid ResNet+ViT -------------------------------------------------------------------

HYBRID = "vit_tiny_r_s16_p8_224"  # ResNet stem of stride 4, then 8x8 patches of its feature map


@pytest.fixture(scope="module")
def hybrid_checkpoint(tmp_path_factory):
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model(HYBRID, pretrained=False)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp("hybrid") / "hybrid.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def test_hybrid_checkpoint_capture_equals_timm_with_the_stems_stride(hybrid_checkpoint, chelsea):
    loaded = load_model(ModelSpec(name=HYBRID, checkpoint=str(hybrid_checkpoint)))
    x = preprocess([chelsea, chelsea.transpose(0)], loaded.data_config).tensor
    out = capture(loaded.model, x)
    with torch.no_grad():
        own = loaded.model(x)  # timm's default fused attention
    assert _rel(out.logits, own) < 1e-5
    assert torch.allclose(out.stack("attn"), timm_unfused_attention(loaded.model, x), atol=1e-6)
    assert torch.allclose(out.stack("attn").sum(-1), torch.ones(()), atol=1e-5)
    # 224 px: the stem reduces 4x to 56x56, 8x8 patches of that give 7x7 tokens 32 px apart.
    assert out.layout.grid_size == (7, 7)
    assert out.layout.patch_size == (32, 32)
    assert out.layout.prefix_tokens == ("cls",)
    assert loaded.card()["token_layout"]["patch_size"] == (32, 32)


def test_hybrid_attention_anatomy_reproduces_the_captured_rows(hybrid_checkpoint, chelsea):
    from vitviz.analyses.anatomy import attention_anatomy, layer_qkv

    loaded = load_model(ModelSpec(name=HYBRID, checkpoint=str(hybrid_checkpoint)))
    x = preprocess([chelsea], loaded.data_config).tensor
    attention = capture(loaded.model, x).stack("attn")[0].double().numpy()
    for layer in (0, len(loaded.model.blocks) - 1):
        qkv = layer_qkv(loaded.model, x, layer)
        for head, query in ((0, 0), (1, 17)):  # the CLS row and a patch row
            np.testing.assert_allclose(attention_anatomy(qkv, head, query).weights, attention[layer, head, query],
                                       atol=1e-6)


def test_hybrid_mean_attention_distance_is_in_pixels_of_the_effective_stride(hybrid_checkpoint):
    from vitviz.analyses.distance import uniform_attention_distance

    loaded = load_model(ModelSpec(name=HYBRID, checkpoint=str(hybrid_checkpoint)))
    rows, cols = np.meshgrid(np.arange(7), np.arange(7), indexing="ij")
    centres = np.stack([rows.ravel(), cols.ravel()], 1) * 32.0
    brute = np.linalg.norm(centres[:, None] - centres[None], axis=-1).mean()
    assert uniform_attention_distance(loaded.layout) == pytest.approx(brute)


def test_hybrid_has_no_linear_rgb_filters_and_says_so(hybrid_checkpoint):
    from vitviz.analyses.filters import patch_filters

    loaded = load_model(ModelSpec(name=HYBRID, checkpoint=str(hybrid_checkpoint)))
    with pytest.raises(ValueError, match="no linear RGB patch filters"):
        patch_filters(loaded.model)


def test_cli_analyzes_a_hybrid_checkpoint(hybrid_checkpoint, tmp_path):
    from vitviz.cli import main

    argv = ["analyze", str(ASSETS / "coffee.jpg"), "--out", str(tmp_path), "--model", HYBRID,
            "--checkpoint", str(hybrid_checkpoint)]
    assert main(argv) == 0
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["model"]["token_layout"]["grid_size"] == [7, 7]
    assert np.load(tmp_path / "analysis.npz")["attention"].shape[-1] == 50


def test_r50_hybrid_layout_and_budget_use_stride_16():
    import timm

    from vitviz.sources.budget import architecture
    from vitviz.layout import TokenLayout

    torch.manual_seed(0)
    model = timm.create_model("vit_base_r50_s16_224", pretrained=False, img_size=64, embed_dim=64, depth=2,
                              num_heads=4, num_classes=10).eval()
    x = torch.randn(1, 3, 64, 64)
    out = capture(model, x)
    with torch.no_grad():
        assert _rel(out.logits, model(x)) < 1e-5
    assert out.layout == TokenLayout(("cls",), (4, 4), (16, 16), "token", 1)
    assert architecture("vit_base_r50_s16_224").patch == (16, 16)


@pytest.mark.slow
def test_app_loads_an_hf_folder_from_the_sidebar_and_the_heads_page_shows_its_maps(hf_folders):
    from streamlit.testing.v1 import AppTest

    from test_app import APP, _heatmaps
    from vitviz.analyses.maps import query_attention_map

    at = AppTest.from_file(APP, default_timeout=180).run()
    at.switch_page("pages/2_heads.py").run()
    at.sidebar.selectbox(key="model_choice").set_value("Hugging Face (hub id or local folder)").run()
    at.sidebar.text_input(key="hf_name").input(hf_folders["dinov2_registers"]).run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    at.slider(key="heads_layer").set_value(2).run()
    loaded = load_model(ModelSpec(name=hf_folders["dinov2_registers"]))
    out = capture(loaded.model, preprocess([load_image(ASSETS / "astronaut.jpg").image], loaded.data_config).tensor)
    maps = _heatmaps(at, "heads_grid")
    assert len(maps) == 4 and maps[0].shape == (5, 5)
    np.testing.assert_allclose(maps[3], query_attention_map(out.stack("attn")[0].numpy(), out.layout, 1, 3, "cls"),
                               atol=1e-6)
    # A folder without a config: a sentence, and the folder's model stays.
    at.sidebar.text_input(key="hf_name").input("/nonexistent/vitviz-model").run()
    assert any("no such folder" in e.value for e in at.error)
    assert len(_heatmaps(at, "heads_grid")) == 4


def test_hf_patch_filters_and_position_embeddings_are_the_models_own(hf_folders):
    from vitviz.analyses.anatomy import layer_qkv
    from vitviz.analyses.filters import patch_filters
    from vitviz.analyses.posembed import patch_position_embeddings

    vit = load_model(ModelSpec(name=hf_folders["vit"]))
    np.testing.assert_array_equal(patch_filters(vit.model),
                                  vit.model.vit.embeddings.patch_embeddings.projection.weight.numpy())
    np.testing.assert_array_equal(patch_position_embeddings(vit.model, vit.layout),
                                  vit.model.vit.embeddings.position_embeddings[0, 1:].numpy())
    assert patch_position_embeddings(vit.model, vit.layout, (6, 6)).shape == (36, 64)
    siglip = load_model(ModelSpec(name=hf_folders["siglip"]))  # nn.Embedding, no prefix row
    np.testing.assert_array_equal(patch_position_embeddings(siglip.model, siglip.layout),
                                  siglip.model.embeddings.position_embedding.weight.numpy())
    deit = load_model(ModelSpec(name=hf_folders["deit_distilled"]))  # CLS and distillation rows dropped
    np.testing.assert_array_equal(patch_position_embeddings(deit.model, deit.layout),
                                  deit.model.deit.embeddings.position_embeddings[0, 2:].numpy())
    # The anatomy reads q, k, v through the adapter (held against the model in test_hf_explain.py).
    assert layer_qkv(vit.model, torch.zeros(1, 3, 64, 64), 0).q.shape == (4, 17, 16)


@pytest.mark.slow
def test_app_pages_with_an_hf_model_show_figures_or_a_sentence(hf_folders):
    from streamlit.testing.v1 import AppTest

    from test_app import APP

    at = AppTest.from_file(APP, default_timeout=180).run()
    at.sidebar.selectbox(key="model_choice").set_value("Hugging Face (hub id or local folder)").run()
    at.sidebar.text_input(key="hf_name").input(hf_folders["vit"]).run()
    for page in ("pages/1_overview.py", "pages/5_filters.py", "pages/6_position_embeddings.py", "pages/7_anatomy.py"):
        at.switch_page(page).run()
        assert not at.exception, (page, [e.message for e in at.exception])
        assert not at.error, (page, [e.value for e in at.error])
    assert at.get("plotly_chart"), "the anatomy page draws its charts for a transformers model"


def test_memory_budget_reads_a_transformers_folder_config_and_refuses_what_does_not_fit(hf_folders):
    from vitviz.sources.budget import architecture, check_resolution

    folder = hf_folders["dinov2_registers"]  # CLS + 4 registers, patch 14
    arch = architecture(folder)
    assert (arch.depth, arch.heads, arch.patch, arch.prefix_tokens, arch.default_size) == (
        SMALL["num_hidden_layers"], SMALL["num_attention_heads"], (14, 14), 5, 70)
    # 140 px: 10x10 patches + 5 prefix tokens = 105 tokens per image.
    assert arch.attention_bytes(140) == SMALL["num_hidden_layers"] * SMALL["num_attention_heads"] * 105 * 105 * 4
    check_resolution(folder, 140, arch.attention_bytes(140))  # exactly at the limit: allowed
    with pytest.raises(ModelError, match=r"largest size that fits is 126 px"):
        check_resolution(folder, 140, arch.attention_bytes(140) - 1)
    assert architecture("hf:nobody/not-in-the-cache") is None  # offline and uncached: nothing downloaded


# BEiT here has relative position biases only, DINOv3 rotary embeddings: their page says so
# (tests/test_families.py, tests/test_adapters_hf.py).
@pytest.mark.parametrize("family", [f for f in HF_FAMILIES if f not in ("beit", "dinov3")])
def test_position_embedding_page_resamples_as_the_models_own_interpolate_pos_encoding(family, hf_folders):
    from vitviz.adapters import adapter_for

    loaded = load_model(ModelSpec(name=hf_folders[family]))
    embeddings = next(m for m in loaded.model.modules() if hasattr(m, "interpolate_pos_encoding"))
    native = adapter_for(loaded.model).native_pos_embed(loaded.model, loaded.layout)
    prefix = loaded.layout.pos_embed_prefix_rows
    patch = loaded.layout.patch_size
    for grid in [(7, 5), (2, 3)]:  # larger and smaller than the stored 4x4 (5x5) grid, not square
        dummy = torch.zeros(1, prefix + grid[0] * grid[1], SMALL["hidden_size"])
        with torch.no_grad():
            own = embeddings.interpolate_pos_encoding(dummy, grid[0] * patch[0], grid[1] * patch[1])
        assert own.shape[1] == prefix + grid[0] * grid[1]
        torch.testing.assert_close(native.grid_rows(grid), own[0, prefix:], rtol=1e-6, atol=1e-6)
