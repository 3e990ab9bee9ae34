"""The engine (vitviz.runs.engines): batches in file order with the decoded inputs a user's preprocessing gives,
resuming skips whole batches, bad files are listed, part files appear together; on Ray (the test session's one local
Ray, slow): the same values as here, for the engine, the SAE's token stream and float16 shards, and the
features train, probe and qk commands; Ray runs killed and started again end as uninterrupted local runs."""
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


# --- Ray: the session's one local Ray (conftest.ray_cluster) ----------------------------------------------

@pytest.fixture
def ray_session(ray_session):
    """conftest's ray_session, whose workers can also run this module's per-batch functions (Ray's workers cannot
    import test modules: they get them pickled by value)."""
    import sys

    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return ray_session


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


def _model(weights) -> list[str]:
    return ["--model", ARCH, "--checkpoint", str(weights), "--img-size", str(IMG), "--device", "cpu"]


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _shard(data: bytes) -> tuple[dict, list]:
    """A shard file's metadata and tokens (float16 values as a list): safetensors writes the header's keys in an
    order of its own (a hash map's), so two equal shards need not be equal bytes."""
    from safetensors.torch import load

    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + size])["__metadata__"], load(data)["tokens"].tolist()


@pytest.mark.slow
def test_features_train_on_ray_with_shards_writes_the_local_files(tmp_path, backbone, ray_session):
    """`features train --shards --engine ray`: the actors write the float16 shards (one per image here: the first,
    broken.png alone, gives an empty shard), the same tokens and metadata as the local run's; the SAE trained from
    them is the same file with the same sae.json."""
    from vitviz.cli import main

    root, weights, _ = backbone
    for engine, workers in (("local", "0"), ("ray", "2")):
        assert main(["features", "train", str(root / "img"), "--layer", "6", "--latents", "16", "--topk", "2",
                     "--epochs", "2", "--batch-size", "1", "--batch-tokens", "8", "--shards", str(tmp_path / engine),
                     "--out", str(tmp_path / engine / "sae"), "--engine", engine, "--workers", workers,
                     *_model(weights)]) == 0
    local, ray = (_files(tmp_path / engine) for engine in ("local", "ray"))
    assert sorted(local) == [*(f"shard-00000{i}.safetensors" for i in range(8)), "shards.json"]
    shards = [name for name in local if name.endswith(".safetensors")]
    assert all(_shard(ray[name]) == _shard(local[name]) for name in shards)
    assert _shard(ray["shard-000000.safetensors"]) == (  # broken.png's batch: no tokens, the file named
        {"index": "0", "names": "[]", "problems": '["broken.png: is not an image file Pillow can read"]'}, [])
    meta, tokens = _shard(ray["shard-000003.safetensors"])
    assert meta == {"index": "3", "names": '["img2.png"]', "problems": "[]"} and len(tokens) == 1
    sae_local, sae_ray = (_files(tmp_path / engine / "sae") for engine in ("local", "ray"))
    assert sae_ray["sae.safetensors"] == sae_local["sae.safetensors"]
    assert json.loads(sae_ray["sae.json"]) == json.loads(sae_local["sae.json"])


class Killed(Exception):
    pass


class _KilledBar:
    """The shards' progress bar of a run killed after ``at`` shards came back."""

    def __init__(self, at: int):
        self.at, self.n = at, 0

    def update(self, n):
        self.n += n
        if self.n == self.at:
            raise Killed

    def set_postfix(self, *a, **k):
        pass

    def close(self):
        pass


@pytest.mark.slow
def test_features_train_on_ray_killed_and_started_again_ends_with_the_local_weights(tmp_path, backbone, ray_session,
                                                                                    monkeypatch):
    """Killed while the actors write the shards, then while the trainer reads them; and a run streaming from the
    actors killed in its first epoch. Each started again ends with the weights of the uninterrupted local run."""
    from vitviz.features import train as train_module
    from vitviz.features.train import TrainSettings, train
    from vitviz.features.shards import shard_name

    _, weights, paths = backbone
    lens = open_backbone(weights)
    settings = TrainSettings(point="resid_post", layer=6, latents=16, topk=2, epochs=2, batch_size=1, batch_tokens=8)
    ray = Engine("ray", 2)

    def kill_at(n):
        def kill(done, metrics):
            if done == n:
                raise Killed
        return kill

    def same(a, b):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            assert torch.equal(p, q), name
        assert a.info["metrics"] == b.info["metrics"] and a.info["activations"] == b.info["activations"]

    # float16 shards: killed after 2 of 8 shards came back (broken.png's, empty, and one), then after 3 of
    # the 16 training batches
    whole = train(lens, paths, settings, tmp_path / "local", progress=False, shards=tmp_path / "local-shards")
    real_bar = train_module._bar
    monkeypatch.setattr(train_module, "_bar", lambda total, progress, initial, desc="": (
        _KilledBar(2) if desc == "float16 shards" else real_bar(total, progress, initial, desc)))
    with pytest.raises(Killed):
        train(lens, paths, settings, tmp_path / "cut", progress=False, engine=ray, shards=tmp_path / "shards")
    monkeypatch.setattr(train_module, "_bar", real_bar)
    assert 2 <= len(list((tmp_path / "shards").glob("shard-*"))) <= 4  # the two in flight may have landed too
    assert not (tmp_path / "cut" / "checkpoint.pt").exists()
    with pytest.raises(Killed):
        train(lens, paths, settings, tmp_path / "cut", progress=False, engine=ray, shards=tmp_path / "shards",
              callback=kill_at(3))
    for i in range(8):
        assert _shard((tmp_path / "shards" / shard_name(i)).read_bytes()) == _shard(
            (tmp_path / "local-shards" / shard_name(i)).read_bytes()), i
    same(train(lens, paths, settings, tmp_path / "cut", progress=False, engine=ray, shards=tmp_path / "shards"), whole)

    # the float32 stream from the actors: killed after its second image batch
    whole = train(lens, paths, settings, tmp_path / "local-stream", progress=False)
    with pytest.raises(Killed):
        train(lens, paths, settings, tmp_path / "stream", progress=False, engine=ray, callback=kill_at(2))
    seen = []
    resumed = train(lens, paths, settings, tmp_path / "stream", progress=False, engine=ray,
                    callback=lambda done, m: seen.append(done))
    assert seen == list(range(3, 17))  # from the third batch on, the first two from the checkpoint
    same(resumed, whole)
    assert resumed.info["activations"]["tokens"] == 7 * 4  # 7 good images x 2x2 patches
    assert resumed.info["images"]["skipped"] == whole.info["images"]["skipped"] == [
        "broken.png: is not an image file Pillow can read"]


