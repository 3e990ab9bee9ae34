"""``python -m vitviz features train|top`` on a tiny random ViT: the layer's patch tokens are what the SAE reads
(checked against timm's own blocks), a killed run resumes to the uninterrupted weights, the top table is the
brute-force one, mistakes get a sentence."""
import json

import numpy as np
import pandas as pd
import pytest
import timm
import torch
from PIL import Image

from conftest import ASSETS
from vitviz.cli import main
from vitviz.features import SAE

NAME = "vit_tiny_patch16_224"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random ViT-Ti/16 at 64 px (4x4 patches) saved as safetensors, and 10 images (4 photos, 6 noise)."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model(NAME, pretrained=False, img_size=64).eval()
    folder = tmp_path_factory.mktemp("tiny")
    weights = folder / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    images = folder / "images"
    images.mkdir()
    for p in sorted(ASSETS.glob("*.jpg")):
        (images / p.name).write_bytes(p.read_bytes())
    rng = np.random.default_rng(0)
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (80, 80, 3), dtype=np.uint8)).save(images / f"noise{i}.png")
    return model, weights, images


def _args(tiny, out, *extra):
    _, weights, images = tiny
    return ["features", "train", str(images), "--model", NAME, "--checkpoint", str(weights), "--img-size", "64",
            "--device", "cpu", "--layer", "2", "--latents", "32", "--topk", "4", "--batch-size", "3",
            "--batch-tokens", "16", "--out", str(out), *extra]


def _timm_tokens(model, paths, layer):
    """Patch tokens leaving block ``layer`` (0-based) from timm's own modules, preprocessed by timm's transform."""
    cfg = {**timm.data.resolve_model_data_config(model), "input_size": (3, 64, 64)}
    transform = timm.data.create_transform(**cfg)
    x = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])
    with torch.no_grad():
        h = model.patch_embed(x)
        h = model.norm_pre(model._pos_embed(h))
        for block in model.blocks[:layer + 1]:
            h = block(h)
    return h[:, model.num_prefix_tokens:].reshape(-1, h.shape[-1]).double()


def test_train_reads_the_layers_patch_tokens_and_writes_both_files(tiny, tmp_path):
    model, _, images = tiny
    out = tmp_path / "sae"
    assert main(_args(tiny, out, "--epochs", "2")) == 0
    info = json.loads((out / "sae.json").read_text())
    assert (info["point"], info["layer"], info["latents"], info["topk"]) == ("blocks.1.resid_post", 2, 32, 4)
    assert info["images"]["count"] == 10 and info["tokens_read"] == "patch tokens"
    assert info["training"]["tokens"] == 2 * 10 * 16  # 2 epochs x 10 images x 4x4 patches
    assert set(info["metrics"]) >= {"nmse", "explained_variance", "l0", "dead_fraction"}
    assert set(info["versions"]) >= {"torch", "timm", "vitviz"}
    # The scale is fixed at initialisation from the first batch (the first 3 files, sorted): s = sqrt(D / E||x - mu||^2)
    first = sorted(images.iterdir())[:3]
    x = _timm_tokens(model, first, layer=1)
    s = (x.shape[1] / (x - x.mean(0)).pow(2).sum(1).mean()).sqrt()
    assert abs(info["normalisation"]["scale"] - float(s)) < 1e-5 * float(s)
    sae = SAE.load(out)
    assert sae.decoder.shape == (32, 192)
    np.testing.assert_allclose(sae.decoder.norm(dim=-1).numpy(), 1, atol=1e-6)


def test_without_epochs_it_trains_until_the_plateau_and_runs_the_model_once(tiny, tmp_path, capsys, monkeypatch):
    """10 images are 160 tokens, 10 steps a pass: the defaults repeat over them (from memory) past 2,000 steps."""
    from vitviz.features import train as train_module

    forwards = []
    read = train_module.token_batches

    def counted(*args, **kwargs):
        for batch in read(*args, **kwargs):
            forwards.append(batch.index)
            yield batch

    monkeypatch.setattr(train_module, "token_batches", counted)
    out = tmp_path / "sae"
    assert main(_args(tiny, out)) == 0
    training = json.loads((out / "sae.json").read_text())["training"]
    assert forwards == [0, 1, 2, 3]  # 4 batches of 3 images, once
    assert training["stop_reason"] == "plateau" and training["steps"] >= 2000 and training["warning"] is None
    assert training["epochs_run"] == training["steps"] / 10 and training["epochs"] is None
    err = capsys.readouterr().err
    assert f"stopped when the explained variance stopped rising after {training['steps']} steps" in err
    assert "warning" not in err


