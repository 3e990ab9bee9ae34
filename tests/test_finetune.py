"""Bring your own fine-tuned model: a timm checkpoint trained on other classes, saved the way training
scripts save it, loads as the architecture its tensors describe, with its class names."""
import argparse
import json
import os

import pytest
import timm
import torch
from safetensors.torch import save_file

from vitviz.trace import trace_for_analysis as capture
from vitviz.errors import ModelError
from vitviz.sources.labels import ClassNames, parse_labels, read_labels
from vitviz.sources.models import ModelSpec, load_model

ARCH = "vit_tiny_patch16_224"
CLASSES = ("apple", "banana", "cherry", "date", "elderberry", "fig", "grape")


def finetuned(seed: int = 0, **kwargs) -> torch.nn.Module:
    """``ARCH`` as a lab fine-tunes it (7 classes unless ``kwargs`` say otherwise), weights randomised so a
    wrongly built model cannot agree by accident (timm zero-initialises some)."""
    torch.manual_seed(seed)
    model = timm.create_model(ARCH, pretrained=False, **({"num_classes": 7} | kwargs))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.fixture(scope="module")
def seven():
    return finetuned()


def _save(model, path, how: str):
    """Write ``model``'s weights as a user's training script does."""
    state = model.state_dict()
    if how == "state_dict":  # torch.save(model.state_dict(), path)
        torch.save(state, path)
    elif how == "safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    elif how == "timm_train":  # timm's train.py CheckpointSaver: model_best.pth.tar
        torch.save({"epoch": 9, "arch": ARCH, "state_dict": state, "optimizer": {"state": {}, "param_groups": []},
                    "version": 2, "args": argparse.Namespace(model=ARCH, num_classes=7, lr=1e-3),
                    "metric": 91.5}, path)
    elif how == "model_entry":  # torchvision's reference scripts and many others
        torch.save({"model": state, "epoch": 9, "args": argparse.Namespace(lr=0.1)}, path)
    elif how == "data_parallel":  # saved from inside DataParallel / DistributedDataParallel
        torch.save(torch.nn.DataParallel(model).state_dict(), path)
    elif how == "compiled":  # saved from torch.compile's wrapper (compiling is lazy: nothing runs here)
        torch.save(torch.compile(model).state_dict(), path)
    elif how == "lightning":  # a LightningModule keeping the network as self.model
        torch.save({"epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.4.0",
                    "state_dict": {f"model.{k}": v for k, v in state.items()},
                    "hyper_parameters": {"lr": 1e-3, "num_classes": 7}, "optimizer_states": [], "lr_schedulers": []},
                   path)
    elif how == "deepspeed":  # DeepSpeed's mp_rank_00_model_states.pt
        torch.save({"module": state, "buffer_names": [], "ds_version": "0.14.0", "global_steps": 120}, path)
    else:
        raise AssertionError(how)
    return path


def _reference(state: dict, **kwargs) -> torch.nn.Module:
    """timm's own model built with the training script's arguments, the same weights loaded strictly."""
    model = timm.create_model(ARCH, pretrained=False, **kwargs)
    model.load_state_dict(state, strict=True)
    return model.eval()


# how -> (file name, what the model's notes say was done to find the weights)
FORMATS = {"state_dict": ("weights.pth", None), "safetensors": ("weights.safetensors", None),
           "timm_train": ("model_best.pth.tar", "its 'state_dict' entry"),
           "model_entry": ("checkpoint.pt", "its 'model' entry"),
           "data_parallel": ("pytorch_model.bin", "the keys under 'module.', without it"),
           "compiled": ("compiled.pt", "the keys under '_orig_mod.', without it"),
           "lightning": ("epoch=3.ckpt", "its 'state_dict' entry; the keys under 'model.', without it"),
           "deepspeed": ("mp_rank_00_model_states.pt", "its 'module' entry")}


