"""vitviz.save and vitviz.load for window models (Swin): a window model's ``analyze`` folder read back as the Trace
``Lens.trace`` returns, and a Swin trace written as ``python -m vitviz analyze`` writes that model's run.

Two tiny random Swins saved the way users save them (tests/test_adapters_swin.py): timm (a registered name plus a
safetensors checkpoint) and Hugging Face (a ``save_pretrained`` folder). At 72 px their grids (18 x 18, 9 x 9) are
not whole 4 x 4 windows and every second block is shifted, so the padding order (timm rolls then pads, transformers
pads then rolls) decides which token sits in which window slot. analyze stores the window probabilities as float32,
as the trace keeps them: every comparison is exact (``torch.equal``, ``np.array_equal``), none is close.
"""
import json
import shutil

import numpy as np
import pytest
import torch

import vitviz
from conftest import ASSETS
from test_adapters_swin import TINY_SWIN, hf_swin_folder, timm_swin_checkpoint
from vitviz import swin
from vitviz.cli import main
from vitviz.errors import VitvizError
from vitviz.runs.analysis import AnalysisSettings

IMAGES = [ASSETS / "chelsea.jpg", ASSETS / "coffee.jpg"]
FAMILIES = ["timm", "hf"]


@pytest.fixture(scope="module")
def opened(tmp_path_factory):
    """family -> (Lens, analyze's model options) for the same model."""
    folder = tmp_path_factory.mktemp("swins")
    checkpoint = timm_swin_checkpoint(folder)
    hf = hf_swin_folder(folder / "hf", 72, absolute=True)
    return {"timm": (vitviz.open(TINY_SWIN, checkpoint=checkpoint, img_size=72),
                     ["--model", TINY_SWIN, "--checkpoint", checkpoint, "--img-size", "72"]),
            "hf": (vitviz.open(hf), ["--model", hf])}


@pytest.fixture(scope="module")
def analyzed(opened, tmp_path_factory):
    """family -> the folder ``python -m vitviz analyze`` wrote for IMAGES (one batch)."""
    out = {}
    for family, (_, options) in opened.items():
        out[family] = tmp_path_factory.mktemp(f"analyze_{family}")
        assert main(["analyze", *map(str, IMAGES), "--out", str(out[family]), *options]) == 0
    return out


def _files(folder):
    with np.load(folder / "analysis.npz") as data:
        arrays = {k: data[k] for k in data.files}
    return arrays, json.loads((folder / "settings.json").read_text())


def _geometry(g) -> tuple:
    """Everything a WindowGeometry holds (it compares by identity), with where each window slot sits on the grid."""
    return (g.index, g.stage, g.block, g.grid_size, g.window_size, g.shift, g.stride, g.pad_first,
            None if g.allowed is None else g.allowed.tobytes(), g.token_positions().tobytes())


def assert_same_windows(back, trace):
    assert back.layout == trace.layout and back.num_layers == trace.num_layers == 4
    assert [_geometry(g) for g in back.geometry] == [_geometry(g) for g in trace.geometry]


@pytest.mark.parametrize("family", FAMILIES)
def test_load_reads_analyze_window_folder_as_the_trace_lens_traces(opened, analyzed, family):
    lens = opened[family][0]
    x = lens.preprocess(IMAGES)
    trace = lens.trace(x, keep=("attn", "final_norm", "logits"))
    back = vitviz.load(analyzed[family])
    assert sorted(back) == sorted(trace) and back.layers("attn") == [0, 1, 2, 3]
    for layer in range(4):  # analyze stores float32, as the trace keeps it: equal bit for bit
        assert back["attn", layer].dtype == torch.float32 and torch.equal(back["attn", layer], trace["attn", layer])
    assert back["attn", 2].shape == (2, 9, 4, 16, 16)  # stage 2: 9 x 9 grid padded to 12 x 12, 4 heads
    assert torch.equal(back["final_norm"], trace["final_norm"]) and torch.equal(back.logits, trace.logits)
    assert torch.equal(back.inputs.tensor, x.tensor)
    assert_same_windows(back, trace)
    assert [g.pad_first for g in back.geometry] == [family == "hf"] * 4
    # The window analyses read the loaded trace as analyze read its forward: the distances analyze wrote come back.
    distances = swin.heads_padded([swin.mean_window_attention_distance(a, g)
                                   for a, g in zip(back.each("attn"), back.geometry)])
    assert np.array_equal(distances, back.saved["arrays"]["window_distance"], equal_nan=True)
    one = back.image(1)
    assert one.geometry is back.geometry and torch.equal(one["attn", 3], trace["attn", 3][1])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("keep", [("attn", "final_norm", "logits", "pooled"),
                                  ("attn",)])  # the second: the rest from one more forward
