"""Outliers, register neurons and the test-time register (vitviz.analyses.registers) on a planted model: a tiny
random timm ViT into which the test writes one MLP neuron that fires on a few patches and makes them
high-norm outliers from its layer on."""
import copy
import os
import stat

import numpy as np
import pytest
import timm
import torch

from vitviz.analyses import registers as R
from vitviz.adapters import run
from vitviz.layout import TokenLayout

LAYER, NEURON, PATCHES = 1, 7, (3, 6, 9)  # 0-based layer and hidden unit, raster patches on the 4x4 grid


def plant(model: torch.nn.Module, layer: int = LAYER, neuron: int = NEURON, patches=PATCHES) -> torch.nn.Module:
    """Write one register neuron into ``model`` (in place): the position embedding of ``patches`` gets a
    component along a direction u (3x a typical token norm: visible, but far below the outlier rule); the
    neuron reads u after ``norm2`` of ``layer`` (GELU(4 u.x - 14): ~14 where the component is, ~0 elsewhere)
    and writes 30 typical norms x 3 along another direction v: those patches become outliers from ``layer`` on."""
    layout = TokenLayout.from_model(model)
    D = model.embed_dim
    typical = float(R.token_norms(model, torch.randn(4, 3, *model.patch_embed.img_size))[:, 0, layout.patch_slice]
                    .median())
    g = torch.Generator().manual_seed(1)
    u, v = torch.randn(D, generator=g), torch.randn(D, generator=g)
    u, v = (u - u.mean()) / (u - u.mean()).norm(), (v - v.mean()) / (v - v.mean()).norm()
    blk = model.blocks[layer]
    with torch.no_grad():
        for p in patches:
            model.pos_embed[0, layout.pos_embed_prefix_rows + p] += 3 * typical * u
        blk.mlp.fc1.weight[neuron] = 4 * u / blk.norm2.weight
        blk.mlp.fc1.bias[neuron] = -14 - 4 * (blk.norm2.bias @ u)
        blk.mlp.fc2.weight[:, neuron] = 30 * typical / 14 * 3 * v
    return model


