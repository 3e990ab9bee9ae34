"""Slider interactivity measured in a real browser, as a ratio to a minimal Streamlit page (the floor).

Chromium (Playwright) focuses a slider (its role=slider input), presses ArrowLeft/ArrowRight, and times from the key press
(a keydown listener's performance.now()) to the paint of the NEW figure: a MutationObserver on the
chart's element records the time of every mutation (and of the animation frame after it); a move
ends once the figure's images (tiles, heatmaps: <image href>) and title differ from before the
press, the script has finished (stApp's data-test-script-state) and the chart has been quiet for QUIET_MS. The figure time is the
frame after the last mutation inside the Plotly chart; "first change" is the first mutation inside
it (≈ when the new figure arrived from the server: the rest is Plotly drawing); "settled" also
counts the element container (Streamlit's stale marking); "script done" is when the app's
script state turned notRunning (key press -> debounce -> rerun -> end of the script).

Targets: (1) the Attention heads page's Layer slider (heads grid), (2) its Opacity slider (in the
"Display" expander), (3) the floor: benchmarks/floor_app.py (one slider, one 224 px image with a
16x16 heatmap), served by its own `streamlit run` in the same run. Moves are interleaved in blocks
(floor, layer, opacity, floor, ...) so load drift hits all three alike. The machine's load average
and CPU count are recorded beside the figures.

    .venv/bin/python benchmarks/browser_interactivity.py [--moves 16] [--json benchmarks/results/x.json]

Goals (issue): layer slider <= 1.5x the floor (median), opacity <= 1.1x.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1440, "height": 900}
QUIET_MS = 800
GOALS = {"layer": 1.5, "opacity": 1.1}

# Arm the measurement on the chart-th Plotly chart of the page.
ARM_JS = """(chartIndex) => {
  const chart = () => document.querySelectorAll('[data-testid="stPlotlyChart"]')[chartIndex];
  const box = () => { const c = chart(); return c && (c.closest('[data-testid="stElementContainer"]') || c); };
  const sig = () => {
    const c = chart(); if (!c) return '';
    const parts = [...c.querySelectorAll('image')].map(i => {
      const h = i.getAttribute('href') || i.getAttribute('xlink:href') || '';
      return h.length + ':' + h.slice(-160); });
    const title = c.querySelector('.gtitle'); parts.push(title ? title.textContent : '');
    return parts.join('|');
  };
  if (window.__bench && window.__bench.observer) window.__bench.observer.disconnect();
  const b = {start: null, runEnd: null, figFirst: null, figLast: null, figPaint: null, boxLast: null, boxPaint: null, sig0: sig(), sig};
  b.observer = new MutationObserver((muts) => {
    if (b.start === null) return;
    if (muts.some(m => m.attributeName === 'data-test-script-state'
                       && m.target.getAttribute('data-test-script-state') === 'notRunning')) b.runEnd = performance.now();
    const c = chart(), bx = box();
    const inFig = c && muts.some(m => c.contains(m.target));
    const inBox = bx && muts.some(m => bx.contains(m.target));
    if (!inFig && !inBox) return;
    const t = performance.now();
    if (inFig) { if (b.figFirst === null) b.figFirst = t; b.figLast = t; }
    b.boxLast = t;
    requestAnimationFrame(() => { const f = performance.now(); if (inFig) b.figPaint = f; b.boxPaint = f; });
  });
  b.observer.observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true});
  if (!window.__benchKey) {
    window.__benchKey = true;
    document.addEventListener('keydown', () => { if (window.__bench && window.__bench.start === null)
      window.__bench.start = performance.now(); }, true);
  }
  window.__bench = b;
}"""

DONE_JS = """(quiet) => {
  const b = window.__bench;
  if (!b || b.start === null || b.figPaint === null) return false;
  if (document.querySelector('[data-testid="stApp"]').getAttribute('data-test-script-state') !== 'notRunning')
    return false;
  if (b.sig() === b.sig0) return false;
  return performance.now() - Math.max(b.boxLast, b.start) > quiet;
}"""

RESULT_JS = """() => { const b = window.__bench;
  return {figure_ms: b.figPaint - b.start, settled_ms: b.boxPaint - b.start,
          first_ms: b.figFirst - b.start, run_end_ms: b.runEnd === null ? null : b.runEnd - b.start}; }"""

IDLE_JS = """() => document.querySelector('[data-testid="stApp"]').getAttribute('data-test-script-state') === 'notRunning'
  && !document.querySelector('[data-testid="stStatusWidget"], [data-testid="stSkeleton"], '
  + '[data-testid="stAppSkeleton"]') && !/Loading the model|Running the model|Computing/.test(document.body.innerText)
  && [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].every(c => c.querySelector('.main-svg'))"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_streamlit(script: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", script, "--server.port", str(port),
                             "--server.address", "127.0.0.1", "--server.headless", "true"],
                            cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                return proc, url
        except OSError:
            time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"{script} did not start")


def stop(proc: subprocess.Popen):
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_idle(page, quiet_ms: int = 1500):
    page.wait_for_timeout(300)
    page.wait_for_function(IDLE_JS, polling=200, timeout=240_000)
    page.wait_for_timeout(quiet_ms)