def test_epochs_that_end_while_the_explained_variance_rises_say_so(tiny, tmp_path, capsys):
    out = tmp_path / "sae"
    assert main(_args(tiny, out, "--epochs", "3")) == 0
    training = json.loads((out / "sae.json").read_text())["training"]
    assert (training["stop_reason"], training["steps"], training["still_rising"]) == ("budget", 30, True)
    err = capsys.readouterr().err
    assert "stopped on its budget (epochs=3) after 30 steps" in err
    assert f"warning: {training['warning']}" in err and "explained variance still rising" in err


class Killed(Exception):
    pass


def test_a_killed_run_continues_to_the_uninterrupted_weights(tiny, tmp_path, monkeypatch):
    """Killed in the second epoch, which reads the tokens held in memory; the resumed run holds none and reads the
    rest of that epoch from the model: the same tokens, the same weights."""
    import vitviz
    from vitviz.features import train as train_module
    from vitviz.features.train import TrainSettings, train
    from vitviz.io.inputs import expand_inputs

    monkeypatch.setattr(train_module, "CHECKPOINT_STEPS", 1)  # a checkpoint after every batch read from memory too

    _, weights, images = tiny
    lens = vitviz.open(NAME, checkpoint=str(weights), img_size=64, device="cpu")
    files, _ = expand_inputs([images])
    settings = TrainSettings(point="resid_post", layer=2, latents=32, topk=4, epochs=2, batch_size=3,
                             batch_tokens=16, dead_after=64)
    whole = train(lens, files, settings, tmp_path / "whole", progress=False)

    def kill(done, metrics):
        if done == 6:  # the second epoch's second batch (4 batches per epoch)
            raise Killed

    with pytest.raises(Killed):
        train(lens, files, settings, tmp_path / "resumed", progress=False, callback=kill)
    assert not (tmp_path / "resumed" / "sae.safetensors").exists()
    seen = []
    resumed = train(lens, files, settings, tmp_path / "resumed", progress=False,
                    callback=lambda done, m: seen.append(done))
    assert seen == [7, 8]
    for (name, p), q in zip(whole.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), name
    assert resumed.info["metrics"] == whole.info["metrics"]


