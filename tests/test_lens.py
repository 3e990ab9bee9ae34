"""The front door: vitviz.open -> Lens, Lens.trace -> Trace, the map-method registry, vitviz.explain and
vitviz.faithfulness — against the CLI's files, timm's own forward and Captum, on a tiny DeiT (two prefix tokens,
a 4 x 4 grid) saved to safetensors the way users save weights.

The Trace's parity with each library's eager attention is asserted for every registered adapter in
tests/test_adapters.py and tests/test_adapters_hf.py, which read their forwards through ``Lens.trace``.
"""
import json
import os

import numpy as np
import pandas as pd
import pytest
import timm
import torch
from PIL import Image

import vitviz
from conftest import ASSETS, assert_edits_stay_in_their_thread
from vitviz.errors import ImageError, VitvizError
from vitviz.explainers import MethodError, names, registered

NAME = "deit_tiny_distilled_patch16_224"
IMAGES = [ASSETS / "rocket.jpg", ASSETS / "coffee.jpg"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model(NAME, pretrained=False, img_size=64).eval()
    with torch.no_grad():  # random init leaves the head near zero: randomise so a wrong wiring shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp("deit") / "deit.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path, model


@pytest.fixture(scope="module")
def lens(weights):
    return vitviz.open(NAME, checkpoint=str(weights[0]), img_size=64)


@pytest.fixture(scope="module")
def x(lens):
    return lens.preprocess(IMAGES)


def test_open_resolves_the_model_once(lens):
    assert lens.num_layers == 12 and lens.num_heads == 3 and lens.num_classes == 1000
    assert lens.layout.prefix_tokens == ("cls", "dist") and lens.layout.grid_size == (4, 4)
    assert lens.points()[:2] == ["embed", "blocks.0.resid_pre"] and lens.points()[-1] == "logits"


def test_trace_indexes_by_name_and_by_kind_and_layer_and_stacks(lens, x):
    trace = lens.trace(x, keep=("attn", "resid_post", "logits"))
    assert trace["attn", -1] is trace["blocks.11.attn"] and trace["attn", 3] is trace["blocks.3.attn"]
    assert trace["attn", -12] is trace["blocks.0.attn"]
    stacked = trace.stack("attn")
    assert stacked.shape == (2, 12, 3, 18, 18)
    torch.testing.assert_close(stacked[:, 5], trace["attn", 5], rtol=0, atol=0)
    torch.testing.assert_close(stacked.sum(-1), torch.ones(2, 12, 3, 18), rtol=0, atol=18 * 2 ** -24)
    assert trace["resid_post", 0].shape == (2, 18, 192) and trace.logits.shape == (2, 1000)
    assert trace.layers("attn") == list(range(12)) and trace.pooled is None
    # The last block's output read through the model's own final norm and head is the trace's logits.
    model = lens.model
    with torch.no_grad():
        expected = model.forward_head(model.norm(trace["resid_post", -1]))
    torch.testing.assert_close(trace.logits, expected, rtol=1e-5, atol=1e-5)


def test_a_kind_kept_at_every_layer_is_one_stack_whose_slices_are_the_layers(lens, x):
    trace = lens.trace(x, keep="attn")
    stacked = trace.stack("attn")
    assert stacked.data_ptr() == trace["attn", 0].data_ptr() and trace.stack("attn") is stacked  # no copy
    assert trace.nbytes == stacked.numel() * 4  # the layers are views of the stack: counted once
    # The graph-keeping path keeps layer by layer and stacks on demand: the same numbers, bit for bit.
    separate = lens.trace(x, keep="attn", grad=True)
    torch.testing.assert_close(separate.stack("attn").detach(), stacked, rtol=0, atol=0)
    for layer in range(12):
        assert torch.equal(trace["attn", layer], separate["attn", layer].detach())


def test_norm_keeps_only_the_points_norm(lens, x):
    trace = lens.trace(x, keep=("resid_post.norm", ("ln1.norm", 2), "pooled.norm"))
    full = lens.trace(x, keep=("resid_post", ("ln1", 2), "pooled"))
    assert sorted(trace) == sorted(["blocks.2.ln1.norm", "pooled.norm"] + [f"blocks.{i}.resid_post.norm" for i in range(12)])
    assert trace.stack("resid_post.norm").shape == (2, 12, 18)
    for layer in range(12):
        torch.testing.assert_close(trace["resid_post.norm", layer], full["resid_post", layer].norm(dim=-1), rtol=0, atol=0)
    torch.testing.assert_close(trace["ln1.norm", 2], full["ln1", 2].norm(dim=-1), rtol=0, atol=0)
    torch.testing.assert_close(trace["pooled.norm"], full.pooled.norm(dim=-1), rtol=0, atol=0)
    both = lens.trace(x, keep=("resid_post", "resid_post.norm"))  # one point read twice: both kept
    torch.testing.assert_close(both["resid_post.norm", 4], both["resid_post", 4].norm(dim=-1), rtol=0, atol=0)


def test_a_trace_sliced_to_one_image_drops_the_batch_axis(lens, x):
    trace = lens.trace(x, keep=("attn", "resid_post.norm", "logits", ("q", 3)))
    one = trace.image(1)
    assert not one.batched and trace[1].keys() == one.keys() and sorted(one) == sorted(trace)
    torch.testing.assert_close(one.stack("attn"), trace.stack("attn")[1], rtol=0, atol=0)
    assert one.stack("attn").shape == (12, 3, 18, 18) and one["q", 3].shape == (3, 18, 64)
    assert one.stack("attn").data_ptr() == one["attn", 5].data_ptr() - 5 * 3 * 18 * 18 * 4  # still one stack
    torch.testing.assert_close(one.logits, trace.logits[1], rtol=0, atol=0)
    torch.testing.assert_close(one.stack("resid_post.norm"), trace.stack("resid_post.norm")[1], rtol=0, atol=0)
    assert one.inputs.images == x.images[1:] and torch.equal(one.inputs.tensor, x.tensor[1:])
    assert trace.image(-1).inputs.images == x.images[1:] and torch.equal(trace[-1]["attn", 0], trace["attn", 0][1])
    with pytest.raises(VitvizError, match="already one image"):
        one.image(0)
    moved = trace.to("cpu")
    assert moved.stack("attn").data_ptr() == moved["attn", 0].data_ptr()


def test_trace_keeps_only_what_was_asked_and_says_what_it_kept(lens, x):
    trace = lens.trace(x, keep=[("attn", 2), "blocks.4.q"])
    assert sorted(trace) == ["blocks.2.attn", "blocks.4.q"] and trace["q", 4].shape == (2, 3, 18, 64)
    with pytest.raises(vitviz.PointNotKept, match=r"'blocks.5.attn' was not kept.*blocks.2.attn, blocks.4.q"):
        trace["attn", 5]
    with pytest.raises(KeyError):  # a Mapping: a missing key is a KeyError too
        trace["logits"]
    assert set(lens.trace(x, keep="attn")) == {f"blocks.{i}.attn" for i in range(12)}  # a kind: every layer, no more
    stopped = lens.trace(x, keep="resid_post", stop_after=("resid_post", 1))
    assert stopped.layers("resid_post") == [0, 1]


@pytest.mark.parametrize("keep,sentence", [
    ("atn", r"unknown point 'atn': the points are embed, final_norm, pooled, logits"),
    (("attn", 12), r"layer index 12 is out of range for attn: the model has 12 blocks.*layers 1 to 12"),
    (("attn", -13), r"layer index -13 is out of range"),
    ("blocks.x.attn", r"not a point name"),
])
def test_unknown_points_and_layers_get_a_sentence(lens, x, keep, sentence):
    with pytest.raises(VitvizError, match=sentence):
        lens.trace(x, keep=keep)


def test_a_headless_model_has_no_logits_to_keep(tmp_path):
    from safetensors.torch import save_file

    model = timm.create_model("vit_small_patch16_224.dino", pretrained=False, num_classes=0, img_size=32)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "w.safetensors"))
    headless = vitviz.open("vit_small_patch16_224.dino", checkpoint=str(tmp_path / "w.safetensors"), img_size=32)
    with pytest.raises(VitvizError, match="has no classifier head, so it has no logits: keep 'pooled'"):
        headless.trace(torch.zeros(1, 3, 32, 32), keep="logits")
    assert headless.trace(torch.zeros(1, 3, 32, 32), keep="pooled").pooled.shape == (1, 384)
    with pytest.raises(MethodError, match="Gradient rollout needs a classifier head"):
        vitviz.explain(headless, torch.zeros(1, 3, 32, 32), "gradient_rollout")


