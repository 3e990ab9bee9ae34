"""Deletion/insertion faithfulness and attention flow: known answers, independent recomputation, CLI and page."""
import itertools
import json
import math

import numpy as np
import pytest
import torch

from conftest import ASSETS, tiny_model
from vitviz.perturbation.curves import (ChanceBand, attention_maps, auc, ordered, patch_order, perturbation_curves,
                                 perturbed_at, random_map, random_seed_maps, step_counts)
from vitviz.analyses.flow import FlowNetwork, attention_flow, layer_capacities
from vitviz.analyses.rollout import readout_vector
from vitviz.layout import TokenLayout

GRID = TokenLayout(prefix_tokens=("cls",), grid_size=(4, 4), patch_size=(2, 2), global_pool="token",
                   pos_embed_prefix_rows=1)
KNOWN = [5, 6, 9, 10]  # the patches the hand-built model reads (raster order, 4x4 grid)


from vitviz.adapters import Adapter, register_adapter  # noqa: E402


class KnownPatchModel(torch.nn.Module):
    """A model whose output depends only on the pixels of ``KNOWN`` patches (8x8 input, 2x2 patches).

    With a head: logits (w * sum of those pixels, 0). Headless: pre-logits (sum of those pixels, 1).
    """

    def __init__(self, head: bool):
        super().__init__()
        self.num_classes = 2 if head else 0
        self.weight = torch.nn.Parameter(torch.ones(1))
        mask = torch.zeros(4, 4)
        mask.view(-1)[KNOWN] = 1
        self.register_buffer("pixels", mask.repeat_interleave(2, 0).repeat_interleave(2, 1))

    def forward_features(self, x):
        return (x * self.pixels).sum(dim=(1, 2, 3))[:, None]

    def forward_head(self, feats, pre_logits=False):
        if pre_logits or not self.num_classes:
            return torch.cat([feats, torch.ones_like(feats)], dim=1)
        return torch.cat([0.1 * self.weight * feats, torch.zeros_like(feats)], dim=1)

    def forward(self, x):
        return self.forward_head(self.forward_features(x))


@register_adapter
class KnownPatchAdapter(Adapter):
    """The planted model's family: its forward is its own two steps (no blocks)."""

    name = "test-known-patch"

    def claims(self, model):
        return isinstance(model, KnownPatchModel)

    def num_classes(self, model):
        return model.num_classes

    def forward(self, model, x, hooks):
        feats = hooks("final_norm", model.forward_features(x))
        hooks("pooled", model.forward_head(feats, pre_logits=True))
        if model.num_classes:
            hooks("logits", model.forward_head(feats))


def test_patch_order_is_descending_with_ties_to_the_lower_index():
    grid = np.array([[0.5, 0.9], [0.5, 0.9]])
    np.testing.assert_array_equal(patch_order(grid), [1, 3, 0, 2])
    np.testing.assert_array_equal(step_counts(np.linspace(0, 1, 11), 256), [0, 26, 51, 77, 102, 128, 154, 179, 205,
                                                                            230, 256])
    np.testing.assert_array_equal(step_counts([0, 0.1, 0.5, 1], 5), [0, 1, 3, 5])  # halves round up
    np.testing.assert_allclose(auc(np.array([0.0, 1.0, 1.0]), np.array([0, 0.5, 1.0])), 0.75)


@pytest.mark.parametrize("head", [True, False], ids=["class probability", "pre-logits cosine"])
def test_the_map_that_ranks_the_read_patches_first_is_the_most_faithful(head):
    model = KnownPatchModel(head).eval()
    image = torch.ones(3, 8, 8)
    right = np.zeros(16)
    right[KNOWN] = [4, 3, 2, 1]
    maps = {"right": right.reshape(4, 4), "reversed": -right.reshape(4, 4) + np.arange(16).reshape(4, 4) * 1e-3,
            "random": random_map((4, 4), seed=0)}
    result = perturbation_curves(model, image, maps, GRID, fractions=np.linspace(0, 1, 9))
    d, i = dict(zip(result.methods, result.deletion_auc)), dict(zip(result.methods, result.insertion_auc))
    assert d["right"] < d["random"] < d["reversed"]
    assert i["right"] > i["random"] > i["reversed"]
    # Deleting the 4 read patches (step 2 of 8 = 4 patches) leaves nothing of the signal: the score of the blank input.
    np.testing.assert_allclose(result.deletion[0, 2], result.deletion[0, -1])
    np.testing.assert_allclose(result.insertion[0, 2], result.insertion[0, -1])
    assert ("class 0" in result.score) == head and result.target == (0 if head else None)
    reference = result.reference()
    assert reference["best"] == {"deletion": "right", "insertion": "right"}
    assert reference["worst"] == {"deletion": "reversed", "insertion": "reversed"}