@pytest.mark.parametrize("how", list(FORMATS))
def test_a_seven_class_checkpoint_loads_as_timm_builds_it(tmp_path, seven, how):
    name, found = FORMATS[how]
    path = _save(seven, tmp_path / name, how)
    loaded = load_model(ModelSpec(name=ARCH, checkpoint=str(path)))

    assert loaded.num_classes == 7 and "num_classes=7" in loaded.label
    assert (f"Weights read from {name}: {found}." in loaded.notes) if found else \
        not any(n.startswith("Weights read") for n in loaded.notes)
    for key, value in seven.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value), key
    reference = _reference(seven.state_dict(), num_classes=7)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        # The same timm module class, weights, input, process and thread count run the same kernels in the
        # same order: the library's forward is bit-identical, not merely close.
        assert torch.equal(loaded.model(x), reference(x))
        # vitviz's spelled-out forward (explicit softmax instead of fused attention) agrees to float32 rounding
        # of O(1) logits through 12 blocks: 1e-5, the suite's parity bound.
        torch.testing.assert_close(capture(loaded.model, x).logits, reference(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kwargs", [
    {"global_pool": "avg"},                                      # fc_norm present: average pooling
    {"img_size": 288},                                           # fine-tuned at 288 px: an 18x18 position grid
    {"reg_tokens": 2},                                           # register tokens
    {"class_token": False, "global_pool": "avg"},                # no class token
    {"class_token": False, "global_pool": "map"},                # attention pooling, as SigLIP
    {"num_classes": 0},                                          # a headless backbone
], ids=["global_pool", "img_size", "reg_tokens", "no_class_token", "map", "headless"])
def test_what_the_training_script_changed_is_read_from_the_tensor_shapes(tmp_path, kwargs):
    trained = finetuned(seed=2, **kwargs)
    path = _save(trained, tmp_path / "weights.pth", "state_dict")
    loaded = load_model(ModelSpec(name=ARCH, checkpoint=str(path)))

    reference = _reference(trained.state_dict(), **({"num_classes": 7} | kwargs))
    for name in ("num_classes", "global_pool", "num_prefix_tokens", "num_reg_tokens", "has_class_token"):
        assert getattr(loaded.model, name) == getattr(reference, name), name
    size = kwargs.get("img_size", 224)
    assert loaded.data_config["input_size"] == (3, size, size)
    assert loaded.layout.grid_size == (size // 16, size // 16)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        assert torch.equal(loaded.model(x), reference(x))  # bit-identical: see the test above


@pytest.mark.parametrize("name, size", [("deit_tiny_distilled_patch16_224", 224), ("eva02_tiny_patch14_224", 224),
                                        ("swin_vitviz_tiny_test", 64)])
def test_other_families_fine_tuned_to_seven_classes_load(tmp_path, name, size):
    """The classifier is found where timm's get_classifier() says: distilled DeiT's two heads, Swin's head.fc."""
    import test_swin  # noqa: F401 - registers swin_vitviz_tiny_test

    torch.manual_seed(7)
    trained = timm.create_model(name, pretrained=False, num_classes=7).eval()
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = _save(trained, tmp_path / "weights.pth", "state_dict")
    loaded = load_model(ModelSpec(name=name, checkpoint=str(path)))
    assert loaded.num_classes == 7 and "num_classes=7" in loaded.label
    reference = timm.create_model(name, pretrained=False, num_classes=7).eval()
    reference.load_state_dict(trained.state_dict(), strict=True)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(8))
    with torch.inference_mode():
        assert torch.equal(loaded.model(x), reference(x))  # bit-identical: see the first test


def test_an_asked_resolution_resamples_the_fine_tuned_grid(tmp_path):
    trained = finetuned(seed=4, img_size=288)
    path = _save(trained, tmp_path / "weights.safetensors", "safetensors")
    loaded = load_model(ModelSpec(name=ARCH, checkpoint=str(path), img_size=224))
    assert loaded.layout.grid_size == (14, 14) and loaded.num_classes == 7
    assert loaded.native_pos_embed.grid_size == (18, 18)  # the position page shows the weights' own grid


@pytest.mark.parametrize("change, sentence", [
    ({"embed_dim": 128, "num_heads": 4},
     "Checkpoint wrong.pth does not fit vit_tiny_patch16_224 (num_classes=7): its tensor 'cls_token' has shape "
     "(1, 1, 128), the architecture's (1, 1, 192)."),
    ({"depth": 3},
     "Checkpoint wrong.pth does not fit vit_tiny_patch16_224 (num_classes=7): the architecture's tensor "
     "'blocks.3.norm1.weight' (192) is not in the checkpoint."),
    ({"depth": 13},
     "Checkpoint wrong.pth does not fit vit_tiny_patch16_224 (num_classes=7): its tensor 'blocks.12.norm1.weight' "
     "(192) has no place in the architecture."),
], ids=["embed_dim", "fewer_blocks", "more_blocks"])
def test_a_checkpoint_that_truly_does_not_fit_names_the_first_tensor_and_both_shapes(tmp_path, change, sentence):
    torch.manual_seed(0)
    path = _save(timm.create_model(ARCH, num_classes=7, **change), tmp_path / "wrong.pth", "state_dict")
    with pytest.raises(ModelError) as err:
        load_model(ModelSpec(name=ARCH, checkpoint=str(path)))
    assert str(err.value) == sentence