def test_preprocess_takes_paths_pil_images_and_arrays_alike(lens):
    image = Image.open(IMAGES[0]).convert("RGB")
    array = np.asarray(image)
    by_path = lens.preprocess(IMAGES[0]).tensor
    for other in (image, array, array.astype(np.float64) / 255):
        torch.testing.assert_close(lens.preprocess([other]).tensor, by_path, rtol=0, atol=0)
    with pytest.raises(ImageError, match=r"array 0: has shape \(4, 4\)"):
        lens.preprocess(np.zeros((4, 4)))


def test_preprocess_names_a_file_it_cannot_read(lens, tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not a jpeg")
    with pytest.raises(ImageError, match="bad.jpg: is not an image file"):
        lens.preprocess([IMAGES[0], bad])


def test_two_threads_with_different_edits_on_one_lens_keep_their_own_results(lens, x):
    assert_edits_stay_in_their_thread(lambda model, t, keep, edit: lens.trace(t, keep=keep, edit=edit), lens.model,
                                      x.tensor, "logits")


def test_an_edit_through_the_trace_changes_the_forward_and_not_the_model(lens, x):
    before = lens.trace(x, keep="logits").logits.clone()

    def zero_head(z, point):
        z = z.clone()
        z[:, 1] = 0
        return z
    edited = lens.trace(x, keep=("logits", ("z", 7)), edit={"blocks.7.z": zero_head})
    assert float(edited["z", 7][:, 1].abs().max()) == 0
    assert float((edited.logits - before).abs().max()) > 1e-4
    torch.testing.assert_close(lens.trace(x, keep="logits").logits, before, rtol=0, atol=0)


@pytest.fixture(scope="module")
def analyze_folder(weights, tmp_path_factory):
    from vitviz.cli import main

    out = tmp_path_factory.mktemp("analyze")
    assert main(["analyze", *map(str, IMAGES), "--out", str(out), "--model", NAME, "--checkpoint",
                 str(weights[0]), "--img-size", "64"]) == 0
    return out


def _files(folder):
    with np.load(folder / "analysis.npz") as data:
        arrays = {k: data[k] for k in data.files}
    return arrays, json.loads((folder / "settings.json").read_text())


@pytest.mark.parametrize("keep", [("attn", "resid_post.norm", "final_norm", "logits", "pooled"),
                                  ("attn", "pooled")])  # the second: the rest from one more forward
def test_save_writes_what_analyze_writes_and_load_reads_either(lens, analyze_folder, keep, tmp_path):
    trace = lens.trace(lens.preprocess(IMAGES), keep=keep)
    assert vitviz.save(trace, tmp_path / "t") == tmp_path / "t"
    (cli_arrays, cli_settings), (arrays, settings) = _files(analyze_folder), _files(tmp_path / "t")
    assert sorted(arrays) == sorted(cli_arrays) and "gradient_rollout" in arrays and "posembed_similarity" in arrays
    for name in cli_arrays:
        assert np.array_equal(arrays[name], cli_arrays[name]), name  # equal, not close
    assert settings.pop("run_id") != cli_settings.pop("run_id")  # each run its own id; everything else the same
    assert settings == cli_settings and settings["images"][0]["name"] == "rocket.jpg"
    for folder in (analyze_folder, tmp_path / "t"):
        back = vitviz.load(folder)
        assert back.stack("attn").data_ptr() == back["attn", 0].data_ptr() and back.layout == trace.layout
        torch.testing.assert_close(back.stack("attn"), trace.stack("attn"), rtol=0, atol=0)
        for layer in (0, 5, 11):
            torch.testing.assert_close(back["attn", layer], trace["attn", layer], rtol=0, atol=0)
        np.testing.assert_array_equal(back.stack("resid_post.norm").numpy(), cli_arrays["token_norms"])
        np.testing.assert_array_equal(back["final_norm"].numpy(), cli_arrays["features"])
        np.testing.assert_array_equal(back.inputs.tensor.numpy(), cli_arrays["input"])
        np.testing.assert_array_equal(back.saved["arrays"]["rollout"], cli_arrays["rollout"])
        assert back.saved["settings"]["analysis"] == cli_settings["analysis"]
    torch.testing.assert_close(vitviz.load(tmp_path / "t").pooled, trace.pooled, rtol=0, atol=0)  # from trace.npz


def test_save_refuses_an_edited_trace_that_lacks_what_analyze_reads(lens, x, tmp_path):
    edited = lens.trace(x, keep="attn", edit={"blocks.3.z": lambda v, p: v * 0})
    with pytest.raises(VitvizError, match="ran with edit= and lacks what analyze reads"):
        vitviz.save(edited, tmp_path)
    with pytest.raises(VitvizError, match="neither analyze's analysis.npz nor a trace.npz"):
        vitviz.load(tmp_path)


def test_save_and_load_give_the_same_arrays_and_the_users_file_mode(lens, x, tmp_path):
    trace = lens.trace(x, keep=("attn", "pooled", "logits"))
    old = os.umask(0o027)
    try:
        trace.save(tmp_path / "t")
    finally:
        os.umask(old)
    back = vitviz.load_trace(tmp_path / "t")
    assert list(back) == list(trace) and back.layout == trace.layout and back.num_layers == 12
    for name in trace:
        assert torch.equal(back[name], trace[name])
    assert (tmp_path / "t" / "trace.npz").stat().st_mode & 0o777 == 0o640
    assert not [p for p in (tmp_path / "t").iterdir() if p.name.startswith(".")]  # no temporary left
    with pytest.raises(VitvizError, match="not a vitviz trace folder"):
        vitviz.load_trace(tmp_path)


# --- the registry ----------------------------------------------------------------------------------------


def test_the_registry_lists_every_method_with_what_it_needs():
    listed = {m["name"]: m for m in vitviz.methods()}
    assert list(listed) == ["attnlrp", "cp-lrp", "gradient", "integrated_gradients", "legrad", "gradcam", "occlusion",
                            "rollout", "attention_flow", "gradient_rollout", "last_layer_mean", "random"]
    assert listed["gradient_rollout"]["needs"] == ["a classifier head", "gradients through the model's forward",
                                                   "the attention probabilities of every layer"]
    assert listed["occlusion"]["kind"] == "perturbation" and listed["occlusion"]["needs"] == []
    with pytest.raises(MethodError, match="unknown map method 'shap': choose from attnlrp, cp-lrp"):
        vitviz.explain(None, None, "shap")


@pytest.mark.parametrize("method", list(registered()))
def test_every_method_gives_one_map_per_image_on_the_patch_grid(lens, x, method):
    options = {"steps": 4} if method == "integrated_gradients" else {}
    result = vitviz.explain(lens, x, method, **options)
    assert result.method == method and result.patches.shape == (2, 4, 4)
    assert np.isfinite(result.patches).all() and result.patches.std() > 0
    if not registered()[method].signed:
        assert result.patches.min() >= 0
    if registered()[method].pixels:
        assert result.pixels.shape == (2, 64, 64)


@pytest.fixture(scope="module")
def cli_attribution(weights, tmp_path_factory):
    from vitviz.cli import main

    out = tmp_path_factory.mktemp("attr")
    methods = names(kinds=("relevance", "perturbation"))
    assert main(["analyze", *map(str, IMAGES), "--model", NAME, "--checkpoint", str(weights[0]), "--img-size", "64",
                 "--out", str(out), "--attribution", ",".join(methods), "--target-class", "3", "--no-attention"]) == 0
    return np.load(out / "analysis.npz"), json.loads((out / "settings.json").read_text())


@pytest.mark.parametrize("method", names(kinds=("relevance", "perturbation")))
def test_explain_equals_the_clis_attribution_arrays(lens, cli_attribution, method):
    """The CLI writes what the front door computes, bit for bit, on the npz's own input."""
    data, settings = cli_attribution
    x = torch.from_numpy(data["input"])
    result = vitviz.explain(lens, x, method, target=vitviz.ClassLogit(3))
    key = "attribution_" + method.replace("-", "_")
    np.testing.assert_array_equal(data[key], result.patches.astype(np.float32))
    if result.pixels is not None:
        np.testing.assert_array_equal(data[key + "_pixels"], result.pixels.astype(np.float32))
    assert settings["analysis"]["attribution"]["methods"][method] == registered()[method].label


def test_faithfulness_equals_the_clis_tables(lens, weights, tmp_path):
    from vitviz.cli import main

    out = tmp_path / "faith"
    argv = ["faithfulness", *map(str, IMAGES), "--model", NAME, "--checkpoint", str(weights[0]), "--img-size", "64",
            "--out", str(out), "--methods", "attnlrp,rollout,occlusion,random", "--protocols", "morf,insertion",
            "--steps", "5", "--random-seeds", "2"]
    assert main(argv) == 0
    tables = vitviz.faithfulness(lens, lens.preprocess(IMAGES), methods=["attnlrp", "rollout", "occlusion", "random"],
                                 protocols=("morf", "insertion"), names=[str(p) for p in IMAGES], steps=5,
                                 random_seeds=2)
    for file, ours in (("auc.parquet", tables.aucs), ("faithfulness.parquet", tables.curves)):
        theirs = pd.read_parquet(out / file)
        keys = list(theirs.columns[:-1])
        pd.testing.assert_frame_equal(ours.sort_values(keys).reset_index(drop=True),
                                      theirs.sort_values(keys).reset_index(drop=True), check_exact=True)


# --- occlusion and Integrated Gradients against outside references ------------------------------------------


def _timm_logit(model, x, cls=3):
    with torch.no_grad():
        return model(x)[:, cls].double()


def test_occlusion_is_the_logit_drop_of_timms_own_forward_per_patch(lens, weights, x):
    """Each patch's value is logit_3(x) - logit_3(x with that patch's 16 x 16 pixels at the mean colour), the logits
    from timm's forward of the saved model. Both are float32 forwards of the same function in other orders: logits
    of size ~1 agree to ~1e-6; 1e-4 absolute leaves room and fails for a wrong patch or replacement."""
    model = weights[1]
    result = vitviz.explain(lens, x, "occlusion", target=vitviz.ClassLogit(3))
    t = x.tensor
    base = _timm_logit(model, t)
    for i in range(2):
        for r in range(4):
            for c in range(4):
                hidden = t[i:i + 1].clone()
                hidden[..., 16 * r:16 * (r + 1), 16 * c:16 * (c + 1)] = 0
                expected = float(base[i] - _timm_logit(model, hidden)[0])
                assert abs(result.patches[i, r, c] - expected) <= 1e-4, (i, r, c)


def test_occlusion_with_a_2x2_window_averages_the_windows_that_cover_each_patch(lens, weights, x):
    model = weights[1]
    result = vitviz.explain(lens, x, "occlusion", target=vitviz.ClassLogit(3), window=2, stride=1)
    t = x.tensor[:1]
    base = float(_timm_logit(model, t)[0])
    drops = np.zeros((3, 3))
    for r in range(3):
        for c in range(3):
            hidden = t.clone()
            hidden[..., 16 * r:16 * (r + 2), 16 * c:16 * (c + 2)] = 0
            drops[r, c] = base - float(_timm_logit(model, hidden)[0])
    expected = np.zeros((4, 4))
    for r in range(4):
        for c in range(4):
            covering = [drops[a, b] for a in range(max(0, r - 1), min(3, r + 1))
                        for b in range(max(0, c - 1), min(3, c + 1))]
            expected[r, c] = np.mean(covering)
    np.testing.assert_allclose(result.patches[0], expected, rtol=0, atol=1e-4)


def test_integrated_gradients_equals_captum_on_timms_forward_and_is_complete(lens, weights, x):
    """The same Captum call on timm's own forward (no vitviz code) gives the same pixels; the pixels sum to
    logit(x) - logit(mean image) up to the quadrature error Captum reports."""
    from captum.attr import IntegratedGradients

    model = weights[1]
    result = vitviz.explain(lens, x, "integrated_gradients", target=vitviz.ClassLogit(3), steps=32)
    for i in range(2):
        xi = x.tensor[i:i + 1]
        attr = IntegratedGradients(lambda z: model(z)[:, 3]).attribute(xi, baselines=torch.zeros_like(xi), n_steps=32,
                                                                         internal_batch_size=16)
        ref = attr.sum(1)[0].double().numpy()
        # float32 forwards in another order: gradients agree to ~1e-6 of their size, summed over 32 nodes.
        np.testing.assert_allclose(result.pixels[i], ref, rtol=0, atol=1e-4 * np.abs(ref).max())
        gap = float(_timm_logit(model, xi)[0] - _timm_logit(model, torch.zeros_like(xi))[0])
        delta = result.settings["convergence_delta"][i]
        assert abs(result.pixels[i].sum() - gap) <= delta + 1e-4 * abs(gap)
        np.testing.assert_allclose(result.patches[i].sum(), result.pixels[i].sum(), rtol=1e-9)