def test_resuming_with_other_settings_is_refused_with_a_sentence(tiny, tmp_path, capsys):
    out = tmp_path / "sae"
    assert main(_args(tiny, out, "--epochs", "1")) == 0
    assert main(_args(tiny, out, "--epochs", "1")[:-4] + ["--seed", "1", "--out", str(out), "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint of another run" in err and "seed" in err and "Traceback" not in err


def test_a_sheet_of_a_latent_out_of_range_is_a_sentence(tiny, tmp_path, capsys):
    _, _, images = tiny
    out = tmp_path / "sae"
    assert main(_args(tiny, out, "--epochs", "1")) == 0
    assert main(["features", "top", str(out), str(images), "--device", "cpu", "--sheets", "32"]) == 2
    assert "latent 32 is out of range (0 to 31)" in capsys.readouterr().err


@pytest.mark.parametrize("extra, words", [(["--layer", "13"], "--layer 13 is out of range"),
                                          (["--point", "attn"], "is not one vector per token"),
                                          (["--topk", "40"], "more than --latents")])
def test_setting_mistakes_get_a_sentence(tiny, tmp_path, capsys, extra, words):
    args = _args(tiny, tmp_path / "x")
    for flag, value in zip(extra[::2], extra[1::2]):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert not (tmp_path / "x" / "sae.safetensors").exists()


def test_top_table_is_the_brute_force_top_n_per_latent(tiny, tmp_path):
    model, _, images = tiny
    out = tmp_path / "sae"
    assert main(_args(tiny, out, "--epochs", "1")) == 0
    assert main(["features", "top", str(out), str(images), "--top", "5", "--batch-size", "4", "--device", "cpu"]) == 0
    table = pd.read_parquet(out / "top.parquet")
    first = int(table.latent.iloc[0])
    assert main(["features", "top", str(out), str(images), "--top", "5", "--device", "cpu", "--sheets", str(first)]) == 0
    sheet = np.asarray(Image.open(out / f"latent_{first}.png").convert("RGB"))
    green = (sheet == [0, 255, 0]).all(-1)  # every tile's patch outline
    assert green.sum() > 0 and sheet.shape[1] > 4 * 5 * 16 * 3 / 2
    assert list(table.columns) == ["latent", "image", "patch", "activation"]
    sae = SAE.load(out)
    paths = sorted(images.iterdir())
    z = sae.encode(_timm_tokens(model, paths, layer=1).float()).detach().numpy()  # (10 * 16, K)
    for latent in range(sae.latents):
        rows = table[table.latent == latent]
        col = z[:, latent]
        expected = np.sort(col[col > 0])[::-1][:5]
        # timm's blocks vs vitviz's spelled-out forward: the same float32 arithmetic to a few ulps
        np.testing.assert_allclose(rows.activation.to_numpy(), expected, rtol=1e-4, atol=1e-4)
        for _, row in rows.iterrows():
            flat = paths.index(images / row.image) * 16 + row.patch
            assert abs(col[flat] - row.activation) <= 1e-4 * max(1, abs(row.activation))
    # the model has a 1000-class head: each latent of the table has its 5 nearest classes, by the cosine of its
    # decoder row with P (γ ⊙ w_c) (tests/test_features_classes.py has the method's own tests)
    classes = json.loads((out / "nearest_classes.json").read_text())
    assert sorted(int(j) for j in classes["latents"]) == sorted(table.latent.unique())
    r = (model.norm.weight[None] * model.head.weight).double().detach().numpy()
    r = r - r.mean(-1, keepdims=True)
    cos = sae.decoder.double().numpy() @ (r / np.linalg.norm(r, axis=-1, keepdims=True)).T
    for j, near in classes["latents"].items():
        assert [c["class"] for c in near] == list(np.argsort(-cos[int(j)])[:5])
        np.testing.assert_allclose([c["cosine"] for c in near], np.sort(cos[int(j)])[::-1][:5], atol=1e-5)


@pytest.mark.slow
def test_the_readme_features_examples_run_as_typed(tmp_path, monkeypatch, capsys):
    """The documented features train line, then its Python example (docs/guide/features.md) on the folder it wrote (assets/ linked beside)."""
    import re

    from conftest import readme_command

    (tmp_path / "assets").symlink_to(ASSETS)
    monkeypatch.chdir(tmp_path)
    args = readme_command(".venv/bin/python -m vitviz features train assets/", tmp_path / "sae")
    assert main(args[2:]) == 0
    info = json.loads((tmp_path / "sae" / "sae.json").read_text())
    assert (info["layer"], info["latents"], info["topk"], info["images"]["count"]) == (9, 256, 8, 4)
    # what docs/guide/features.md says of this line: it stops on the plateau after 2,000 steps (2,000 epochs of the
    # four photos' 1,024 tokens) at a training explained variance of 0.95, and says so on its last line
    training = info["training"]
    assert (training["stop_reason"], training["steps"], training["epochs_run"]) == ("plateau", 2000, 2000)
    assert training["tokens"] == 2000 * 4 * 256 and training["warning"] is None
    assert round(training["explained_variance"], 2) == round(info["metrics"]["explained_variance"], 2) == 0.95
    assert "stopped when the explained variance stopped rising after 2000 steps" in capsys.readouterr().err
    section = (ASSETS.parent / "docs" / "guide" / "features.md").read_text()
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    capsys.readouterr()
    exec(compile(code, "docs/guide/features.md", "exec"), {})
    assert capsys.readouterr().out == "(1, 16, 16) (1, 256)\n"  # what the README's comment says it prints


def test_a_second_writer_of_the_folder_is_refused_with_a_sentence(tiny, tmp_path, capsys):
    import threading

    from vitviz.io.lock import output_lock

    out = tmp_path / "sae"
    codes = []
    with output_lock(out, "features train"):
        thread = threading.Thread(target=lambda: codes.append(main(_args(tiny, out))))
        thread.start()
        thread.join()
    assert codes == [2]
    err = capsys.readouterr().err
    assert "is being written by another run" in err and "Traceback" not in err
    assert not (out / "checkpoint.pt").exists()