def test_a_dictionary_without_weights_says_which_entries_it_has(tmp_path):
    path = tmp_path / "run.ckpt"
    torch.save({"epoch": 3, "weights_of_my_net": {"a": torch.zeros(1)}, "note": "hi"}, path)
    with pytest.raises(ModelError, match=r"run.ckpt: it is not a dictionary of tensors.*none of its entries "
                                         r"'state_dict_ema', 'model_ema', 'state_dict', 'model', 'module' holds one "
                                         r"\(it has 'epoch', 'weights_of_my_net', 'note'\)"):
        load_model(ModelSpec(name=ARCH, checkpoint=str(path)))


# Class names ------------------------------------------------------------------------------------

def test_class_names_as_lines_or_a_json_list():
    assert parse_labels("apple\r\nbanana\n cherry \n\n", "a.txt") == ClassNames(("apple", "banana", "cherry"), "a.txt")
    assert parse_labels(' ["apple", "banana split"]\n', "a.json").names == ("apple", "banana split")
    with pytest.raises(ModelError, match=r"^Class names \(a.txt\): line 2 is empty; give one name per line"):
        parse_labels("apple\n\nbanana\n", "a.txt")
    with pytest.raises(ModelError, match=r"^Class names \(a.json\): the JSON list must hold strings"):
        parse_labels("[1, 2]", "a.json")
    with pytest.raises(ModelError, match=r"^Class names \(a.json\): it starts like a JSON list but is not one"):
        parse_labels('["apple",', "a.json")


def test_a_labels_file_that_cannot_be_used_gets_a_sentence(tmp_path):
    with pytest.raises(ModelError, match=r"^Class names \(.*absent.txt\): no such file\.$"):
        read_labels(tmp_path / "absent.txt")
    binary = tmp_path / "classes.txt"
    binary.write_bytes(b"\xff\xfe\x00\x81 not text")
    with pytest.raises(ModelError, match=r"^Class names \(classes.txt\): it is not UTF-8 text"):
        read_labels(binary)
    huge = tmp_path / "huge.txt"
    huge.write_text("x\n" * (3 << 20))  # 6 MiB
    with pytest.raises(ModelError, match=r"^Class names \(huge.txt\): the file takes 6 MiB, more than a list of "
                                         r"class names needs \(at most 4 MiB\)\.$"):
        read_labels(huge)


@pytest.fixture(scope="module")
def seven_path(tmp_path_factory, seven):
    return _save(seven, tmp_path_factory.mktemp("ft") / "weights.pth", "state_dict")


@pytest.mark.parametrize("text, file", [("\n".join(CLASSES) + "\n", "classes.txt"), (json.dumps(CLASSES), "classes.json")])
def test_class_names_from_a_file_name_the_top_classes(tmp_path, seven, seven_path, text, file):
    from vitviz.analyses.tokens import top_classes

    (tmp_path / file).write_text(text)
    loaded = load_model(ModelSpec(name=ARCH, checkpoint=str(seven_path), labels=read_labels(tmp_path / file)))
    assert loaded.class_labels == CLASSES
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        logits = seven(x)[0].numpy()
    order = logits.argsort()[::-1]
    assert [name for _, name, _ in top_classes(logits, 3, loaded.class_labels)] == [CLASSES[i] for i in order[:3]]


def test_class_names_that_do_not_count_the_classes_are_refused(tmp_path, seven_path):
    six = ClassNames(CLASSES[:6], "classes.txt")
    with pytest.raises(ModelError) as err:
        load_model(ModelSpec(name=ARCH, checkpoint=str(seven_path), labels=six))
    assert str(err.value) == ("Class names (classes.txt): 6 names, but vit_tiny_patch16_224 with weights from "
                              "weights.pth (num_classes=7) has 7 classes; give exactly one name per class, in the "
                              "order of the head's outputs.")
    headless = _save(finetuned(num_classes=0), tmp_path / "backbone.pth", "state_dict")
    with pytest.raises(ModelError, match=r"^Class names \(classes.txt\): .* has no classifier head"):
        load_model(ModelSpec(name=ARCH, checkpoint=str(headless), labels=six))


