"""Public SAE formats (vitviz.features.public): small SAEs written the way saev and ViT-Prisma write them, read
back and encoding as those libraries' formulas say (numpy); pickles that would run code refused; widths checked."""
import dataclasses
import io
import json
import os
import sys
import types

import numpy as np
import pytest
import torch

from vitviz.features.public import check_width, load_prisma, load_sae, load_saev
from vitviz.features.sae import SAEError

D, K, k = 12, 40, 5


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    W_enc = rng.standard_normal((D, K)).astype(np.float32)  # both libraries store (d_in, d_sae)
    W_dec = rng.standard_normal((K, D)).astype(np.float32)
    W_dec /= np.linalg.norm(W_dec, axis=1, keepdims=True)
    b_enc = rng.standard_normal(K).astype(np.float32) * 0.1
    b_dec = rng.standard_normal(D).astype(np.float32)
    return {"W_enc": W_enc, "b_enc": b_enc, "W_dec": W_dec, "b_dec": b_dec}


def _topk(pre, k, relu):
    z = np.zeros_like(pre)
    for i, row in enumerate(pre):
        top = np.argsort(row)[-k:]
        z[i, top] = np.maximum(row[top], 0) if relu else row[top]
    return z


def write_saev(path, w, activation=("TopK", {"top_k": k})):
    """As saev.nn.modeling.dump writes: the JSON header line, then torch.save(state_dict) into the same file."""
    cfg = {"d_vit": D, "exp_factor": len(w["W_dec"]) // D, "n_reinit_samples": 10, "remove_parallel_grads": True,
           "normalize_w_dec": True, "seed": 0, "activation": {"cls": activation[0], "params": activation[1]}}
    header = {"schema": 2, "cfg": cfg, "commit": "unknown", "lib": "1.0.0"}
    with open(path, "wb") as fd:
        fd.write((json.dumps(header) + "\n").encode())
        torch.save({n: torch.from_numpy(v) for n, v in w.items()}, fd)


def _saev_weights(seed=0):
    """saev's d_sae is d_vit * exp_factor: 36 = 12 x 3 latents."""
    w = _weights(seed)
    return {**w, "W_enc": w["W_enc"][:, :36], "b_enc": w["b_enc"][:36], "W_dec": w["W_dec"][:36]}


def test_saev_topk_round_trip_encodes_as_saev_does(tmp_path):
    w = _saev_weights()
    w["b_enc"] -= 6.0  # some of the top k are negative (saev keeps them)
    write_saev(tmp_path / "sae.pt", w)
    sae = load_saev(tmp_path / "sae.pt", model="bundled", point="resid_post", layer=11, scale=2.0)
    assert (sae.d_model, sae.latents, sae.topk, sae.activation) == (D, 36, k, "topk")
    x = np.random.default_rng(1).standard_normal((7, D)).astype(np.float32)
    # saev: f = TopK(x W_enc + b_enc) (values as they are), x_hat = f W_dec + b_dec, on activations scaled by 2
    pre = (2 * x) @ w["W_enc"] + w["b_enc"]
    z = _topk(pre, k, relu=False)
    x_hat = (z @ w["W_dec"] + w["b_dec"]) / 2
    got_hat, got_z = sae(torch.from_numpy(x))
    np.testing.assert_allclose(got_z.detach().numpy(), z, atol=1e-5)  # float32 sums of 12 O(1) terms
    np.testing.assert_allclose(got_hat.detach().numpy(), x_hat, atol=1e-5)
    assert (z < 0).any()  # saev's TopK keeps negative values: a ReLU here would be wrong
    assert sae.info["point"] == "blocks.10.resid_post" and sae.info["source"]["library"] == "saev"


def test_saev_relu_sae_and_load_sae_detects_it(tmp_path):
    w = _saev_weights()
    write_saev(tmp_path / "relu.pt", w, ("Relu", {}))
    sae = load_sae(tmp_path / "relu.pt")
    x = np.random.default_rng(2).standard_normal((4, D)).astype(np.float32)
    np.testing.assert_allclose(sae.encode(torch.from_numpy(x)).detach().numpy(),
                               np.maximum(x @ w["W_enc"] + w["b_enc"], 0), atol=1e-5)


def _prisma_module():
    """A stand-in for vit_prisma.sae.config so the test can pickle a config object exactly as Prisma does."""
    names = ["vit_prisma", "vit_prisma.sae", "vit_prisma.sae.config"]
    mods = [types.ModuleType(n) for n in names]

    @dataclasses.dataclass
    class VisionModelSAERunnerConfig:
        d_in: int = D
        d_sae: int = K
        activation_fn_str: str = "topk"
        hook_point: str = "blocks.8.hook_mlp_out"
        dtype: torch.dtype = torch.float32

    VisionModelSAERunnerConfig.__module__ = names[-1]
    VisionModelSAERunnerConfig.__qualname__ = "VisionModelSAERunnerConfig"
    mods[-1].VisionModelSAERunnerConfig = VisionModelSAERunnerConfig
    return dict(zip(names, mods)), VisionModelSAERunnerConfig


