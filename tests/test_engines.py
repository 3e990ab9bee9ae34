"""The engine (vitviz.runs.engines): batches in file order with the decoded inputs a user's preprocessing gives,
resuming skips whole batches, bad files are listed, part files appear together; on Ray (one local Ray session for
the module, slow): the same values as here, for the engine, the probe command and the SAE's token stream."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import vitviz
from vitviz.errors import VitvizError
from vitviz.runs.engines import Engine, Parts, run_batches

from test_probe_head import ARCH, IMG, open_backbone, save_backbone
from test_probes import noise_images


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    root = tmp_path_factory.mktemp("engines")
    weights = save_backbone(root / "tiny.safetensors", seed=4)
    paths = noise_images(root / "img", 7, 3)
    (root / "img" / "broken.png").write_bytes(b"not a png")
    return root, weights, sorted((root / "img").iterdir())


class Pooled:
    """A per-batch function: each image's pooled vector (B, D), and the batch's names as finish sees them."""

    def __call__(self, lens, batch):
        return batch.names, lens.trace(batch.x, keep="pooled")["pooled"]

    def finish(self, value):
        names, pooled = value
        return {"names": names, "pooled": pooled.double().numpy()}


def _expected(lens, paths, batch_size):
    """Per batch (names, pooled) computed the plain way: lens.preprocess of the good files of the batch."""
    out = []
    for s in range(0, len(paths), batch_size):
        good = [p for p in paths[s:s + batch_size] if p.name != "broken.png"]
        out.append(([p.name for p in good], lens.trace(lens.preprocess(good), keep="pooled")["pooled"].double().numpy()))
    return out


@pytest.mark.parametrize("workers", [0, 1], ids=["decoded-here", "decoded-in-a-worker"])
def test_local_batches_come_in_file_order_with_the_lens_preprocessing(backbone, workers):
    _, weights, paths = backbone
    lens = open_backbone(weights)
    files = [(p, p.name) for p in paths]
    batches = list(run_batches(Pooled(), lens, files, 3, Engine("local", workers)))
    assert [b.index for b in batches] == [0, 1, 2] and [b.files for b in batches] == [3, 3, 2]
    for b, (names, pooled) in zip(batches, _expected(lens, paths, 3)):
        assert b.value["names"] == b.names == names and b.x is None
        np.testing.assert_array_equal(b.value["pooled"], pooled)  # the same inputs, the same forward: equal
    assert [b.bad for b in batches] == [[("broken.png", "is not an image file Pillow can read")], [], []]
    assert len(batches[1].sha256) == 3 and len(set(batches[1].sha256)) == 3


def test_resuming_skips_whole_batches_and_keeps_their_indices(backbone):
    _, weights, paths = backbone
    lens = open_backbone(weights)
    batches = list(run_batches(Pooled(), lens, paths, 3, skip={0, 2}))
    assert [b.index for b in batches] == [1] and batches[0].names == [p.name for p in paths[3:6]]


def test_a_batch_finished_before_an_error_still_reaches_the_caller(backbone):
    _, weights, paths = backbone
    lens = open_backbone(weights)
    calls = []

    class Failing(Pooled):
        def __call__(self, lens, batch):
            calls.append(batch.index)
            if batch.index == 1:
                raise KeyboardInterrupt
            return super().__call__(lens, batch)

    seen = []
    with pytest.raises(KeyboardInterrupt):
        for b in run_batches(Failing(), lens, paths, 3):
            seen.append(b.index)
    assert seen == [0] and calls == [0, 1]


@pytest.mark.parametrize("engine, words", [(Engine("ray", 0), "--workers must be 1 or more"),
                                           (Engine("local", -1), "--workers must be 0 or more"),
                                           (Engine("local", 0, "auto"), "--address is for --engine ray"),
                                           (Engine("spark"), "--engine must be one of local, ray")])
def test_engine_settings_that_cannot_run_get_a_sentence(engine, words):
    with pytest.raises(VitvizError, match=words):
        engine.check()


def test_parts_of_a_batch_appear_together_or_not_at_all(tmp_path, monkeypatch):
    import pandas as pd
    import pyarrow.parquet as pq

    parts = Parts(tmp_path / ".parts")
    frame = pd.DataFrame({"image": ["a"], "value": [1.0]})
    parts.write([("one", frame, None), ("two", frame, None)])
    assert len(parts.done("one")) == len(parts.done("two")) == 1
    real, calls = pq.write_table, []

    def second_fails(table, where, **kw):
        calls.append(where)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(table, where, **kw)

    monkeypatch.setattr(pq, "write_table", second_fails)
    with pytest.raises(OSError):
        parts.write([("one", frame, None), ("two", frame, None)])
    assert len(parts.done("one")) == len(parts.done("two")) == 1  # the cut batch left no finished part
    parts.clear()
    parts.close()
    assert not (tmp_path / ".parts").exists()


# --- Ray: one local session for the module ---------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_session():
    import sys

    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray's workers cannot import test modules
    # Ray runs a one-CPU actor's torch on one thread (OMP_NUM_THREADS=1); with this process on one thread too, both
    # run the same kernels on the same inputs in the same order, so Ray's values equal the local ones to the bit.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield ray
    torch.set_num_threads(threads)
    ray.shutdown()


@pytest.mark.slow
def test_ray_gives_the_local_values_in_file_order(backbone, ray_session):
    _, weights, paths = backbone
    lens = open_backbone(weights)
    local = list(run_batches(Pooled(), lens, paths, 3, skip={1}))
    remote = list(run_batches(Pooled(), lens, paths, 3, Engine("ray", 2), skip={1}))
    assert [b.index for b in remote] == [0, 2] and [b.bad for b in remote] == [b.bad for b in local]
    for r, loc in zip(remote, local):
        assert r.names == loc.names and r.sha256 == loc.sha256
        np.testing.assert_array_equal(r.value["pooled"], loc.value["pooled"])


@pytest.mark.slow
def test_a_users_mistake_on_a_ray_actor_reaches_the_caller_as_its_sentence(backbone, ray_session):
    _, weights, paths = backbone

    class Refusing(Pooled):
        def __call__(self, lens, batch):
            raise VitvizError(f"batch {batch.index + 1} refused")

    with pytest.raises(VitvizError) as caught:
        list(run_batches(Refusing(), open_backbone(weights), paths, 3, Engine("ray", 1)))
    assert str(caught.value) == "batch 1 refused"


@pytest.mark.slow
def test_probe_on_ray_writes_the_local_probe(tmp_path, backbone, ray_session):
    from vitviz.cli import main

    root, weights, _ = backbone
    for i, cls in enumerate(("cat", "dog")):
        noise_images(tmp_path / "set" / cls, 4, 20 + i)
    model = ["--model", ARCH, "--checkpoint", str(weights), "--img-size", str(IMG), "--device", "cpu"]
    outs = {}
    for engine in ("local", "ray"):
        outs[engine] = tmp_path / engine
        assert main(["probe", str(tmp_path / "set"), "--folders", "--out", str(outs[engine]), "--batch-size", "3",
                     "--engine", engine, "--workers", "2", *model]) == 0
    assert len(json.loads((outs["ray"] / "probe.json").read_text())["images"]) == 8
    for name in ("probe.safetensors", "probe.json"):  # the same features to the bit: the same probe
        assert (outs["ray"] / name).read_bytes() == (outs["local"] / name).read_bytes(), name
    assert not (outs["ray"] / ".vitviz-probe-parts").exists()


@pytest.mark.slow
def test_the_sae_token_stream_from_ray_has_the_local_mean_and_variance(tmp_path, backbone, ray_session):
    from vitviz.features.data import flat, token_batches

    _, weights, paths = backbone
    lens = open_backbone(weights)

    def moments(engine):
        x = torch.cat([flat(b.tokens) for b in token_batches(lens, paths, "resid_post", 6, 3, engine=engine)
                       if b.names]).double()
        return len(x), x.mean(0), x.var(0, unbiased=False)

    (n_local, mean_local, var_local), (n_ray, mean_ray, var_ray) = moments(None), moments(Engine("ray", 2))
    assert n_ray == n_local == 7 * 4  # 7 good images x 2x2 patches
    assert torch.equal(mean_ray, mean_local)
    assert torch.equal(var_ray, var_local)


@pytest.mark.slow
def test_features_train_on_ray_reads_the_local_token_statistics(tmp_path, backbone, ray_session):
    from vitviz.features.train import TrainSettings, train

    _, weights, paths = backbone
    lens = open_backbone(weights)
    settings = TrainSettings(point="resid_post", layer=6, latents=16, topk=2, epochs=1, batch_size=3,
                             batch_tokens=8)
    local = train(lens, paths, settings, tmp_path / "local", progress=False)
    ray = train(lens, paths, settings, tmp_path / "ray", progress=False, engine=Engine("ray", 2))
    assert ray.info["activations"] == local.info["activations"]
    assert ray.info["activations"]["tokens"] == 7 * 4 and ray.info["images"]["skipped"] == local.info["images"][
        "skipped"] == ["broken.png: is not an image file Pillow can read"]
    for (name, p), q in zip(local.named_parameters(), ray.parameters()):  # the same tokens: the same training
        assert torch.equal(p, q), name
