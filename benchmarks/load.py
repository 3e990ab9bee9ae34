"""Time to first map for N browser sessions arriving at once (issue 9), with tests/test_load.py's machinery.

A fresh server from scripts/app.sh (cold: nothing imported, no model loaded); one Chromium, one
browser context per session. A session opens the app, goes to "Attention heads", uploads its own
generated image and ends when that image's first map is drawn (header names it, script finished).
Three rounds on the same server, in this order:

1. cold: N sessions at once on the fresh server (imports, model load and N analyses);
2. warm, alone: one session with a new image (the baseline: one user on a warm server);
3. warm, N at once: N sessions with new images.

Reported: p50 / p95 (linear interpolation) of the time to first map per round, the warm-N p50 as a
ratio of the warm-alone time, the server's peak RSS (VmHWM) and the machine's load average.

    .venv/bin/python benchmarks/load.py [--sessions 8] [--cache-mb 512] [--json benchmarks/results/load.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from loadtest import app_server, run_sessions, session_image  # noqa: E402


def _round(url: str, seeds: range) -> dict:
    results = run_sessions(url, [(f"load_{seed}.png", session_image(seed)) for seed in seeds], timeout_s=900)
    times = [r.first_map_s for r in results if r.first_map_s is not None and not r.exceptions]
    failed = [(r.name, r.error, r.exceptions) for r in results if r.first_map_s is None or r.exceptions]
    return {"sessions": len(results), "ok": len(times), "failed": failed,
            "p50_s": float(np.percentile(times, 50)) if times else None,
            "p95_s": float(np.percentile(times, 95)) if times else None,
            "times_s": sorted(round(t, 2) for t in times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--cache-mb", type=int, default=512)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    n = args.sessions
    load_before = os.getloadavg()
    log = ROOT / "test-artifacts" / "load_benchmark_server.log"
    with app_server(log, {"VITVIZ_CACHE_MB": str(args.cache_mb)}) as server:
        rounds = {"cold": _round(server.url, range(n)),
                  "warm_alone": _round(server.url, range(100, 101)),
                  "warm": _round(server.url, range(200, 200 + n))}
        peak = server.peak_mib()
    load_after = os.getloadavg()
    alone = rounds["warm_alone"]["p50_s"]
    report = {"rounds": rounds, "server_peak_rss_mib": round(peak), "cache_mb": args.cache_mb,
              "warm_p50_over_alone": round(rounds["warm"]["p50_s"] / alone, 2) if alone and rounds["warm"]["p50_s"]
              else None,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "loadavg_before": [round(x, 2) for x in load_before],
                          "loadavg_after": [round(x, 2) for x in load_after]}}
    print(f"{'round':<12} {'sessions':>8} {'ok':>4} {'p50 s':>8} {'p95 s':>8}  times s")
    for name, r in rounds.items():
        p50 = f"{r['p50_s']:.1f}" if r["p50_s"] is not None else "-"
        p95 = f"{r['p95_s']:.1f}" if r["p95_s"] is not None else "-"
        print(f"{name:<12} {r['sessions']:>8} {r['ok']:>4} {p50:>8} {p95:>8}  {r['times_s']}")
        for failure in r["failed"]:
            print(f"  failed: {failure}")
    print(f"warm {n} at once, p50 / one session alone: {report['warm_p50_over_alone']}x; "
          f"server peak RSS {peak:.0f} MiB (VITVIZ_CACHE_MB={args.cache_mb}); "
          f"load average before {report['machine']['loadavg_before']}, after {report['machine']['loadavg_after']} "
          f"on {os.cpu_count()} CPUs")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