def write_prisma(folder, w, cfg_json):
    """As ViT-Prisma's SparseAutoencoder.save_model writes a .pt ({"cfg": the config object, "state_dict": ...}) and
    the Hub repositories put config.json beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    mods, Config = _prisma_module()
    sys.modules.update(mods)
    try:
        torch.save({"cfg": Config(), "state_dict": {n: torch.from_numpy(v) for n, v in w.items()}},
                   folder / "n_images_2600058.pt")
    finally:
        for name in mods:
            sys.modules.pop(name)
    (folder / "config.json").write_text(json.dumps(cfg_json))


PRISMA_CFG = {"d_in": D, "d_sae": K, "activation_fn_str": "topk", "activation_fn_kwargs": {"k": k},
              "hook_point": "blocks.8.hook_mlp_out", "model_name": "open-clip:laion/CLIP-ViT-B-32-DataComp.XL-s13B-b90K",
              "normalize_activations": "none"}


def test_prisma_round_trip_encodes_as_prisma_does_without_importing_its_config_class(tmp_path):
    w = _weights(3)
    write_prisma(tmp_path / "p", w, PRISMA_CFG)
    assert "vit_prisma" not in sys.modules
    sae = load_sae(tmp_path / "p")
    assert "vit_prisma" not in sys.modules
    x = np.random.default_rng(4).standard_normal((6, D)).astype(np.float32)
    # Prisma: hidden_pre = (x - b_dec) W_enc + b_enc; TopK with ReLU after; out = acts W_dec + b_dec
    z = _topk((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"], k, relu=True)
    got_hat, got_z = sae(torch.from_numpy(x))
    np.testing.assert_allclose(got_z.detach().numpy(), z, atol=1e-5)
    np.testing.assert_allclose(got_hat.detach().numpy(), z @ w["W_dec"] + w["b_dec"], atol=1e-5)
    assert (sae.info["point"], sae.info["layer"]) == ("blocks.8.mlp_out", 9)


def test_prisma_per_token_normalisation_is_refused_with_a_sentence(tmp_path):
    write_prisma(tmp_path / "p", _weights(), PRISMA_CFG | {"normalize_activations": "constant_norm_rescale"})
    with pytest.raises(SAEError, match="normalize_activations 'constant_norm_rescale'"):
        load_prisma(tmp_path / "p")


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


def test_a_pickle_that_would_run_code_is_refused_and_does_not_run(tmp_path):
    _Evil.marker = tmp_path / "ran"
    (tmp_path / "p").mkdir()
    torch.save({"cfg": _Evil(), "state_dict": {}}, tmp_path / "p" / "w.pt")
    (tmp_path / "p" / "config.json").write_text(json.dumps(PRISMA_CFG))
    with pytest.raises(SAEError, match="pickle that would import and run the code object (posix|os).system"):
        load_prisma(tmp_path / "p")
    buffer = io.BytesIO()
    torch.save({"W_enc": _Evil()}, buffer)
    (tmp_path / "saev.pt").write_bytes(b'{"schema": 2, "cfg": {"d_vit": 12, "exp_factor": 3, "activation": '
                                       b'{"cls": "TopK", "params": {"top_k": 2}}}}\n' + buffer.getvalue())
    with pytest.raises(SAEError, match="pickle that would import and run"):
        load_saev(tmp_path / "saev.pt")
    assert not _Evil.marker.exists()


def test_not_an_sae_and_wrong_shapes_get_sentences(tmp_path):
    (tmp_path / "x.pt").write_bytes(b"not json\n")
    with pytest.raises(SAEError, match="not a saev checkpoint"):
        load_sae(tmp_path / "x.pt")
    w = _weights()
    write_prisma(tmp_path / "p", {**w, "b_dec": w["b_dec"][:5]}, PRISMA_CFG)
    with pytest.raises(SAEError, match=r"b_dec has shape \(5,\), expected \(12,\)"):
        load_sae(tmp_path / "p")


def test_width_mismatch_with_the_model_is_refused(tmp_path):
    import timm
    from safetensors.torch import save_file

    import vitviz

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32)
    save_file({n: v.contiguous() for n, v in model.state_dict().items()}, str(tmp_path / "t.safetensors"))
    write_prisma(tmp_path / "p", _weights(), PRISMA_CFG)
    sae = load_sae(tmp_path / "p")
    lens = vitviz.open("vit_tiny_patch16_224", checkpoint=str(tmp_path / "t.safetensors"), img_size=32, device="cpu")
    with pytest.raises(SAEError, match="reads 12-wide tokens, but resid_post of layer 1 .* is 192 wide"):
        check_width(sae, lens, "resid_post", 1)
