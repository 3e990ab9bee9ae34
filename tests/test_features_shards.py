"""``features train --shards DIR``: the tokens written once as float16 and read back within float16's rounding,
training from them is training from the stream rounded to float16 (nothing else differs), a second run reads
them without running the model, shards of other tokens and tokens float16 cannot hold are refused;
``SAE.fit(device=)``."""
import json

import numpy as np
import pytest
import torch

import vitviz
from vitviz.cli import main
from vitviz.errors import VitvizError
from vitviz.features import SAE
from vitviz.features.data import TokenWork, token_batches
from vitviz.features.shards import Shards, write_shards
from vitviz.features.train import TrainSettings, train
from vitviz.io.inputs import expand_inputs

from test_features_cli import NAME, _args, tiny  # noqa: F401 (the module's fixture)

# float16 rounds to nearest with 11 significant bits: unit roundoff 2^-11 relative in the normal range
# (|x| >= 2^-14); below it the spacing is 2^-24, so rounding is off by at most half of that, 2^-25.
F16_U, F16_MIN_NORMAL, F16_HALF_SUBNORMAL = 2.0 ** -11, 2.0 ** -14, 2.0 ** -25
SETTINGS = TrainSettings(point="resid_post", layer=2, latents=32, topk=4, epochs=2, batch_size=3, batch_tokens=16,
                         dead_after=64)


def _setup(tiny):  # noqa: F811
    _, weights, images = tiny
    lens = vitviz.open(NAME, checkpoint=str(weights), img_size=64, device="cpu")
    files, _ = expand_inputs([images])
    return lens, files


def _run(settings: TrainSettings) -> dict:
    keys = ("point", "layer", "prefix", "batch_size")
    return {"model": NAME, **{k: getattr(settings, k) for k in keys}}


def test_shards_read_back_every_token_within_float16_rounding(tiny, tmp_path):  # noqa: F811
    lens, files = _setup(tiny)
    stream = list(token_batches(lens, files, "resid_post", 2, 3))
    shards = write_shards(lens, files, "resid_post", 2, 3, False, tmp_path / "shards", _run(SETTINGS))
    read = list(shards.read())
    assert [b.index for b in read] == [b.index for b in stream] == [0, 1, 2, 3]
    for s, r in zip(stream, read):
        assert r.names == s.names and r.tokens.dtype == torch.float32 and r.tokens.shape == s.tokens.shape
        x, y = s.tokens.double(), r.tokens.double()
        bound = torch.where(x.abs() >= F16_MIN_NORMAL, F16_U * x.abs(), torch.full_like(x, F16_HALF_SUBNORMAL))
        assert ((y - x).abs() <= bound).all()
        assert (y != x).any()  # float16, not float32 kept under another name
    assert json.loads((tmp_path / "shards" / "shards.json").read_text())["dtype"] == "float16"


def test_training_from_shards_is_training_from_the_stream_rounded_to_float16(tiny, tmp_path, monkeypatch):  # noqa: F811
    lens, files = _setup(tiny)
    from_shards = train(lens, files, SETTINGS, tmp_path / "a", progress=False, shards=tmp_path / "shards")
    real = TokenWork.__call__
    monkeypatch.setattr(TokenWork, "__call__", lambda self, lens, batch: real(self, lens, batch).half().float())
    rounded = train(lens, files, SETTINGS, tmp_path / "b", progress=False)
    for (name, p), q in zip(from_shards.named_parameters(), rounded.parameters()):
        assert torch.equal(p, q), name
    assert from_shards.info["metrics"] == rounded.info["metrics"]
    assert from_shards.info["activations"]["tokens"] == 10 * 16


