"""``python -m vitviz faithfulness``: the tables equal the core recomputed, a run cut short and resumed equals an
uninterrupted one, Ray equals local, the README's line runs."""
import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import readme_command
from test_streaming_rollout import MODEL, make_images, tiny_checkpoint  # noqa: F401
from vitviz.cli import main


def _args(inputs, out, checkpoint, *extra):
    return ["faithfulness", *map(str, inputs), "--out", str(out), "--model", MODEL, "--checkpoint", str(checkpoint),
            "--img-size", "64", "--methods", "attnlrp,rollout,random", "--random-seeds", "3", "--steps", "5",
            "--batch-size", "1", *extra]


def _tables(out):
    return {name: pq.read_table(out / name) for name in ("faithfulness.parquet", "auc.parquet")}


def test_cli_tables_equal_the_core_on_each_image(tmp_path, tiny_checkpoint):
    from attribution_names import attribute, default_target
    from vitviz.trace import trace_for_analysis as capture
    from vitviz.perturbation.curves import ordered, random_seed_maps
    from vitviz.perturbation.protocols import protocol_curves
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess
    from vitviz.sources.models import ModelSpec, load_model
    from vitviz.analyses.rollout import rollout

    images = make_images(tmp_path / "img", 2)
    out = tmp_path / "out"
    assert main(_args([tmp_path / "img"], out, tiny_checkpoint)) == 0
    auc = pd.read_parquet(out / "auc.parquet")
    curves = pd.read_parquet(out / "faithfulness.parquet")
    assert set(auc["protocol"]) == {"morf", "lerf", "insertion", "lerf_minus_morf", "positive", "negative"}
    assert set(auc["method"]) == {"attnlrp", "rollout", "random", "random_seed_0", "random_seed_1", "random_seed_2"}

    loaded = load_model(ModelSpec(name=MODEL, checkpoint=str(tiny_checkpoint), img_size=64))
    x = preprocess([load_image(images[1]).image], loaded.data_config).tensor
    out_capture = capture(loaded.model, x)
    maps = {"attnlrp": ordered(attribute(loaded.model, x, "attnlrp", default_target(loaded.model)).patches[0], "signed"),
            "rollout": rollout(out_capture.stack("attn")[0].numpy(), out_capture.layout).map} | \
        random_seed_maps(out_capture.layout.grid_size, 0, 3)
    core = protocol_curves(loaded.model, x[0], maps, out_capture.layout,
                           protocols=("morf", "lerf", "insertion", "positive", "negative"),
                           fractions=np.linspace(0, 1, 5))
    mine = auc[auc["image"] == "img001.png"].set_index(["method", "protocol"])["auc"]
    for protocol, values in core.aucs().items():
        for method, value in zip(core.methods, values):
            # float32 forwards of one image, batched differently: probabilities agree to ~1e-6.
            assert abs(mine[(method, protocol)] - value) < 1e-5, (method, protocol)
        seeds = [mine[(f"random_seed_{s}", protocol)] for s in range(3)]
        assert abs(mine[("random", protocol)] - np.mean(seeds)) < 1e-12
    assert abs(mine[("rollout", "lerf_minus_morf")] - (mine[("rollout", "lerf")] - mine[("rollout", "morf")])) < 1e-12
    mean_curve = curves[(curves["image"] == "img001.png") & (curves["method"] == "random")
                        & (curves["protocol"] == "morf")]["score"].to_numpy()
    np.testing.assert_allclose(mean_curve, core.curves["morf"][2:].mean(axis=0), atol=1e-5)

    settings = json.loads((out / "settings.json").read_text())
    assert settings["run"]["methods"] == ["attnlrp", "rollout", "random"]
    assert settings["random_seeds"] == [0, 1, 2] and "mean colour" in settings["replacement"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["images"] == 2 and summary["resamples"] == 10000
    assert summary["protocols"]["morf"]["random_seeds"]["seeds"] == 3


@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt], ids=["crash", "ctrl-c"])
def test_a_run_cut_short_and_resumed_writes_the_uninterrupted_tables(tmp_path, tiny_checkpoint, monkeypatch, failure):
    import vitviz.runs.faithfulness_run as run

    make_images(tmp_path / "img", 3)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(_args([tmp_path / "img"], whole, tiny_checkpoint)) == 0
    real, calls = run.image_tables, []

    def failing(*a, **k):  # the second batch fails: the first is already on disk
        calls.append(1)
        if len(calls) == 2:
            raise failure("injected")
        return real(*a, **k)

    monkeypatch.setattr(run, "image_tables", failing)
    if failure is KeyboardInterrupt:
        assert main(_args([tmp_path / "img"], cut, tiny_checkpoint)) == 130
        assert set(pd.read_parquet(cut / "auc.parquet")["image"]) == {"img000.png"}
        assert not json.loads((cut / "summary.json").read_text())["complete"]
    else:
        with pytest.raises(RuntimeError):
            main(_args([tmp_path / "img"], cut, tiny_checkpoint))
        assert len(pd.read_parquet(cut / "auc.parquet")) == 0  # the tables as they were; the batch waits in its part
    monkeypatch.setattr(run, "image_tables", real)
    assert main(_args([tmp_path / "img"], cut, tiny_checkpoint)) == 0
    for name, table in _tables(whole).items():
        assert _tables(cut)[name].equals(table), name
    assert not (cut / ".vitviz-faithfulness-parts").exists()
    assert main(_args([tmp_path / "img"], cut, tiny_checkpoint)) == 0  # nothing left to do: the same tables
    for name, table in _tables(whole).items():
        assert _tables(cut)[name].equals(table), name


