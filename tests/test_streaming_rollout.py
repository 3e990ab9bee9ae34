"""Rollout as a row-vector chain equals the matrix products; `analyze` streams, is interruptible and atomic."""
import itertools

import numpy as np
import pytest
import torch

from vitviz.trace import trace_for_analysis as capture
from vitviz.sources.preprocess import preprocess
from vitviz.layout import TokenLayout
from vitviz.analyses.rollout import gradient_rollout, gradient_rollout_reference, rollout, rollout_reference
from vitviz.analyses.tokens import artifact_tokens, attention_sinks


def random_attention(rng, L, H, N, sharp=3.0):
    logits = rng.normal(scale=sharp, size=(L, H, N, N))
    a = np.exp(logits - logits.max(-1, keepdims=True))
    return (a / a.sum(-1, keepdims=True)).astype(np.float32)


def layout_for(prefix, grid):
    return TokenLayout(prefix_tokens=prefix, grid_size=grid, patch_size=(16, 16), global_pool="token",
                       pos_embed_prefix_rows=len(prefix))


def assert_same_rollout(chain, matrix):
    np.testing.assert_allclose(chain.per_layer, matrix.per_layer, rtol=0, atol=1e-10)
    np.testing.assert_allclose(chain.map, matrix.map, rtol=0, atol=1e-10)
    assert chain.prefix_share.keys() == matrix.prefix_share.keys()
    for name in chain.prefix_share:
        assert abs(chain.prefix_share[name] - matrix.prefix_share[name]) < 1e-10
    assert chain.layers == matrix.layers and chain.readout == matrix.readout


@pytest.mark.parametrize("prefix, grid, L", [(("cls",), (3, 4), 5), ((), (4, 4), 3), (("cls", "dist"), (5, 3), 4),
                                             (("cls", "reg0", "reg1", "reg2", "reg3"), (6, 6), 6)])
def test_rollout_chain_equals_matrix_products_on_random_attention(prefix, grid, L):
    rng = np.random.default_rng(len(prefix) * 10 + L)
    layout = layout_for(prefix, grid)
    attention = random_attention(rng, L, 3, layout.num_tokens)
    excluded = [(), (layout.num_prefix_tokens + 2,), tuple(range(layout.num_prefix_tokens, layout.num_prefix_tokens + 3))]
    for fusion, discard, (start, end), exclude in itertools.product(
            ("mean", "max", "min"), (0.0, 0.3, 0.9), [(0, None), (1, L), (0, 1), (L - 2, L - 1)], excluded):
        kwargs = dict(fusion=fusion, discard=discard, start=start, end=end, exclude_tokens=exclude)
        assert_same_rollout(rollout(attention, layout, **kwargs), rollout_reference(attention, layout, **kwargs))


@pytest.mark.slow
def test_rollout_chain_equals_matrix_products_on_the_bundled_model(bundled, sample_images):
    batch = preprocess([sample_images[0].image], bundled.data_config)
    out = capture(bundled.model, batch.tensor)
    attention, layout = out.stack("attn")[0].numpy(), out.layout
    sinks = attention_sinks(attention, layout).patch_sinks(layout) + layout.num_prefix_tokens
    artifacts = artifact_tokens(out.stack("resid_post.norm")[0, -1].numpy(), layout)
    assert len(sinks)  # this model has sinks, so the exclusion below changes the result
    for fusion, discard, (start, end), exclude in itertools.product(
            ("mean", "max", "min"), (0.0, 0.5, 0.9), [(0, None), (2, 12), (5, 6), (0, 11)],
            [(), tuple(sinks), tuple(artifacts)]):
        kwargs = dict(fusion=fusion, discard=discard, start=start, end=end, exclude_tokens=exclude)
        assert_same_rollout(rollout(attention, layout, **kwargs), rollout_reference(attention, layout, **kwargs))


@pytest.mark.parametrize("prefix", [("cls",), (), ("cls", "reg0")])
def test_gradient_rollout_chain_equals_matrix_products(prefix):
    rng = np.random.default_rng(7)
    layout = layout_for(prefix, (4, 5))
    attention = random_attention(rng, 4, 3, layout.num_tokens)
    gradients = rng.normal(size=attention.shape).astype(np.float32)
    chain = gradient_rollout(attention, gradients, layout)
    np.testing.assert_allclose(chain, gradient_rollout_reference(attention, gradients, layout), rtol=0, atol=1e-10)
    assert chain.shape == (4, 5) and chain.max() > 0.01  # a real signal, not zeros on both sides


