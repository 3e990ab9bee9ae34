"""End to end in a real browser: the README's start command driven by Debian's Chromium through Playwright.

One app server and one browser page for the module; the tests run in file order on that page:
upload, walk every page (screenshots, no exceptions), the patch picker's last column, the colours
that reach the browser, and the distance plot's click that opens a head.

Screenshots go to test-artifacts/browser/ (the path is printed). Skipped when Chromium is not
installed, except under CI, where .ci/run installs it and a missing browser is a failure.
"""
import os
import re
import shutil
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from conftest import ASSETS
from loadtest import app_server

pytestmark = [pytest.mark.slow, pytest.mark.browser]
ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = ROOT / "test-artifacts" / "browser"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1440, "height": 900}


def require_chromium() -> None:
    """Skip without Debian's Chromium, except in CI, where .ci/run installs it: there its absence fails."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing: .ci/run should have installed the Debian package 'chromium'.")
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
# At least these pages; the walk visits every link of the sidebar nav.
PAGES = ["Overview", "Attention heads", "Attention rollout", "Attention distance", "Embedding filters",
         "Position embeddings"]
GRID_WIDTH = 16  # the bundled DINOv2 ViT-S/14 at 224 px: a 16x16 patch grid
PICKER = 'iframe[title*="streamlit_image_coordinates"]'

# Idle = the script has finished (stApp's data-test-script-state; the status widget never shows with
# toolbarMode "minimal"), no status widget, no skeleton, no "Loading/Running/Computing" text, every Plotly chart
# drawn, and no DOM mutation for QUIET ms (the page's elements arrive in several renders).
IDLE_JS = """(quiet) => {
  if (!window.__vvObserver) {
    window.__vvLast = performance.now();
    window.__vvObserver = new MutationObserver(() => { window.__vvLast = performance.now(); });
    window.__vvObserver.observe(document.body, {subtree: true, childList: true, attributes: true,
                                                characterData: true});
  }
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
  if (document.querySelector('[data-testid="stStatusWidget"], [data-testid="stSkeleton"], '
                             + '[data-testid="stAppSkeleton"]')) return false;
  if (/Loading the model|Running the model|Computing/.test(document.body.innerText)) return false;
  for (const c of document.querySelectorAll('[data-testid="stPlotlyChart"]'))
    if (!c.querySelector('.main-svg')) return false;
  return performance.now() - window.__vvLast > quiet;
}"""

# The colour bar's gradient of the first Plotly figure: [[offset 0..1, stop-color], ...].
GRADIENT_JS = """(plot) => [...plot.querySelectorAll('linearGradient')].map(g =>
  [...g.querySelectorAll('stop')].map(s => [parseFloat(s.getAttribute('offset')) / 100,
                                           s.getAttribute('stop-color') || s.style.stopColor]))"""

# (layer, head) of a depth-plot dot, read from the figure's own data (customdata = [layer, head, ...]).
POINT_JS = """(pt) => {
  const gd = pt.closest('.js-plotly-plot');
  const trace = pt.closest('.trace');
  const cd = trace && trace.__data__ && trace.__data__[0];
  const i = pt.__data__ && pt.__data__.i;
  if (!cd || i === undefined) return null;
  const custom = (gd._fullData[cd.trace.index] || cd.trace).customdata;
  return custom ? Array.from(custom[i]).map(Number) : null;
}"""


# Which tile of the heads grid carries the green outline (#00c853): the "head k" subplot title nearest
# above the outline's top edge. None when no outline is drawn.
OUTLINED_HEAD_JS = """(plot) => {
  const rects = [...plot.querySelectorAll('.shapelayer path')].filter(p =>
    /0,\\s*200,\\s*83|#00c853/i.test(p.style.stroke || p.getAttribute('stroke') || ''));
  if (!rects.length) return null;
  const r = rects.map(p => p.getBoundingClientRect()).sort((a, b) => b.width * b.height - a.width * a.height)[0];
  let best = null, bestD = Infinity;
  for (const a of plot.querySelectorAll('.annotation')) {
    const m = /^head (\\d+)/.exec(a.textContent.trim());
    if (!m) continue;
    const b = a.getBoundingClientRect();
    const d = Math.abs((b.left + b.right) / 2 - (r.left + r.right) / 2) + Math.abs(b.bottom - r.top);
    if (d < bestD) { bestD = d; best = Number(m[1]); }
  }
  return best;
}"""


@pytest.fixture(scope="module")
def server():
    require_chromium()
    # The README's start command (scripts/app.sh -> ensure_venv.sh, a no-op once installed).
    with app_server(ROOT / "test-artifacts" / "browser_server.log") as running:
        yield running.url


FIRST_VISIT: dict = {}


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):
        old.unlink()
    print(f"\nbrowser screenshots: {SHOTS}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport=VIEWPORT)
        pg.set_default_timeout(120_000)
        # The first visit of a fresh server is a deep link: Streamlit once ran such a page without app.py.
        pg.goto(f"{server}/rollout", timeout=120_000)
        pg.wait_for_selector('[data-testid="stFileUploaderDropzoneInput"]', state="attached", timeout=180_000)
        _wait_idle(pg)
        FIRST_VISIT["nav"] = pg.locator('[data-testid="stSidebarNav"] a').all_inner_texts()
        FIRST_VISIT["sidebar_text"] = pg.locator('[data-testid="stSidebarNav"]').inner_text()
        FIRST_VISIT["visible"] = [a.is_visible() for a in pg.locator('[data-testid="stSidebarNav"] a').all()]
        pg.locator('[data-testid="stFileUploader"]', has_text="Upload images").locator(  # not the Head box's uploader
            '[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(ASSETS / "coffee.jpg"))
        _wait_idle(pg)
        yield pg
        browser.close()


def _wait_idle(page, timeout=180_000, quiet=1500):
    """Wait until Streamlit has finished the current run and the page has stopped changing."""
    page.wait_for_timeout(300)
    page.wait_for_function(IDLE_JS, arg=quiet, polling=200, timeout=timeout)


def _goto(page, name: str):
    """Open a page by its sidebar link and wait for its run to finish.

    Waiting for idle alone raced on a loaded machine: the old page stays idle until the server answers the
    click, so the wait could end on the old page (CI once read "Compare models" as the heads page's header).
    Streamlit sets the page's address when the server starts its run, so the address is waited for first.
    """
    link = page.get_by_role("link", name=name, exact=True)
    path = urlparse(link.get_attribute("href")).path
    link.click()
    page.wait_for_url(lambda url: urlparse(url).path == path)
    _wait_idle(page)


def _show(page, name: str):
    """Open a page by its sidebar link unless the browser shows it already (a page run costs seconds of both
    cores; what the heads tests read does not depend on which of them ran before)."""
    path = urlparse(page.get_by_role("link", name=name, exact=True).get_attribute("href")).path
    if urlparse(page.url).path != path:
        _goto(page, name)


# How much taller than the viewport the page is: Streamlit scrolls its main section, not the document,
# so Playwright's full_page screenshot alone would show the viewport only.
OVERFLOW_JS = """() => Math.max(0, ...[...document.querySelectorAll('*')].map(e => {
  const o = getComputedStyle(e).overflowY;
  return (o === 'auto' || o === 'scroll') ? e.scrollHeight - e.clientHeight : 0; }))"""


def _shot(page, stem: str):
    """Viewport and whole-page screenshots (the viewport grown to the page's height, then restored)."""
    page.screenshot(path=SHOTS / f"{stem}.png")
    extra = min(page.evaluate(OVERFLOW_JS), 12_000)
    if extra > 0:
        page.set_viewport_size({"width": VIEWPORT["width"], "height": VIEWPORT["height"] + extra})
        _wait_idle(page, quiet=800)
    page.screenshot(path=SHOTS / f"{stem}_full.png", full_page=True)
    if extra > 0:
        page.set_viewport_size(VIEWPORT)
        _wait_idle(page, quiet=800)


def _changed_screenshot(page, locator, old: bytes, path, timeout_s: float = 60) -> bytes:
    """Screenshot ``locator`` until it differs from ``old`` (Streamlit reruns asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        _wait_idle(page, quiet=500)
        shot = locator.screenshot(path=path)
        if shot != old or time.monotonic() > deadline:
            return shot
        page.wait_for_timeout(500)


def _rgb(colour: str) -> tuple[int, int, int]:
    """'rgb(0, 0, 4)', 'rgba(0,0,4,1)', '#000004' or '#004' -> (0, 0, 4)."""
    c = colour.strip().lower()
    if c.startswith("#"):
        h = c[1:]
        if len(h) in (3, 4):
            h = "".join(ch * 2 for ch in h[:3])
        return tuple(int(h[i:i + 2], 16) for i in (0, 2, 4))
    m = re.match(r"rgba?\(\s*([\d.]+)\s*,\s*([\d.]+)\s*,\s*([\d.]+)", c)
    assert m, f"unreadable colour {colour!r}"
    return tuple(round(float(v)) for v in m.groups())


def test_every_page_renders_without_exceptions(page):
    links = [t.strip() for t in page.locator('[data-testid="stSidebarNav"] a').all_inner_texts()]
    assert set(PAGES) <= set(links), f"sidebar pages {links}, expected at least {PAGES}"
    exceptions = {}
    for i, name in enumerate(links, 1):
        _goto(page, name)
        _shot(page, f"{i}_{re.sub(r'[^A-Za-z]+', '_', name).strip('_').lower()}")
        errors = page.locator('[data-testid="stException"]')
        if errors.count():
            exceptions[name] = errors.all_inner_texts()
            print(f"\n--- exception on {name!r}:\n" + "\n".join(exceptions[name]))
    # client.showErrorDetails = "none" redacts the message in the browser; the traceback is in the server log.
    log = (ROOT / "test-artifacts" / "browser_server.log").read_text(errors="replace").splitlines()
    log = "\n".join(line for line in log if "Inotify" not in line)[-4000:]
    assert not exceptions, f"exceptions on pages {list(exceptions)}: {exceptions}\nserver log:\n{log}"


def test_a_deep_link_on_a_fresh_server_opens_the_page_inside_the_app(page):
    """Opening /rollout first on a fresh server shows app.py's page list, not Streamlit's legacy pages/ list."""
    assert FIRST_VISIT["nav"][:3] == ["Overview", "Attention heads", "Attention rollout"]


def test_the_sidebar_shows_every_page_under_its_section_without_view_more(page):
    """ui/navigation.py's sections as drawn at 1440x900: the section headers, then every page's link, none folded
    away (Streamlit folds pages past the tenth under "View more" unless the navigation is expanded). With 16 pages
    the last link ends ~870 px down: all on the first screen (docs/img/app/sidebar.png)."""
    from ui.navigation import SECTIONS

    assert [t.strip() for t in FIRST_VISIT["nav"]] == [p.title for ps in SECTIONS.values() for p in ps]
    words = [w.strip() for w in FIRST_VISIT["sidebar_text"].splitlines() if w.strip()]
    assert words == [w for section, ps in SECTIONS.items() for w in (section, *(p.title for p in ps))], words
    assert "View" not in FIRST_VISIT["sidebar_text"] and all(FIRST_VISIT["visible"]), FIRST_VISIT


def test_upload_becomes_the_current_image(page):
    _show(page, "Attention heads")
    # Needs the sidebar's "newest upload becomes current" (commit 3197da6).
    header = page.locator("h2").first.inner_text()
    assert "coffee.jpg" in header, f"heads page header after uploading coffee.jpg: {header!r}"


def test_patch_picker_last_column_visible_and_clickable(page):
    from playwright.sync_api import expect

    _show(page, "Attention heads")
    iframe = page.locator(PICKER).first
    img = page.frame_locator(PICKER).first.locator("img")
    img.wait_for(state="visible")
    page.wait_for_timeout(1000)  # the component attaches its click listener after the image loads
    frame_box, img_box = iframe.bounding_box(), img.bounding_box()
    tol = 1.0  # sub-pixel layout (e.g. a 245.95 px iframe around a 246 px image)
    assert img_box["x"] >= frame_box["x"] - tol and img_box["y"] >= frame_box["y"] - tol, (img_box, frame_box)
    assert img_box["x"] + img_box["width"] <= frame_box["x"] + frame_box["width"] + tol, \
        f"the patch picker's image is clipped on the right: image {img_box}, iframe {frame_box}"
    assert img_box["y"] + img_box["height"] <= frame_box["y"] + frame_box["height"] + tol, \
        f"the patch picker's image is clipped at the bottom: image {img_box}, iframe {frame_box}"
    assert frame_box["x"] >= 0 and frame_box["x"] + frame_box["width"] <= VIEWPORT["width"], frame_box

    img.click(position={"x": img_box["width"] - 3, "y": img_box["height"] / 2})
    caption = page.get_by_text(re.compile(r"Selected: patch \d+"))
    expect(caption).to_be_visible(timeout=60_000)
    _wait_idle(page)
    m = re.search(r"Selected: patch (\d+) \(row (\d+), col (\d+)\)", caption.inner_text())
    assert m, caption.inner_text()
    patch, row, col = map(int, m.groups())  # patch: 0-based raster index; row, col: 1-based on screen
    assert col == GRID_WIDTH, f"clicked 3 px from the right edge but got {m.group(0)!r}"
    assert abs(row - (GRID_WIDTH // 2 + 1)) <= 1, m.group(0)
    assert patch == (row - 1) * GRID_WIDTH + (col - 1)
    page.screenshot(path=SHOTS / "heads_patch_clicked.png")

    grid = page.locator(".js-plotly-plot").first
    before = grid.screenshot(path=SHOTS / "heads_grid_cls_query.png")
    page.get_by_text("clicked patch", exact=True).click()
    after = _changed_screenshot(page, grid, before, SHOTS / "heads_grid_clicked_patch_query.png")
    assert after != before, "the heads grid did not change when the query became the clicked patch"


def test_colour_bar_reaches_the_browser_unaltered(page):
    from vitviz.figures.colour import reference_stops

    _show(page, "Attention heads")
    plot = page.locator(".js-plotly-plot").first
    plot.locator("linearGradient stop").first.wait_for(state="attached")
    gradients = [g for g in plot.evaluate(GRADIENT_JS) if g]
    assert gradients, "no colour bar gradient in the heads grid figure"
    want = [_rgb(c) for _, c in sorted(reference_stops("Inferno"))]
    for stops in gradients:
        got = sorted((off, _rgb(c)) for off, c in stops)
        assert [c for _, c in got] == want, \
            f"colour bar stops in the browser {got} differ from plotly's Inferno {want} (a front-end theme?)"
        assert [round(o, 4) for o, _ in got] == [round(p, 4) for p, _ in sorted(reference_stops("Inferno"))]


def test_distance_plot_click_opens_the_head(page):
    from playwright.sync_api import expect

    _goto(page, "Attention distance")
    dots = page.locator(".js-plotly-plot .scatterlayer .point")
    dots.first.wait_for(state="visible")
    n = dots.count()
    assert n >= 12, f"only {n} dots in the depth plot"
    dot = dots.nth(n // 2 + 3)  # a dot in the middle layers, not the first trace's first point
    expected = dot.evaluate(POINT_JS)  # [layer, head, ...] from the figure's customdata, or None
    print(f"\ndepth-plot dot: customdata {expected}")
    # The first visit's explanation stands above the plot until closed: a click outside the viewport is lost.
    dot.scroll_into_view_if_needed()
    box = dot.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.screenshot(path=SHOTS / "distance_dot_clicked.png")
    message = page.get_by_text(re.compile(r"Opened from the distance plot: layer \d+, head \d+"))
    expect(message).to_be_visible(timeout=90_000)
    _wait_idle(page)
    # Read after the page settled: the reruns that follow the switch keep the note while the grid shows that head
    # (they once took it away: the URL, which can lag behind the widgets, was compared too).
    expect(message).to_be_visible()
    text = message.inner_text()
    _shot(page, "heads_opened_from_distance")
    m = re.search(r"layer (\d+), head (\d+)", text)
    layer, head = int(m.group(1)), int(m.group(2))
    # The dot's own (layer, head) must be readable: a None here used to skip the check silently.
    assert expected is not None, "the clicked dot carries no customdata: the check below would test nothing"
    assert [layer, head] == [int(expected[0]), int(expected[1])], (m.group(0), expected)
    assert page.locator("h2").first.inner_text().startswith("Attention heads")
    value = page.get_by_test_id("stSliderThumbValue").first.inner_text()
    assert int(value) == layer, f"Layer slider shows {value}, the message says layer {layer}"
    outlined = page.locator(".js-plotly-plot").first.evaluate(OUTLINED_HEAD_JS)
    assert outlined == head, f"the message says head {head}, the grid outlines head {outlined}"
