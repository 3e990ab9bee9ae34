"""Two browser sessions asking for the same result at once run the model once: the second waits for the
first's result (ui.memo.ByteLRU, one computation per key), counted in forwards."""
import threading

import numpy as np
import pytest
from PIL import Image

MiB = 1 << 20


def test_a_caller_arriving_while_the_result_is_stored_does_not_compute_it_again():
    from ui.memo import ByteLRU

    calls, storing, go = [], threading.Event(), threading.Event()

    class Slow(ByteLRU):
        def put(self, key, value):  # widen the moment between the computation's end and the value being stored
            storing.set()
            go.wait(10)
            super().put(key, value)

    cache = Slow(MiB)

    def compute():
        calls.append(1)
        return np.ones(4)

    first = threading.Thread(target=cache.get_or_compute, args=("k", compute))
    first.start()
    assert storing.wait(10)
    storing.clear()
    late = threading.Thread(target=cache.get_or_compute, args=("k", compute))
    late.start()
    late.join(0.5)  # a late caller that computes again reaches put by now
    go.set()
    for t in (first, late):
        t.join(10)
    assert len(calls) == 1


@pytest.fixture
def fresh_store(monkeypatch):
    import ui.cache
    from ui.memo import ByteLRU
    from ui.runs import RunLimiter

    store = ByteLRU(256 * MiB)
    monkeypatch.setattr(ui.cache, "store", lambda: store)
    monkeypatch.setattr(ui.cache, "run_limiter", lambda: RunLimiter(None))
    return store


def test_two_sessions_opening_one_image_run_one_forward(fresh_store, monkeypatch):
    import ui.cache
    from conftest import tiny_model
    from vitviz.sources.models import ModelSpec, _finish

    spec = ModelSpec(name="deit_tiny_patch16_224", img_size=64)
    fresh_store.put(("model", spec), _finish(tiny_model("deit3"), spec, "random weights", "tiny", []))
    forwards, started = [], threading.Barrier(2)
    real_forward = ui.cache.analyse_images

    def counted(loaded, images):
        forwards.append(1)
        threading.Event().wait(0.3)  # the other session asks while this forward runs
        return real_forward(loaded, images)

    monkeypatch.setattr(ui.cache, "analyse_images", counted)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 80, 3), dtype=np.uint8))
    results = [None, None]

    def session(i):
        started.wait(10)
        results[i] = ui.cache.cached_image_result(spec, "sha-of-the-photo", image)

    threads = [threading.Thread(target=session, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(forwards) == 1
    assert results[0] is results[1] and results[0].attention.shape[-1] == 1 + 16