def test_rollout_chain_hand_example_cumulative_maps():
    # Two layers, one patch grid of 2 tokens + CLS; A1 sends CLS to patch 0, A2 sends CLS to patch 1.
    layout = layout_for(("cls",), (1, 2))
    a1 = np.array([[0, 1, 0], [0, 1, 0], [0, 0, 1]], np.float32)
    a2 = np.array([[0, 0, 1], [0, 1, 0], [0, 0, 1]], np.float32)
    attention = np.stack([a1, a2])[:, None]
    r = rollout(attention, layout)
    # After layer 1: CLS row of 0.5 A1 + 0.5 I = [0.5, 0.5, 0].
    np.testing.assert_allclose(r.per_layer[0], [[0.5, 0.0]])
    # After layer 2: [0.5, 0, 0.5] @ A1' = 0.25 CLS + 0.25 patch 0 + 0.5 patch 1.
    np.testing.assert_allclose(r.per_layer[1], [[0.25, 0.5]])
    assert r.prefix_share == {"cls": pytest.approx(0.25)}



@pytest.mark.parametrize("prefix, grid", [(("cls",), (3, 4)), ((), (4, 4)), (("cls", "reg0", "reg1"), (5, 3))])
def test_clicked_patch_rollout_chain_equals_matrix_products(prefix, grid):
    rng = np.random.default_rng(11)
    layout = layout_for(prefix, grid)
    attention = random_attention(rng, 5, 3, layout.num_tokens)
    for query, fusion, discard, (start, end), exclude in itertools.product(
            (0, layout.num_patches - 1, 5), ("mean", "max"), (0.0, 0.6), [(0, None), (1, 4)],
            [(), (len(prefix) + 2,)]):
        kwargs = dict(fusion=fusion, discard=discard, start=start, end=end, exclude_tokens=exclude, query=query)
        chain = rollout(attention, layout, **kwargs)
        assert_same_rollout(chain, rollout_reference(attention, layout, **kwargs))
        assert chain.readout == f"patch {query} (raster order, 0-based)"


def test_clicked_patch_rollout_hand_example():
    # Layer 1: patch 1 attends only to patch 0. Layer 2: patch 0 attends only to CLS. Read out patch 1, then patch 0.
    layout = layout_for(("cls",), (1, 2))
    a1 = np.array([[1, 0, 0], [0, 1, 0], [0, 1, 0]], np.float32)
    a2 = np.array([[1, 0, 0], [1, 0, 0], [0, 0, 1]], np.float32)
    r = rollout(np.stack([a1, a2])[:, None], layout, query=1)
    # After layer 1: row 2 of 0.5 A1 + 0.5 I = [0, 0.5, 0.5].
    np.testing.assert_allclose(r.per_layer[0], [[0.5, 0.5]])
    # After layer 2: row 2 of A2' = [0, 0, 1], times A1' -> [0, 0.5, 0.5]: patch 1 keeps itself in layer 2.
    np.testing.assert_allclose(r.per_layer[1], [[0.5, 0.5]])
    r0 = rollout(np.stack([a1, a2])[:, None], layout, query=0)
    # Patch 0: layer 2 row [0.5, 0.5, 0] (half to CLS) then A1' rows: 0.5 [1, 0, 0] + 0.5 [0, 1, 0].
    np.testing.assert_allclose(r0.map, [[0.5, 0.0]])
    assert r0.prefix_share == {"cls": pytest.approx(0.5)}

# ---------------------------------------------------------------- analyze: streaming, atomic, interruptible
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from PIL import Image  # noqa: E402

from vitviz.io.output import run_id_of  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL = "deit_tiny_patch16_224"
# Only a hung child is stopped at this age: a test never fails for being slow (machine load is not a bug).
HANG_S = 1800


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A random deit-tiny (12 layers, 3 heads, a head: gradient rollout runs too) saved as safetensors."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model(MODEL, pretrained=False)
    path = tmp_path_factory.mktemp("ckpt") / "deit_tiny.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def make_images(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(n)
    paths = []
    for i in range(n):
        path = folder / f"img{i:03d}.png"
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def cli_args(images, out, checkpoint, *extra):
    return ["analyze", *map(str, images), "--out", str(out), "--model", MODEL, "--checkpoint", str(checkpoint),
            "--batch-size", "4", *extra]