def tiny_vit(seed: int = 0, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = timm.create_model("vit_small_patch16_224", pretrained=False, **({"depth": 4, "embed_dim": 64, "num_heads": 4,
                                                                             "img_size": 64, "num_classes": 10} | kw))
    with torch.no_grad():  # random init leaves heads near zero; randomise so a wrong forward shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.fixture(scope="module")
def planted():
    model = plant(tiny_vit())
    torch.manual_seed(2)
    return model, TokenLayout.from_model(model), torch.randn(6, 3, 64, 64)


def test_plain_tiny_vit_has_no_outliers_and_the_planted_one_has_them_from_its_layer_on(planted):
    model, layout, x = planted
    plain = R.find_outliers(R.token_norms(tiny_vit(), x).numpy(), layout)
    assert not plain.any and plain.emergence_layer is None
    out = R.find_outliers(R.token_norms(model, x).numpy(), layout)
    assert out.emergence_layer == LAYER
    assert not out.mask[:, :LAYER].any()
    for layer in range(LAYER, 4):
        assert [p.tolist() for p in out.positions(layer)] == [list(PATCHES)] * len(x)


def test_search_ranks_the_planted_neuron_first_in_the_layers_up_to_emergence(planted):
    model, layout, x = planted
    search = R.search_register_neurons(model, [x[:4], x[4:]], layout)
    best = search.neurons[0]
    assert (best.layer, best.index) == (LAYER, NEURON)
    assert best.score > 5 * search.neurons[1].score
    assert {n.layer for n in search.neurons} <= {0, LAYER}  # nothing past the emergence layer is searched
    data = search.to_json()
    assert data["emergence_layer"] == LAYER + 1 and data["neurons"][0] == {"layer": LAYER + 1, "index": NEURON,
                                                                            "score": best.score}
    assert data["threshold"] == R.OUTLIER_FACTOR and search.images_with_outliers == len(x)


def test_search_scores_are_the_mean_absolute_activation_at_the_outliers(planted):
    """The score by hand: the hidden units of the planted layer at the three outlier patches, |.|, mean over
    patches, then over images (numpy on the adapter's mlp_hidden point)."""
    model, layout, x = planted
    search = R.search_register_neurons(model, [x], layout)
    with torch.no_grad():
        h = run(model, x, keep=(f"blocks.{LAYER}.mlp_hidden",))[f"blocks.{LAYER}.mlp_hidden"].numpy()
    expected = np.abs(h[:, [1 + p for p in PATCHES]]).mean(axis=1).mean(axis=0)
    np.testing.assert_allclose(search.scores[LAYER], expected, rtol=1e-5)


def test_register_moves_the_outliers_to_the_extra_token_and_keeps_the_output(planted):
    """After the repair no patch is above the threshold in the last layer, the extra token (one more prefix
    token) carries the norm, and the output changes less than removing the outliers' cause does: the same
    neuron zeroed everywhere without an extra token (the baseline that needs no register) -- per image, a
    pooled cosine at least as high and no larger logit change. A random head's top-1 margins can be tiny
    (0.016 here), so top-1 must agree only where the margin exceeds twice the largest logit change (the most
    a change of that size can close)."""
    model, layout, x = planted
    register = R.TestTimeRegister(((LAYER, NEURON),))
    after = register.layout(layout)
    assert after.prefix_tokens == ("cls", R.EXTRA_TOKEN) and after.num_tokens == layout.num_tokens + 1
    norms = R.token_norms(model, x, edit=register.edit(layout)).numpy()
    out = R.find_outliers(norms, after)
    assert not out.mask[:, -1].any()
    assert (norms[:, -1, 1] > R.OUTLIER_FACTOR * out.median[:, -1]).all()
    repaired = R.compare_outputs(model, x, register.edit(layout))

    def ablate(h, point):
        h = h.clone()
        h[..., NEURON] = 0
        return h

    ablated = R.compare_outputs(model, x, {f"blocks.{LAYER}.mlp_hidden": ablate})
    assert (repaired.pooled_cosine >= ablated.pooled_cosine).all()
    assert (repaired.max_logit_change <= ablated.max_logit_change).all()
    with torch.no_grad():
        top2 = model(x).topk(2).values
    safe = (top2[:, 0] - top2[:, 1]).numpy() > 2 * repaired.max_logit_change
    assert safe.sum() >= 4 and repaired.top1_agrees[safe].all()


def test_register_through_edit_equals_the_same_done_by_hand_on_the_modules(planted):
    """The reference: timm's own forward of a deep copy, with forward hooks on ``norm_pre`` (the tokens entering
    block 1: insert the extra token after CLS) and on the planted block's ``mlp.act`` (the hidden units). Both
    runs are float32; the spelled-out attention differs from timm's fused one by rounding (~1e-6)."""
    model, layout, x = planted
    for init in ("zero", "mean"):
        register = R.TestTimeRegister(((LAYER, NEURON), (0, 5)), init=init)
        with torch.no_grad():
            ours = run(model, x, keep=("logits",), edit=register.edit(layout))["logits"]
        copy_ = copy.deepcopy(model)

        def insert(module, inputs, out):
            extra = out[:, 1:].mean(1, keepdim=True) if init == "mean" else torch.zeros_like(out[:, :1])
            return torch.cat([out[:, :1], extra, out[:, 1:]], dim=1)

        def move(index):
            def hook(module, inputs, out):
                out = out.clone()
                out[:, 1, index] = out[:, 2:, index].max(dim=1).values
                out[:, 2:, index] = 0
                return out
            return hook

        copy_.norm_pre.register_forward_hook(insert)
        copy_.blocks[LAYER].mlp.act.register_forward_hook(move(NEURON))
        copy_.blocks[0].mlp.act.register_forward_hook(move(5))
        with torch.no_grad():
            theirs = copy_(x)
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-5, rtol=1e-5)
        assert not np.allclose(theirs.numpy(), model(x).detach().numpy(), atol=1e-3)  # the repair did something


