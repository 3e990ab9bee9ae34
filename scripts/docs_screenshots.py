"""Fresh screenshots of the app for the documentation: the sidebar and every page, at 1440x900 in Chromium.

    .venv/bin/python scripts/docs_screenshots.py [--pages overview,heads] [--out docs/img/app]

Starts the app (``streamlit run app.py``, offline, bundled model), opens each page of ui/navigation.py by its
address with the sample photos and writes ``<out>/<address>.png`` (the viewport, as a user sees it first) and
``<out>/sidebar.png``. On the Features page it first trains an SAE in the browser (Train, the defaults, until
converged: a few minutes on a CPU) and shows its top latents. Needs Debian's Chromium (``apt-get install chromium``)
and Playwright. Each page's shot is recorded in ``<out>/taken.json`` with the SHA-256 of the page's file it was
taken of (tests/test_docs.py fails when a page's file no longer matches its shot: a retake can give the same PNG
bytes, so the record, not the PNG's commit date, says it was retaken).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from loadtest import app_server  # noqa: E402
from test_browser import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, _wait_idle  # noqa: E402
from ui.navigation import PAGES  # noqa: E402


def address(file: str) -> str:
    """The page's URL path as Streamlit derives it from the file name ("pages/3_rollout.py" -> "rollout")."""
    return re.sub(r"^\d+_", "", Path(file).stem)


def page_hash(file: str) -> str:
    """SHA-256 of a page's file, as ``taken.json`` records it."""
    return hashlib.sha256((ROOT / file).read_bytes()).hexdigest()


def record_taken(out: Path, shots: dict[str, str]) -> None:
    """Merge ``{address: page_hash}`` into ``out/taken.json``, written whole."""
    path = out / "taken.json"
    taken = json.loads(path.read_text()) if path.is_file() else {}
    taken.update(shots)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(taken.items())), indent=1) + "\n")
    tmp.replace(path)


def train_sae(page) -> None:
    """Train an SAE on the Features page with its defaults and bring its top latents into view: the page shows
    nothing until an SAE is given."""
    page.get_by_role("button", name="Train", exact=True).click()
    _wait_idle(page, timeout=1_800_000)
    if page.get_by_text("Trained here:", exact=False).count() != 1:
        raise SystemExit("the Features page did not finish training an SAE: see the server log")
    # The trained line at the top of the view: the screenshot says what was trained, then shows its top latents.
    page.get_by_text("Trained here:", exact=False).evaluate("e => e.scrollIntoView({block: 'start'})")
    page.mouse.wheel(0, -40)
    _wait_idle(page, quiet=800)


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--pages", help="comma-separated addresses (default: every page)")
    cli.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "app")
    args = cli.parse_args(argv)
    files = {address(p.file): p.file for p in PAGES}
    wanted = list(files)
    if args.pages:
        wanted = [a for a in wanted if a in args.pages.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with app_server(ROOT / "test-artifacts" / "docs" / "screenshots_server.log", direct=True) as server, \
            sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.set_default_timeout(240_000)
        for i, name in enumerate(wanted):
            page.goto(f"{server.url}/{'' if name == 'overview' else name}?intro=0", timeout=240_000)
            _wait_idle(page, timeout=600_000)
            if i == 0:
                page.locator('[data-testid="stSidebar"]').screenshot(path=args.out / "sidebar.png")
            if name == "features":
                train_sae(page)
            page.screenshot(path=args.out / f"{name}.png")
            record_taken(args.out, {name: page_hash(files[name])})
            print(f"wrote {args.out / name}.png")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