def test_streamed_analyze_equals_an_in_memory_computation(tmp_path, tiny_checkpoint):
    from vitviz.runs.analysis import AnalysisSettings, analyze_images
    from vitviz.cli import main
    from vitviz.analyses.distance import mean_attention_distance
    from vitviz.io.images import load_image
    from vitviz.sources.models import ModelSpec, load_model

    images = make_images(tmp_path / "img", 5)  # batches of 4: one full, one partial
    out = tmp_path / "out"
    assert main(cli_args(images, out, tiny_checkpoint, "--discard", "0.3", "--start-layer", "2")) == 0
    data = np.load(out / "analysis.npz")
    settings = json.loads((out / "settings.json").read_text())
    assert settings["run_id"] == run_id_of(out / "analysis.npz")
    assert settings["arrays"] == {k: list(data[k].shape) for k in data.files}

    loaded = load_model(ModelSpec(name=MODEL, checkpoint=str(tiny_checkpoint)))
    pil = [load_image(p).image for p in images]
    # Not streamed: every image in one forward, every analysis on the whole attention.
    whole = capture(loaded.model, preprocess(pil, loaded.data_config).tensor)
    np.testing.assert_array_equal(data["input"], preprocess(pil, loaded.data_config).tensor.numpy())
    np.testing.assert_allclose(data["attention"], whole.stack("attn").numpy(), atol=1e-6)
    np.testing.assert_allclose(data["logits"], whole.logits.numpy(), atol=1e-5)
    for i in range(5):
        expected = rollout_reference(whole.stack("attn")[i].numpy(), whole.layout, discard=0.3, start=1)
        np.testing.assert_allclose(data["rollout_per_layer"][i], expected.per_layer, atol=1e-6)
    distance = mean_attention_distance(whole.stack("attn").numpy(), whole.layout)
    np.testing.assert_allclose(data["mean_distance_per_image"], distance, rtol=1e-5)
    np.testing.assert_allclose(data["mean_distance"], distance.mean(0), rtol=1e-5)
    # The app's in-memory path gives the same arrays as the stream.
    memory = analyze_images(loaded, pil, AnalysisSettings(discard=0.3, start_layer=1, batch_size=4))
    assert set(memory.arrays) == set(data.files)
    for name in data.files:
        np.testing.assert_allclose(data[name], memory.arrays[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert settings["analysis"]["gradient_rollout_targets"] == memory.info["gradient_rollout_targets"]
    assert not list(out.glob(".vitviz-*"))  # no temporary file left


# One image's attention in deit-tiny at 224 px: 12 layers x 3 heads x 197 x 197 tokens x 4 bytes (5.3 MiB).
ATTENTION_MIB = 12 * 3 * 197 ** 2 * 4 / 2 ** 20
# The CLI in a fresh process, its peak RSS (VmHWM, kB) read each time a plain progress line "k/n images" is
# written and once more at the end: how the peak grows within one run, free of the process-to-process noise
# (separate runs of 4, 8, 16 and 32 images peaked within 56 MiB of each other, not in the order of their counts).
_PEAK_PER_BATCH = """
import json, re, sys
from pathlib import Path

def hwm():
    return int(re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1))

class Stderr:
    def __init__(self, stream):
        self.stream, self.peaks = stream, {}
    def write(self, text):
        for done in re.findall(r"(\\d+)/\\d+ images", text):
            self.peaks[int(done)] = hwm()
        return self.stream.write(text)
    def __getattr__(self, name):
        return getattr(self.stream, name)

sys.stderr = Stderr(sys.stderr)
from vitviz.cli import main
rc = main(json.loads(sys.argv[1]))
print("PEAKS", json.dumps({"by_images": sys.stderr.peaks, "end": hwm()}))
sys.exit(rc)
"""


def run_cli_measuring_peak_per_batch(args) -> tuple[int, dict, str]:
    """Run the CLI in a fresh process; return (exit code, {"by_images": {images done: VmHWM kB}, "end": kB},
    stderr)."""
    result = subprocess.run([sys.executable, "-c", _PEAK_PER_BATCH, json.dumps(args)], capture_output=True, text=True,
                            cwd=ROOT, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    peaks = json.loads(result.stdout.split("PEAKS")[-1]) if "PEAKS" in result.stdout else {}
    return result.returncode, peaks, result.stderr


def assert_peak_does_not_grow(peaks: dict, steady_after: int, total: int, attention_mib: float) -> None:
    """From ``steady_after`` images on (every buffer of the batches in flight allocated by then) to the end of
    the run, the peak RSS may not grow by even half the attention of the images after it: held in memory, the
    attention of 32 more images would add 171 MiB; streamed, the peak stays that of the batches in flight
    (measured 2026-11-24, 44 images from 12 on: stats +4 MiB, analyze +35 MiB, all of it at the end, where it
    assembles the npz and computes the model's own arrays)."""
    steady = peaks["by_images"][str(steady_after)]
    grew_mib = (peaks["end"] - steady) / 1024
    assert grew_mib <= 0.5 * (total - steady_after) * attention_mib, (peaks, f"grew by {grew_mib:.0f} MiB")


@pytest.mark.slow
def test_analyze_peak_memory_does_not_grow_with_the_image_count(tmp_path, tiny_checkpoint):
    n = 44  # 11 batches of 4; the peak after 3 batches is compared with the end of the run
    images = make_images(tmp_path / "img", n)
    code, peaks, err = run_cli_measuring_peak_per_batch(cli_args(images, tmp_path / "out", tiny_checkpoint,
                                                                 "--no-attention"))
    assert code == 0, err
    assert f"{n}/{n} images" in err  # plain progress lines when stderr is not a terminal
    data = np.load(tmp_path / "out" / "analysis.npz")
    assert "attention" not in data.files and data["rollout"].shape == (n, 14, 14)
    assert_peak_does_not_grow(peaks, 12, n, ATTENTION_MIB)


@pytest.mark.slow  # kills and restarts the CLI until a kill lands mid-write
def test_sigterm_while_writing_leaves_the_previous_or_the_new_complete_result(tmp_path, tiny_checkpoint):
    out = tmp_path / "out"
    from vitviz.cli import main

    assert main(cli_args(make_images(tmp_path / "a", 2), out, tiny_checkpoint)) == 0
    first = json.loads((out / "settings.json").read_text())["run_id"]
    images = make_images(tmp_path / "b", 8)

    def complete_and_matching():
        settings = json.loads((out / "settings.json").read_text())
        assert settings["run_id"] == run_id_of(out / "analysis.npz")
        data = np.load(out / "analysis.npz")
        assert len(data["attention"]) == len(settings["images"])
        return settings["run_id"]

    outcomes = set()
    for wait_for in ("attention.raw", "analysis.npz"):  # while streaming; while assembling the npz
        proc = subprocess.Popen([sys.executable, "-m", "vitviz", *cli_args(images, out, tiny_checkpoint)],
                                cwd=ROOT, stderr=subprocess.PIPE, text=True, env=os.environ | {"HF_HUB_OFFLINE": "1"})
        # No deadline of its own: the run ends by itself, and under load (0.05 img/s was seen on a shared
        # machine) a 120 s limit failed a correct run. HANG_S only stops a run that hangs.
        while proc.poll() is None:
            if any(out.glob(f".vitviz-run-*.partial/{wait_for}")):
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.005)
        _, err = proc.communicate(timeout=HANG_S)
        run = complete_and_matching()
        assert not list(out.glob(".vitviz-*"))
        if proc.returncode == 143:
            assert err.strip().splitlines()[-1].startswith("interrupted:") and "Traceback" not in err
            outcomes.add("previous" if run == first else "new")
        else:
            assert proc.returncode == 0 and run != first
            outcomes.add("finished")
        first = run
    assert "previous" in outcomes  # the kill during streaming must have landed


def test_unwritable_out_is_a_sentence_before_the_model_loads(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    image = make_images(tmp_path / "img", 1)[0]
    result = subprocess.run([sys.executable, "-m", "vitviz", "analyze", str(image), "--out", str(blocker / "out"),
                             "--model", "not_a_model"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2
    # The model name is bad too: the folder is checked first, so the model is never looked at.
    assert result.stderr.strip() == (f"error: Cannot write the output folder --out {blocker / 'out'}: Not a directory. "
                                     "Pick a folder you can write to.")


def test_analyze_refuses_a_batch_whose_attention_does_not_fit_before_the_model_loads(tmp_path, monkeypatch, capsys):
    import vitviz.sources.models
    from vitviz.cli import main

    def must_not_load(spec):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(vitviz.sources.models, "load_model", must_not_load)
    monkeypatch.setenv("VITVIZ_CACHE_MB", "1500")  # 750 MiB of attention per batch
    images = make_images(tmp_path / "img", 2)
    # 518 px: 12 x 6 x 1370^2 x 4 bytes = 516 MiB per image; one fits, a batch of two does not;
    # 476 px: 2 x 12 x 6 x 1157^2 x 4 bytes = 736 MiB fits, 490 px: 2 x 12 x 6 x 1226^2 x 4 = 826 MiB does not.
    assert main(["analyze", *map(str, images), "--out", str(tmp_path / "out"), "--img-size", "518",
                 "--batch-size", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: Input resolution 518 px: the bundled model's attention for a batch of 2 images would take "
                   "1.0 GiB (2 images x 12 layers x 6 heads x 1370x1370 tokens x 4 bytes), over this server's limit "
                   "of 750 MiB per batch (half of VITVIZ_CACHE_MB); the largest size that fits is 476 px (or a "
                   "smaller --batch-size: one image needs 516 MiB).")
    assert main(["analyze", str(images[0]), "--out", str(tmp_path / "out"), "--img-size", "1036"]) == 2
    assert "the largest size that fits is 560 px." in capsys.readouterr().err
    assert not list((tmp_path / "out").iterdir())
