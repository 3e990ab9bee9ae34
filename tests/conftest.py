"""Shared fixtures. Every test runs offline: the hub is unreachable and must never be needed."""
import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
# One converted copy of the bundled weights per test session, always away from the user's cache (even
# when VITVIZ_CACHE names one), removed when the session ends (pytest_unconfigure). pytest-xdist's workers
# inherit the controller's environment: they share its folder (one conversion, not one per worker; the
# cache is written through a rename) and the controller, which outlives them, removes it.
_OWN_CACHE = not (os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("VITVIZ_TEST_CACHE"))
_TEST_CACHE = tempfile.mkdtemp(prefix="vitviz-test-cache-") if _OWN_CACHE else os.environ["VITVIZ_TEST_CACHE"]
os.environ["VITVIZ_CACHE"] = os.environ["VITVIZ_TEST_CACHE"] = _TEST_CACHE
# AppTests read the server-drawn Plotly grids; the browser explorer has its own browser test.
os.environ.setdefault("VITVIZ_DRAW", "server")
# Ray starts its worker processes at nice 15 (raylet's worker_niceness): beside the other test processes
# on CI's two cores they got almost no CPU, and each Ray test waited 120-180 s for 15 s of work (20 s
# alone; 120 s beside two busy loops, 32 s with this). The tests' Ray workers compete like everything else.
os.environ.setdefault("RAY_worker_niceness", "0")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import timm  # noqa: E402
import torch  # noqa: E402

ASSETS = Path(__file__).resolve().parent.parent / "assets"
# float32's unit roundoff: one correctly rounded float32 operation is off by at most this, relatively.
# Tolerances of float32 results are written as multiples of it, with the count derived in a comment.
F32_U = 2.0 ** -24


def entropy_float32_atol(keys: int) -> float:
    """How far (nats) :func:`vitviz.analyses.maps._entropy` of float32 rows may be from the float64 computation.

    With K keys: the float32 row sum is within (K-1)u of exact in any order, so p = r / sum is within
    Ku (first order); log p is then off by Ku absolutely (dp/p) plus its own rounding, at most one ulp
    (2u|log p|, vectorised logs are not always correctly rounded); the product p·log p adds u
    relatively; the float64 sum adds nothing that shows. Per term |Δ| <= p|log p|·(K+3)u + p·Ku, and
    over a row (Σp = 1, Σp|log p| = H <= log K): |ΔH| <= u·((K+3)·log K + K), 1.2e-4 nats at K = 256
    (a mean over query rows keeps the bound).
    """
    import math

    return F32_U * ((keys + 3) * math.log(keys) + keys)

# Tiny random models of each family capture must handle: (timm name, extra kwargs).
TINY = dict(depth=2, embed_dim=64, num_heads=4, img_size=64)
FAMILIES = {
    "vit_augreg": ("vit_base_patch16_224.augreg_in21k_ft_in1k", {}),
    "deit_distilled": ("deit_tiny_distilled_patch16_224", {}),
    "deit3": ("deit3_small_patch16_224", {}),
    "dino": ("vit_small_patch16_224.dino", {"num_classes": 0}),
    "dinov2_reg": ("vit_small_patch14_reg4_dinov2", {"img_size": 70}),
    "dinov2": ("vit_small_patch14_dinov2", {"img_size": 70}),
    "clip": ("vit_base_patch16_clip_224.openai", {}),
    "siglip": ("vit_base_patch16_siglip_224", {"num_classes": 10}),
    "gap": ("vit_base_patch16_gap_224", {}),
    "patch32_rect": ("vit_base_patch32_224", {"img_size": (64, 96)}),
}


def pytest_unconfigure(config):
    import shutil

    if _OWN_CACHE:
        shutil.rmtree(_TEST_CACHE, ignore_errors=True)


@pytest.fixture
def network_calls(monkeypatch):
    """Every attempt to open a connection, recorded as its ``timeout`` and refused as a machine without
    a network would (so a test that turns offline mode off can never download). Returns the list."""
    import socket

    from vitviz.sources import hub

    calls = []

    def refuse(address, timeout=None, *args, **kwargs):
        calls.append(timeout)
        raise OSError("no network in the tests")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(hub.socket, "create_connection", refuse)
    monkeypatch.setattr(hub, "_probe", {})  # probe afresh, not the answer of an earlier test
    return calls


def tiny_model(family: str, seed: int = 0) -> torch.nn.Module:
    name, extra = FAMILIES[family]
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, **(TINY | extra))
    # Random init leaves LayerScale/heads near zero; randomise so a wrong forward shows.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.fixture(scope="session")