def test_names_share_the_loaded_model(seven_path):
    from vitviz.sources.models import with_labels

    plain = load_model(ModelSpec(name=ARCH, checkpoint=str(seven_path)))
    named = with_labels(plain, ClassNames(CLASSES, "box"))
    assert named.model is plain.model and named.class_labels == CLASSES and plain.class_labels is None
    assert named.spec.labels.names == CLASSES and named.card()["spec"]["labels"]["names"] == CLASSES


# The attention budget of the fitted architecture ------------------------------------------------

def test_the_budget_counts_the_resolution_the_checkpoint_was_fine_tuned_at(tmp_path):
    from vitviz.sources.budget import admit, admit_fitted
    from vitviz.settings import Settings

    path = _save(finetuned(seed=6, img_size=384), tmp_path / "ft384.pth", "state_dict")
    spec = ModelSpec(name=ARCH, checkpoint=str(path))
    limits = Settings(cache_bytes=40 << 20)  # one image's attention: at most 20 MiB
    admit(spec, limits)  # by its name: 224 px, 12 x 3 x 197^2 x 4 B = 5.3 MiB
    loaded = load_model(spec)
    # Fitted: 384 px, 577 tokens: 12 x 3 x 577^2 x 4 B = 46 MiB. The largest square that fits: N^2 <= 20 MiB / 144 B
    # gives N <= 381, so 19 x 19 patches + CLS = 362 tokens: 304 px.
    with pytest.raises(ModelError, match=r"^Input resolution 384 px: vit_tiny_patch16_224 with weights from ft384.pth "
                                         r"\(num_classes=7, img_size=384\)'s attention for one image would take 46 MiB "
                                         r".*the largest size that fits is 304 px\.$"):
        admit_fitted(loaded, limits)
    admit_fitted(load_model(ModelSpec(name=ARCH, checkpoint=str(path), img_size=224)), limits)


# The command line -------------------------------------------------------------------------------

def test_analyze_names_each_images_top_class_with_labels(tmp_path, seven, seven_path):
    import numpy as np

    from conftest import ASSETS
    from vitviz.cli import main

    labels = tmp_path / "classes.txt"
    labels.write_text("\n".join(CLASSES) + "\n")
    images = [ASSETS / "chelsea.jpg", ASSETS / "coffee.jpg"]
    assert main(["analyze", *map(str, images), "--model", ARCH, "--checkpoint", str(seven_path),
                 "--labels", str(labels), "--out", str(tmp_path / "out")]) == 0
    settings = json.loads((tmp_path / "out" / "settings.json").read_text())
    logits = np.load(tmp_path / "out" / "analysis.npz")["logits"]
    assert logits.shape == (2, 7)
    assert [im["top1"]["name"] for im in settings["images"]] == [CLASSES[i] for i in logits.argmax(1)]
    assert settings["model"]["spec"]["labels"] == {"names": list(CLASSES), "source": "classes.txt"}


