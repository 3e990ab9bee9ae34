"""Issue 9, "safe to share": each hostile input is generated here, refused with a sentence, memory bounded.

Peak memory is read from /proc/self/status (VmHWM) in a fresh subprocess, so one test's
allocations never hide another's.
"""
import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file
from streamlit.testing.v1 import AppTest

from conftest import ASSETS
from vitviz.sources import bundled
from vitviz.sources.budget import admit, architecture, check_resolution
from vitviz.errors import ImageError, ModelError, first_line
from vitviz.io.images import LoadedImage, frame_image, load_image
from vitviz.sources.preprocess import preprocess
from vitviz.sources.checkpoints import read_checkpoint
from vitviz.sources.models import ModelSpec, load_model
from vitviz.settings import SettingError, Settings

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
MiB = 1 << 20
CONFIG = {"input_size": (3, 224, 224), "interpolation": "bicubic", "mean": (0.5,) * 3, "std": (0.5,) * 3,
          "crop_pct": 0.875, "crop_mode": "center"}


def _peak(code: str, env: dict | None = None) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line. VmHWM is reset after imports by
    writing 5 to /proc/self/clear_refs, so ``peak_mib`` is what the code itself took on top of them."""
    prelude = textwrap.dedent("""
        import json, re
        from pathlib import Path
        def _status(key):
            return int(re.search(key + r":\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024
        def start():
            Path("/proc/self/clear_refs").write_text("5")
            return _status("VmRSS")
        def peak_mib(base):
            return _status("VmHWM") - base
    """)
    out = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                         cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)} | (env or {}), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _png(array: np.ndarray, bits16: bool = False) -> bytes:
    """A PNG written by hand (Pillow cannot write 16-bit RGB): 8-bit grey or 16-bit RGB."""
    h, w = array.shape[:2]
    colour, depth = (2, 16) if bits16 else (0, 8)
    rows = array.astype(">u2" if bits16 else np.uint8).reshape(h, -1)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _strip_png(width=700_000, height=8) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (width, height)).save(buffer, "PNG")
    return buffer.getvalue()


# 1. Input resolution over the attention budget ------------------------------------------------

def test_resolution_over_budget_names_the_largest_size_that_fits():
    arch = architecture("bundled")
    assert (arch.depth, arch.heads, arch.patch, arch.prefix_tokens) == (12, 6, (14, 14), 1)
    # By hand: 12 * 6 * (74*74 + 1)^2 * 4 bytes at 1036 px; 560 px (40x40 + 1 tokens) fits 750 MiB, 574 px does not.
    assert arch.attention_bytes(1036) == 12 * 6 * 5477 ** 2 * 4
    assert 12 * 6 * 1601 ** 2 * 4 <= 750 * MiB < 12 * 6 * 1682 ** 2 * 4
    with pytest.raises(ModelError) as err:
        admit(ModelSpec(img_size=1036), Settings(cache_bytes=1500 * MiB))
    message = str(err.value)
    assert "Input resolution 1036 px" in message and "8.0 GiB" in message
    assert "12 layers x 6 heads x 5477x5477 tokens" in message
    assert "the largest size that fits is 560 px" in message
    admit(ModelSpec(img_size=518), Settings(cache_bytes=1500 * MiB))  # 516 MiB: fits
    with pytest.raises(ModelError, match="over this server's cap of 448 px"):
        check_resolution("bundled", 518, 1 << 40, max_img_size=448)


@pytest.mark.slow
def test_app_refuses_1036_px_before_running_the_model():
    result = _peak("""
        from streamlit.testing.v1 import AppTest
        at = AppTest.from_file("app.py", default_timeout=180).run()
        base = start()
        at.sidebar.number_input(key="img_size").set_value(1036).run()
        print(json.dumps({"errors": [e.value for e in at.error], "peak": peak_mib(base),
                          "exceptions": [e.message for e in at.exception]}))
    """, {"VITVIZ_CACHE_MB": "1500"})
    assert not result["exceptions"]
    assert any("Input resolution 1036 px" in e and "largest size that fits is 560 px" in e for e in result["errors"])
    print(f"peak extra memory refusing 1036 px: {result['peak']:.0f} MiB")
    assert result["peak"] < 300  # the model never ran at 1036 px (8 GiB of attention)


# 2. Absurd aspect ratios and every resize step bounded ----------------------------------------

def test_strip_png_is_refused_at_decode_with_its_aspect_ratio():
    data = _strip_png()
    assert len(data) < 20_000 and 700_000 * 8 < 40_000_000  # small file, under the megapixel guard
    with pytest.raises(ImageError) as err:
        load_image(data, "strip.png")
    assert str(err.value).startswith("strip.png: is 700000x8 pixels, an aspect ratio of 87500:1, over the limit of 100:1")


def test_every_resize_step_is_bounded_before_it_allocates():
    result = _peak("""
        from PIL import Image
        from vitviz.errors import ImageError
        from vitviz.sources.preprocess import preprocess
        cfg = {"input_size": (3, 224, 224), "interpolation": "bicubic", "mean": (0.5,) * 3, "std": (0.5,) * 3,
               "crop_pct": 0.875, "crop_mode": "center"}
        strip = Image.new("RGB", (200_000, 8))  # 4.8 MB; scaled to a 256 px short side: 1.6 gigapixels
        preprocess([Image.new("RGB", (300, 300))], cfg)  # timm's transforms imported before the measurement
        base = start()
        try:
            preprocess([strip], cfg)
            message = None
        except ImageError as exc:
            message = str(exc)
        print(json.dumps({"message": message, "peak": peak_mib(base)}))
    """)
    assert result["message"] == ("200000x8 image: would become 1638 megapixels in the model's Resize step, "
                                 "over the limit of 40 megapixels")
    print(f"peak extra memory refusing the strip: {result['peak']:.0f} MiB")
    assert result["peak"] < 50  # the resize alone would have taken 4.9 GB
    assert preprocess([Image.new("RGB", (2000, 80))], CONFIG).tensor.shape == (1, 3, 224, 224)  # 25:1 still works


def test_padding_a_long_image_never_makes_a_huge_canvas():
    wide = LoadedImage("wide.png", Image.new("RGB", (8000, 100), (255, 0, 0)), "abc")
    padded = frame_image(wide, "pad", (1, 2, 3))
    assert padded.image.size == (4096, 4096)  # not 8000x8000 (192 MB)
    assert np.asarray(padded.image)[2048, 2048].tolist() == [255, 0, 0]
    assert np.asarray(padded.image)[0, 0].tolist() == [1, 2, 3]
    assert any("scaled to a 4096 px side first" in n for n in padded.notes)


# 3. Checkpoint zip bombs and safetensors headers ----------------------------------------------

def _zip_bomb(path: Path, unpacked: int) -> None:
    """A real torch.save file whose storage record is replaced by ``unpacked`` deflated zero bytes."""
    torch.save({"pos_embed": torch.zeros(4)}, path)
    with zipfile.ZipFile(path) as src:
        records = {info.filename: src.read(info) for info in src.infolist()}
    storage = next(name for name in records if name.endswith("/data/0"))
    zeros = bytes(16 * MiB)
    record = zipfile.ZipInfo(storage)
    record.compress_type = zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "w") as out:
        for name, data in records.items():
            if name != storage:
                out.writestr(name, data)
        with out.open(record, "w", force_zip64=True) as f:
            for _ in range(unpacked // len(zeros)):
                f.write(zeros)


@pytest.mark.slow
def test_zip_bomb_checkpoint_is_refused_from_its_central_directory(tmp_path):
    bomb = tmp_path / "bomb.pth"
    _zip_bomb(bomb, 512 * MiB)
    assert bomb.stat().st_size < 2 * MiB
    result = _peak(f"""
        from vitviz.errors import ModelError
        from vitviz.sources.models import ModelSpec, load_model
        try:  # imports and the meta-device build first, so the measurement sees only the checkpoint
            load_model(ModelSpec(name="vit_tiny_patch16_224", checkpoint="warm-up.pth"))
        except ModelError:
            pass
        base = start()
        try:
            load_model(ModelSpec(name="vit_tiny_patch16_224", checkpoint={str(bomb)!r}))
            message = None
        except ModelError as exc:
            message = str(exc)
        print(json.dumps({{"message": message, "peak": peak_mib(base)}}))
    """)
    assert result["message"].startswith("Checkpoint bomb.pth: its contents would take 512 MiB once unpacked, "
                                        "more than vit_tiny_patch16_224 (22 MiB of float32 weights) can use")
    assert "vitviz does not unpack it" in result["message"]
    print(f"peak extra memory refusing a 512 MiB zip bomb: {result['peak']:.0f} MiB")
    assert result["peak"] < 100  # torch.load would have unpacked all 512 MiB


def test_safetensors_header_declaring_gigabytes_is_refused(tmp_path):
    header = json.dumps({"pos_embed": {"dtype": "F32", "shape": [1 << 28], "data_offsets": [0, 1 << 30]}}).encode()
    lying = tmp_path / "lying.safetensors"
    lying.write_bytes(struct.pack("<Q", len(header)) + header + bytes(64))
    with pytest.raises(ModelError, match=r"lying.safetensors: its contents would take 1.0 GiB once unpacked"):
        load_model(ModelSpec(name="vit_tiny_patch16_224", checkpoint=str(lying)))
    huge_header = tmp_path / "header.safetensors"
    huge_header.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ModelError, match="header.safetensors: it could not be read .*claims 1099511627776 bytes"):
        load_model(ModelSpec(name="vit_tiny_patch16_224", checkpoint=str(huge_header)))


# 7. Smaller findings --------------------------------------------------------------------------

def test_empty_checkpoint_and_empty_exception_messages_are_sentences(tmp_path):
    empty = tmp_path / "empty.pth"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match=r"^Checkpoint empty.pth: it is empty \(0 bytes\)\.$"):
        load_model(ModelSpec(name="vit_tiny_patch16_224", checkpoint=str(empty)))
    assert first_line(IndexError()) == "IndexError"
    assert first_line(ValueError("bad\nmore")) == "ValueError: bad"


def test_path_box_does_not_tell_whether_a_non_checkpoint_file_exists(tmp_path):
    existing = tmp_path / "secret.txt"
    existing.write_text("x")
    answers = []
    for path in (existing, tmp_path / "absent.txt"):
        with pytest.raises(ModelError) as err:
            read_checkpoint(path)
        answers.append(str(err.value).replace(path.name, "NAME"))
    assert answers[0] == answers[1] and "unsupported file type" in answers[0]


@pytest.mark.slow
def test_corrupt_bundled_cache_with_a_matching_digest_is_rebuilt(tmp_path):
    cache = tmp_path / bundled.CACHE_FILE
    cache.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + bytes(100))
    digest = hashlib.sha256(cache.read_bytes()).hexdigest()
    cache.with_name(cache.name + ".sha256").write_text(digest + "\n")
    state, where = bundled.load_state_dict(tmp_path)
    assert where.startswith(f"the cached conversion at {cache} could not be read (SafetensorError")
    assert "so it was rebuilt; converted from" in where
    assert state["pos_embed"].shape == (1, 1 + 37 * 37, 384)
    assert bundled.load_state_dict(tmp_path)[1] == f"cached conversion at {cache}"  # healthy again


def test_48_bit_rgb_gets_a_note():
    values = np.zeros((9, 9, 3), np.uint16)
    values[..., 0] = 0x80FF  # the high byte survives, the low byte is lost
    loaded = load_image(_png(values, bits16=True), "deep.png")
    assert "48-bit RGB (16 bits per channel) reduced to 8 bits per channel" in loaded.notes
    assert np.asarray(loaded.image)[0, 0].tolist() == [0x80, 0, 0]
    assert not load_image(_png(np.zeros((9, 9))), "grey.png").notes


# 4. One byte budget, LRU by size -----------------------------------------------------------------

def test_byte_lru_evicts_the_least_recently_used_by_size():
    from ui.memo import ByteLRU, nbytes

    cache = ByteLRU(budget=int(2.5 * MiB))
    block = lambda: np.zeros(MiB, np.uint8)  # noqa: E731
    for key in "abc":
        cache.get_or_compute(key, block)
    assert cache.keys() == ["b", "c"] and cache.used == 2 * MiB  # a went first
    cache.get_or_compute("b", lambda: pytest.fail("b is cached"))
    cache.get_or_compute("d", block)
    assert cache.keys() == ["b", "d"]  # c was the least recently used
    cache.get_or_compute("big", lambda: np.zeros(4 * MiB, np.uint8))
    assert cache.keys() == ["big"]  # the newest stays even over the budget
    shared = np.zeros(10, np.float64)
    assert nbytes([shared, torch.nn.Linear(2, 3), shared]) == 80 + (6 + 3) * 4  # counted once


def test_byte_lru_computes_a_key_once_for_concurrent_callers():
    from ui.memo import ByteLRU

    cache, calls, gate = ByteLRU(MiB), [], threading.Event()

    def slow():
        calls.append(1)
        gate.wait(5)
        return np.ones(4)

    threads = [threading.Thread(target=cache.get_or_compute, args=("k", slow)) for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert len(calls) == 1


@pytest.mark.slow
def test_analysing_one_image_takes_at_most_twice_its_attention():
    result = _peak("""
        import gc
        from vitviz.io.images import load_image
        from vitviz.sources.models import ModelSpec, load_model
        import ui.cache as cache
        spec = ModelSpec(img_size=518)
        loaded = load_model(spec)
        cache.cached_model = lambda s: loaded
        image = load_image("assets/chelsea.jpg").image
        gc.collect()
        base = start()
        result = cache._image_result(spec, image)
        print(json.dumps({"attention": result.attention.nbytes / 2**20, "peak": peak_mib(base)}))
    """)
    print(f"bundled @518: attention {result['attention']:.0f} MiB, peak extra {result['peak']:.0f} MiB")
    assert result["attention"] == pytest.approx(12 * 6 * 1370 ** 2 * 4 / MiB)
    assert result["peak"] <= 2 * result["attention"]  # no float64 copy of the whole (L, H, N, N) array


# 5 and shared mode: the model box never builds what it will refuse -------------------------------------

def test_shared_mode_settings_and_allow_list(monkeypatch):
    import timm

    shared = Settings.from_env({"VITVIZ_SHARED": "1", "VITVIZ_CACHE_MB": "2000"})
    assert shared.shared and shared.cache_bytes == 2000 * MiB and shared.max_images == 8
    assert shared.max_img_size == 518 and "vit_small_patch16_224.dino" in shared.models
    local = Settings.from_env({"VITVIZ_CACHE_MB": "2000"})
    assert not local.shared and local.models is None and local.max_images is None
    monkeypatch.setattr(timm, "create_model", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(ModelError, match=r"'vit_giant_patch14_dinov2' is not on this server's allow-list "
                                         r"\(VITVIZ_MODELS: bundled, vit_base"):
        admit(ModelSpec(name="vit_giant_patch14_dinov2"), shared)
    with pytest.raises(ModelError, match=r"Device 'cuda' is not allowed on this server \(VITVIZ_DEVICES: cpu\)"):
        admit(ModelSpec(device="cuda"), Settings.from_env({"VITVIZ_DEVICES": "cpu"}))
    with pytest.raises(SettingError, match=r"VITVIZ_CACHE_MB=.lots. is not a positive whole number"):
        Settings.from_env({"VITVIZ_CACHE_MB": "lots"})


def test_failed_download_builds_nothing(monkeypatch):
    """Online but the download fails: the weights are fetched first, so no model is ever built."""
    import huggingface_hub
    import timm

    from vitviz.sources import models

    built = []
    real_create = timm.create_model
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout=1.0: True)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: (_ for _ in ()).throw(OSError("reset")))
    monkeypatch.setattr(timm, "create_model",
                        lambda *a, **k: built.append(k.get("pretrained")) or real_create(*a, **k))
    with pytest.raises(ModelError, match=r"'vit_small_patch16_224.dino' could not be loaded: downloading its "
                                         r"weights failed \(OSError: reset\)"):
        load_model(ModelSpec(name="vit_small_patch16_224.dino"))
    assert True not in built  # only the meta-device architecture was made


# The app: failures cached per session, server-side upload limit, shared mode, uploads deleted -----------

@pytest.fixture
def operator_env(monkeypatch):
    """Set operator environment variables for one AppTest; the cached settings and store follow them."""
    import ui.cache

    def apply(**env):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        ui.cache.operator_settings.clear()
        ui.cache.store.clear()

    yield apply
    monkeypatch.undo()
    ui.cache.operator_settings.clear()
    ui.cache.store.clear()


@pytest.mark.slow
def test_a_failing_model_is_tried_once_per_session(monkeypatch):
    import ui.cache

    calls = []
    real = ui.cache.load_model
    monkeypatch.setattr(ui.cache, "load_model", lambda spec: calls.append(spec.name) or real(spec))
    at = AppTest.from_file(APP, default_timeout=180).run()
    at.sidebar.selectbox(key="model_choice").set_value("timm model by name").run()
    at.sidebar.selectbox(key="timm_name").set_value("deit3_small_patch16_224.fb_in1k").run()
    for framing in ("pad", "crop"):  # reruns with the same model setting
        at.sidebar.radio(key="framing").set_value(framing).run()
    assert not at.exception
    assert calls.count("deit3_small_patch16_224.fb_in1k") == 1
    assert any("'deit3_small_patch16_224.fb_in1k' could not be loaded" in e.value for e in at.error)


@pytest.mark.slow
def test_server_checks_the_upload_size_itself(operator_env):
    operator_env(VITVIZ_UPLOAD_MB="1")
    big = _png(np.random.default_rng(0).integers(0, 256, (1200, 1200)))
    assert len(big) > MiB
    at = AppTest.from_file(APP, default_timeout=180).run()
    at.sidebar.file_uploader(key="uploads").set_value([("big.png", big, "image/png")]).run()
    assert not at.exception
    assert any(e.value.startswith("big.png: it is 1 MiB, over this server's upload limit of 1 MiB (VITVIZ_UPLOAD_MB)")
               for e in at.error)
    assert "big.png" not in at.sidebar.selectbox(key="current").options


@pytest.mark.slow
def test_shared_mode_has_no_path_box_and_builds_nothing_off_the_allow_list(operator_env, monkeypatch):
    import timm

    operator_env(VITVIZ_SHARED="1")
    at = AppTest.from_file(APP, default_timeout=180).run()
    monkeypatch.setattr(timm, "create_model", lambda *a, **k: pytest.fail("a model was built"))
    at.sidebar.selectbox(key="model_choice").set_value("timm model by name").run()
    assert not any(t.key == "ckpt_path" for t in at.sidebar.text_input)
    at.sidebar.text_input(key="timm_query").input("vit_giant").run()
    assert not at.exception
    assert at.sidebar.selectbox(key="timm_name").options == []
    assert any("none of them on this server's allow-list (VITVIZ_MODELS" in w.value for w in at.sidebar.warning)
    assert any("shared server" in c.value for c in at.sidebar.caption)


@pytest.mark.slow
def test_uploaded_checkpoint_is_deleted_after_loading(monkeypatch):
    torch.manual_seed(0)
    import timm

    import vitviz.sources.checkpoints

    state = timm.create_model("vit_tiny_patch16_224", pretrained=False).state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    # Where the loader really read the upload from, seen by the loader, not re-derived here.
    read, real = [], vitviz.sources.checkpoints.read_checkpoint
    monkeypatch.setattr(vitviz.sources.checkpoints, "read_checkpoint",
                        lambda path, *a, **k: read.append((Path(path), Path(path).read_bytes() == data)) or real(path, *a, **k))
    at = AppTest.from_file(APP, default_timeout=180).run()
    at.sidebar.selectbox(key="model_choice").set_value("timm model by name").run()
    at.sidebar.text_input(key="timm_query").input("vit_tiny_patch16_224").run()
    at.sidebar.file_uploader(key="ckpt").set_value(("tiny.pth", data, "application/octet-stream")).run()
    at.sidebar.selectbox(key="timm_name").set_value("vit_tiny_patch16_224").run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert any("vit_tiny_patch16_224" in c.value for c in at.sidebar.caption)
    assert [ok for _, ok in read] == [True]  # read once, and it held the uploaded bytes then
    folder = read[0][0].parent
    assert folder.name.startswith("vitviz-ckpt-") and not folder.exists()
    at.sidebar.radio(key="framing").set_value("pad").run()  # a rerun needs no file: the model is cached
    assert not at.error and not folder.exists() and len(read) == 1


# Concurrent model runs: VITVIZ_MAX_RUNS -------------------------------------------------------------

def test_max_runs_defaults_to_two_when_shared_and_no_limit_locally():
    assert Settings.from_env({}).max_runs is None
    assert Settings.from_env({"VITVIZ_SHARED": "1"}).max_runs == 2
    assert Settings.from_env({"VITVIZ_SHARED": "1", "VITVIZ_MAX_RUNS": "3"}).max_runs == 3
    with pytest.raises(SettingError, match="VITVIZ_MAX_RUNS='0' is not a positive whole number"):
        Settings.from_env({"VITVIZ_MAX_RUNS": "0"})


def test_the_run_over_the_limit_waits_and_every_run_gives_the_serial_result():
    from conftest import tiny_model
    from ui.runs import RunLimiter
    from vitviz.trace import trace_for_analysis as capture

    model = tiny_model("dinov2_reg")
    torch.manual_seed(1)
    inputs = [torch.randn(1, 3, 70, 70) for _ in range(3)]
    serial = [capture(model, x) for x in inputs]
    limiter, gate, lock = RunLimiter(2), threading.Event(), threading.Lock()
    inside, peak, waits, results = set(), [0], [], [None] * 3

    def work(i):
        def on_wait(n):
            waits.append((i, n))
            gate.set()  # the first two runs finish only once the third has been told to wait

        with limiter.slot(on_wait):
            with lock:
                inside.add(i)
                peak[0] = max(peak[0], len(inside))
            gate.wait(10)
            results[i] = capture(model, inputs[i])
            with lock:
                inside.discard(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads[:2]:
        t.start()
    while limiter.running < 2:
        threading.Event().wait(0.01)
    threads[2].start()
    for t in threads:
        t.join(30)
    assert waits == [(2, 2)] and peak[0] == 2 and limiter.running == 0
    for got, want in zip(results, serial):
        assert torch.equal(got.stack("attn"), want.stack("attn")) and torch.equal(got["final_norm"], want["final_norm"])


def test_a_run_inside_a_run_uses_its_own_slot():
    from ui.runs import RunLimiter

    limiter = RunLimiter(1)
    with limiter.slot(), limiter.slot():  # faithfulness asking for gradient rollout: no deadlock
        assert limiter.running == 1
    assert limiter.running == 0


def test_a_waiting_session_is_told_how_many_runs_are_ahead(monkeypatch):
    import ui.cache
    from ui.runs import RunLimiter

    shown = []

    class Notice:
        def info(self, text):
            shown.append(text)

        def empty(self):
            shown.append(None)

    limiter = RunLimiter(1)
    monkeypatch.setattr(ui.cache, "run_limiter", lambda: limiter)
    monkeypatch.setattr(ui.cache.st, "empty", Notice)
    held, release = threading.Event(), threading.Event()

    def other_session():
        with limiter.slot():
            held.set()
            release.wait(10)

    threading.Thread(target=other_session).start()
    held.wait(10)
    threading.Timer(0.2, release.set).start()
    with ui.cache.model_run():
        assert limiter.running == 1
    assert shown == ["Waiting for 1 other run to finish (this server runs at most 1 at once) ...", None]