def app_servers():
    """App servers shared by this process's browser test files, one per drawing mode (tests/loadtest.py)."""
    from loadtest import SharedServers

    servers = SharedServers()
    yield servers
    servers.close()


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray (2 CPUs) for every Ray test of this test process, started once (~10 s of two cores each time)
    and shut down at the end. A command run with ``--engine ray`` in this process joins it
    (:func:`vitviz.runs.engines.start_ray` reuses a running Ray), so a test calls the CLI's ``main(argv)`` here
    rather than a new process that starts a Ray of its own."""
    ray = pytest.importorskip("ray")
    from vitviz.runs.engines import start_ray

    start_ray(None, 2)
    yield ray
    ray.shutdown()


@pytest.fixture
def ray_session(ray_cluster):
    """The shared Ray, with this process's torch on one thread during the test, as a one-CPU actor's torch is
    (OMP_NUM_THREADS=1): both run the same kernels on the same inputs in the same order, so values computed on Ray
    equal the ones computed here to the bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield ray_cluster
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def bundled():
    from vitviz.sources.models import ModelSpec, load_model

    return load_model(ModelSpec())


@pytest.fixture(scope="session")
def sample_images():
    from vitviz.io.images import load_image

    return [load_image(ASSETS / n) for n in ("chelsea.jpg", "coffee.jpg", "astronaut.jpg", "rocket.jpg")]


def capture_in_threads(model, inputs: list[torch.Tensor]) -> list:
    """``capture`` of every input, each in its own thread at once, on one shared model."""
    import threading

    from vitviz.trace import trace_for_analysis as capture

    results = [None] * len(inputs)

    def run(i):
        results[i] = capture(model, inputs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def documented_files() -> list[Path]:
    """README.md and every page of the documentation site (docs/**/*.md): the text that tells users what to type."""
    root = ASSETS.parent
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def readme_command(prefix: str, out: Path | None) -> list[str]:
    """The one documented command line starting with ``prefix`` (in README.md or a page of docs/), as argv after
    the interpreter, with its ``--out`` pointed at ``out`` (everything else typed as it stands; ``out=None``: the
    line whole, its relative paths then read and written in the current folder). A prefix that matches two
    different lines is an error: a line added above the intended one must not be typed instead (the same line on
    two pages is one line). A ``# comment`` after the command is the shell's, not an argument.
    ``tests/test_readme_commands.py`` checks that every command line of the README and the docs is typed this way
    by some test."""
    import shlex

    lines = sorted({l for f in documented_files() for l in f.read_text().splitlines() if l.startswith(prefix)})
    assert len(lines) == 1, f"documented lines starting with {prefix!r}: {lines}"
    line = lines[0]
    args = shlex.split(line, comments=True)[1:]
    if out is not None:
        args[args.index("--out") + 1] = str(out)
    return args


def timm_unfused_attention(model, x: torch.Tensor) -> torch.Tensor:
    """timm's own unfused attention, on a copy (the shared model is never switched): the softmax
    output each block's ``attn_drop`` sees, stacked to (B, L, H, N, N)."""
    import copy

    reference = copy.deepcopy(model)
    seen = []
    for blk in reference.blocks:
        blk.attn.fused_attn = False
        blk.attn.attn_drop.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        reference(x)
    return torch.stack(seen, 1)


def assert_edits_stay_in_their_thread(run, model, x, point: str) -> None:
    """Two threads, each scaling ``blocks.0.mlp_hidden`` by its own factor five times on one shared model, get
    exactly what the same edit gives alone: no edit leaks into the other thread's forward."""
    import threading

    def scaled(factor):
        return lambda h, p: h * factor

    with torch.no_grad():
        serial = {f: run(model, x, keep=(point,), edit={"blocks.0.mlp_hidden": scaled(f)})[point] for f in (0.0, 2.0)}
    results = {}

    def work(factor):
        with torch.no_grad():
            for _ in range(5):
                results.setdefault(factor, []).append(
                    run(model, x, keep=(point,), edit={"blocks.0.mlp_hidden": scaled(factor)})[point])

    threads = [threading.Thread(target=work, args=(f,)) for f in (0.0, 2.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # The two edits give different outputs, so a leaked edit would show.
    assert (serial[0.0] - serial[2.0]).abs().max() > 1e-3 * serial[2.0].abs().max()
    for factor in (0.0, 2.0):
        assert len(results[factor]) == 5
        for out in results[factor]:
            assert torch.equal(out, serial[factor])