def test_stats_takes_labels_per_model_and_says_when_they_do_not_count_the_classes(tmp_path, seven_path, capsys):
    from conftest import ASSETS
    from vitviz.cli import main

    labels = tmp_path / "classes.json"
    labels.write_text(json.dumps(CLASSES[:5]))
    code = main(["stats", str(ASSETS / "chelsea.jpg"), "--model", ARCH, "--checkpoint", str(seven_path),
                 "--labels", str(labels), "--out", str(tmp_path / "stats"), "--workers", "0"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "error: Class names (classes.json): 5 names, but vit_tiny_patch16_224 with weights from weights.pth "
        "(num_classes=7) has 7 classes; give exactly one name per class, in the order of the head's outputs.")
    labels.write_text(json.dumps(CLASSES))
    assert main(["stats", str(ASSETS / "chelsea.jpg"), "--model", ARCH, "--checkpoint", str(seven_path),
                 "--labels", str(labels), "--out", str(tmp_path / "stats"), "--workers", "0"]) == 0
    summary = json.loads((tmp_path / "stats" / "summary.json").read_text())
    assert summary["models"][ARCH]["spec"]["labels"]["names"] == list(CLASSES)
    code = main(["stats", str(ASSETS / "chelsea.jpg"), "--model", ARCH, "--model", "bundled",
                 "--labels", str(labels), "--out", str(tmp_path / "stats")])
    assert code == 2 and "1 --labels for 2 --model: give one per --model" in capsys.readouterr().err


# The app ----------------------------------------------------------------------------------------

def _top5_labels(at) -> list[str]:
    chart = next(c for c in at.get("plotly_chart") if "top5" in (c.proto.id or ""))
    bar = json.loads(chart.proto.spec)["data"][0]
    return list(bar["y"] if bar.get("orientation") == "h" else bar["x"])


@pytest.mark.slow
def test_the_sidebar_loads_a_fine_tuned_checkpoint_with_the_class_names_box(seven, seven_path):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from conftest import ASSETS
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"), default_timeout=180).run()
    at.sidebar.selectbox(key="model_choice").set_value("timm model by name").run()
    at.sidebar.text_input(key="timm_query").input(ARCH).run()
    at.sidebar.selectbox(key="timm_name").set_value(ARCH).run()  # offline, no weights: the pick is taken back
    assert any("give the checkpoint below, then pick it again" in i.value for i in at.info)
    at.sidebar.text_input(key="ckpt_path").input(str(seven_path)).run()
    at.sidebar.selectbox(key="timm_name").set_value(ARCH).run()
    at.sidebar.text_area(key="class_names").input("\n".join(CLASSES)).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("num_classes=7" in c.value for c in at.sidebar.caption)

    x = preprocess([load_image(ASSETS / "astronaut.jpg").image], load_model(  # the first sample photo
        ModelSpec(name=ARCH, checkpoint=str(seven_path))).data_config).tensor
    with torch.inference_mode():
        order = seven(x)[0].argsort(descending=True)[:5].tolist()
    assert _top5_labels(at) == [f"{CLASSES[i]} ({i})" for i in order]

    # Six names for seven classes: the sentence, and the model stays loaded with its names.
    at.sidebar.text_area(key="class_names").input("\n".join(CLASSES[:6])).run()
    assert any(e.value.startswith("Class names (the Class names box): 6 names, but vit_tiny_patch16_224 with "
                                  "weights from weights.pth (num_classes=7) has 7 classes") for e in at.error)
    assert _top5_labels(at) == [f"{CLASSES[i]} ({i})" for i in order]


@pytest.mark.slow
def test_the_readmes_fine_tuned_command_does_what_it_says(tmp_path, seven):
    """The README's command typed as it stands, in a folder holding the files it names (saved as timm's
    train.py and a user's text editor save them); only --out is pointed at a temporary folder."""
    import subprocess
    import sys
    from pathlib import Path

    import numpy as np

    from conftest import ASSETS, readme_command

    args = readme_command(".venv/bin/python -m vitviz analyze assets/astronaut.jpg --model vit_tiny_patch16_224",
                          tmp_path / "out")
    _save(seven, tmp_path / "model_best.pth.tar", "timm_train")
    (tmp_path / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    (tmp_path / "assets").symlink_to(ASSETS)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    result = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    settings = json.loads((tmp_path / "out" / "settings.json").read_text())
    logits = np.load(tmp_path / "out" / "analysis.npz")["logits"]
    assert settings["model"]["label"] == "vit_tiny_patch16_224 with weights from model_best.pth.tar (num_classes=7)"
    assert settings["images"][0]["top1"]["name"] == CLASSES[int(logits[0].argmax())]


def test_ema_weights_are_read_first_as_timm_does(tmp_path, seven):
    """timm's train.py with --model-ema keeps both; timm.models.load_state_dict (use_ema=True) reads the EMA."""
    ema = finetuned(seed=9)
    path = tmp_path / "model_best.pth.tar"
    torch.save({"epoch": 9, "state_dict": seven.state_dict(), "state_dict_ema": ema.state_dict(),
                "args": argparse.Namespace(model_ema=True)}, path)
    loaded = load_model(ModelSpec(name=ARCH, checkpoint=str(path)))
    assert torch.equal(loaded.model.head.weight, ema.head.weight)
    assert "Weights read from model_best.pth.tar: its 'state_dict_ema' entry." in loaded.notes
