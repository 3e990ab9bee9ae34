"""The heads page drawn in the browser (issue 20) against the server-drawn one and the one-slider floor, one run.

Three servers in this run: the app with ``VITVIZ_DRAW=server`` (before), the app drawing in the browser
(after), and ``benchmarks/floor_app.py`` (one slider, one Plotly figure). In Chromium (Playwright):

- layer move: a key press on the Layer slider until the new heads grid is painted;
- head order: choosing "entropy" / "head number" under "Order heads by" until the reordered grid is painted;
- patch click: a click on the patch picker (query = clicked patch) until the grid for that patch is painted;
- floor: a key press on the floor page's slider until its new figure is painted (browser_interactivity's measure).

Server-drawn views end at the frame after the Plotly chart's last mutation once the script has finished
(browser_interactivity.py's DONE_JS); browser-drawn views end at the frame after the explorer's repaint.
Moves are interleaved (floor, before, after) so load drift hits all alike; median and max of --moves each.
Also: the bytes the explorer sends per image (bundled model at 224 and 518 px, against the float32
attention) and the time from opening /heads to the first painted grid, cold (fresh server) and warm.

    .venv/bin/python benchmarks/explorer_latency.py [--moves 12] [--json benchmarks/results/explorer.json]
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
from browser_interactivity import (ARM_JS, CHROMIUM, CHROMIUM_ARGS, DONE_JS, QUIET_MS, RESULT_JS, ROOT,  # noqa: E402
                                   VIEWPORT, Target, start_streamlit, stop, wait_idle)

ROOT_JS = """(() => [...document.querySelectorAll('*')].map(e => e.shadowRoot && e.shadowRoot.querySelector('.vv-explorer'))
  .find(Boolean) || document.querySelector('.vv-explorer'))()"""
# The time of the first explorer repaint after `start` and the frame after it.
PAINTED_JS = """(start) => { const p = (window.__vvPaints || []).find(e => e.t > start && e.frame !== null);
  return p ? {paint_ms: p.t - start, frame_ms: p.frame - start} : null; }"""


def start_app(draw: str):
    os.environ["VITVIZ_DRAW"] = draw
    os.environ["PYTHONPATH"] = str(ROOT)
    return start_streamlit("app.py")


def summary(values: list[float]) -> dict:
    return {"median_ms": round(statistics.median(values), 1), "max_ms": round(max(values), 1), "n": len(values)}


class Explorer:
    """Moves on the browser-drawn heads page, timed from the input event to the frame after the repaint."""

    def __init__(self, page):
        self.page = page
        self.k = {"layer": 0, "order": 0, "patch": 0}
        self.times: dict[str, list[float]] = {"layer": [], "order": [], "patch": []}

    def _timed(self, kind: str, act, record: bool):
        page = self.page
        page.bring_to_front()
        start = page.evaluate("() => performance.now()")
        act()
        page.wait_for_function(PAINTED_JS, arg=start, polling="raf", timeout=60_000)
        r = page.evaluate(PAINTED_JS, start)
        if record:
            self.times[kind].append(r["frame_ms"])
        page.wait_for_timeout(600)  # let the debounced report and its rerun pass between moves

    def move(self, kind: str, record: bool = True):
        page, k = self.page, self.k[kind]
        self.k[kind] += 1
        if kind == "layer":
            slider = page.locator('.vv-explorer input[data-key="layer"]')
            slider.focus()
            self._timed(kind, lambda: slider.press("ArrowLeft" if k % 22 < 11 else "ArrowRight"), record)
        elif kind == "order":
            select = page.locator('.vv-explorer select[data-key="order"]')
            self._timed(kind, lambda: select.select_option(index=(k + 1) % 2), record)
        else:
            picker = page.locator(".vv-explorer canvas.vv-picker")
            box = picker.bounding_box()
            x, y = box["x"] + box["width"] * (0.1 + 0.8 * ((k * 37) % 16) / 16), box["y"] + box["height"] * (0.1 + 0.8 * ((k * 11) % 16) / 16)
            self._timed(kind, lambda: page.mouse.click(x, y), record)


class ServerDrawn:
    """The same moves on the server-drawn page, timed to the frame after the heads grid's last mutation."""

    def __init__(self, page):
        self.page = page
        self.layer = Target("layer", page, "Layer", 11)
        self.k = {"order": 0, "patch": 0}
        self.times: dict[str, list[float]] = {"layer": self.layer.figure_ms, "order": [], "patch": []}

    def _timed(self, kind: str, act, record: bool):
        page = self.page
        page.bring_to_front()
        page.evaluate(ARM_JS, 0)
        page.evaluate("() => { window.__bench.start = performance.now(); }")
        act()
        page.wait_for_function(DONE_JS, arg=QUIET_MS, polling=100, timeout=120_000)
        r = page.evaluate(RESULT_JS)
        if record:
            self.times[kind].append(r["figure_ms"])
        page.wait_for_timeout(200)

    def move(self, kind: str, record: bool = True):
        page = self.page
        if kind == "layer":
            return self.layer.move(record)
        k = self.k[kind]
        self.k[kind] += 1
        if kind == "order":
            box = page.locator('[data-testid="stSelectbox"]').filter(has=page.get_by_text("Order heads by", exact=True)).first

            def choose():  # Streamlit's selectbox is a combobox: type the option, Enter
                box.click()
                page.keyboard.type("head number" if k % 2 else "entropy")
                page.keyboard.press("Enter")
            self._timed(kind, choose, record)
        else:
            frame = page.frame_locator('iframe[title*="streamlit_image_coordinates"]').first
            img = frame.locator("img").first
            b = img.bounding_box()
            x, y = b["width"] * (0.1 + 0.8 * ((k * 37) % 16) / 16), b["height"] * (0.1 + 0.8 * ((k * 11) % 16) / 16)
            self._timed(kind, lambda: img.click(position={"x": x, "y": y}), record)