@pytest.mark.slow
def test_probe_on_ray_killed_and_started_again_writes_the_local_probe(tmp_path, backbone, ray_session):
    """The feature table's parts written as the actors' batches come back; killed after the first, the command
    started again computes the rest on Ray and writes the local run's files byte for byte (the same features to the
    bit: the same probe), and removes the parts."""
    from vitviz.cli import main
    from vitviz.probes.collect import PARTS_DIR, collect_features
    from vitviz.probes.data import from_folders

    _, weights, _ = backbone
    for i, cls in enumerate(("cat", "dog")):
        noise_images(tmp_path / "set" / cls, 4, 20 + i)

    def probe(out, engine):
        return main(["probe", str(tmp_path / "set"), "--folders", "--out", str(out), "--batch-size", "3",
                     "--engine", engine, "--workers", "2" if engine == "ray" else "0", *_model(weights)])

    assert probe(tmp_path / "local", "local") == 0

    def killed(count):
        if count >= 3:
            raise Killed

    (tmp_path / "ray").mkdir()
    with pytest.raises(Killed):
        collect_features(open_backbone(weights), from_folders([tmp_path / "set"]), "cls", batch_size=3,
                         engine=Engine("ray", 2), folder=tmp_path / "ray", progress=killed)
    assert len(list((tmp_path / "ray" / PARTS_DIR).glob("features-*.parquet"))) == 1
    assert probe(tmp_path / "ray", "ray") == 0
    assert len(json.loads((tmp_path / "ray" / "probe.json").read_text())["images"]) == 8
    for name in ("probe.safetensors", "probe.json"):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    assert not (tmp_path / "ray" / PARTS_DIR).exists()


@pytest.mark.slow
def test_qk_on_ray_writes_the_local_files_and_the_librarys_picture(tmp_path, backbone, ray_session):
    """`qk --engine ray`: queries, keys and scores come back from the actors batch by batch (three batches of 3
    files, broken.png skipped) and the files equal the local engine's; the picture is the library's over the seven
    images in one forward, to float32 rounding of the forward (batches of 3 against one of 7)."""
    import pandas as pd

    from vitviz.cli import main
    from vitviz.heads import qk

    root, weights, paths = backbone
    for engine, workers in (("local", "0"), ("ray", "2")):
        assert main(["qk", str(root / "img"), "--layer", "3", "--batch-size", "3", "--engine", engine,
                     "--workers", workers, "--out", str(tmp_path / engine), *_model(weights)]) == 0
    local, ray = (pd.read_parquet(tmp_path / engine / "qk.parquet") for engine in ("local", "ray"))
    pd.testing.assert_frame_equal(ray, local, check_exact=True)
    for name in ("ray", "local"):
        assert (tmp_path / name / "correlations.json").read_text() == (tmp_path / "local" / "correlations.json").read_text()
    settings = {e: json.loads((tmp_path / e / "settings.json").read_text()) for e in ("local", "ray")}
    assert settings["ray"].pop("engine") == "ray" and settings["local"].pop("engine") == "local"
    assert settings["ray"] == settings["local"]
    assert settings["ray"]["skipped"] == [{"name": "broken.png", "reason": "is not an image file Pillow can read"}]
    good = [p for p in paths if p.name != "broken.png"]
    lens = open_backbone(weights)
    pictures = qk.layer_pictures(lens, lens.preprocess(good), 2)
    expected = qk.points_table(pictures, lens.layout_for(lens.preprocess(good[:1])), [p.name for p in good])
    assert list(ray["image"]) == list(expected["image"]) and list(ray["token"]) == list(expected["token"])
    xy = expected[["x", "y"]].to_numpy()
    # float32 forwards of other batch shapes differ by a few units of 2^-24 relative; PCA of ~70 points moves them
    # by far less than 1e-4 of the cloud's extent
    np.testing.assert_allclose(ray[["x", "y"]].to_numpy(), xy, rtol=0, atol=1e-4 * np.abs(xy).max())