def test_sink_masking_drops_the_masked_keys_and_renormalises_rows(planted):
    model, layout, x = planted
    out = R.find_outliers(R.token_norms(model, x).numpy(), layout)
    masked = R.outlier_mask(out)
    with torch.no_grad():
        attn = run(model, x, keep=("blocks.*.attn",), edit=R.mask_keys(masked))
    for layer in range(4):
        a = attn[f"blocks.{layer}.attn"]
        torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)))
        cols = [1 + p for p in PATCHES]
        assert (a[..., cols] == 0).all() == (layer >= LAYER)


def test_trained_registers_are_prefix_tokens_apart_from_the_patches():
    from vitviz.figures.registers_figures import norm_by_layer

    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, depth=2, embed_dim=64,
                              num_heads=4, img_size=70).eval()
    layout = TokenLayout.from_model(model)
    assert layout.prefix_tokens == ("cls", "reg0", "reg1", "reg2", "reg3")
    norms = R.token_norms(model, torch.randn(2, 3, 70, 70)).numpy()
    assert norms.shape == (2, 2, 5 + 25)
    fig = norm_by_layer(R.find_outliers(norms, layout))
    names = [t.name for t in fig.data]
    assert "registers (reg0-reg3)" in names and "CLS" in names
    reg = next(t for t in fig.data if t.name == "registers (reg0-reg3)")
    np.testing.assert_allclose(reg.y, norms[:, :, 1:5].max(axis=(0, 2)), rtol=1e-6)


def test_register_json_mistakes_get_a_sentence(planted):
    model, layout, _ = planted
    with pytest.raises(ValueError, match="no register neurons"):
        R.register_from_json({"neurons": []})
    with pytest.raises(ValueError, match="integer 'layer' and 'index'"):
        R.register_from_json({"neurons": [{"layer": "x"}]})
    with pytest.raises(ValueError, match="layer 9, and this model has 4"):
        R.check_register(model, R.register_from_json({"neurons": [{"layer": 9, "index": 0}]}), layout)
    with pytest.raises(ValueError, match="hidden unit 999 of layer 2, which has 256"):
        R.check_register(model, R.register_from_json({"neurons": [{"layer": 2, "index": 999}]}), layout)
    assert R.why_no_register(tiny_vit(global_pool="avg", class_token=False)) is not None
    assert R.why_no_register(model) is None


