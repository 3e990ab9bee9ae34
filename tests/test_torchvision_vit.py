"""torchvision's VisionTransformer loaded the way users load it (``--model torchvision:NAME --checkpoint FILE``
with a ``torch.save(model.state_dict())`` file), checked against torchvision's own forward and transforms.

A tiny architecture gets a builder in torchvision's own registry (as a user's ``@register_model`` builder would),
so the loader's path is the one ``torchvision:vit_b_16`` takes; nothing is downloaded.
"""
import json

import numpy as np
import pytest
import torch

from conftest import ASSETS
from vitviz.cli import main
from vitviz.errors import ModelError
from vitviz.sources.models import ModelSpec, load_model

TINY = "vit_tiny_vitviz_test"
TINY_CONFIG = dict(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32)


def tiny_builder(*, weights=None, progress=True, **kwargs):
    from torchvision.models.vision_transformer import VisionTransformer

    assert weights is None
    return VisionTransformer(**(TINY_CONFIG | kwargs))


def register_tiny() -> str:
    """Register the tiny builder in torchvision's registry (once per process); its ``torchvision:`` name."""
    from torchvision.models._api import BUILTIN_MODELS

    BUILTIN_MODELS.setdefault(TINY, tiny_builder)
    return f"torchvision:{TINY}"


def save_tiny(path, num_classes: int = 10, seed: int = 0):
    """A tiny model's state dict saved as users save it; every weight moved (torchvision zeroes the head and
    the class token, so a wrong forward would not show)."""
    torch.manual_seed(seed)
    model = tiny_builder(num_classes=num_classes)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    torch.save(model.state_dict(), path)
    return path


def load_tiny(tmp_path_factory):
    """The tiny model through ``load_model`` (the test_adapters example)."""
    path = save_tiny(tmp_path_factory.mktemp("torchvision") / "tiny.pth")
    return load_model(ModelSpec(register_tiny(), checkpoint=str(path)))


