"""A classroom on one shared server: N students (default 24) at once in ``VITVIZ_SHARED=1`` mode, in Chromium.

A fresh (cold) server, ``streamlit run app.py`` with this interpreter, shared mode, ``VITVIZ_CACHE_MB`` and
``VITVIZ_MAX_RUNS`` as given. One Chromium, one browser context per student (separate cookies, so separate
Streamlit sessions), all started at once. Each student opens the app, goes to "Attention heads", uploads a photo
of their own and waits for its first map; then opens "Attention rollout" and "Attribution" and waits for each page's maps;
every ``--faithfulness-every``-th student then opens "Faithfulness" and presses the button (defaults: AttnLRP,
rollout, random; 11 steps) and waits for the curves.

Reported: errors (Playwright failures, exception elements on a page, tracebacks in the server log; goal 0), the
time to the first map per student (median and p95) and to each later page, how many students saw "Waiting for N
other runs" (and the largest N), whether any page of a student named another student's image (goal: none), and the
server's peak RSS (VmHWM) against VITVIZ_CACHE_MB. The maps are drawn on the server (``VITVIZ_DRAW=server``: a
drawn Plotly chart is what the readiness check can see; the browser-drawn explorer sends less work to the server).

    .venv/bin/python benchmarks/classroom.py [--students 24] [--cache-mb 1024] [--max-runs 2] [--json FILE]

Machinery from tests/loadtest.py (the CI load test keeps 8 sessions; this one is the 24).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from loadtest import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, app_server, session_image  # noqa: E402

# A page is drawn: its header is the page's own with the image's name (not the page before it, still on screen
# right after a click), the script has finished, nothing is loading or
# computing, and a map (a Plotly chart or an image) is on the page. Every poll also keeps the largest
# "Waiting for N other runs" the page showed in window.__vitvizWaited (the page is one document across pages).
READY_JS = """([header, needChart]) => {
  const text = document.body.innerText;
  const m = text.match(/Waiting for (\\d+) other run/);
  if (m) window.__vitvizWaited = Math.max(window.__vitvizWaited || 0, parseInt(m[1]));
  const h = document.querySelector('h2');
  if (!h || !h.innerText.includes(header)) return false;
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
  if (/Loading the model|Running the model|Computing|Waiting for/.test(text)) return false;
  if (document.querySelector('[data-testid="stProgress"]')) return false;
  if (!needChart) return true;
  return !!document.querySelector('[data-testid="stPlotlyChart"] .main-svg, [data-testid="stImage"] img');
}"""


@dataclass
class Student:
    name: str
    times_s: dict[str, float] = field(default_factory=dict)  # page -> seconds from opening the app
    waited_for: int = 0  # the largest N of "Waiting for N other runs" seen
    others_seen: list[str] = field(default_factory=list)  # other students' image names found on a page
    exceptions: list[str] = field(default_factory=list)
    error: str | None = None


HEADERS = {"Attention heads": "Attention heads · ", "Attention rollout": "Attention rollout · ", "Attribution": "Attribution · ",
           "Faithfulness": "Faithfulness · "}


async def _ready(page, student: Student, label: str, start: float, timeout_ms: int, chart: bool = True) -> None:
    await page.wait_for_function(READY_JS, arg=[HEADERS[label] + student.name, chart], polling=250, timeout=timeout_ms)
    student.times_s[label] = round(time.monotonic() - start, 2)
    await page.wait_for_timeout(500)  # late renders: an exception element arrives after the charts
    student.exceptions += await page.locator('[data-testid="stException"]').all_inner_texts()


async def _student(browser, url: str, student: Student, data: bytes, others: list[str], faithfulness: bool,
                   timeout_ms: int) -> Student:
    context = await browser.new_context(viewport=VIEWPORT)
    page = None
    try:
        page = await context.new_page()
        page.set_default_timeout(timeout_ms)
        start = time.monotonic()
        await page.goto(url, timeout=timeout_ms)
        await page.get_by_role("link", name="Attention heads", exact=True).click()
        upload = page.locator('[data-testid="stFileUploaderDropzoneInput"]').first
        await upload.wait_for(state="attached")
        await upload.set_input_files({"name": student.name, "mimeType": "image/png", "buffer": data})
        pages = [("Attention heads", True), ("Attention rollout", True), ("Attribution", True)]
        for i, (label, chart) in enumerate(pages):
            if i:
                await page.get_by_role("link", name=label, exact=True).click()
            await _ready(page, student, label, start, timeout_ms, chart)
            text = await page.locator("body").inner_text()
            student.others_seen += [o for o in others if o in text and o not in student.others_seen]
        if faithfulness:
            await page.get_by_role("link", name="Faithfulness", exact=True).click()
            button = page.get_by_role("button", name=re.compile("Run the perturbation test"))
            await button.click()
            await button.wait_for(state="detached", timeout=timeout_ms)
            await _ready(page, student, "Faithfulness", start, timeout_ms)
    except Exception as exc:  # noqa: BLE001 - reported per student
        student.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if page is not None:
            try:
                student.exceptions += await page.locator('[data-testid="stException"]').all_inner_texts()
            except Exception:  # noqa: BLE001
                pass
    finally:
        if page is not None:
            try:
                student.waited_for = int(await page.evaluate("window.__vitvizWaited || 0"))
            except Exception:  # noqa: BLE001
                pass
        await context.close()
    return student


async def _class(url: str, n: int, every: int, timeout_ms: int) -> list[Student]:
    from playwright.async_api import async_playwright

    names = [f"student_{i:02d}.png" for i in range(n)]
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            return await asyncio.gather(*[
                _student(browser, url, Student(name), session_image(1000 + i), [o for o in names if o != name],
                         every > 0 and i % every == every - 1, timeout_ms)
                for i, name in enumerate(names)])
        finally:
            await browser.close()


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "median_s": round(float(np.median(values)), 1),
            "p95_s": round(float(np.percentile(values, 95)), 1), "max_s": round(max(values), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=24)
    parser.add_argument("--cache-mb", type=int, default=1024)
    parser.add_argument("--max-runs", type=int, default=2)
    parser.add_argument("--faithfulness-every", type=int, default=4, help="every k-th student presses the button")
    parser.add_argument("--timeout", type=float, default=1500, help="seconds a student may wait for one page")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    load_before, started = os.getloadavg(), time.monotonic()
    log = ROOT / "test-artifacts" / "classroom_server.log"
    env = {"VITVIZ_SHARED": "1", "VITVIZ_CACHE_MB": str(args.cache_mb), "VITVIZ_MAX_RUNS": str(args.max_runs),
           "VITVIZ_DRAW": "server", "VITVIZ_MAX_IMAGES": "8"}
    with app_server(log, env, direct=True) as server:
        students = asyncio.run(_class(server.url, args.students, args.faithfulness_every, int(args.timeout * 1000)))
        peak = server.peak_mib()
        log_text = server.log.read_text(errors="replace")
    load_after = os.getloadavg()
    failed = [s for s in students if s.error or s.exceptions]
    report = {
        "students": args.students, "cache_mb": args.cache_mb, "max_runs": args.max_runs,
        "errors": {"students_failed": len(failed), "tracebacks_in_server_log": log_text.count("Traceback"),
                   "details": [(s.name, s.error, s.exceptions[:2]) for s in failed]},
        "first_map": _stats([s.times_s["Attention heads"] for s in students if "Attention heads" in s.times_s]),
        "pages": {p: _stats([s.times_s[p] for s in students if p in s.times_s])
                  for p in ("Attention rollout", "Attribution", "Faithfulness")},
        "saw_waiting": {"students": sum(s.waited_for > 0 for s in students),
                        "largest_n": max((s.waited_for for s in students), default=0)},
        "saw_another_students_image": [(s.name, s.others_seen) for s in students if s.others_seen],
        "server_peak_rss_mib": round(peak), "peak_over_cache_mib": round(peak - args.cache_mb),
        "load_average_before": [round(x, 1) for x in load_before], "load_average_after": [round(x, 1) for x in load_after],
        "cpu_cores": os.cpu_count(), "wall_s": round(time.monotonic() - started, 1),
        "per_student": [asdict(s) for s in students],
    }
    print(json.dumps({k: v for k, v in report.items() if k != "per_student"}, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