def test_resuming_with_other_settings_is_refused_with_a_sentence(tmp_path, tiny_checkpoint, capsys):
    make_images(tmp_path / "img", 1)
    assert main(_args([tmp_path / "img"], tmp_path / "out", tiny_checkpoint)) == 0
    capsys.readouterr()
    assert main(_args([tmp_path / "img"], tmp_path / "out", tiny_checkpoint, "--replacement", "blur")) == 2
    err = capsys.readouterr().err
    assert "replacement 'mean' there, 'blur' now" in err and "Traceback" not in err
    assert main(_args([tmp_path / "img"], tmp_path / "x", tiny_checkpoint, "--methods", "rollout,magic")) == 2
    assert "--methods: unknown magic" in capsys.readouterr().err


@pytest.mark.slow
def test_ray_engine_writes_the_local_engines_tables(tmp_path, tiny_checkpoint, ray_session):
    make_images(tmp_path / "img", 3)
    assert main(_args([tmp_path / "img"], tmp_path / "local", tiny_checkpoint)) == 0
    assert main(_args([tmp_path / "img"], tmp_path / "ray", tiny_checkpoint, "--engine", "ray", "--workers", "2")) == 0
    local, ray = _tables(tmp_path / "local"), _tables(tmp_path / "ray")
    for name in local:
        # The actors' processes: float32 sums possibly in another order, probabilities within ~1e-6.
        pd.testing.assert_frame_equal(ray[name].to_pandas(), local[name].to_pandas(), rtol=0, atol=1e-5)


def test_the_readme_faithfulness_line_runs(tmp_path, monkeypatch, capsys):
    from conftest import ASSETS

    monkeypatch.chdir(ASSETS.parent)  # the README's paths are relative to the repository
    args = readme_command(".venv/bin/python -m vitviz faithfulness assets/astronaut.jpg", tmp_path)
    assert args[:3] == ["-m", "vitviz", "faithfulness"]
    assert main(args[2:]) == 0
    auc = pd.read_parquet(tmp_path / "auc.parquet")
    assert set(auc["method"]) == {"rollout", "random", "random_seed_0", "random_seed_1"}
    assert "bootstrap 95 % intervals" in capsys.readouterr().out


def test_a_parquet_list_names_the_images_as_its_path_column_does(tmp_path, tiny_checkpoint):
    from vitviz.io.inputs import expand_inputs

    make_images(tmp_path / "set" / "img", 2)
    pd.DataFrame({"path": ["img/img001.png", "img/img000.png", "img/missing.png"]}).to_parquet(tmp_path / "set" / "l.parquet")
    files, problems = expand_inputs([tmp_path / "set" / "l.parquet"])
    assert [f.name for f in files] == ["img/img001.png", "img/img000.png"]
    assert [str(p) for p in problems] == ["img/missing.png: does not exist"]
    pd.DataFrame({"x": [1]}).to_parquet(tmp_path / "bad.parquet")
    _, problems = expand_inputs([tmp_path / "bad.parquet"])
    assert "neither a 'path' nor an 'image' column" in str(problems[0])
    assert main(_args([tmp_path / "set" / "l.parquet"], tmp_path / "out", tiny_checkpoint)) == 0
    assert set(pd.read_parquet(tmp_path / "out" / "auc.parquet")["image"]) == {"img/img000.png", "img/img001.png"}


def test_a_parquet_list_past_the_line_cap_is_refused_before_its_rows_are_read(tmp_path, monkeypatch):
    import vitviz.io.inputs
    from vitviz.io.inputs import expand_inputs

    make_images(tmp_path / "img", 3)
    pd.DataFrame({"path": [f"img/img00{i}.png" for i in (2, 0, 1)]}).to_parquet(tmp_path / "l.parquet")
    monkeypatch.setattr(vitviz.io.inputs, "MAX_LIST_LINES", 3)
    files, problems = expand_inputs([tmp_path / "l.parquet"])
    assert [f.name for f in files] == ["img/img002.png", "img/img000.png", "img/img001.png"] and problems == []
    monkeypatch.setattr(vitviz.io.inputs, "MAX_LIST_LINES", 2)
    files, problems = expand_inputs([tmp_path / "l.parquet"])
    assert files == [] and "is a Parquet list of 3 rows, more than the 2" in str(problems[0])
