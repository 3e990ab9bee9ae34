"""A probe file as a model's head (--head, vitviz.open(head=)): the probe's classes in every class-specific view.

The reference is timm itself: a model of the same architecture built with ``depth = layer``, ``num_classes = K``
(``global_pool="token"`` for cls pooling, ``"avg"`` with ``fc_norm=False`` for mean pooling) holding the backbone's
first blocks, its final norm and the probe's weights computes exactly what the probed model computes.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch

import vitviz
from vitviz.explainers.targets import ClassLogit
from vitviz.errors import ModelError
from vitviz.lens import Lens
from vitviz.sources.models import ModelSpec, _finish
from vitviz.probes.probe import ProbeResult, model_identity

ARCH, IMG, K = "vit_tiny_patch16_224", 32, 3
ASSETS_CHELSEA, ASSETS_COFFEE = (str(Path(__file__).resolve().parent.parent / "assets" / f) for f in ("chelsea.jpg",
                                                                                                     "coffee.jpg"))


def save_backbone(path, seed: int = 0):
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = timm.create_model(ARCH, pretrained=False, num_classes=0, img_size=IMG)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def open_backbone(path, **kw) -> Lens:
    return vitviz.open(ARCH, checkpoint=str(path), img_size=IMG, device="cpu", **kw)


def write_probe(lens: Lens, folder, layer: int, pooling: str = "cls", seed: int = 0):
    """A probe file for ``lens`` with random weights (layer 1-based): what `probe` writes, without the fitting."""
    blank = torch.zeros(1, 3, *lens.loaded.data_config["input_size"][-2:])
    D = lens.trace(blank, keep="pooled")["pooled"].shape[-1]
    F = 2 * D if pooling == "cls+mean" else D
    rng = np.random.default_rng(seed)
    result = ProbeResult(model_identity(lens), pooling, tuple(f"class {c}" for c in "abc"), [], 1 / 3, layer,
                         rng.normal(size=(K, F)) / np.sqrt(F), rng.normal(size=K), 1.0, [])
    return result.save(folder)


def timm_twin(probed) -> torch.nn.Module:
    """The timm model that computes the probed model's logits: first ``layer + 1`` blocks, norm, probe as head."""
    pool = {"cls": dict(global_pool="token"), "mean": dict(global_pool="avg", fc_norm=False)}[probed.pooling]
    twin = timm.create_model(ARCH, pretrained=False, img_size=IMG, depth=probed.layer + 1,
                             num_classes=probed.num_classes, **pool)
    state = {k: v for k, v in probed.backbone.state_dict().items()
             if not k.startswith("blocks.") or int(k.split(".")[1]) <= probed.layer}
    state |= {"head.weight": probed.head.weight, "head.bias": probed.head.bias}
    twin.load_state_dict(state, strict=True)
    return twin.eval().requires_grad_(False)


def twin_lens(probed_lens: Lens) -> Lens:
    return Lens(_finish(timm_twin(probed_lens.model), ModelSpec(name=ARCH, device="cpu"), "twin", "timm twin", []))


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return save_backbone(tmp_path_factory.mktemp("backbone") / "tiny.safetensors")


def load_probed(tmp_path_factory, layer: int = 12, pooling: str = "cls"):
    """The adapters' parity example: a tiny ViT with a probe head on its last layer (tests/test_adapters.py)."""
    folder = tmp_path_factory.mktemp("probe_example")
    weights = save_backbone(folder / "tiny.safetensors", seed=5)
    head = write_probe(open_backbone(weights), folder, layer, pooling, seed=5)
    return open_backbone(weights, head=head).loaded


def probe_reference(model, x, zero_head=None):
    from test_adapters import _timm_reference

    return _timm_reference(timm_twin(model), x, zero_head)


def images(lens: Lens, n: int = 2) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(n, 3, IMG, IMG)


@pytest.mark.parametrize("layer, pooling", [(12, "cls"), (4, "cls"), (12, "mean"), (7, "mean")])
def test_probe_logits_equal_timm_built_with_num_classes_k_holding_the_probe(backbone, tmp_path, layer, pooling):
    plain = open_backbone(backbone)
    probed = open_backbone(backbone, head=write_probe(plain, tmp_path, layer, pooling))
    assert probed.has_head and probed.num_classes == K and probed.num_layers == layer
    assert probed.class_labels == ("class a", "class b", "class c")
    x = images(probed)
    logits = probed.trace(x, keep="logits")["logits"]
    with torch.no_grad():
        expected = timm_twin(probed.model)(x)
    # float32, the same operations in the same order up to the head's matmul: a few roundings of the logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)
    assert probed.points()[-1] == "logits" and f"blocks.{layer}.attn" not in probed.points()