def _independent_curve(model, image, grid_map, layout, fractions, mode, target):
    """The protocol spelled out one input at a time, with no code shared with vitviz.perturbation.curves."""
    values = grid_map.ravel()
    order = sorted(range(len(values)), key=lambda p: (-values[p], p))
    gw, (ph, pw) = layout.grid_size[1], layout.patch_size
    with torch.no_grad():
        reference = model.forward_head(model.forward_features(image[None]), pre_logits=True)[0]
        out = []
        for f in fractions:
            k = math.floor(f * len(values) + 0.5)
            x = image.clone() if mode == "deletion" else torch.zeros_like(image)
            for p in order[:k]:
                r, c = divmod(p, gw)
                block = (slice(None), slice(r * ph, (r + 1) * ph), slice(c * pw, (c + 1) * pw))
                x[block] = 0 if mode == "deletion" else image[block]
            if target is None:
                feats = model.forward_head(model.forward_features(x[None]), pre_logits=True)[0]
                out.append(float(torch.dot(feats, reference) / (feats.norm() * reference.norm())))
            else:
                out.append(float(model(x[None]).softmax(-1)[0, target]))
    return np.array(out)


@pytest.mark.parametrize("family", ["vit_augreg", "dino"])
def test_curves_equal_an_independent_recomputation_of_the_protocol(family):
    from vitviz.trace import trace_for_analysis as capture
    from vitviz.analyses.rollout import rollout

    model = tiny_model(family)
    torch.manual_seed(1)
    image = torch.randn(3, 64, 64)
    out = capture(model, image[None])
    attention, layout = out.stack("attn")[0].numpy(), out.layout
    maps = attention_maps(attention, layout, rollout_map=rollout(attention, layout).map)
    fractions = np.array([0, 0.1, 0.25, 0.5, 0.8, 1.0])
    result = perturbation_curves(model, image, maps, layout, fractions=fractions, batch_size=3)
    target = None if family == "dino" else int(out.logits[0].argmax())
    assert result.target == target
    for m, name in enumerate(result.methods):
        for mode in ("deletion", "insertion"):
            expected = _independent_curve(model, image, maps[name], layout, fractions, mode, target)
            np.testing.assert_allclose(getattr(result, mode)[m], expected, atol=1e-5, err_msg=f"{name} {mode}")
    # The perturbed input shown on the page is the one scored.
    shown = perturbed_at(image, maps["rollout"], layout, 0.25)["deletion"]
    assert (shown == 0).all(dim=0).sum() == 4 * 16 * 16  # 4 of 16 patches (16x16 px each) set to the mean


# --- attention flow ----------------------------------------------------------------------------------------------

def _brute_force_min_cut(capacity: dict, nodes: list, source, sink) -> float:
    """Minimum over every source/sink partition of the capacity leaving the source side."""
    others = [n for n in nodes if n not in (source, sink)]
    best = math.inf
    for r in range(len(others) + 1):
        for side in itertools.combinations(others, r):
            s = {source, *side}
            best = min(best, sum(c for (u, v), c in capacity.items() if u in s and v not in s))
    return best


def _layered_graph(mats, readout):
    """Every node and edge of the layered graph, bottom tokens included: (layer, token) nodes, sink 'out'."""
    N = mats[0].shape[0]
    capacity = {((k, i), (k + 1, j)): m[j, i] for k, m in enumerate(mats) for i in range(N) for j in range(N)}
    capacity |= {((len(mats), j), "out"): w for j, w in enumerate(readout) if w > 0}
    nodes = [(k, t) for k in range(len(mats) + 1) for t in range(N)] + ["out"]
    return capacity, nodes


@pytest.mark.parametrize("readout", ["cls", "mean"])
def test_attention_flow_is_the_brute_force_min_cut_on_a_two_layer_graph(readout):
    # CLS + 2 patches, or a register + 2 patches (no CLS: the readout takes 1/2 of each top patch).
    layout = TokenLayout(prefix_tokens=("cls",) if readout == "cls" else ("reg0",), grid_size=(1, 2),
                         patch_size=(1, 1), global_pool="token", pos_embed_prefix_rows=1)
    # Rows in eighths: 0.5 A + 0.5 I is in sixteenths, so the integer scaling is exact.
    attention = np.random.default_rng(3).multinomial(8, [1 / 3] * 3, size=(2, 1, 3)) / 8
    mats = layer_capacities(attention, layout)
    result = attention_flow(attention, layout)
    top = np.array([1.0, 0, 0]) if readout == "cls" else np.array([0, 0.5, 0.5])
    capacity, nodes = _layered_graph(mats, top)
    for p in range(2):
        expected = _brute_force_min_cut(capacity, nodes, (0, 1 + p), "out")
        assert result.map.ravel()[p] >= 0
        assert result.map.ravel()[p] == expected
    assert result.readout == ("cls" if readout == "cls" else "mean over patch rows")
    if readout == "cls":  # not saturated: the cut is inside the graph, not at the readout
        np.testing.assert_array_equal(result.map, [[0.4375, 0.5625]])


