"""benchmarks/gpu.py keeps working where CI runs: on the CPU at small sizes, every workload of both models gives
a figure, the table and the JSON agree, and it ends well inside its five minutes."""
import json
import os
import subprocess
import sys
import time

import pytest

from test_streaming_rollout import ROOT


@pytest.mark.slow  # a fresh interpreter, the bundled model and ViT-B/16 through every workload once (~15-40 s)
def test_gpu_benchmark_runs_on_the_cpu_with_a_figure_for_every_case(tmp_path):
    env = os.environ | {"OUT": str(tmp_path), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--small"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    took = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    records = report["records"]
    assert {(r["model"].split(" @")[0], r["workload"]) for r in records} == {
        (m, w) for m in ("bundled", "vit_b16")
        for w in ("forward", "analysis", "analysis, results only", "attnlrp", "legrad", "gradcam", "faithfulness")}
    assert all(r["device"] == "cpu" and r["batch"] == 1 and r["ms_per_image"] > 0 and not r["note"] for r in records)
    table = (tmp_path / "gpu.md").read_text()
    assert table == done.stdout
    for r in records:  # the printed cell is the JSON's figure
        v = r["ms_per_image"]
        cell = f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"
        assert f"| {r['model'].split(' @')[0]} | {r['workload']} | 1 | {cell} |" in table
    assert "SAE training tokens/s: " in table and "pytest -m gpu: not run: no CUDA GPU" in table
    assert report["wall_s"] < 280 and took < 300
