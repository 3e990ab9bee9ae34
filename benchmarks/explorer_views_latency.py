"""The browser explorer's three views against the one-slider floor page, one run (issue 20).

Two servers in this run: the app drawing in the browser (``VITVIZ_DRAW=browser``) and
``benchmarks/floor_app.py`` (one slider, one Plotly figure). In Chromium (Playwright), one key press on a
slider until the new picture is painted:

- heads: the Layer slider of the heads grid (six tiles);
- compare layers: the "Layer B" slider of Compare layers on the heads page (two panels);
- rollout: "Show cumulative rollout after layer" on the rollout page (one tile, CLS readout);
- floor: the floor page's slider until its new figure is painted (browser_interactivity's measure).

Browser-drawn moves end at the frame after the explorer's repaint (explorer_latency.py's PAINTED_JS).
Moves are interleaved (floor, heads, compare, rollout) so load drift hits all alike; median and max of
--moves each. Also the bytes each view sends per image (bundled model at 224 and 518 px): compare layers
draws from the heads payload (no bytes of its own); rollout sends its own.

    .venv/bin/python benchmarks/explorer_views_latency.py [--moves 12] [--json benchmarks/results/explorer_views.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from browser_interactivity import CHROMIUM, CHROMIUM_ARGS, ROOT, VIEWPORT, Target, start_streamlit, stop, wait_idle  # noqa: E402
from explorer_latency import PAINTED_JS, start_app, summary  # noqa: E402

READY = '.vv-explorer[data-ready="1"]'


class SliderMove:
    """Key presses on one of the explorer's sliders, timed from the key press to the frame after the repaint."""

    def __init__(self, page, key: str, steps: int):
        self.page, self.key = page, key
        self.plan = ["ArrowLeft"] * steps + ["ArrowRight"] * steps
        self.k = 0
        self.times: list[float] = []

    def move(self, record: bool = True):
        page = self.page
        page.bring_to_front()
        slider = page.locator(f'.vv-explorer input[data-key="{self.key}"]')
        slider.focus()
        start = page.evaluate("() => performance.now()")
        slider.press(self.plan[self.k % len(self.plan)])
        self.k += 1
        page.wait_for_function(PAINTED_JS, arg=start, polling="raf", timeout=60_000)
        if record:
            self.times.append(page.evaluate(PAINTED_JS, start)["frame_ms"])
        page.wait_for_timeout(600)  # let the debounced report and its rerun pass between moves


def payload_bytes() -> dict:
    """Bytes per image of the bundled model at 224 and 518 px: the heads payload (heads and compare layers) and
    the rollout payload (CLS readout, all 12 layers, default settings)."""
    from vitviz.figures.explorer import explorer_payload, rollout_payload
    from vitviz.io.images import load_image
    from vitviz.sources.models import ModelSpec, load_model
    from vitviz.analyses.per_image import analyse_images as forward

    out = {}
    for size in (None, 518):
        fwd = forward(load_model(ModelSpec(img_size=size)), [load_image(ROOT / "assets" / "astronaut.jpg").image])
        attention, layout, image = fwd.trace.stack("attn")[0], fwd.layout, fwd.batch.images[0]
        L = attention.shape[0]
        heads = explorer_payload(attention, layout, image, sinks=[fwd.sinks[0].patch_sinks(layout, [l]) for l in range(L)],
                                 selected=0)
        t = time.perf_counter()
        roll = rollout_payload(attention, layout, image, sinks=fwd.sinks[0].patch_sinks(layout), selected=0)
        build_s = time.perf_counter() - t
        out[f"{image.width}px"] = {"heads_and_compare_bytes": heads.nbytes, "heads_every_patch_row": heads.patch_rows,
                                   "rollout_bytes": roll.nbytes, "rollout_arrays": roll.arrays,
                                   "rollout_every_patch_row": roll.patch_rows, "rollout_build_s": round(build_s, 2),
                                   "float32_attention_bytes": int(attention.numel() * 4)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moves", type=int, default=12)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    load_before = os.getloadavg()
    sizes = payload_bytes()
    servers = {}
    try:
        servers["browser"] = start_app("browser")
        servers["floor"] = start_streamlit("benchmarks/floor_app.py")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            pages = {}
            for name, path in (("floor", ""), ("heads", "/heads?intro=0"), ("rollout", "/rollout?intro=0")):
                page = browser.new_context(viewport=VIEWPORT).new_page()
                page.set_default_timeout(120_000)
                page.goto(servers["floor" if name == "floor" else "browser"][1] + path, timeout=300_000)
                if name == "floor":
                    wait_idle(page)
                else:
                    page.wait_for_selector(READY, timeout=300_000)
                    wait_idle(page)
                pages[name] = page
            floor = Target("floor", pages["floor"], "Layer", 11)
            moves = {"heads": SliderMove(pages["heads"], "layer", 11), "compare": SliderMove(pages["heads"], "cl1", 11),
                     "rollout": SliderMove(pages["rollout"], "depth", 11)}
            floor.move(record=False)
            for m in moves.values():
                m.move(record=False)
            for _ in range(args.moves):
                floor.move()
                for m in moves.values():
                    m.move()
            browser.close()
    finally:
        for proc, _ in servers.values():
            stop(proc)
    load_after = os.getloadavg()
    base = statistics.median(floor.figure_ms)
    results = {"floor": summary(floor.figure_ms)}
    for name, m in moves.items():
        results[name] = summary(m.times) | {"over_floor_median": round(statistics.median(m.times) / base, 3)}
    machine = {"cpu_count": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
               "loadavg_after": [round(x, 2) for x in load_after], "python": platform.python_version(),
               "date": time.strftime("%Y-%m-%d %H:%M")}
    out = {"machine": machine, "latency": results, "bytes": sizes}
    print(f"\nlayer move: key press -> picture painted (ms), {args.moves} moves each; load {machine['loadavg_before']} -> "
          f"{machine['loadavg_after']} on {machine['cpu_count']} CPUs\n")
    print("| view | median / max ms | median / floor median |")
    print("|---|---|---|")
    print(f"| floor (one slider, one figure) | {results['floor']['median_ms']:.0f} / {results['floor']['max_ms']:.0f} | 1 |")
    for name, label in (("heads", "heads grid, Layer"), ("compare", "Compare layers, Layer B"),
                        ("rollout", "rollout, after layer")):
        r = results[name]
        print(f"| {label} | {r['median_ms']:.1f} / {r['max_ms']:.1f} | {r['over_floor_median']:.3f} |")
    for size, s in sizes.items():
        print(f"bytes @{size}: heads + compare {s['heads_and_compare_bytes'] / 1e6:.2f} MB, rollout "
              f"{s['rollout_bytes'] / 1e6:.2f} MB (every patch's rows: {s['rollout_every_patch_row']}, built in "
              f"{s['rollout_build_s']} s), float32 attention {s['float32_attention_bytes'] / 1e6:.1f} MB")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
        print(f"written {args.json}")


if __name__ == "__main__":
    main()