def first_paint(browser, url: str, draw: str) -> float:
    """Seconds from opening /heads in a new browser context to the first painted heads grid."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(300_000)
    t = time.monotonic()
    page.goto(f"{url}/heads", timeout=300_000)
    if draw == "browser":
        page.wait_for_selector('.vv-explorer[data-ready="1"]', timeout=300_000)
    else:
        page.wait_for_function("""() => { const c = document.querySelector('[data-testid="stPlotlyChart"]');
          return c && c.querySelectorAll('image').length >= 6; }""", polling=100, timeout=300_000)
    seconds = time.monotonic() - t
    context.close()
    return seconds


def payload_bytes() -> dict:
    """Bytes the explorer sends for one image of the bundled model at 224 and 518 px, and the float32 attention."""
    from PIL import Image

    from vitviz.figures.explorer import explorer_payload
    from vitviz.io.images import load_image
    from vitviz.sources.models import ModelSpec, load_model
    from vitviz.analyses.per_image import analyse_images as forward

    out = {}
    for size in (None, 518):
        loaded = load_model(ModelSpec(img_size=size))
        fwd = forward(loaded, [load_image(ROOT / "assets" / "astronaut.jpg").image])
        attention, layout = fwd.trace.stack("attn")[0], fwd.layout
        image: Image.Image = fwd.batch.images[0]
        L = attention.shape[0]
        payload = explorer_payload(attention, layout, image, sinks=[fwd.sinks[0].patch_sinks(layout, [l]) for l in range(L)],
                                   selected=0)
        out[f"{image.width}px"] = {"payload_bytes": payload.nbytes, "arrays": payload.arrays,
                                   "every_patch_row": payload.patch_rows,
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
        servers["server"] = start_app("server")
        servers["browser"] = start_app("browser")
        servers["floor"] = start_streamlit("benchmarks/floor_app.py")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            paint = {draw: {"cold_s": round(first_paint(browser, servers[draw][1], draw), 2),
                            "warm_s": round(first_paint(browser, servers[draw][1], draw), 2)} for draw in ("server", "browser")}
            pages = {}
            for name in ("floor", "server", "browser"):
                page = browser.new_context(viewport=VIEWPORT).new_page()
                page.set_default_timeout(120_000)
                page.goto(servers[name][1] + ("/heads" if name != "floor" else ""), timeout=300_000)
                if name == "browser":
                    page.wait_for_selector('.vv-explorer[data-ready="1"]', timeout=300_000)
                else:
                    wait_idle(page)
                pages[name] = page
            # Patch clicks need "clicked patch" as the query on the server-drawn page.
            srv = pages["server"]
            srv.locator('[data-testid="stRadio"]').filter(has=srv.get_by_text("Query", exact=True)).first \
                .get_by_text("clicked patch").click()
            wait_idle(srv)
            srv.frame_locator('iframe[title*="streamlit_image_coordinates"]').first.locator("img").first.click()
            wait_idle(srv)
            floor, before, after = Target("floor", pages["floor"], "Layer", 11), ServerDrawn(srv), Explorer(pages["browser"])
            floor.move(record=False)
            for kind in ("layer", "order", "patch"):
                before.move(kind, record=False)
                after.move(kind, record=False)
            for _ in range(args.moves):
                floor.move()
                for kind in ("layer", "order", "patch"):
                    before.move(kind)
                    after.move(kind)
            browser.close()
    finally:
        for proc, _ in servers.values():
            stop(proc)
    load_after = os.getloadavg()
    base = statistics.median(floor.figure_ms)
    results = {"floor": summary(floor.figure_ms)}
    for kind in ("layer", "order", "patch"):
        results[kind] = {"before_server_drawn": summary(before.times[kind]), "after_browser_drawn": summary(after.times[kind])}
        results[kind]["after_over_floor_median"] = round(results[kind]["after_browser_drawn"]["median_ms"] / base, 3)
        results[kind]["before_over_floor_median"] = round(results[kind]["before_server_drawn"]["median_ms"] / base, 3)
    machine = {"cpu_count": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
               "loadavg_after": [round(x, 2) for x in load_after], "python": platform.python_version(),
               "date": time.strftime("%Y-%m-%d %H:%M")}
    out = {"machine": machine, "latency": results, "first_paint": paint, "bytes": sizes}
    print(f"\nheads page: input -> grid painted (ms), {args.moves} moves each; load {machine['loadavg_before']} -> "
          f"{machine['loadavg_after']} on {machine['cpu_count']} CPUs")
    print(f"floor (one slider, one figure): median {results['floor']['median_ms']:.0f}, max {results['floor']['max_ms']:.0f}\n")
    print("| move | before (server) median / max | after (browser) median / max | after / floor (median) |")
    print("|---|---|---|---|")
    for kind, label in (("layer", "layer move"), ("order", "head order change"), ("patch", "patch click (query)")):
        b, a = results[kind]["before_server_drawn"], results[kind]["after_browser_drawn"]
        print(f"| {label} | {b['median_ms']:.0f} / {b['max_ms']:.0f} | {a['median_ms']:.1f} / {a['max_ms']:.1f} | "
              f"{results[kind]['after_over_floor_median']:.3f} |")
    print(f"\nfirst paint of /heads (s): {paint}")
    for size, s in sizes.items():
        print(f"bytes @{size}: payload {s['payload_bytes'] / 1e6:.2f} MB (every patch row: {s['every_patch_row']}), "
              f"float32 attention {s['float32_attention_bytes'] / 1e6:.1f} MB")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
        print(f"written {args.json}")


if __name__ == "__main__":
    main()
