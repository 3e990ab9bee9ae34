"""Whatever the README or the documentation site tells a user to type, a test types: every command line of the
```bash blocks of README.md and docs/**/*.md (``conftest.documented_files``).

The guard (``test_every_readme_command_line_is_typed_by_a_test``) lists their command lines (those that start
with ``.venv/bin/python`` or ``scripts/``) and names each one no test types. A line counts as
typed when it starts with a prefix some test passes to ``conftest.readme_command`` (read from tests/*.py with
``ast``), with one of :data:`TYPED_HERE` (this file types them), or is one of :data:`TYPED_ELSEWHERE` (the
scripts, run by the browser test and CI). A prefix must name exactly one line (the same line on two pages is one), as ``readme_command`` requires.

The lines this file types run as written, the README's relative paths read and written in a temporary folder
that holds the files they name (photos/ is made of small crops of the sample photos, assets/ is the repository's).
Most lines that run on the bundled model (no ``--model``) run here on a stand-in for it (:func:`standin`): the
bundled architecture (timm's DINOv2 ViT-S/14: 12 blocks, 6 heads, CLS, patch 14) but 48 wide, randomly
initialised and at 112 px (8x8 patches) by default. The lines' options, the files they read and write and the
shapes, rows and keys of what they write are what is tested; the bundled model's own runs of the same commands
take 10-30x longer (the Probes section's faithfulness line alone 200 s on four photos, two shared cores) and its
numbers are other tests' (test_probe_cli, test_faithfulness_cli, test_heads_cli, test_features_cli). Two cheap
lines (patch masks on two photos, stats of two crops) run on the bundled model itself.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from conftest import ASSETS, documented_files, readme_command
from vitviz.cli import main

ROOT = ASSETS.parent
COMMAND_STARTS = (".venv/bin/python", "scripts/")
VITVIZ = ".venv/bin/python -m vitviz "

# The README's lines this file types: name -> the prefix that picks the one line (readme_command's rule).
TYPED_HERE = {
    "deit_384": VITVIZ + "analyze photo.jpg --model deit_small_patch16_224 --checkpoint deit.safetensors",
    "finetuned_stats": VITVIZ + "stats photos/ --model vit_tiny_patch16_224 --checkpoint model_best.pth.tar",
    "probe_folders": VITVIZ + "probe photos/ --folders",
    "probe_labels": VITVIZ + "probe --labels labels.csv",
    "probe_analyze": VITVIZ + "analyze photo.jpg --head probe/probe.safetensors",
    "probe_faithfulness": VITVIZ + "faithfulness photos/ --head probe/probe.safetensors",
    "probe_stats": VITVIZ + "stats photos/ --head probe/probe.safetensors",
    "patch_masks": VITVIZ + "probe photos/ --patch-masks masks/",
    "registers_large": VITVIZ + "registers assets/ --model vit_large_patch14_dinov2.lvd142m",
    "analyze_registers": VITVIZ + "analyze photo.jpg --model vit_large_patch14_dinov2.lvd142m --registers",
    "stats_two_models": VITVIZ + "stats imagenet/val/ --model bundled --model",
    "stats_ray": VITVIZ + "stats /shared/imagenet/val/",
    "faithfulness_assets": VITVIZ + "faithfulness assets/ --methods",
    "features_train": VITVIZ + "features train assets/",
    "features_train_ray": VITVIZ + "features train /shared/",  # docs/how-to/ray.md
    "probe_ray": VITVIZ + "probe /shared/",  # docs/how-to/ray.md
    "features_top": VITVIZ + "features top",
    "heads_patch": VITVIZ + "heads assets/chelsea.jpg assets/coffee.jpg --patch",
    "heads_ablate": VITVIZ + "heads assets/ --ablate",
    "gpu_auto": VITVIZ + "analyze assets/chelsea.jpg --device auto",  # docs/how-to/gpu.md
}
# Lines a test or CI runs without readme_command: line -> (the file that runs it, the text there that runs it).
TYPED_ELSEWHERE = {
    "scripts/app.sh": ("tests/loadtest.py", '["bash", "scripts/app.sh"]'),  # test_browser.py's server
    "scripts/test.sh": (".ci/run", "bash scripts/test.sh"),
    "scripts/docs.sh": ("tests/test_docs.py", '["bash", "scripts/docs.sh"]'),  # the site's strict build
}

STANDIN_WIDTH, STANDIN_PX = 48, 112


# ---------------------------------------------------------------------------------------------- the guard

def readme_command_lines(text: str) -> list[str]:
    """The command lines of the ```bash blocks of ``text`` (those starting with :data:`COMMAND_STARTS`)."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside and line[3:].strip() == "bash"
        elif inside and line.startswith(COMMAND_STARTS):
            lines.append(line)
    return lines


def prefixes_typed_by_tests(folder: Path = ROOT / "tests") -> set[str]:
    """Every literal first argument of a ``readme_command(...)`` call in ``folder/*.py``."""
    found = set()
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = getattr(node, "func", None) and getattr(node.func, "id", getattr(node.func, "attr", None))
            if (isinstance(node, ast.Call) and name == "readme_command"
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                found.add(node.args[0].value)
    return found


def untyped(text: str, prefixes: set[str]) -> list[str]:
    """What the guard reports for a README ``text``: each command line no prefix (nor :data:`TYPED_ELSEWHERE`)
    types, and each prefix that names several lines (``readme_command`` would refuse it)."""
    lines = readme_command_lines(text)
    problems = []
    for prefix in sorted(prefixes):
        named = list(dict.fromkeys(l for l in lines if l.startswith(prefix)))  # a line on two pages is one
        if len(named) > 1:
            problems.append(f"the prefix {prefix!r} names {len(named)} README lines: {named}")
    for line in dict.fromkeys(lines):  # a line on two pages is checked once
        elsewhere = next((k for k in TYPED_ELSEWHERE if line.split("#")[0].strip() == k), None)
        if elsewhere is not None:
            file, text_there = TYPED_ELSEWHERE[elsewhere]
            if text_there not in (ROOT / file).read_text():
                problems.append(f"{line!r}: {file} no longer runs it ({text_there!r} is not there)")
        elif not any(line.startswith(p) for p in prefixes):
            problems.append(f"no test types the README line {line!r}")
    return problems


def documented_text() -> str:
    """README.md and every docs page, one after the other (each file's ``` blocks close in that file)."""
    return "\n".join(f.read_text() for f in documented_files())


def test_every_readme_command_line_is_typed_by_a_test():
    text = documented_text()
    assert len(readme_command_lines(text)) >= 26  # the block reader finds the lines (26 in the README on 2026-11-27)
    assert any(f.parent.name == "how-to" for f in documented_files())  # the docs pages are read, not only the README
    assert untyped(text, prefixes_typed_by_tests() | set(TYPED_HERE.values())) == []


def test_the_guard_names_a_line_no_test_types_and_a_prefix_that_names_two(monkeypatch):
    """Planted: a new README line, a prefix made ambiguous by it, a script no test runs, a script whose runner no
    longer runs it; and the lines outside ```bash blocks (prose, ```python) are not command lines."""
    text = documented_text()
    prefixes = prefixes_typed_by_tests() | set(TYPED_HERE.values())
    new = VITVIZ + "heads assets/ --ablate all --mode zero --out z/"
    planted = text.replace("```bash\n", "```bash\n" + new + "\nscripts/bench.sh\n", 1)
    assert untyped(planted, prefixes) == [
        f"the prefix {TYPED_HERE['heads_ablate']!r} names 2 README lines: {[new, readme_line('heads_ablate')]}",
        f"no test types the README line {'scripts/bench.sh'!r}"]
    assert untyped(text + f"\n```python\n{new}\n```\n{new}\n", prefixes) == []
    assert untyped(text, prefixes - {TYPED_HERE["deit_384"]}) == [
        f"no test types the README line {readme_line('deit_384')!r}"]
    assert "readme_command(\".venv/bin/python -m vitviz qk\"" in (ROOT / "tests" / "test_heads_cli.py").read_text()
    assert VITVIZ + "qk" in prefixes  # read from another test file by ast
    monkeypatch.setitem(TYPED_ELSEWHERE, "scripts/test.sh", (".ci/run", "bash scripts/test.sh -n 0"))
    assert untyped(text, prefixes) == [f"{readme_command_lines(text)[1]!r}: .ci/run no longer runs it "
                                       f"({'bash scripts/test.sh -n 0'!r} is not there)"]


# ---------------------------------------------------------------------------------------------- helpers

def readme_line(name: str) -> str:
    lines = sorted({l for l in documented_text().splitlines() if l.startswith(TYPED_HERE[name])})
    assert len(lines) == 1, lines
    return lines[0]


def typed(name: str) -> list[str]:
    """The README's line ``name`` of :data:`TYPED_HERE` as ``python -m vitviz``'s arguments, exactly as written."""
    args = readme_command(TYPED_HERE[name], None)
    assert args[:2] == ["-m", "vitviz"]
    return args[2:]


def crops(folder: Path, name: str, n: int, size: int = 96) -> list[Path]:
    """``n`` small square crops of the sample photo ``name`` (from its corners and centre) as folder/<i>.jpg."""
    from PIL import Image

    photo = Image.open(ASSETS / f"{name}.jpg").convert("RGB")
    W, H = photo.size
    s = min(W, H) // 2
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (x, y) in enumerate([(0, 0), (W - s, H - s), ((W - s) // 2, (H - s) // 2), (W - s, 0)][:n]):
        paths.append(folder / f"{i}.jpg")
        photo.crop((x, y, x + s, y + s)).resize((size, size)).save(paths[-1])
    return paths


def standin_model(img_size: int = STANDIN_PX) -> torch.nn.Module:
    """The bundled model's architecture (timm), 48 wide, random weights (always the same)."""
    import timm

    from vitviz.sources import bundled

    torch.manual_seed(0)
    model = timm.create_model(bundled.TIMM_ARCH, pretrained=False, num_classes=0, img_size=img_size,
                              embed_dim=STANDIN_WIDTH, num_heads=6)
    with torch.no_grad():  # random init leaves LayerScale near zero: randomise so every block acts
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.fixture
def standin(monkeypatch):
    """:func:`standin_model` (at 112 px unless --img-size says otherwise) in place of the bundled model."""
    from vitviz.sources import models

    def load(spec):
        return models._finish(standin_model(spec.img_size or STANDIN_PX), spec, "a random stand-in",
                              "stand-in for the bundled model", [])

    monkeypatch.setattr(models, "_load_bundled", load)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A temporary working folder for the README's relative paths, assets/ linked in."""
    (tmp_path / "assets").symlink_to(ASSETS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused_offline(name: str, capsys, words: tuple[str, ...]) -> str:
    """Type line ``name`` and check what an offline user gets: exit status 2 and one sentence with ``words``."""
    assert main(typed(name)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(w in err for w in words), err
    return err


HUB_OFFLINE = ("could not be loaded", "hub cannot be reached")


# ---------------------------------------------------------------------------------------------- the lines

@pytest.mark.slow
def test_deit_at_384_from_a_safetensors_file_gives_timms_own_logits(folder):
    """`analyze photo.jpg --model deit_small_patch16_224 --checkpoint deit.safetensors --img-size 384`: a random
    DeiT-S saved as users save it (safetensors of the state dict, 224 px position grid); the logits equal those of
    timm's own model built at 384 from the same file through timm's loading path (pretrained_cfg_overlay), on the
    npz's input. Planted: the resampled position grid flipped in the loader -> 999 of 1000 logits differ."""
    import timm
    from PIL import Image
    from safetensors.torch import save_file

    Image.open(ASSETS / "chelsea.jpg").convert("RGB").resize((226, 150)).save("photo.jpg")
    torch.manual_seed(0)
    deit = timm.create_model("deit_small_patch16_224", pretrained=False)
    with torch.no_grad():
        for p in deit.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_file({k: v.contiguous() for k, v in deit.state_dict().items()}, "deit.safetensors")
    assert main(typed("deit_384")) == 0
    arrays = np.load("out/analysis.npz")
    assert arrays["input"].shape == (1, 3, 384, 384) and arrays["attention"].shape == (1, 12, 6, 577, 577)
    assert arrays["rollout"].shape == (1, 24, 24) and arrays["logits"].shape == (1, 1000)
    settings = json.loads(Path("out/settings.json").read_text())
    assert settings["model"]["label"] == "deit_small_patch16_224 with weights from deit.safetensors"
    reference = timm.create_model("deit_small_patch16_224", pretrained=True, img_size=384,
                                  pretrained_cfg_overlay={"file": str(folder / "deit.safetensors")}).eval()
    with torch.no_grad():
        expected = reference(torch.from_numpy(arrays["input"]))
    np.testing.assert_allclose(arrays["logits"], expected.numpy(), rtol=1e-4, atol=1e-4 * expected.abs().max().item())


@pytest.mark.slow
def test_stats_of_the_fine_tuned_checkpoint_equal_timms_attention(folder):
    """`stats photos/ --model vit_tiny_patch16_224 --checkpoint model_best.pth.tar --labels classes.txt`, with the
    files test_finetune.py builds for the analyze line above it: one row per image, layer and head, the model named
    with its checkpoint and class names, and the entropy equal to timm's own unfused attention's."""
    import timm
    from PIL import Image

    from conftest import timm_unfused_attention
    from test_finetune import ARCH, CLASSES, _save, finetuned

    seven = finetuned()
    _save(seven, folder / "model_best.pth.tar", "timm_train")
    Path("classes.txt").write_text("\n".join(CLASSES) + "\n")
    crops(folder / "photos" / "astronaut", "astronaut", 2)
    crops(folder / "photos" / "rocket", "rocket", 1)
    assert main(typed("finetuned_stats")) == 0
    table = pd.read_parquet("stats/stats.parquet")
    assert len(table) == 3 * 12 * 3 and set(table["model"]) == {ARCH}
    assert sorted(set(table["image"])) == ["astronaut/0.jpg", "astronaut/1.jpg", "rocket/0.jpg"]
    card = json.loads(Path("stats/summary.json").read_text())["models"][ARCH]
    assert card["label"] == f"{ARCH} with weights from model_best.pth.tar (num_classes=7)"
    assert card["spec"]["labels"] == {"names": list(CLASSES), "source": "classes.txt"}

    config = timm.data.resolve_model_data_config(seven)
    x = timm.data.create_transform(**config)(Image.open("photos/rocket/0.jpg").convert("RGB"))[None]
    attention = timm_unfused_attention(seven, x)[0, :, :, 1:, 1:].double()  # (L, H, patches, patches)
    p = attention / attention.sum(-1, keepdim=True)
    entropy = -(p * p.clamp_min(1e-300).log()).sum(-1).mean(-1)  # (L, H) nats, mean over patch queries
    rows = table[table["image"] == "rocket/0.jpg"].sort_values(["layer", "head"])
    np.testing.assert_allclose(rows["entropy"].to_numpy(), entropy.numpy().ravel(), atol=1e-4)


@pytest.mark.slow
def test_the_probes_section_runs_in_order_each_line_reading_what_the_last_wrote(folder, standin):
    """The Probes section's five lines in order: the head from photos/<class>/ (--folders), then from labels.csv at
    layer 9 with cls+mean pooling (replacing the first), then analyze, faithfulness and stats reading it. analyze's
    logits equal the probe's weights applied by hand to timm's own first 9 blocks, final norm, CLS and patch mean."""
    from PIL import Image

    names = {cls: crops(folder / "photos" / cls, cls, 3) for cls in ("astronaut", "rocket")}
    Image.open(ASSETS / "chelsea.jpg").convert("RGB").resize((150, 100)).save("photo.jpg")
    Path("labels.csv").write_text("path,label\n" + "".join(
        f"{p.relative_to(folder)},{cls}\n" for cls, paths in names.items() for p in paths))

    assert main(typed("probe_folders")) == 0
    info = json.loads(Path("probe/probe.json").read_text())
    assert info["classes"] == ["astronaut", "rocket"] and len(info["images"]) == 6
    assert [r["layer"] for r in info["layers"]] == list(range(1, 13)) and info["pooling"] == "cls"
    assert load_file("probe/probe.safetensors")["weight"].shape == (2, STANDIN_WIDTH)

    assert main(typed("probe_labels")) == 0
    info = json.loads(Path("probe/probe.json").read_text())
    assert (info["layer"], info["pooling"], info["classes"]) == (9, "cls+mean", ["astronaut", "rocket"])
    assert sorted(i["name"] for i in info["images"])[0] == "photos/astronaut/0.jpg"
    head = load_file("probe/probe.safetensors")
    assert head["weight"].shape == (2, 2 * STANDIN_WIDTH) and head["bias"].shape == (2,)

    assert main(typed("probe_analyze")) == 0
    arrays = np.load("out/analysis.npz")
    assert arrays["attention"].shape == (1, 9, 6, 65, 65) and arrays["logits"].shape == (1, 2)
    assert arrays["attribution_attnlrp"].shape == arrays["attribution_legrad"].shape == (1, 8, 8)
    assert arrays["attribution_attnlrp_pixels"].shape == (1, STANDIN_PX, STANDIN_PX)
    settings = json.loads(Path("out/settings.json").read_text())
    assert settings["model"]["probe"] == {"layer": 9, "pooling": "cls+mean", "classes": ["astronaut", "rocket"],
                                          "file": "probe.safetensors"}
    model, x = standin_model(), torch.from_numpy(arrays["input"])
    with torch.no_grad():  # timm's own modules: the first 9 blocks, the final norm, CLS and patch mean, the probe
        tokens = model.norm(model.blocks[:9](model._pos_embed(model.patch_embed(x))))
        pooled = torch.cat([tokens[:, 0], tokens[:, 1:].mean(1)], -1)
        expected = pooled @ head["weight"].T + head["bias"]
    np.testing.assert_allclose(arrays["logits"], expected.numpy(), rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    target = settings["analysis"]["attribution"]["target"]
    assert target["kind"] == "logit" and target["classes"] == [int(arrays["logits"][0].argmax())]  # the top-1 class

    assert main(typed("probe_faithfulness")) == 0
    aucs = pd.read_parquet("faith/auc.parquet")
    assert set(aucs["protocol"]) == {"positive", "negative"} and aucs["image"].nunique() == 6
    assert {"attnlrp", "rollout", "random"} <= set(aucs["method"])
    assert aucs["auc"].between(0, 90).all()  # Chefer's AUC: trapezoid x 100 over fractions 0-90 %
    assert json.loads(Path("faith/settings.json").read_text())["run"]["head"] == "probe/probe.safetensors"

    assert main(typed("probe_stats")) == 0
    table = pd.read_parquet("stats/stats.parquet")
    assert sorted(set(table["layer"])) == list(range(9)) and len(table) == 6 * 9 * 6  # the probed model's blocks


@pytest.mark.slow
def test_patch_masks_label_the_painted_patches_and_map_every_image(folder):
    """`probe photos/ --patch-masks masks/ --out concept/` on the bundled model itself (two photos: seconds), with
    masks/chelsea.png for photos/chelsea.jpg (the README's comment) painted at the patch grid's size (16 x 16, the
    cat's eyes); coffee.jpg unpainted: only mapped."""
    import shutil

    from PIL import Image

    (folder / "photos").mkdir()
    for name in ("chelsea", "coffee"):
        shutil.copy(ASSETS / f"{name}.jpg", folder / "photos")
    eyes = np.zeros((16, 16), bool)
    eyes[5:8, 3:7] = eyes[6:9, 11:15] = True
    (folder / "masks").mkdir()
    Image.fromarray(eyes.astype(np.uint8) * 255).save("masks/chelsea.png")
    assert main(typed("patch_masks")) == 0
    info = json.loads(Path("concept/probe.json").read_text())
    assert info["kind"] == "patch" and [r["layer"] for r in info["layers"]] == list(range(1, 13))
    maps = np.load("concept/concept_maps.npz")
    assert list(maps["names"]) == ["photos/chelsea.jpg", "photos/coffee.jpg"]
    assert maps["probability"].shape == (2, 12, 16, 16)
    np.testing.assert_array_equal(maps["labels"][0], eyes.astype(np.int8))  # painted: 1, the rest of it 0
    assert (maps["labels"][1] == -1).all()  # nothing painted: left out of training
    assert load_file("concept/probe.safetensors")["weight"].shape == (12, 384)  # one probe per layer, ViT-S wide
    assert info["layers"][-1]["balanced_accuracy"] > 0.8  # the cat's eyes are readable there (0.92 measured)


def test_the_registers_repair_of_a_hub_model_offline_says_why(folder, capsys, network_calls):
    """`registers assets/ --model vit_large_patch14_dinov2.lvd142m` and `analyze photo.jpg --model ... --registers`:
    DINOv2-L/14 is a hub download (1.2 GB), so offline (as here: the hub off, every connection refused) each line
    gets one sentence naming the model and why, exit status 2, and writes nothing. What the two lines do with a
    model that has outliers is test_registers.py's (a planted ViT-Ti)."""
    from PIL import Image

    Image.open(ASSETS / "chelsea.jpg").convert("RGB").save("photo.jpg")
    err = refused_offline("registers_large", capsys, HUB_OFFLINE)
    assert "'vit_large_patch14_dinov2.lvd142m'" in err
    assert not list(Path("regs").rglob("*.json"))
    err = refused_offline("analyze_registers", capsys, HUB_OFFLINE)
    assert "'vit_large_patch14_dinov2.lvd142m'" in err and not Path("out/analysis.npz").exists()


@pytest.mark.slow
def test_stats_of_two_models_offline_writes_the_bundled_rows_and_names_the_hub_model(folder, capsys,
                                                                                     network_calls):
    """`stats imagenet/val/ --model bundled --model vit_base_patch16_224.augreg2_in21k_ft_in1k`: offline the
    second model cannot be downloaded. The user gets the bundled model's table, a sentence naming the other model
    and exit status 2, the summary marked incomplete (the bundled model itself: two crops, seconds); the same
    command online (or with --checkpoint - FILE) adds the second model's rows."""
    crops(folder / "imagenet" / "val" / "n09472597", "rocket", 2)
    err = refused_offline("stats_two_models", capsys, HUB_OFFLINE)
    assert "'vit_base_patch16_224.augreg2_in21k_ft_in1k'" in err
    table = pd.read_parquet("stats/stats.parquet")
    assert set(table["model"]) == {"bundled"} and len(table) == 2 * 12 * 6
    assert sorted(set(table["image"])) == ["n09472597/0.jpg", "n09472597/1.jpg"]
    assert "stats/stats.parquet holds 2 images for bundled" in err
    summary = json.loads(Path("stats/summary.json").read_text())
    assert summary["complete"] is False and list(summary["models"]) == ["bundled"]


def test_stats_on_a_ray_cluster_offline_names_the_hub_model_before_ray_starts(folder, capsys, network_calls,
                                                                              monkeypatch):
    """The Ray line names /shared/ paths (a cluster's shared file system): here /shared/ is a folder of the
    temporary one (the only change to the line). Offline the hub model is refused before any Ray is started or
    reached (--address auto would find none here): exit status 2, a sentence naming the model, no summary and no row."""
    import ray

    args = [a.replace("/shared/", str(folder / "shared") + "/") for a in typed("stats_ray")]
    assert args.count(str(folder / "shared" / "stats") + "/") == 1
    crops(folder / "shared" / "imagenet" / "val", "rocket", 1)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray was started"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(w in err for w in HUB_OFFLINE)
    assert "'vit_base_patch16_224.augreg2_in21k_ft_in1k'" in err
    # nothing of this run to keep: no summary, no row (the one sentence, as for any model that cannot load)
    out = folder / "shared" / "stats"
    assert not (out / "summary.json").exists()
    assert not (out / "stats.parquet").exists() or pd.read_parquet(out / "stats.parquet").empty


@pytest.mark.parametrize("name, out", [("features_train_ray", "sae"), ("probe_ray", "probe")])
def test_the_ray_pages_sae_and_probe_lines_offline_name_the_hub_model_before_ray_starts(folder, capsys, network_calls,
                                                                                      monkeypatch, name, out):
    """The Ray page's `features train` and `probe` lines, /shared/ a folder of the temporary one (as for the stats
    line above): every option parses, and offline the hub model is refused before Ray is started or reached, with
    nothing written (the runs themselves, on a local Ray, are test_engines.py's)."""
    import ray

    args = [a.replace("/shared/", str(folder / "shared") + "/") for a in typed(name)]
    assert args[args.index("--engine") + 1] == "ray" and args[args.index("--address") + 1] == "auto"
    for name in ("rocket", "coffee"):  # two classes, as --folders needs
        crops(folder / "shared" / "imagenet" / "train" / name, name, 3)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray was started"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(w in err for w in HUB_OFFLINE)
    assert "'vit_base_patch16_224.augreg2_in21k_ft_in1k'" in err
    written = [p for p in (folder / "shared").rglob("*") if p.is_file() and "imagenet" not in p.parts]
    assert not any(p.suffix in (".safetensors", ".parquet", ".pt") for p in written), written


@pytest.mark.slow
def test_faithfulness_over_the_sample_photos_writes_every_table(folder, standin, capsys):
    """`faithfulness assets/ --methods attnlrp,rollout,random --out faith/`: the four photos, the default protocols,
    ten random seeds, the bootstrap summary of every method."""
    assert main(typed("faithfulness_assets")) == 0
    aucs = pd.read_parquet("faith/auc.parquet")
    assert sorted(set(aucs["image"])) == ["astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg"]
    assert set(aucs["method"]) == {"attnlrp", "rollout", "random"} | {f"random_seed_{s}" for s in range(10)}
    assert set(aucs["protocol"]) == {"morf", "lerf", "insertion", "lerf_minus_morf"}
    assert len(aucs) == 4 * 13 * 4
    curves = pd.read_parquet("faith/faithfulness.parquet")
    assert sorted(set(curves["fraction"].round(6))) == [round(f / 10, 6) for f in range(11)]
    summary = json.loads(Path("faith/summary.json").read_text())
    assert summary["complete"] and summary["images"] == 4 and set(summary["protocols"]) >= {"morf", "lerf", "insertion"}
    for protocol in ("morf", "lerf", "insertion"):
        rows = {m["method"]: m for m in summary["protocols"][protocol]["methods"]}
        assert set(rows) >= {"attnlrp", "rollout"} and all(m["low"] <= m["mean"] <= m["high"] for m in rows.values())
        means = aucs[(aucs["protocol"] == protocol)].groupby("method")["auc"].mean()
        np.testing.assert_allclose(rows["attnlrp"]["mean"], means["attnlrp"], rtol=1e-9)  # the mean over images
    assert "bootstrap 95 % intervals" in capsys.readouterr().out


@pytest.mark.slow
def test_features_top_after_features_train_writes_the_table_and_the_two_sheets(folder, standin, capsys):
    """The Features section's two lines in order: `features train ... --out sae/`, then `features top sae/ assets/
    --top 16 --sheets 3,17` on what it wrote (the stand-in has no head: no nearest_classes.json, and it says so)."""
    assert main(typed("features_train")) == 0
    training = json.loads(Path("sae/sae.json").read_text())["training"]  # trained until converged, as the README says
    assert training["stop_reason"] == "plateau" and training["steps"] >= 2000 and training["warning"] is None
    assert main(typed("features_top")) == 0
    assert "no nearest_classes.json" in capsys.readouterr().err
    top = pd.read_parquet("sae/top.parquet")
    assert list(top.columns) == ["latent", "image", "patch", "activation"]
    assert top.groupby("latent").size().max() <= 16 and top["latent"].between(0, 255).all()
    assert top["patch"].between(0, 63).all() and (top["activation"] > 0).all()
    for _, rows in top.groupby("latent", sort=False):  # each latent's rows strongest first
        assert (np.diff(rows["activation"].to_numpy()) <= 0).all()
    assert Path("sae/latent_3.png").is_file() and Path("sae/latent_17.png").is_file()
    assert not Path("sae/nearest_classes.json").exists()


@pytest.mark.slow
def test_heads_patch_and_ablate_lines_write_one_effect_per_head(folder, standin):
    """`heads assets/chelsea.jpg assets/coffee.jpg --patch all --out patch/` (every head of every layer, B = coffee
    moved towards A = chelsea) and `heads assets/ --ablate 12 --mode mean --out ablate/` (layer 12's heads, each
    set to its mean over the four photos)."""
    assert main(typed("heads_patch")) == 0
    patch = pd.read_parquet("patch/effects.parquet")
    assert len(patch) == 12 * 6 and set(patch["kind"]) == {"pooled_towards_a"}
    assert sorted(set(zip(patch["layer"], patch["head"]))) == [(l, h) for l in range(1, 13) for h in range(1, 7)]
    assert np.isfinite(patch["effect"]).all() and patch["effect"].abs().max() > 0

    assert main(typed("heads_ablate")) == 0
    ablate = pd.read_parquet("ablate/effects.parquet")
    assert len(ablate) == 6 * 4 and set(ablate["layer"]) == {12} and set(ablate["head"]) == set(range(1, 7))
    assert set(ablate["kind"]) == {"pooled_cosine"} and ablate["effect"].between(-1, 1 + 1e-6).all()
    assert json.loads(Path("ablate/settings.json").read_text())["mode"] == "mean"


@pytest.mark.slow
def test_the_gpu_pages_device_line_runs_where_cuda_is_or_on_the_cpu(folder):
    """docs/how-to/gpu.md's line on the bundled model itself (one photo: seconds): ``--device auto`` takes CUDA when
    there is one, else MPS, else the CPU, and settings.json says which."""
    import torch

    assert main(typed("gpu_auto")) == 0
    model = json.loads(Path("out/settings.json").read_text())["model"]
    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert (model["device"].split(":")[0], model["dtype"], model["spec"]["device"]) == (expected, "float32", "auto")