def slider(page, label: str):
    box = page.locator('[data-testid="stSlider"]').filter(has=page.get_by_text(label, exact=True)).first
    return box.get_by_role("slider").first  # <input type="range"> (react-aria) in Streamlit 1.67


class Target:
    """One slider on one page; moves sweep down then up the slider's range."""

    def __init__(self, name: str, page, label: str, steps_down: int):
        self.name, self.page, self.label = name, page, label
        self.plan = ["ArrowLeft"] * steps_down + ["ArrowRight"] * steps_down
        self.k = 0
        self.figure_ms: list[float] = []
        self.settled_ms: list[float] = []
        self.first_ms: list[float] = []
        self.run_end_ms: list[float] = []

    def move(self, record: bool = True):
        page = self.page
        page.bring_to_front()
        thumb = slider(page, self.label)
        thumb.focus()
        page.evaluate(ARM_JS, 0)
        page.keyboard.press(self.plan[self.k % len(self.plan)])
        self.k += 1
        page.wait_for_function(DONE_JS, arg=QUIET_MS, polling=100, timeout=120_000)
        r = page.evaluate(RESULT_JS)
        if record:
            self.figure_ms.append(r["figure_ms"])
            self.settled_ms.append(r["settled_ms"])
            self.first_ms.append(r["first_ms"])
            if r["run_end_ms"] is not None:
                self.run_end_ms.append(r["run_end_ms"])
        page.wait_for_timeout(200)


def summary(values: list[float]) -> dict:
    return {"median_ms": round(statistics.median(values), 1), "max_ms": round(max(values), 1),
            "min_ms": round(min(values), 1), "n": len(values)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moves", type=int, default=16, help="recorded moves per slider (>= 10)")
    ap.add_argument("--block", type=int, default=4, help="moves per slider before switching to the next")
    ap.add_argument("--json", type=Path, help="also write the results here (e.g. benchmarks/results/x.json)")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    load_before = os.getloadavg()
    app, app_url = start_streamlit("app.py")
    floor, floor_url = start_streamlit("benchmarks/floor_app.py")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            pages = {}
            for name, url in (("floor", floor_url), ("layer", app_url), ("opacity", app_url)):
                page = browser.new_context(viewport=VIEWPORT).new_page()
                page.set_default_timeout(120_000)
                page.goto(url, timeout=120_000)
                wait_idle(page)
                if name != "floor":
                    page.get_by_role("link", name="Attention heads", exact=True).click()
                    wait_idle(page)
                if name == "opacity":
                    page.locator('[data-testid="stExpander"] summary').filter(has_text="Display").first.click()
                    wait_idle(page)
                pages[name] = page
            targets = [Target("floor", pages["floor"], "Layer", 11), Target("layer", pages["layer"], "Layer", 11),
                       Target("opacity", pages["opacity"], "Opacity", 10)]
            for t in targets:  # warm-up: first rerun of each session, caches, Plotly's first react
                t.move(record=False)
            while min(len(t.figure_ms) for t in targets) < args.moves:
                for t in targets:
                    for _ in range(args.block):
                        if len(t.figure_ms) < args.moves:
                            t.move()
            browser.close()
    finally:
        stop(app)
        stop(floor)
    load_after = os.getloadavg()

    res = {t.name: {"figure": summary(t.figure_ms), "settled": summary(t.settled_ms),
                    "first_change": summary(t.first_ms),
                    "script_done": summary(t.run_end_ms) if t.run_end_ms else None,
                    "figure_ms": [round(v, 1) for v in t.figure_ms]} for t in targets}
    base = res["floor"]["figure"]
    for name in ("layer", "opacity"):
        f = res[name]["figure"]
        res[name]["ratio_median"] = round(f["median_ms"] / base["median_ms"], 2)
        res[name]["ratio_max"] = round(f["max_ms"] / base["max_ms"], 2)
        res[name]["goal_median_ratio"] = GOALS[name]
    machine = {"cpu_count": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
               "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in load_after],
               "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M")}
    out = {"machine": machine, "quiet_ms": QUIET_MS, "results": res}

    print(f"\nbrowser interactivity: key press -> new figure painted (ms), {args.moves} moves each")
    print(f"load average before {machine['loadavg_before']}, after {machine['loadavg_after']}, "
          f"{machine['cpu_count']} CPUs ({machine['cpus_usable']} usable)\n")
    print("| target | median ms | max ms | ratio median | ratio max | goal | first change median ms "
          "| script done median ms | settled median ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, label in (("floor", "floor (1 slider, 1 figure)"), ("layer", "heads: Layer slider"),
                        ("opacity", "heads: Opacity slider")):
        r = res[name]
        ratio = (f"{r['ratio_median']:.2f}", f"{r['ratio_max']:.2f}", f"<= {r['goal_median_ratio']}") \
            if name != "floor" else ("1", "1", "")
        print(f"| {label} | {r['figure']['median_ms']:.0f} | {r['figure']['max_ms']:.0f} | {ratio[0]} | {ratio[1]} "
              f"| {ratio[2]} | {r['first_change']['median_ms']:.0f} | "
              f"{r['script_done']['median_ms'] if r['script_done'] else float('nan'):.0f} | {r['settled']['median_ms']:.0f} |")
    print()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
        print(f"written {args.json}")
    else:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
