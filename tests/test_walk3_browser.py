"""Issue 34 (walk3), in Chromium at 1440x900: the Rollout page's download buttons under its half-width map show their
labels whole, in one row, with the sidebar open and with the Display box expanded (equal columns cut them to
"Settings …" and "Image (p…"). Screenshots in test-artifacts/walk3/."""
from pathlib import Path

import pytest

from test_browser import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, _wait_idle, require_chromium

pytestmark = [pytest.mark.slow, pytest.mark.browser]
ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "test-artifacts" / "walk3"

# Each download button: its label, its box, and whether an element inside clips its text (Streamlit ends a label
# that does not fit with an ellipsis: the text's scrollWidth then exceeds the box it is shown in).
BUTTONS_JS = """() => [...document.querySelectorAll('[data-testid="stDownloadButton"] button')].map(b => {
  const r = b.getBoundingClientRect();
  const cut = [...b.querySelectorAll('*')].some(e => getComputedStyle(e).overflow !== 'visible'
                                                    && e.scrollWidth > e.clientWidth);
  return {label: b.innerText, x: r.x, y: r.y, width: r.width, cut};
})"""
ROLLOUT_ROW = ["Data (npz)", "Settings (json)", "Image (png)", "Image (svg)", "Image (pdf)"]


@pytest.fixture(scope="module")
def server(app_servers):
    require_chromium()
    SHOTS.mkdir(parents=True, exist_ok=True)
    return app_servers.url("server")


def test_rollout_download_labels_are_whole_in_one_row_with_the_sidebar_and_the_display_box_open(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.set_default_timeout(240_000)
        page.goto(f"{server}/rollout?intro=0", timeout=240_000)
        _wait_idle(page)
        assert page.locator('[data-testid="stSidebar"]').is_visible()
        for state in ("sidebar", "display"):
            if state == "display":
                page.locator('[data-testid="stExpander"] summary').filter(has_text="Display").first.click()
                _wait_idle(page)
            # (a button with a help tooltip is in the page twice, the copy 0 px wide and out of sight)
            buttons = [b for b in page.evaluate(BUTTONS_JS) if b["width"] > 0]
            assert buttons and not [b["label"] for b in buttons if b["cut"]], (state, buttons)
            row = buttons[:len(ROLLOUT_ROW)]  # the rollout map's row comes first on the page
            assert [b["label"] for b in row] == ROLLOUT_ROW, buttons
            # One line: wrapping would make the page longer than it needs to be.
            assert max(b["y"] for b in row) - min(b["y"] for b in row) < 1, row
            button = page.get_by_role("button", name="Settings (json)").first
            button.evaluate("b => b.scrollIntoView({block: 'center'})")
            page.wait_for_timeout(300)
            page.screenshot(path=SHOTS / f"rollout_downloads_{state}.png")
        browser.close()