def test_a_second_run_reads_the_shards_without_running_the_model(tiny, tmp_path, monkeypatch):  # noqa: F811
    shards = tmp_path / "shards"
    assert main(_args(tiny, tmp_path / "first", "--shards", str(shards))) == 0

    def no_forward(self, lens, batch):
        raise AssertionError("the model ran")

    monkeypatch.setattr(TokenWork, "__call__", no_forward)
    assert main(_args(tiny, tmp_path / "second", "--shards", str(shards))) == 0
    first, second = SAE.load(tmp_path / "first"), SAE.load(tmp_path / "second")
    for (name, p), q in zip(first.named_parameters(), second.parameters()):
        assert torch.equal(p, q), name


def test_shards_of_other_tokens_are_refused_with_a_sentence(tiny, tmp_path, capsys):  # noqa: F811
    shards = tmp_path / "shards"
    assert main(_args(tiny, tmp_path / "a", "--shards", str(shards))) == 0
    capsys.readouterr()
    other = _args(tiny, tmp_path / "b", "--shards", str(shards))
    other[other.index("--layer") + 1] = "1"
    assert main(other) == 2
    err = capsys.readouterr().err
    assert "holds the shards of other tokens (layer 2 there, 1 now)" in err and "Traceback" not in err


def test_tokens_beyond_float16_are_refused_with_a_sentence(tiny, tmp_path, monkeypatch, capsys):  # noqa: F811
    real = TokenWork.__call__
    monkeypatch.setattr(TokenWork, "__call__", lambda self, lens, batch: real(self, lens, batch) * 1e6)
    assert main(_args(tiny, tmp_path / "a", "--shards", str(tmp_path / "shards"))) == 2
    err = capsys.readouterr().err
    assert "beyond float16's largest value 65504: train without --shards" in err
    assert not list((tmp_path / "shards").glob("shard-*"))


def test_shards_with_a_missing_file_are_written_again_by_the_next_run(tiny, tmp_path):  # noqa: F811
    lens, files = _setup(tiny)
    shards = write_shards(lens, files, "resid_post", 2, 3, False, tmp_path / "shards", _run(SETTINGS))
    whole = [b.tokens for b in shards.read()]
    (tmp_path / "shards" / "shard-000002.safetensors").unlink()  # a run killed while writing it
    again = Shards(tmp_path / "shards", _run(SETTINGS), 4)
    assert again.missing() == [2]
    written = write_shards(lens, files, "resid_post", 2, 3, False, tmp_path / "shards", _run(SETTINGS))
    assert all(torch.equal(x, y) for x, y in zip(whole, [b.tokens for b in written.read()]))


# --- SAE.fit(device=) --------------------------------------------------------------------------------------

def _tokens(n=512, d=16, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


def test_sae_fit_on_the_cpu_device_is_the_default_fit():
    default = SAE.fit(_tokens(), latents=32, topk=4, seed=1, epochs=1, batch_size=64)
    on_cpu = SAE.fit(_tokens(), latents=32, topk=4, seed=1, epochs=1, batch_size=64, device="cpu")
    assert on_cpu.W_dec.device.type == "cpu"
    for (name, p), q in zip(default.named_parameters(), on_cpu.parameters()):
        assert torch.equal(p, q), name


def test_sae_fit_on_an_absent_device_is_a_sentence():
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(VitvizError, match="has no CUDA GPU"):
        SAE.fit(_tokens(), latents=32, topk=4, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_sae_fit_on_a_gpu_trains_there_to_the_cpus_quality():
    from vitviz.features.sae import evaluate

    x = _tokens(4096, 32)
    cpu = SAE.fit(x, latents=64, topk=8, seed=0, batch_size=256, epochs=3)
    gpu = SAE.fit(x, latents=64, topk=8, seed=0, batch_size=256, epochs=3, device="cuda")
    assert gpu.W_dec.device.type == "cuda"
    # the same initialisation (computed in float64 on the CPU, then moved): equal scale
    assert float(gpu.scale) == float(cpu.scale)
    # GPU kernels sum in other orders, so the weights drift apart; the fit's quality does not
    assert abs(evaluate(gpu, x)["explained_variance"] - evaluate(cpu, x)["explained_variance"]) < 0.02
