"""``python -m vitviz probe`` computes every layer's features through the engine into resumable parts: the
features equal :func:`vitviz.probes.layer_features`'s, a run killed and started again writes the uninterrupted
run's files, parts of another run are refused with a sentence."""
from __future__ import annotations

import numpy as np
import pytest

from vitviz.cli import main
from vitviz.errors import VitvizError
from vitviz.probes import collect
from vitviz.probes.collect import PARTS_DIR, collect_features
from vitviz.probes.data import from_folders
from vitviz.probes.features import layer_features

from test_probe_cli import model_args, setup  # noqa: F401 (the module's fixture: two classes of 4 noise images)
from test_probe_head import open_backbone, save_backbone


def _args(root, weights, out, *extra):
    return ["probe", str(root / "set"), "--folders", "--out", str(out), "--batch-size", "3", "--workers", "0",
            *model_args(weights), *extra]


def test_features_through_the_engine_equal_layer_features(setup, tmp_path):  # noqa: F811
    root, weights = setup
    lens, images = open_backbone(weights), from_folders([root / "set"])
    expected, hashes = layer_features(lens, images, "cls+mean", batch_size=3)
    features, got = collect_features(lens, images, "cls+mean", batch_size=3, folder=tmp_path)
    assert features.shape == (12, 8, 2 * 192) and got == hashes
    np.testing.assert_array_equal(features, expected)
    # read back from the parts (the resumed path): the same float64 values
    again, _ = collect_features(lens, images, "cls+mean", batch_size=3, folder=tmp_path)
    np.testing.assert_array_equal(again, expected)


@pytest.mark.slow
def test_a_killed_probe_run_resumes_to_the_uninterrupted_files(setup, tmp_path, monkeypatch):  # noqa: F811
    root, weights = setup
    assert main(_args(root, weights, tmp_path / "whole")) == 0
    real, calls = collect.batch_features, []

    def killed_at_the_second_batch(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(collect, "batch_features", killed_at_the_second_batch)
    assert main(_args(root, weights, tmp_path / "cut")) == 130
    assert len(list((tmp_path / "cut" / PARTS_DIR).glob("features-*.parquet"))) == 1
    assert not (tmp_path / "cut" / "probe.json").exists()
    calls.clear()
    monkeypatch.setattr(collect, "batch_features", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert main(_args(root, weights, tmp_path / "cut")) == 0
    assert len(calls) == 2  # batches 2 and 3 of 3; the first came from its part
    for name in ("probe.safetensors", "probe.json"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert not (tmp_path / "cut" / PARTS_DIR).exists()


def test_parts_of_another_pooling_are_refused_with_a_sentence(setup, tmp_path):  # noqa: F811
    root, weights = setup
    lens, images = open_backbone(weights), from_folders([root / "set"])
    collect_features(lens, images, "cls", batch_size=3, folder=tmp_path)
    with pytest.raises(VitvizError, match="holds the features of another run \\(pooling 'cls' there, 'mean' now\\)"):
        collect_features(lens, images, "mean", batch_size=3, folder=tmp_path)
    other = open_backbone(save_backbone(tmp_path / "other.safetensors", seed=6))
    with pytest.raises(VitvizError, match="or its weights"):
        collect_features(other, images, "cls", batch_size=3, folder=tmp_path)


def test_parts_of_batches_that_held_other_images_are_computed_again(setup, tmp_path):  # noqa: F811
    """A label file edited between runs shifts the batches: a part is reused only for exactly its images."""
    root, weights = setup
    lens, images = open_backbone(weights), from_folders([root / "set"])
    collect_features(lens, images, "cls", batch_size=3, folder=tmp_path)
    fewer = type(images)(*(field[1:] for field in (images.paths, images.names, images.labels, images.where)))
    expected, _ = layer_features(lens, fewer, "cls", batch_size=3)
    features, _ = collect_features(lens, fewer, "cls", batch_size=3, folder=tmp_path)
    np.testing.assert_array_equal(features, expected)