@pytest.fixture(scope="module")
def planted_checkpoint(tmp_path_factory):
    """A planted ViT-Ti/16 at 64 px, saved the way users save weights (safetensors of the state dict)."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    plant(model)
    path = tmp_path_factory.mktemp("planted") / "planted.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model, path


def load_planted(at, weights) -> str:
    """Pick the planted ViT-Ti/16 in the sidebar the way a user does (timm name, checkpoint, 64 px); its timm name."""
    at.sidebar.selectbox(key="model_choice").set_value("timm model by name").run()
    at.sidebar.text_input(key="timm_query").input("vit_tiny_patch16_224").run()
    name = next(o for o in at.sidebar.selectbox(key="timm_name").options if o.startswith("vit_tiny_patch16_224"))
    at.sidebar.text_input(key="ckpt_path").input(str(weights)).run()  # first: a pick without weights is taken back
    at.sidebar.selectbox(key="timm_name").set_value(name).run()
    at.sidebar.number_input(key="img_size").set_value(64).run()
    return name


def test_cli_finds_the_planted_neuron_and_analyze_runs_with_the_register(planted_checkpoint, tmp_path):
    import json

    import pandas as pd

    from conftest import ASSETS
    from vitviz.cli import main

    model, weights = planted_checkpoint
    photos = [str(ASSETS / n) for n in ("chelsea.jpg", "coffee.jpg", "astronaut.jpg", "rocket.jpg")]
    common = ["--model", "vit_tiny_patch16_224", "--checkpoint", str(weights), "--img-size", "64"]
    assert main(["registers", *photos, *common, "--out", str(tmp_path / "r")]) == 0
    data = json.loads((tmp_path / "r" / "registers.json").read_text())
    assert data["threshold"] == R.OUTLIER_FACTOR and data["emergence_layer"] == LAYER + 1
    assert {k: data["neurons"][0][k] for k in ("layer", "index")} == {"layer": LAYER + 1, "index": NEURON}
    norms = pd.read_parquet(tmp_path / "r" / "norms.parquet")
    umask = os.umask(0)
    os.umask(umask)
    for written in ("registers.json", "norms.parquet"):  # the user's umask, as every other output (not mkstemp's 0600)
        assert stat.S_IMODE((tmp_path / "r" / written).stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["norms.parquet", "registers.json"]  # no temporaries
    assert len(norms) == 4 * 12 * 17 and norms["layer"].min() == 1 and norms["layer"].max() == 12
    outliers = norms[norms["outlier"]]
    assert set(outliers["token"]) == {1 + p for p in PATCHES} and outliers["layer"].min() == LAYER + 1

    out = tmp_path / "a"
    assert main(["analyze", *photos[:2], *common, "--registers", str(tmp_path / "r" / "registers.json"),
                 "--register-neurons", "1", "--out", str(out)]) == 0
    arrays = np.load(out / "analysis.npz")
    settings = json.loads((out / "settings.json").read_text())
    assert settings["analysis"]["token_layout"]["prefix_tokens"] == ["cls", R.EXTRA_TOKEN]
    assert settings["analysis"]["test_time_register"]["neurons"] == [{"layer": LAYER + 1, "index": NEURON}]
    assert arrays["token_norms"].shape == (2, 12, 18) and arrays["attention"].shape == (2, 12, 3, 18, 18)
    register = R.TestTimeRegister(((LAYER, NEURON),))
    layout = TokenLayout.from_model(model)
    with torch.no_grad():
        expected = run(model, torch.from_numpy(arrays["input"]), keep=("logits",), edit=register.edit(layout))["logits"]
    np.testing.assert_allclose(arrays["logits"], expected.numpy(), rtol=1e-4, atol=1e-4)
    patch_norms = arrays["token_norms"][:, -1, 2:]
    assert (patch_norms.max(-1) < R.OUTLIER_FACTOR * np.median(patch_norms, -1)).all()


def test_cli_register_mistakes_get_a_sentence_and_write_nothing(planted_checkpoint, tmp_path, capsys):
    import json

    from conftest import ASSETS
    from vitviz.cli import main

    _, weights = planted_checkpoint
    common = [str(ASSETS / "rocket.jpg"), "--model", "vit_tiny_patch16_224", "--checkpoint", str(weights),
              "--img-size", "64"]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"neurons": [{"layer": 20, "index": 3, "score": 1.0}]}))
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"neurons": []}))
    for path, sentence in ((bad, "is not JSON"), (other, "names layer 20, and this model has 12 (was it written for "
                                                         "another model?)"), (empty, "nothing to repair")):
        out = tmp_path / path.stem
        assert main(["analyze", *common, "--registers", str(path), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--registers {path}" in err and sentence in err and "Traceback" not in err
        assert not (out / "analysis.npz").exists()


@pytest.mark.slow
def test_registers_page_says_the_bundled_model_has_nothing_to_repair_and_masks_its_sinks(bundled):
    """The bundled DINOv2-S/14 has no outliers (max/median <= 1.9 at 224): the page says so plainly, its
    norm plot's patch max equals the core's, and sink masking is shown with its output change."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from conftest import ASSETS
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess

    app = str(Path(__file__).resolve().parent.parent / "app.py")
    at = AppTest.from_file(app, default_timeout=300).run()
    at.switch_page("pages/11_registers.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("No outliers: nothing to repair" in i.value for i in at.info)
    chart = next(c for c in at.get("plotly_chart") if "registers_norms" in (c.proto.id or ""))
    import json

    traces = {t["name"]: t for t in json.loads(chart.proto.spec)["data"]}
    image = at.sidebar.selectbox(key="current").value
    x = preprocess([load_image(ASSETS / image).image], bundled.data_config).tensor
    norms = R.token_norms(bundled.model, x).numpy()
    y = traces["patches: max"]["y"]
    y = np.frombuffer(__import__("base64").b64decode(y["bdata"]), dtype=y["dtype"]) if isinstance(y, dict) else y
    np.testing.assert_allclose(y, norms[0, :, 1:].max(-1), rtol=1e-5)
    assert any("Sink masking" in s.value for s in at.subheader)
    assert any("pooled cosine" in c for df in at.dataframe for c in df.value.columns)


@pytest.mark.slow
def test_registers_page_repairs_the_planted_model(planted_checkpoint):
    """The planted ViT-Ti loaded the way a user does (timm name, checkpoint path, 64 px): the page finds the
    planted neuron first and draws the heads and rollout before and after the register, whose 'after' rollout
    equals the core's rollout of the repaired forward."""
    import json
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from vitviz.trace import trace_for_analysis as capture
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess
    from vitviz.sources.models import ModelSpec, load_model
    from vitviz.analyses.rollout import rollout

    model, weights = planted_checkpoint
    app = str(Path(__file__).resolve().parent.parent / "app.py")
    at = AppTest.from_file(app, default_timeout=300).run()
    name = load_planted(at, weights)
    at.switch_page("pages/11_registers.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert not any("nothing to repair" in i.value for i in at.info)
    ranks = at.dataframe[0].value
    # the crossed patches are named for what they are: outliers here, not sinks
    assert any(f"patches {list(PATCHES)} set no limit (outliers)" in c.value for c in at.caption)
    assert (int(ranks.iloc[0]["layer"]), int(ranks.iloc[0]["unit"])) == (LAYER + 1, NEURON)
    assert any("Test-time register" in s.value for s in at.subheader)
    at.slider(key="registers_k").set_value(1).run()
    chart = next(c for c in at.get("plotly_chart") if "register_rollout" in (c.proto.id or ""))
    heat = [t for t in json.loads(chart.proto.spec)["data"] if t["type"] == "heatmap"]
    from conftest import ASSETS

    image = at.sidebar.selectbox(key="current").value
    loaded = load_model(ModelSpec(name=name, checkpoint=str(weights), img_size=64))
    x = preprocess([load_image(ASSETS / image).image], loaded.data_config).tensor
    register = R.TestTimeRegister(((LAYER, NEURON),))
    layout = TokenLayout.from_model(model)
    after = capture(model, x, edit=register.edit(layout), layout=register.layout(layout))
    expected = rollout(after.stack("attn")[0].numpy(), register.layout(layout)).map

    def z(t):
        v = t["z"]
        if isinstance(v, dict):
            import base64
            return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).reshape(
                [int(n) for n in str(v["shape"]).split(",")])
        return np.array(v, dtype=float)

    np.testing.assert_allclose(z(heat[1]), expected, rtol=1e-4, atol=1e-7)


def test_compose_edits_applies_every_mapping_at_a_shared_point_in_order(planted):
    """Capture reads ``blocks.*.attn`` while a repair masks it: the capture must see the masked attention."""
    from vitviz.adapters import compose_edits

    model, layout, x = planted
    seen = {}

    def read(a, point):
        seen[point.layer] = a
        return a

    masked = R.outlier_mask(R.find_outliers(R.token_norms(model, x).numpy(), layout))
    with torch.no_grad():
        run(model, x, edit=compose_edits(R.mask_keys(masked), {"blocks.*.attn": read}))
    cols = [1 + p for p in PATCHES]
    assert (seen[3][..., cols] == 0).all() and torch.allclose(seen[3].sum(-1), torch.ones(()))
    seen.clear()
    with torch.no_grad():
        run(model, x, edit=compose_edits({"blocks.*.attn": read}, R.mask_keys(masked)))
    assert (seen[3][..., cols] > 0).all()  # read first: the attention before masking


def test_cli_registers_on_the_bundled_model_finds_nothing_to_repair(tmp_path, monkeypatch, capsys):
    """The README's ``registers`` line, typed as it stands (the four sample photos): the bundled DINOv2-S/14 has no
    outliers at 10x (largest 1.90x the median), so registers.json lists no neuron and no emergence layer, and
    analyze --registers with it says there is nothing to repair."""
    import json

    from conftest import ASSETS, readme_command
    from vitviz.cli import main

    monkeypatch.chdir(ASSETS.parent)  # the README's paths are relative to the repository
    args = readme_command(".venv/bin/python -m vitviz registers assets/ --out", tmp_path)
    assert args[:3] == ["-m", "vitviz", "registers"]
    assert main(args[2:]) == 0
    assert "no outliers" in capsys.readouterr().out
    data = json.loads((tmp_path / "registers.json").read_text())
    assert data["neurons"] == [] and data["emergence_layer"] is None and data["images_with_outliers"] == 0
    assert data["model"]["model"] == "bundled" and data["detect_layer"] == 12
    assert main(["analyze", str(ASSETS / "rocket.jpg"), "--registers", str(tmp_path / "registers.json"),
                 "--out", str(tmp_path / "a")]) == 2
    assert "nothing to repair" in capsys.readouterr().err


def test_the_registers_pages_numbers_on_maps_written_by_hand():
    """What the Registers page prints about a repair, on arrays with known answers: a CLS + 2 x 2 grid before, the
    same plus a register token after."""
    from vitviz.analyses.outliers import Outliers
    from vitviz.analyses.tokens import AttentionSinks

    before = TokenLayout(prefix_tokens=("cls",), grid_size=(2, 2), patch_size=(16, 16), global_pool="token",
                         pos_embed_prefix_rows=1)
    after = TokenLayout(prefix_tokens=("cls", "reg0"), grid_size=(2, 2), patch_size=(16, 16), global_pool="token",
                        pos_embed_prefix_rows=1)
    heads_before = np.arange(3 * 4, dtype=float).reshape(3, 2, 2)  # 3 heads
    heads_after = heads_before[::-1] * 10
    norms_before = np.array([[9.0, 1, 2, 3, 4], [9.0, 1, 2, 3, 12]])  # last layer: patches 1 2 3 12, median 2.5
    norms_after = np.array([[9.0, 5, 1, 2, 3, 4], [9.0, 20, 1, 2, 3, 4]])  # last layer: register 20, patches 1-4
    maps = R.RepairMaps(heads_before, heads_after, np.zeros((2, 2)), np.zeros((2, 2)), norms_before, norms_after,
                        before, after, R.OutputChange(np.ones(1)))
    np.testing.assert_array_equal(maps.last_layer(2), np.stack([heads_before[2], heads_after[2]]))
    np.testing.assert_allclose(maps.last_layer(None), np.stack([heads_before.mean(0), heads_after.mean(0)]))
    assert maps.norm_ratio(after=False) == 12 / 2.5
    assert maps.norm_ratio(after=True) == 4 / 2.5
    assert maps.extra_token_norm() == (20.0, 2.5)
    plain = R.RepairMaps(heads_before, heads_before, np.zeros((2, 2)), np.zeros((2, 2)), norms_before, norms_before,
                         before, before, R.OutputChange(np.ones(1)))
    assert plain.extra_token_norm() is None  # sink masking adds no token

    sinks = AttentionSinks(received=np.zeros((3, 5)), z=np.zeros((3, 5)),
                           sinks=[np.array([0, 3]), np.array([], int), np.array([0, 1, 2, 4])])
    assert sinks.patch_counts(before) == [1, 0, 3]  # the CLS (token 0) is no patch

    # two images, two layers; patch norms per (image, layer) and their outliers at 3x the median
    norms = np.zeros((2, 2, 5))
    norms[0, 0, 1:] = [1, 1, 1, 1]
    norms[0, 1, 1:] = [1, 2, 2, 8]  # ratio 4: patch 3 an outlier
    norms[1, 0, 1:] = [1, 1, 6, 1]  # ratio 6: patch 2 an outlier
    norms[1, 1, 1:] = [2, 2, 2, 2]
    median = np.median(norms[:, :, 1:], axis=-1)
    out = Outliers(norms, before, 3.0, median, norms[:, :, 1:] > 3.0 * median[..., None])
    np.testing.assert_allclose(out.largest_ratio_per_layer, [6.0, 4.0])
    assert out.layers_with_outliers == [0, 1]
    np.testing.assert_array_equal(out.norm_map(0, 1), [[[1, 2], [2, 8]]])