def test_attention_flow_error_bound_brackets_the_true_min_cut():
    layout = TokenLayout(prefix_tokens=("cls",), grid_size=(1, 3), patch_size=(1, 1), global_pool="token",
                         pos_embed_prefix_rows=1)
    rng = np.random.default_rng(0)
    attention = rng.random((2, 2, 4, 4)) ** 3
    attention /= attention.sum(-1, keepdims=True)
    coarse = attention_flow(attention, layout, scale=1000)
    mats = layer_capacities(attention, layout)
    for p in range(3):
        capacity, nodes = _layered_graph(mats, np.eye(4)[0])
        exact = _brute_force_min_cut(capacity, nodes, (0, 1 + p), (2, 0))
        lo, bound = coarse.map.ravel()[p], coarse.error_bound.ravel()[p]
        assert lo <= exact + 1e-12 <= lo + bound + 1e-12
        assert 0 < bound < 0.02
        assert abs(attention_flow(attention, layout).map.ravel()[p] - exact) < 1e-6


def test_attention_flow_with_a_layer_range_uses_only_those_layers():
    model = tiny_model("vit_augreg")
    from vitviz.trace import trace_for_analysis as capture

    out = capture(model, torch.randn(1, 3, 64, 64))
    attention, layout = out.stack("attn")[0].numpy(), out.layout
    calls = []
    full = attention_flow(attention, layout, progress=lambda done, total: calls.append((done, total)))
    last = attention_flow(attention, layout, start=1)
    assert calls[-1] == (16, 16) and len(calls) == 16
    np.testing.assert_allclose(last.map, attention_flow(attention[1:], layout).map)
    assert not np.allclose(full.map, last.map)
    assert (full.map >= 0).all() and (full.map <= 1 + 1e-9).all()
    network = FlowNetwork(layer_capacities(attention, layout), readout_vector(layout))
    assert network.edges < 2 * 17 * 17 + 17  # the top layer keeps only the CLS row


# --- CLI -----------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_faithfulness_and_flow_equal_the_protocol_recomputed(tmp_path):
    import timm
    from safetensors.torch import save_file

    from vitviz.cli import main
    from vitviz.sources.models import ModelSpec, load_model

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    weights = tmp_path / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    out = tmp_path / "out"
    assert main(["analyze", str(ASSETS / "coffee.jpg"), "--model", "vit_tiny_patch16_224", "--checkpoint",
                 str(weights), "--img-size", "64", "--out", str(out), "--faithfulness", "--faithfulness-steps", "5",
                 "--flow", "--start-layer", "9"]) == 0
    data = np.load(out / "analysis.npz")
    info = json.loads((out / "settings.json").read_text())["analysis"]
    methods = info["faithfulness"]["methods"]
    assert methods == ["last_layer_mean", "last_layer_head_1", "last_layer_head_2", "last_layer_head_3", "rollout",
                       "gradient_rollout", "attention_flow", "random"]
    np.testing.assert_allclose(data["faithfulness_fractions"], [0, 0.25, 0.5, 0.75, 1])
    assert data["deletion"].shape == data["insertion"].shape == (1, 8, 5)
    assert data["attention_flow"].shape == (1, 4, 4) and info["attention_flow"]["layers (1-based, inclusive)"] == [9, 12]

    loaded = load_model(ModelSpec(name="vit_tiny_patch16_224", checkpoint=str(weights), img_size=64))
    image = torch.from_numpy(data["input"][0])
    flow = attention_flow(data["attention"][0], loaded.layout, start=8)
    np.testing.assert_allclose(data["attention_flow"][0], flow.map, atol=1e-12)
    target = int(data["logits"][0].argmax())
    assert info["faithfulness"]["target_class"] == [target]
    # Every method's curves are the core's on the maps rebuilt from the npz; rollout's also spelled out by hand.
    maps = attention_maps(data["attention"][0], loaded.layout, rollout_map=data["rollout"][0],
                          gradient_map=data["gradient_rollout"][0], flow_map=data["attention_flow"][0])
    core = perturbation_curves(loaded.model, image, maps, loaded.layout, fractions=data["faithfulness_fractions"])
    assert core.methods == methods
    np.testing.assert_allclose(data["deletion"][0], core.deletion, atol=1e-5)
    np.testing.assert_allclose(data["insertion"][0], core.insertion, atol=1e-5)
    m = methods.index("rollout")
    for mode in ("deletion", "insertion"):
        expected = _independent_curve(loaded.model, image, data["rollout"][0], loaded.layout,
                                      data["faithfulness_fractions"], mode, target)
        np.testing.assert_allclose(data[mode][0, m], expected, atol=1e-5, err_msg=mode)
    for m, name in enumerate(methods):
        assert math.isclose(info["faithfulness"]["auc"][0][name]["deletion"],
                            float(auc(data["deletion"][0, m], data["faithfulness_fractions"])), abs_tol=1e-12)


