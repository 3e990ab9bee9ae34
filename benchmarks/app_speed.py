"""App responsiveness through AppTest, bundled model on the CPU.

Prints
  1. cold start: a fresh process runs the heads page until the first attention map exists
     (bundled weights already converted in the cache, as after the first ever start);
  2. server-side rerun time after a slider move (layer, head-compare, opacity; the model must not
     run again), median over moves, against the goal of 100 ms;
  3. payload per rerun: the serialized size of every element the rerun sends, against 2 MB,
     and what the same attention maps would weigh as float64 JSON for comparison.

Usage: .venv/bin/python benchmarks/app_speed.py
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")


def cold_start_child() -> None:
    start = time.perf_counter()
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/2_heads.py").run()
    assert at.get("plotly_chart"), "no chart"
    print(json.dumps({"seconds": time.perf_counter() - start}))


def payload_bytes(at) -> int:
    total = 0
    stack = [at._tree]
    while stack:
        node = stack.pop()
        proto = getattr(node, "proto", None)
        if proto is not None and hasattr(proto, "SerializeToString"):
            total += len(proto.SerializeToString())
        stack.extend(getattr(node, "children", {}).values())
    return total


def main() -> None:
    from vitviz.sources.models import ModelSpec, load_model

    load_model(ModelSpec())  # make sure the bundled conversion is cached
    out = subprocess.run([sys.executable, __file__, "--cold"], capture_output=True, text=True, check=True, cwd=ROOT)
    cold = json.loads(out.stdout.strip().splitlines()[-1])["seconds"]
    print(f"1. cold start to first attention map (fresh process, converted weights cached): {cold:.1f} s (goal <= 15 s)")

    from streamlit.testing.v1 import AppTest

    import vitviz.trace as capture_module

    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/2_heads.py").run()
    calls = []
    original = capture_module.trace_for_analysis
    capture_module.trace_for_analysis = lambda *a, **k: calls.append(1) or original(*a, **k)
    import ui.cache

    ui.cache.capture = capture_module.trace_for_analysis
    times, sizes = [], []
    moves = [("heads_layer", v) for v in (3, 7, 11, 5, 9, 2)] + [("opacity", v) for v in (0.3, 0.8, 0.5)] + \
            [("compare_0", v) for v in (4, 6)]
    for key, value in moves:
        start = time.perf_counter()
        at.slider(key=key).set_value(value).run()
        times.append(time.perf_counter() - start)
        sizes.append(payload_bytes(at))
    assert not at.exception
    capture_module.capture = original
    med = statistics.median(times)
    print(f"2. rerun after a slider move: median {1000 * med:.0f} ms, max {1000 * max(times):.0f} ms over {len(times)} "
          f"moves (goal <= 100 ms); model forward passes during the moves: {len(calls)}")
    L, H, N = 12, 6, 257
    float_json = L * H * N * N * 20 / 2**20  # about 20 characters per float in JSON
    print(f"3. payload per rerun: median {statistics.median(sizes) / 2**20:.2f} MiB, max {max(sizes) / 2**20:.2f} MiB "
          f"(goal <= 2 MB); all attention of one image as float64 JSON would be about {float_json:.0f} MiB")


if __name__ == "__main__":
    if "--cold" in sys.argv:
        cold_start_child()
    else:
        main()
