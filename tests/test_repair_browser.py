"""The heads page's repair before / after in a real browser, in both drawing modes: moving the grid's layer (in the
browser-drawn explorer, or the server's slider) redraws the before / after of that layer. The grid is a fragment,
and the repair view once sat outside it: it kept showing the layer of the page's first run."""
from pathlib import Path

import pytest

from test_browser import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, _wait_idle, require_chromium

pytestmark = [pytest.mark.slow, pytest.mark.browser]
ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "test-artifacts" / "repair"
TITLES_JS = """() => [...document.querySelectorAll('[data-testid=stPlotlyChart] .annotation-text')].map(e => e.textContent)"""


def _repair_titles(page) -> list[str]:
    return [t for t in page.evaluate(TITLES_JS) if t.endswith(": before") or t.endswith(": after")]


@pytest.mark.parametrize("mode", ["browser", "server"])
def test_heads_repair_follows_the_layer_shown(mode, app_servers):
    from playwright.sync_api import sync_playwright

    require_chromium()
    SHOTS.mkdir(parents=True, exist_ok=True)
    url = app_servers.url(mode)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.set_default_timeout(300_000)
        page.goto(f"{url}/heads?intro=0&repair=sinks", timeout=300_000)
        # the repair view drawn first (idle alone can end before a loaded server's first run has begun)
        page.wait_for_function(f"() => ({TITLES_JS})().some(t => t.endsWith(': after'))", timeout=600_000)
        _wait_idle(page, timeout=600_000)
        assert _repair_titles(page) == ["layer 12, mean over heads: before", "layer 12, mean over heads: after",
                                        "layer 12, head 1: before", "layer 12, head 1: after"]
        slider = (page.locator('.vv-explorer input[data-key="layer"]') if mode == "browser"
                  else page.get_by_role("slider", name="Layer").first)
        slider.scroll_into_view_if_needed()
        slider.focus()
        for _ in range(3):
            slider.press("ArrowLeft")
        page.wait_for_function(f"() => ({TITLES_JS})().includes('layer 9, mean over heads: after')", timeout=300_000)
        _wait_idle(page, timeout=600_000)
        assert _repair_titles(page) == ["layer 9, mean over heads: before", "layer 9, mean over heads: after",
                                        "layer 9, head 1: before", "layer 9, head 1: after"]
        page.get_by_text("Repair: before and after").last.evaluate("e => e.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(800)
        page.screenshot(path=SHOTS / f"heads_{mode}_repair_layer9.png")
        browser.close()