def test_save_writes_what_analyze_writes_for_a_window_model(opened, analyzed, family, keep, tmp_path):
    lens = opened[family][0]
    trace = lens.trace(lens.preprocess(IMAGES), keep=keep)
    assert vitviz.save(trace, tmp_path / "t") == tmp_path / "t"
    (cli_arrays, cli_settings), (arrays, settings) = _files(analyzed[family]), _files(tmp_path / "t")
    assert sorted(arrays) == sorted(cli_arrays) and "window_attention_3" in arrays and "window_distance" in arrays
    for name in cli_arrays:  # equal, not close (window_distance is NaN where a stage has fewer heads)
        assert arrays[name].dtype == cli_arrays[name].dtype, name
        assert np.array_equal(arrays[name], cli_arrays[name], equal_nan=arrays[name].dtype.kind == "f"), name
    assert settings.pop("run_id") != cli_settings.pop("run_id")  # each run its own id; everything else the same
    assert settings == cli_settings and [im["name"] for im in settings["images"]] == ["chelsea.jpg", "coffee.jpg"]
    assert (tmp_path / "t" / "trace.npz").exists() == ("pooled" in keep)


@pytest.mark.parametrize("family", FAMILIES)
def test_load_of_save_round_trips_a_window_trace(opened, family, tmp_path):
    lens = opened[family][0]
    trace = lens.trace(lens.preprocess(IMAGES), keep=("attn", "final_norm", "logits", "pooled", ("q", 1)))
    back = vitviz.load(vitviz.save(trace, tmp_path / "t"))
    assert sorted(back) == sorted(trace)
    for name in trace:
        assert torch.equal(back[name], trace[name]), name
    assert_same_windows(back, trace)
    assert torch.equal(back.inputs.tensor, trace.inputs.tensor)
    own = vitviz.load(trace.save(tmp_path / "own"))  # Trace.save's trace.npz alone carries the windows too
    assert sorted(own) == sorted(trace) and torch.equal(own["attn", 1], trace["attn", 1])
    assert_same_windows(own, trace)


def test_an_older_window_folder_without_the_padding_order_says_to_run_analyze_again(analyzed, opened, tmp_path):
    for family in FAMILIES:
        older = shutil.copytree(analyzed[family], tmp_path / family)
        settings = json.loads((older / "settings.json").read_text())
        del settings["token_layout"]  # the model's own layout stands in for it (analyze ran at the model's size)
        (older / "settings.json").write_text(json.dumps(settings))
        assert vitviz.load(older).layout == opened[family][0].layout
        for record in settings["window_geometry"]:
            del record["pads_before_rolling"]
        (older / "settings.json").write_text(json.dumps(settings))
        with pytest.raises(VitvizError, match="cannot place its windows.*run python -m vitviz analyze again"):
            vitviz.load(older)  # shifted blocks over padded grids: which token sits in which slot is unknown


def test_save_refuses_what_a_window_model_cannot_write_with_a_sentence(opened, tmp_path):
    lens = opened["timm"][0]
    x = lens.preprocess(IMAGES[:1])
    with pytest.raises(VitvizError, match=r"attends within shifted windows.*flow, clusters do not apply"):
        vitviz.save(lens.trace(x), tmp_path, settings=AnalysisSettings(flow=True, clusters=3))
    # as the CLI refuses --target-class without --attribution for a window model: a target needs a map to aim
    with pytest.raises(VitvizError, match=r"the settings target_class do not apply"):
        vitviz.save(lens.trace(x), tmp_path, settings=AnalysisSettings(target_class=3))
    edited = lens.trace(x, keep="attn", edit={"blocks.1.z": lambda v, p: v * 0})
    with pytest.raises(VitvizError, match="lacks what analyze reads: keep 'attn', 'final_norm' and 'logits'"):
        vitviz.save(edited, tmp_path)
    assert not (tmp_path / "analysis.npz").exists()