# --- the page ------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_faithfulness_page_shows_the_cores_curves_and_aucs(bundled):
    from streamlit.testing.v1 import AppTest

    from test_app import APP, _decode, _traces
    from vitviz.trace import trace_for_analysis as capture
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess
    from vitviz.analyses.rollout import rollout

    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/8_faithfulness.py").run()
    assert not at.exception, [e.message for e in at.exception]
    at.multiselect(key="faith_methods").set_value(["rollout", "last_layer_head_2", "random"])
    at.number_input(key="faith_steps").set_value(3)
    at.slider(key="faith_layers").set_value((3, 12)).run()
    assert not at.get("plotly_chart")  # nothing runs before the button
    at.button(key="faith_run").click().run()
    assert not at.exception, [e.message for e in at.exception]

    image = preprocess([load_image(ASSETS / "astronaut.jpg").image], bundled.data_config).tensor
    out = capture(bundled.model, image)
    attention, layout = out.stack("attn")[0].numpy(), out.layout
    maps = attention_maps(attention, layout, rollout_map=rollout(attention, layout, start=2).map)
    # The random floor is the mean of 10 seeded maps' curves (seeds 0-9).
    expected = perturbation_curves(bundled.model, image[0], {m: maps[m] for m in ("rollout", "last_layer_head_2")}
                                   | random_seed_maps(layout.grid_size, 0), layout, fractions=np.array([0, 0.5, 1]))
    deletion = np.vstack([expected.deletion[:2], expected.deletion[2:].mean(0)])
    insertion = np.vstack([expected.insertion[:2], expected.insertion[2:].mean(0)])
    traces = [t for t in _traces(at, "faith_curves") if t["type"] == "scatter"]
    assert len(traces) == 6  # 3 methods x (deletion, insertion)
    for k, t in enumerate(traces):
        curves = deletion if k < 3 else insertion
        np.testing.assert_allclose(_decode(t["y"]), curves[k % 3], atol=1e-5)
    table = at.dataframe[0].value
    assert list(table["method"]) == ["rollout", "last layer, head 2", "random (mean of 10 seeds)"]
    fractions = np.array([0, 0.5, 1])
    np.testing.assert_allclose(table["deletion AUC ↓"], auc(deletion, fractions), atol=1e-5)
    np.testing.assert_allclose(table["insertion AUC ↑"], auc(insertion, fractions), atol=1e-5)
    band = ChanceBand(expected.deletion_auc[2:], expected.insertion_auc[2:])
    assert list(table["vs chance (del. / ins.)"])[:2] == [
        f"{band.compare('deletion', d)} / {band.compare('insertion', i)}"
        for d, i in zip(expected.deletion_auc[:2], expected.insertion_auc[:2])]
    assert not [c for c in table.columns if "_" in c]  # words for headers, not data names (issue 34)
    assert "pre-logits" in at.caption[0].value


@pytest.mark.slow
def test_rollout_page_shows_attention_flow_equal_to_the_core(bundled):
    from streamlit.testing.v1 import AppTest

    from test_app import APP, _heatmaps
    from vitviz.trace import trace_for_analysis as capture
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess

    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/3_rollout.py").run()
    at.slider(key="layer_range").set_value((11, 12)).run()
    assert not any("flow_fig" in (c.proto.id or "") for c in at.get("plotly_chart"))  # on demand only
    at.button(key="flow_run").click().run()
    assert not at.exception, [e.message for e in at.exception]
    image = preprocess([load_image(ASSETS / "astronaut.jpg").image], bundled.data_config).tensor
    out = capture(bundled.model, image)
    expected = attention_flow(out.stack("attn")[0].numpy(), out.layout, start=10, end=12)
    np.testing.assert_allclose(_heatmaps(at, "flow_fig")[0], expected.map, atol=1e-6)
    assert (expected.map > 0).all() and expected.error_bound.max() < 1e-4


