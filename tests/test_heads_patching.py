"""Heads switched off or swapped (vitviz.heads.patching) against the library's own module changed by hand.

References: a deep copy of the timm model the Lens holds, run by timm's own forward with a forward pre-hook on
a block's ``attn.proj`` that zeroes (or replaces by its image-set mean) one head's slice of the projection's
input: that slice is the head's context z. A planted ViT-Ti (random weights; every output projection and MLP
zeroed except one head's projection in layer 2) carries the image into the class token through that one head
only: its ablation alone moves the logit, its patching alone moves B's output to A's.
"""
import copy

import numpy as np
import pytest
import timm
import torch

import vitviz
from vitviz.errors import VitvizError
from vitviz.heads import patching as pt
from vitviz.sources.models import ModelSpec, load_model

from conftest import ASSETS

NAME, SIZE = "vit_tiny_patch16_224", 64  # 12 layers x 3 heads, 4 x 4 patches at 64 px
PLANT_LAYER, PLANT_HEAD = 1, 2


def _save(model, path) -> str:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return str(path)


def _random(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = timm.create_model(NAME, pretrained=False, img_size=SIZE)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def _plant(model: torch.nn.Module) -> torch.nn.Module:
    """Only head PLANT_HEAD of layer PLANT_LAYER writes into the residual stream (besides biases): the class
    token then sees the image through that head alone."""
    d = model.blocks[0].attn.head_dim
    with torch.no_grad():
        for i, blk in enumerate(model.blocks):
            blk.mlp.fc2.weight.zero_()
            keep = blk.attn.proj.weight[:, PLANT_HEAD * d:(PLANT_HEAD + 1) * d].clone()
            blk.attn.proj.weight.zero_()
            if i == PLANT_LAYER:
                blk.attn.proj.weight[:, PLANT_HEAD * d:(PLANT_HEAD + 1) * d] = keep * 20
    return model


@pytest.fixture(scope="module")
def lenses(tmp_path_factory):
    folder = tmp_path_factory.mktemp("patching")
    random = _save(_random(), folder / "random.safetensors")
    planted = _save(_plant(_random()), folder / "planted.safetensors")
    return {name: vitviz.Lens(load_model(ModelSpec(name=NAME, checkpoint=path, img_size=SIZE)))
            for name, path in (("random", random), ("planted", planted))}


def _images(lens, names=("chelsea.jpg", "coffee.jpg", "astronaut.jpg")):
    return lens.preprocess([ASSETS / n for n in names])


def _by_hand(model, x, layer: int, head: int, mode: str) -> torch.Tensor:
    """Logits of timm's forward on a deep copy with one head's context zeroed or set to its image-set mean at the
    output projection's input."""
    model = copy.deepcopy(model)
    proj = model.blocks[layer].attn.proj
    d = model.blocks[layer].attn.head_dim
    cut = slice(head * d, (head + 1) * d)
    mean = None
    if mode == "mean":
        seen = []
        handle = proj.register_forward_pre_hook(lambda m, args: seen.append(args[0][..., cut].mean(0, keepdim=True)))
        with torch.no_grad():
            model(x)
        handle.remove()
        mean = seen[0]

    def replace(module, args):
        h = args[0].clone()
        h[..., cut] = 0 if mean is None else mean
        return (h,)
    proj.register_forward_pre_hook(replace)
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablating_a_head_through_edit_equals_doing_it_by_hand_on_a_copy_of_the_library_module(lenses, mode):
    lens = lenses["random"]
    x = _images(lens)
    layer, head = 4, 1
    means = pt.head_means(lens, x.tensor, [layer]) if mode == "mean" else None
    ours = lens.trace(x, keep="logits", edit=pt.ablation_edit([(layer, head)], mode, means)).logits
    plain = lens.trace(x, keep="logits").logits
    expected = _by_hand(lens.model, x.tensor, layer, head, mode)
    scale = float(expected.abs().max())
    assert float((ours - expected).abs().max()) <= 1e-6 * scale
    assert float((plain - expected).abs().max()) > 1e-3 * scale  # the ablation mattered


def test_the_ablation_effects_are_the_output_change_per_image(lenses):
    lens = lenses["random"]
    x = _images(lens)
    effects = pt.ablate(lens, x, [(4, 1), (5, 0)], mode="zero")
    plain = lens.trace(x, keep="logits").logits.double()
    top = plain.argmax(-1)
    expected = _by_hand(lens.model, x.tensor, 4, 1, "zero").double()
    rows = {(i, l, h, k): e for i, l, h, k, e in effects.rows}
    for i in range(3):
        change = float(expected[i, top[i]] - plain[i, top[i]])
        assert rows[(i, 4, 1, "logit_change")] == pytest.approx(change, abs=1e-5)
        assert rows[(i, 4, 1, "probability_before")] == pytest.approx(float(plain[i].softmax(-1)[top[i]]), rel=1e-9)
        assert rows[(i, 4, 1, "probability_after")] == pytest.approx(float(expected[i].softmax(-1)[top[i]]), abs=1e-6)
    assert effects.grid("logit_change", 12, 3).shape == (12, 3)
    assert np.isnan(effects.grid("logit_change", 12, 3)[0, 0])


def test_patching_every_head_from_an_image_into_itself_leaves_the_output_bit_identical(lenses):
    lens = lenses["random"]
    a = _images(lens, ("chelsea.jpg",)).tensor
    pairs = [(l, h) for l in range(12) for h in range(3)]
    trace = lens.trace(a, keep=[("z", l) for l in range(12)] + ["logits"])
    source = {l: trace["z", l] for l in range(12)}
    # every head of every layer at once
    everything = {f"blocks.{l}.z": (lambda z, p: source[p.layer].clone()) for l in range(12)}
    assert torch.equal(lens.trace(a, keep="logits", edit=everything).logits, trace.logits)
    effects = pt.patch(lens, a, a, pairs[:6], batch=1)
    for _, _, _, kind, value in effects.rows:
        assert np.isnan(value)  # A into A: no way to move (0 / 0), stated as NaN, not a number
    # each head patched alone from A into A: the plain output, bit for bit
    for pair in pairs[::5]:
        out = lens.trace(a, keep="logits", edit=pt.patch_edit([pair], source)).logits
        assert torch.equal(out, trace.logits)


def test_on_the_planted_model_only_the_planted_head_moves_the_logit_and_transfers_the_output(lenses):
    lens = lenses["planted"]
    x = _images(lens, ("chelsea.jpg", "rocket.jpg"))
    every = [(l, h) for l in range(12) for h in range(3)]
    ablation = pt.ablate(lens, x, every, mode="zero")
    change = np.abs(ablation.grid("logit_change", 12, 3, image=0))
    assert change[PLANT_LAYER, PLANT_HEAD] > 0.1
    others = np.delete(change.ravel(), PLANT_LAYER * 3 + PLANT_HEAD)
    assert others.max() == 0.0  # nothing else reaches the class token: exactly no change
    a, b = x.tensor[:1], x.tensor[1:]
    progress = []
    patched = pt.patch(lens, a, b, every, batch=1, progress=lambda done, total: progress.append((done, total)))
    assert progress[-1] == (36, 36) and len(progress) == 36
    towards = patched.grid("pooled_towards_a", 12, 3)
    assert towards[PLANT_LAYER, PLANT_HEAD] == pytest.approx(1.0, abs=1e-5)
    assert np.abs(np.delete(towards.ravel(), PLANT_LAYER * 3 + PLANT_HEAD)).max() == 0.0
    logit = patched.grid("logit_diff_towards_a", 12, 3)
    assert logit[PLANT_LAYER, PLANT_HEAD] == pytest.approx(1.0, abs=1e-4)


def test_batched_patching_equals_one_head_per_forward_to_rounding(lenses):
    lens = lenses["random"]
    x = _images(lens, ("chelsea.jpg", "coffee.jpg")).tensor
    pairs = [(l, h) for l in (0, 5, 11) for h in range(3)]
    one = pt.patch(lens, x[:1], x[1:], pairs, batch=1)
    many = pt.patch(lens, x[:1], x[1:], pairs, batch=4)
    one, many = ({r[:4]: r[4] for r in e.rows} for e in (one, many))
    assert set(one) == set(many) and len(one) == 9 * 2
    print("batched vs one per forward, largest difference:", max(abs(one[k] - many[k]) for k in one))
    # float32 forwards of another batch size may sum in another order: effects agree to 1e-4 of the way
    assert max(abs(one[k] - many[k]) for k in one) <= 1e-4


def test_head_lists_are_read_1_based_and_mistakes_get_a_sentence():
    assert pt.parse_heads("3.2, 1", 4, lambda l: 3) == [(2, 1), (0, 0), (0, 1), (0, 2)]
    assert len(pt.parse_heads("all", 4, lambda l: 3)) == 12
    for bad, words in (("5.1", "layers 1 to 4"), ("2.4", "heads 1 to 3"), ("x", "not a layer"), ("", "no heads")):
        with pytest.raises(VitvizError, match=words):
            pt.parse_heads(bad, 4, lambda l: 3)


def test_readout_maps_before_and_after_an_ablation_are_the_traced_cls_rows(lenses):
    lens = lenses["random"]
    x = _images(lens, ("chelsea.jpg",))
    edit = pt.ablation_edit([(3, 0), (3, 1), (3, 2)], "zero")
    before = pt.readout_maps(lens, x)
    after = pt.readout_maps(lens, x, edit)
    attn = lens.trace(x, keep=[("attn", -1)], edit=edit)["attn", -1][0]  # (H, N, N), CLS first
    np.testing.assert_allclose(after.ravel(), attn[:, 0, 1:].mean(0).numpy(), rtol=1e-6, atol=1e-7)
    assert np.abs(after - before).max() > 1e-4  # layer 4 switched off changes the last layer's attention