def test_cls_plus_mean_head_reads_both_vectors_of_its_layer(backbone, tmp_path):
    plain = open_backbone(backbone)
    probed = open_backbone(backbone, head=write_probe(plain, tmp_path, 5, "cls+mean"))
    x = images(probed)
    with torch.no_grad():
        _, [(patches, prefix)] = plain.model.forward_intermediates(x, indices=[4], norm=True, output_fmt="NLC",
                                                                 return_prefix_tokens=True)
        features = torch.cat([prefix[:, 0], patches.mean(1)], dim=-1)
    head = probed.model.head
    torch.testing.assert_close(probed.trace(x, keep="logits")["logits"], features @ head.weight.T + head.bias,
                               rtol=1e-5, atol=1e-6)


def test_every_map_method_through_the_probe_equals_the_same_method_on_the_timm_model(backbone, tmp_path):
    plain = open_backbone(backbone)
    probed = open_backbone(backbone, head=write_probe(plain, tmp_path, 6, "cls"))
    twin = twin_lens(probed)
    x = images(probed)
    from vitviz.explainers import names as method_names

    names = method_names(probed)
    assert {"attnlrp", "cp-lrp", "gradient", "legrad", "gradcam", "gradient_rollout", "integrated_gradients",
            "occlusion", "rollout"} <= set(names), names
    for method in names:
        ours = vitviz.explain(probed, x, method, target=ClassLogit(2))
        theirs = vitviz.explain(twin, x, method, target=ClassLogit(2))
        scale = max(float(np.abs(theirs.patches).max()), 1e-12)
        assert float(np.abs(ours.patches - theirs.patches).max()) <= 1e-5 * scale, method
        assert float(np.abs(ours.patches).max()) > 0, method
        if theirs.pixels is not None:
            np.testing.assert_allclose(ours.pixels, theirs.pixels, rtol=0,
                                       atol=1e-5 * max(float(np.abs(theirs.pixels).max()), 1e-12))


def test_the_default_target_is_the_probe_class_logit_with_its_name(backbone, tmp_path):
    plain = open_backbone(backbone)
    probed = open_backbone(backbone, head=write_probe(plain, tmp_path, 3))
    m = vitviz.explain(probed, images(probed, 1), "attnlrp")
    top = int(probed.trace(images(probed, 1), keep="logits")["logits"].argmax())
    assert m.target.classes == (top,) and f"(class {'abc'[top]})" in m.target.text()


def test_a_probe_of_another_model_or_layer_is_refused_naming_both(backbone, tmp_path):
    plain = open_backbone(backbone)
    other = open_backbone(save_backbone(tmp_path / "other.safetensors", seed=9))
    head = write_probe(other, tmp_path / "p", 12)
    with pytest.raises(ModelError, match=r"probe.safetensors was trained on .*other.safetensors.*not on .*tiny.safetensors"):
        open_backbone(backbone, head=head)
    (tmp_path / "retrained").mkdir()
    retrained = open_backbone(save_backbone(tmp_path / "retrained" / "tiny.safetensors", seed=4))
    with pytest.raises(ModelError, match=r"trained on .*tiny.safetensors.*not on .*tiny.safetensors.*\(the same name "
                                         r"but other weights\)"):
        open_backbone(backbone, head=write_probe(retrained, tmp_path / "r", 12))
    same = write_probe(plain, tmp_path / "q", 12)
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(same), framework="pt") as f:
        info, tensors = json.loads(f.metadata()["vitviz_probe"]), {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(tmp_path / "deep.safetensors"), metadata={"vitviz_probe": json.dumps(info | {"layer": 13})})
    renamed = info | {"model": info["model"] | {"name": "vit_small_patch16_224", "label": "ViT-S/16"}}
    save_file(tensors, str(tmp_path / "renamed.safetensors"), metadata={"vitviz_probe": json.dumps(renamed)})
    with pytest.raises(ModelError, match=r"trained on ViT-S/16 \(vit_small_patch16_224\), not on .*vit_tiny.*another model"):
        open_backbone(backbone, head=tmp_path / "renamed.safetensors")
    with pytest.raises(ModelError, match="reads layer 13, but .* has layers 1 to 12"):
        open_backbone(backbone, head=tmp_path / "deep.safetensors")
    save_file({"weight": tensors["weight"][:, :-1].contiguous(), "bias": tensors["bias"]},
              str(tmp_path / "narrow.safetensors"), metadata={"vitviz_probe": json.dumps(info)})
    with pytest.raises(ModelError, match="takes 191 features, but cls pooling at layer 12 .* gives 192"):
        open_backbone(backbone, head=tmp_path / "narrow.safetensors")