def test_attention_flow_into_a_clicked_patch_is_the_min_cut_to_that_patch():
    """Flow follows rollout's readout choice: with ``query`` the sink is that patch's top token (brute-force min
    cut of the same graph), and the readout says which."""
    layout = TokenLayout(prefix_tokens=("cls",), grid_size=(1, 2), patch_size=(1, 1), global_pool="token",
                         pos_embed_prefix_rows=1)
    attention = np.random.default_rng(5).multinomial(8, [1 / 3] * 3, size=(2, 1, 3)) / 8  # exact in sixteenths
    result = attention_flow(attention, layout, query=1)
    capacity, nodes = _layered_graph(layer_capacities(attention, layout, query=1), np.array([0, 0, 1.0]))
    for p in range(2):
        assert result.map.ravel()[p] == _brute_force_min_cut(capacity, nodes, (0, 1 + p), "out")
    assert "patch 1" in result.readout
    assert not np.array_equal(result.map, attention_flow(attention, layout).map)


def test_orderings_of_a_signed_map():
    grid = np.array([[0.5, -2.0], [0.0, 1.0]])
    assert list(patch_order(ordered(grid, "signed"))) == [3, 0, 2, 1]  # most negative last
    assert list(patch_order(ordered(grid, "absolute"))) == [1, 3, 0, 2]  # the strongest of either sign first
    assert ordered(grid, "positive").min() == 0 and list(patch_order(ordered(grid, "positive")))[:2] == [3, 0]
    with pytest.raises(ValueError, match="choose from"):
        ordered(grid, "sorted")


def test_chance_band_says_when_a_method_cannot_be_told_from_chance():
    band = ChanceBand(deletion=np.array([0.80, 0.84, 0.82, 0.86]), insertion=np.array([0.84, 0.85, 0.83, 0.84]))
    mean, sd = band.band("deletion")
    assert mean == pytest.approx(0.83) and sd == pytest.approx(np.std([0.80, 0.84, 0.82, 0.86], ddof=1))
    assert band.compare("deletion", mean + 1.9 * sd) == "chance"
    assert band.compare("deletion", mean - 2.1 * sd) == "better"  # lower deletion is better
    assert band.compare("insertion", 0.70) == "worse"  # lower insertion is worse
    assert "cannot be told from chance" in band.sentence("rollout", 0.83, 0.84)
    text = band.sentence("AttnLRP", 0.70, 0.84)
    assert "better than chance on deletion" in text and "not distinguishable from chance on insertion" in text


def test_a_best_method_within_chance_is_labelled_so_in_the_table():
    """The AUC table's "best insertion" must agree with the chance verdict: a method inside the random band is
    "best insertion (within chance)", one outside it plain "best deletion"; without a band nothing is added."""
    from vitviz.perturbation.curves import Faithfulness

    band = ChanceBand(deletion=np.array([0.80, 0.84, 0.82, 0.86]), insertion=np.array([0.84, 0.85, 0.83, 0.84]))
    fractions = np.array([0.0, 1.0])  # trapezoid over [0, 1]: AUC = mean of the two points
    # attnlrp: deletion AUC 0.70 (better than chance), insertion AUC 0.845 (inside 0.84 ± 2 x 0.0082)
    # rollout: deletion AUC 0.83 (chance), insertion AUC 0.80 (worse)
    result = Faithfulness(methods=["attnlrp", "rollout"], maps=np.zeros((2, 2, 2)), fractions=fractions,
                          counts=np.array([0, 4]), deletion=np.array([[0.7, 0.7], [0.83, 0.83]]),
                          insertion=np.array([[0.845, 0.845], [0.8, 0.8]]), score="probability")
    marks = {r["method"]: r["reference"] for r in result.table(band)}
    assert marks == {"attnlrp": "best deletion, best insertion (within chance)",
                     "rollout": "worst deletion, worst insertion"}
    assert {r["method"]: r["reference"] for r in result.table()}["attnlrp"] == "best deletion, best insertion"


def test_random_seed_maps_are_distinct_and_reproducible():
    maps = random_seed_maps((4, 5), first_seed=3, seeds=10)
    assert list(maps) == [f"random_seed_{s}" for s in range(3, 13)]
    np.testing.assert_array_equal(maps["random_seed_3"], random_map((4, 5), 3))
    assert len({m.tobytes() for m in maps.values()}) == 10