def torchvision_reference(model, x, zero_head: tuple[int, int] | None = None):
    """(logits of torchvision's own forward, each layer's probabilities from its MultiheadAttention with
    need_weights=True (B, L, H, N, N)); ``zero_head=(layer, head)`` zeroes that head's probabilities, with
    attention then recomputed from the weights (torchvision's module has no place to change them)."""
    import torch.nn.functional as F

    seen = []
    with torch.no_grad():
        h = model._process_input(x)
        h = torch.cat([model.class_token.expand(h.shape[0], -1, -1), h], dim=1) + model.encoder.pos_embedding
        for i, blk in enumerate(model.encoder.layers):
            a = blk.ln_1(h)
            out, weights = blk.self_attention(a, a, a, need_weights=True, average_attn_weights=False)
            if zero_head is not None and zero_head[0] == i:
                mha = blk.self_attention
                weights = weights.clone()
                weights[:, zero_head[1]] = 0
                v = F.linear(a, mha.in_proj_weight, mha.in_proj_bias).chunk(3, -1)[2]
                B, N, D = v.shape
                v = v.reshape(B, N, mha.num_heads, -1).transpose(1, 2)
                out = mha.out_proj((weights @ v).transpose(1, 2).reshape(B, N, D))
            seen.append(weights)
            h = h + out
            h = h + blk.mlp(blk.ln_2(h))
        logits = model.heads(model.encoder.ln(h)[:, 0])
    if zero_head is None:
        with torch.no_grad():  # the walk above is torchvision's forward: check it is, so the reference is one
            assert torch.allclose(logits, model(x), rtol=0, atol=1e-5 * logits.abs().max().item())
    return logits, torch.stack(seen, 1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_tiny(tmp_path_factory)


def _photos(loaded, n=2):
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess

    image = load_image(ASSETS / "chelsea.jpg").image
    return preprocess([image, image.transpose(0)][:n], loaded.data_config).tensor


def test_loaded_model_runs_like_torchvision(tiny):
    from vitviz.adapters import run

    x = _photos(tiny)
    assert tiny.adapter.name == "torchvision-vit" and tiny.num_classes == 10
    with torch.no_grad():
        out = run(tiny.model, x, keep=("logits", "blocks.*.attn"))
        ref = tiny.model(x)
    _, attention = torchvision_reference(tiny.model, x)
    # float32, two layers: the spelled-out softmax(q kᵀ/√d) v and torchvision's fused kernel sum in another order,
    # a few ulps (1.2e-7) per op through ~10 ops per layer: 1e-5 of the largest value is far above that.
    assert (out["logits"] - ref).abs().max() <= 1e-5 * ref.abs().max()
    for i in range(2):
        assert (out[f"blocks.{i}.attn"] - attention[:, i]).abs().max() <= 1e-5, i


def test_preprocessing_is_torchvisions_transform_of_the_weights():
    """vit_b_16 at 224 px: IMAGENET1K_V1's resize 256 bilinear, crop 224, ImageNet mean/std (torchvision's own
    ``weights.transforms()`` is the reference); SWAG E2E at 384: bicubic, no crop margin."""
    from torchvision.models import ViT_B_16_Weights

    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess
    from vitviz.sources.torchvision_models import data_config

    image = load_image(ASSETS / "chelsea.jpg").image
    for size, weights in ((224, ViT_B_16_Weights.IMAGENET1K_V1), (384, ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1)):
        config, text = data_config(size, None, ViT_B_16_Weights)
        assert weights.name in text
        got = preprocess([image], config).tensor[0]
        ref = weights.transforms()(image)
        assert got.shape == ref.shape == (3, size, size)
        # the same resize and crop; ToTensor vs convert_image_dtype then Normalize: float32 rounding only
        assert (got - ref).abs().max() <= 1e-5, size


def test_analyze_through_the_cli_writes_torchvisions_attention(tmp_path):
    path = save_tiny(tmp_path / "tiny.pth")
    out = tmp_path / "out"
    assert main(["analyze", str(ASSETS / "chelsea.jpg"), "--model", register_tiny(), "--checkpoint", str(path),
                 "--attribution", "attnlrp", "--out", str(out)]) == 0
    data = np.load(out / "analysis.npz")
    loaded = load_model(ModelSpec(register_tiny(), checkpoint=str(path)))
    logits, attention = torchvision_reference(loaded.model, torch.from_numpy(data["input"]))
    assert data["attention"].shape == (1, 2, 2, 17, 17)
    np.testing.assert_allclose(data["attention"], attention.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(data["logits"], logits.numpy(), rtol=0, atol=1e-5 * logits.abs().max().item())
    assert data["attribution_attnlrp"].shape == (1, 4, 4)
    settings = json.loads((out / "settings.json").read_text())
    assert settings["model"]["library"] == "torchvision"
    assert settings["analysis"]["attribution"]["target"]["kind"] == "logit"


def test_checkpoint_size_resolution_and_misfit_are_read_from_the_tensors(tmp_path):
    path = save_tiny(tmp_path / "tiny.pth", num_classes=3)
    name = register_tiny()
    wider = load_model(ModelSpec(name, checkpoint=str(path), img_size=48))
    assert wider.model.image_size == 48 and wider.layout.grid_size == (6, 6) and wider.num_classes == 3
    assert wider.data_config["input_size"] == (3, 48, 48)
    # torchvision's own resampling of the position embedding is the reference
    from torchvision.models.vision_transformer import interpolate_embeddings

    expected = interpolate_embeddings(48, 8, torch.load(path, weights_only=True))["encoder.pos_embedding"]
    assert torch.equal(wider.model.encoder.pos_embedding, expected)
    with pytest.raises(ModelError, match=r"Checkpoint tiny.pth does not fit torchvision's vit_b_32.*not in|shape"):
        load_model(ModelSpec("torchvision:vit_b_32", checkpoint=str(path)))


def test_no_network_no_cache_is_one_sentence_naming_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    with pytest.raises(ModelError, match=r"^Model 'torchvision:vit_b_16' could not be loaded: its weights IMAGENET1K_V1 "
                                         r"are not in torch hub's cache .* cannot be reached"):
        load_model(ModelSpec("torchvision:vit_b_16"))
    with pytest.raises(ModelError, match="torchvision has no model 'vit_q_99'"):
        load_model(ModelSpec("torchvision:vit_q_99"))
    with pytest.raises(ModelError, match="is not supported yet: it is a ResNet"):
        load_model(ModelSpec("torchvision:resnet18"))
    with pytest.raises(ModelError, match=f"the builder '{TINY}' has no named weights; give a file"):
        load_model(ModelSpec(register_tiny()))


def test_the_memory_budget_and_the_declared_size_apply(tmp_path):
    from vitviz.sources.budget import check_resolution
    from vitviz.sources.declared import check_weights

    # vit_h_14: 632 M parameters, 2.5 GB as float32, over a 1 GiB budget; vit_b_16 (346 MB) fits it
    with pytest.raises(ModelError, match=r"Model 'torchvision:vit_h_14': torchvision's architecture \(6\.3\de\+08 "
                                         r"parameters, as float32\) declares"):
        check_weights("torchvision:vit_h_14", 1 << 30)
    check_weights("torchvision:vit_b_16", 1 << 30)
    # vit_b_16's attention at 224: 12 layers x 12 heads x 197² x 4 bytes = 22 353 984 bytes (21.3 MiB) per image
    check_resolution("torchvision:vit_b_16", None, 22 << 20)
    with pytest.raises(ModelError, match="torchvision:vit_b_16's attention for one image"):
        check_resolution("torchvision:vit_b_16", None, 21 << 20)


def test_the_readme_command_loads_a_vit_b_16_state_dict(tmp_path, monkeypatch):
    """The README's line as typed, with a randomly initialised vit_b_16 saved as users save it."""
    from torchvision.models import vit_b_16

    from conftest import readme_command

    args = readme_command(".venv/bin/python -m vitviz analyze assets/chelsea.jpg --model torchvision:", tmp_path / "out")
    torch.manual_seed(0)
    torch.save(vit_b_16(weights=None).state_dict(), tmp_path / "vit_b_16.pth")
    (tmp_path / "assets").symlink_to(ASSETS)
    monkeypatch.chdir(tmp_path)
    assert main(args[2:]) == 0  # after "-m vitviz"
    data = np.load(tmp_path / "out" / "analysis.npz")
    assert data["attention"].shape == (1, 12, 12, 197, 197) and data["logits"].shape == (1, 1000)
    settings = json.loads((tmp_path / "out" / "settings.json").read_text())
    config = settings["model"]["data_config"]  # IMAGENET1K_V1's transform: resize 256 bilinear, crop 224
    assert config["crop_pct"] == 224 / 256 and config["interpolation"] == "bilinear"