def test_chefer_protocols_and_class_faithfulness_through_the_probe_equal_the_timm_model(backbone, tmp_path):
    plain = open_backbone(backbone)
    probed = open_backbone(backbone, head=write_probe(plain, tmp_path, 8, "mean"))
    twin = twin_lens(probed)
    x = images(probed)
    settings = dict(methods=["attnlrp", "gradient_rollout", "legrad"], protocols=("positive", "negative", "morf"),
                    steps=3, target_class=1)
    ours = vitviz.faithfulness(probed, x, **settings)
    theirs = vitviz.faithfulness(twin, x, **settings)
    assert ours.settings["head"] == str(tmp_path / "probe.safetensors") and theirs.settings["head"] is None
    assert set(ours.aucs["protocol"]) >= {"positive", "negative", "morf"}
    np.testing.assert_allclose(ours.aucs["auc"].to_numpy(), theirs.aucs["auc"].to_numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours.curves["score"].to_numpy(), theirs.curves["score"].to_numpy(), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("layer", [2, 3])
def test_a_transformers_dinov2_probe_on_cls_and_mean_equals_dinov2_for_image_classification(tmp_path, layer):
    """DINOv2's linear-eval head in transformers reads exactly cls+mean pooling: its classifier on CLS and the mean
    of the patch tokens after the final layernorm, here with the backbone's first ``layer`` blocks."""
    transformers = pytest.importorskip("transformers")
    from test_hf_hybrid import _save_hf

    folder = str(_save_hf(tmp_path / "dinov2", "dinov2", seed=3))
    plain = vitviz.open(folder, device="cpu")
    probed = vitviz.open(folder, device="cpu", head=write_probe(plain, tmp_path / "p", layer, "cls+mean"))
    config = transformers.Dinov2Config.from_pretrained(folder)
    config.num_hidden_layers, config.num_labels = layer, K
    twin = transformers.Dinov2ForImageClassification(config).eval()
    state = {k: v for k, v in plain.model.state_dict().items()
             if not k.startswith("encoder.layer.") or int(k.split(".")[2]) < layer}
    twin.dinov2.load_state_dict(state, strict=True)
    twin.classifier.load_state_dict(probed.model.head.state_dict())
    x = plain.preprocess([ASSETS_CHELSEA, ASSETS_COFFEE]).tensor
    with torch.no_grad():
        expected = twin(pixel_values=x).logits
    torch.testing.assert_close(probed.trace(x, keep="logits")["logits"], expected, rtol=1e-5, atol=1e-6)
    assert probed.num_layers == layer and probed.has_head


def test_the_backbones_hooks_in_a_probe_run_are_the_probed_runs_but_for_the_stop_and_its_own_head():
    from vitviz.adapters.base import Hooks
    from vitviz.adapters.probe_head import _Backbone

    outer = Hooks(keep=("blocks.0.attn",), edit={"blocks.1.q": lambda value, point: value}, fast=True)
    inner = _Backbone(outer, "blocks.1.resid_post")
    own = {"wants", "plain_blocks"}  # stop at the probe's layer; the backbone's pooled and logits are not the run's
    public = [n for n in dir(Hooks) if not n.startswith("_")] + [n for n in vars(outer) if not n.startswith("_")]
    # Every other method and attribute is the probed run's own (bound to it): one Hooks grows, both answer.
    assert {"edits", "destination", "rules", "kept"} <= set(public)
    for name in set(public) - own:
        assert getattr(inner, name) == getattr(outer, name), name
    assert inner.edits("blocks.1.q") and not inner.edits("blocks.0.q")
    assert inner.wants("blocks.1.resid_post") and inner.wants("blocks.0.attn") and not inner.wants("blocks.0.q")
    assert not inner.wants("logits") and not inner.plain_blocks(12)
