"""The heads explorer in a real browser (Debian Chromium through Playwright), drawn client-side.

One app server with ``VITVIZ_DRAW=browser`` (shared with the other browser-drawn files, conftest's ``app_servers``)
and one page whose websocket to the server goes through
a Playwright route, so a test can hold back every message the browser sends: the component's pixels against
the PNG export's renderer, a layer move repainting while nothing reaches the server, a reload (F5) bringing
back page and layer, a view opened from a link. The tests share that page, so each first opens the link of
the view it starts from (``_open``): any order gives the same result (pytest-randomly once ran them shuffled,
and the tests that relied on the previous one's layer failed).
"""
import base64
import functools
import hashlib
import re

import numpy as np
import pytest

from conftest import ASSETS
from test_browser import CHROMIUM, CHROMIUM_ARGS, IDLE_JS, ROOT, VIEWPORT, require_chromium

pytestmark = [pytest.mark.slow, pytest.mark.browser]
SHOTS = ROOT / "test-artifacts" / "explorer"
READY = '.vv-explorer[data-ready="1"]'
IMAGE = "astronaut.jpg"  # the first sample photo, shown before anything is uploaded
DEFAULT_VIEW: dict = {}  # the heads view as /heads?intro=0 opens it (the fixture reads it)
HELD: dict = {}  # the fixture's route state: "on" (hold back what the page sends), "held" (count), "dropped"

# The explorer's root, in its shadow root (the component isolates its styles) or in the document.
ROOT_JS = """(() => [...document.querySelectorAll('*')].map(e => e.shadowRoot && e.shadowRoot.querySelector('.vv-explorer'))
  .find(Boolean) || document.querySelector('.vv-explorer'))()"""
# A canvas's RGBA bytes as base64 (``px``): a JSON array of numbers took seconds per call to build and parse.
PIXELS_JS = """(c) => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let s = '';
  for (let i = 0; i < d.length; i += 32768) s += String.fromCharCode.apply(null, d.subarray(i, i + 32768));
  return btoa(s); }"""
TILES_JS = f"""() => [...{ROOT_JS}.querySelectorAll('canvas.vv-tile')].map(c => ({{head: Number(c.dataset.head),
  w: c.width, h: c.height, px: ({PIXELS_JS})(c)}}))"""
# Every message the page sends to the server, timed in the page (an init script): whether one left before a repaint
# is read from the page's own clock, not from when the test got round to counting (CI, 2026-11-29: hashing the canvases
# took longer than the view's 400 ms debounce, and a message sent well after the repaint was counted as before it).
# Playwright's route puts its own WebSocket class in the page, so the spy wraps whichever class is there when a test
# acts (once per class); it returns how many sends it has timed so far.
SEND_SPY_JS = """() => { const proto = window.WebSocket.prototype;
  if (!proto.__vvSpied) { const send = proto.send; proto.__vvSpied = true;
    proto.send = function (data) { (window.__vvSent = window.__vvSent || []).push(performance.now());
      return send.call(this, data); }; }
  return (window.__vvSent || []).length; }"""
# The send times (from the ``sent``-th on) earlier than the ``paints``-th repaint (0-based), or null if unknown.
SENT_BEFORE_PAINT_JS = """([sent, paints]) => { const p = (window.__vvPaints || [])[paints];
  return p ? (window.__vvSent || []).slice(sent).filter((t) => t <= p.t) : null; }"""
VIEW_JS = f"""() => {{ const r = {ROOT_JS}; return r ? {{view: JSON.parse(r.dataset.view || 'null'),
  paints: Number(r.dataset.paints || 0)}} : null; }}"""


@pytest.fixture(scope="module")
def server(app_servers):
    require_chromium()
    return app_servers.url("browser")


@pytest.fixture(scope="module")
def browser_page(server):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    held = HELD
    held.update(on=False, held=0, dropped=False)

    def through(ws):
        upstream = ws.connect_to_server()

        def outgoing(message):
            if held["on"]:
                held["held"] += 1  # never reaches the server
                held["dropped"] = True  # the server's idea of this page is now behind it: _open reloads
            else:
                upstream.send(message)
        ws.on_message(outgoing)
        upstream.on_message(lambda message: ws.send(message))

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport=VIEWPORT, accept_downloads=True)
        pg.set_default_timeout(240_000)
        pg.route_web_socket(re.compile(r".*/_stcore/stream.*"), through)
        pg.goto(f"{server}/heads?intro=0", timeout=300_000)  # the first visit's explanation has its own test
        pg.wait_for_selector(READY, timeout=300_000)
        DEFAULT_VIEW.update(pg.evaluate(VIEW_JS)["view"])  # every choice at its default: what _open compares with
        yield pg, held, server
        browser.close()


@functools.lru_cache(maxsize=1)
def _forward():
    """The page's image through the bundled model, here in the test's process: (attention, layout, forward)."""
    from vitviz.io.images import load_image
    from vitviz.sources.models import ModelSpec, load_model
    from vitviz.analyses.per_image import analyse_images as forward

    fwd = forward(load_model(ModelSpec()), [load_image(ASSETS / IMAGE).image])
    return fwd.trace.stack("attn")[0].numpy(), fwd.layout, fwd


def _open(pg, server: str, link: str, unless: dict | None = None) -> None:
    """Open ``link`` (a path with its query, the view's state) in the shared page and wait for the explorer, unless
    the page already shows that path with the view ``unless`` (the previous test in file order left it there: a page
    load costs seconds, and in another order the link is opened) and the server has seen everything the page sent.
    A test that held messages back leaves a server whose session state is behind the page, and a rerun then starts
    from that state: the likely cause of the one time (a CI-like run, 2026-11-25) the smoothed rollout test, which
    follows two held repaints, waited 120 s for a repaint that never came."""
    if unless is not None and not HELD["dropped"] and pg.url.split("?")[0].endswith(link.split("?")[0]):
        state = pg.evaluate(VIEW_JS)
        if state and state["view"] == state["view"] | unless:
            return
    HELD["dropped"] = False
    pg.goto(f"{server}{link}", timeout=300_000)
    pg.wait_for_selector(READY, timeout=300_000)
    pg.wait_for_function(IDLE_JS, arg=1500, polling=200, timeout=300_000)


def _wait_until_held(pg, held: dict, limit_s: float = 60) -> None:
    """Wait until the route has held back at least one message the page sent (the view reported after a repaint,
    debounced). Playwright runs the route handler only while it waits (a time.sleep would not), so in steps."""
    for _ in range(int(limit_s / 0.25)):
        if held["held"] >= 1:
            return
        pg.wait_for_timeout(250)
    assert held["held"] >= 1, f"nothing was sent within {limit_s} s of the repaint"


def _heads_at(layer: int) -> dict:
    """The heads view as the page opens (``DEFAULT_VIEW``, read by the fixture) at ``layer``."""
    return DEFAULT_VIEW | {"layer": layer}


def _reference(view: dict):
    """The PNG export's tiles (vitviz.figures.overlay.render_maps, as ui.display.panel_download calls it, at zoom 1)
    for the page's image, computed here from the model's own forward in float32."""
    from vitviz.analyses.maps import layer_maps
    from vitviz.figures.overlay import render_maps

    attention, layout, fwd = _forward()
    layer = view["layer"] - 1
    by_patch = view["query"] == "patch" or view["dir"] == "key"
    query = view["patch"] if by_patch else view["query"]
    maps = layer_maps(attention, layout, layer, query, "key" if view["dir"] == "key" else "query")
    sinks = fwd.sinks[0].patch_sinks(layout, [layer]) if view["sinks"] else None
    rendered = render_maps(fwd.batch.images[0], maps, scale_mode=view["scale"], cmap=view["cmap"], style=view["style"],
                           opacity=view["opacity"], query=query if by_patch else None, sinks=sinks)
    return maps, rendered, layout


def _compare_reference(view: dict):
    """The Compare layers PNG's tiles (pages/2_heads.py _compare_panel: one head, the panels' layers, each panel's
    own sinks crossed and their union kept out of the scale)."""
    from vitviz.analyses.maps import layer_maps
    from vitviz.figures.overlay import render_maps

    attention, layout, fwd = _forward()
    by_patch = view["query"] == "patch" or view["dir"] == "key"
    query = view["patch"] if by_patch else view["query"]
    mode = "key" if view["dir"] == "key" else "query"
    maps = np.stack([layer_maps(attention, layout, l - 1, query, mode)[view["chead"] - 1] for l in view["cl"]])
    sinks = [fwd.sinks[0].patch_sinks(layout, [l - 1]) for l in view["cl"]] if view["sinks"] else None
    rendered = render_maps(fwd.batch.images[0], maps, scale_mode=view["scale"], cmap=view["cmap"], style=view["style"],
                           opacity=view["opacity"], query=query if by_patch else None, sinks=sinks)
    return maps, rendered, layout


def _rgb(tile: dict) -> np.ndarray:
    """A canvas's pixels (``PIXELS_JS``) as an (h, w, 3) int array."""
    rgba = np.frombuffer(base64.b64decode(tile["px"]), dtype=np.uint8).reshape(tile["h"], tile["w"], 4)
    return rgba[..., :3].astype(int)


def _lut_step(cmap: str) -> int:
    from vitviz.figures.colour import lookup_table

    return int(np.abs(np.diff(lookup_table(cmap).astype(int), axis=0)).max())


def _assert_tiles_equal_export(pg, name: str) -> None:
    view = pg.evaluate(VIEW_JS)["view"]
    tiles = sorted(pg.evaluate(TILES_JS), key=lambda t: t["head"])
    _assert_equal_export(tiles, *_reference(view), view["cmap"], name)


def _assert_equal_export(tiles: list[dict], maps, rendered, layout, cmap: str, name: str) -> None:
    """Each canvas (``px``: RGBA of ``w`` x ``h``) against the export's tile, within the float16 tolerance."""
    assert len(tiles) == len(maps)
    # float16 keeps 11 significant bits: a value (and so a percentile top, a linear interpolation of two values,
    # or a bilinear mix of four) moves by at most 2^-11 relative, so a cell's position on the colour map t = v / top
    # moves by at most ~2^-10 * t; 255 * 2^-10 < 1, so its colour is at most one step of the 256-step map away,
    # blended at alpha <= opacity (alpha = opacity * sqrt(t) moves by < 2^-11): |d| <= one LUT step + 1 (rounding).
    tolerance = _lut_step(cmap) + 1
    gh, gw = layout.grid_size
    worst, exact, pixels = 0, 0, 0
    for i, (t, reference, values, scale) in enumerate(zip(tiles, rendered.tiles, maps, rendered.scales)):
        got = _rgb(t)
        want = np.asarray(reference, dtype=int)
        assert got.shape == want.shape
        diff = np.abs(got - want).max(axis=2)
        # A cell within float16 rounding of its scale's top may be outlined (clipped) on one side only.
        top = 10 ** scale.hi if scale.log else scale.hi
        near = np.abs(values - top) <= 2 * 2.0 ** -11 * top
        ph, pw = want.shape[0] // gh, want.shape[1] // gw
        border = np.zeros(diff.shape, bool)
        for r, c in zip(*np.nonzero(near)):
            block = border[r * ph:(r + 1) * ph, c * pw:(c + 1) * pw]
            block[:] = True
            block[1:-1, 1:-1] = False
        worst = max(worst, int(diff[~border].max()))
        exact, pixels = exact + int((diff == 0).sum()), pixels + diff.size
        assert diff[~border].max() <= tolerance, (name, i, int(diff[~border].max()), tolerance)
    print(f"{name}: worst channel difference {worst} (tolerance {tolerance}), "
          f"{exact / pixels:.4%} of pixels identical")


def test_explorer_tiles_equal_the_png_export(browser_page):
    pg, _, server = browser_page
    _open(pg, server, "/heads?intro=0&layer=12", unless=_heads_at(12))
    pg.screenshot(path=str(SHOTS / "heads_explorer.png"))
    pg.screenshot(path=str(ROOT / "docs" / "heads.png"))  # the README's picture of the page
    view = pg.evaluate(VIEW_JS)["view"]
    assert view["layer"] == 12 and view["query"] == "cls"
    _assert_tiles_equal_export(pg, "layer 12, CLS, robust per head, sinks marked")


def _tile_hash(pg) -> str:
    return hashlib.sha256(b"".join(base64.b64decode(t["px"]) for t in pg.evaluate(TILES_JS))).hexdigest()


def test_layer_move_repaints_with_the_server_cut_off(browser_page):
    pg, held, server = browser_page
    _open(pg, server, "/heads?intro=0&layer=12", unless=_heads_at(12))
    before, paints, sent = _tile_hash(pg), pg.evaluate(VIEW_JS)["paints"], pg.evaluate(SEND_SPY_JS)
    held["on"], held["held"] = True, 0
    try:
        slider = pg.locator('.vv-explorer input[data-key="layer"]')
        slider.focus()
        slider.press("ArrowLeft")
        pg.wait_for_function(f"() => ({VIEW_JS})().paints > {paints}", timeout=10_000)
        state = pg.evaluate(VIEW_JS)
        assert state["view"]["layer"] == 11
        assert _tile_hash(pg) != before  # new pixels, drawn while no message could reach the server
        # The repaint did not wait for the server: nothing was sent before it (by the page's clock).
        assert pg.evaluate(SENT_BEFORE_PAINT_JS, [sent, paints]) == []
        _wait_until_held(pg, held)  # afterwards the view went out (and was held back here)
    finally:
        held["on"] = False
    assert "layer=11" in pg.url
    pg.screenshot(path=str(SHOTS / "heads_layer11_offline.png"))


def test_reload_restores_page_and_layer(browser_page):
    pg, _, server = browser_page
    _open(pg, server, "/heads?intro=0&layer=11", unless=_heads_at(11))
    slider = pg.locator('.vv-explorer input[data-key="layer"]')
    slider.focus()
    slider.press("ArrowLeft")  # layer 10, now with the server listening
    pg.wait_for_function(f"() => ({VIEW_JS})().view.layer === 10")
    pg.wait_for_url(re.compile(r".*[?&]layer=10(&|$).*"))  # the debounced report (a reload reads the URL)
    pg.reload()
    pg.wait_for_selector(READY, timeout=300_000)
    assert "/heads" in pg.url
    assert pg.evaluate(VIEW_JS)["view"]["layer"] == 10


def test_heads_downloads_finish_and_rerun_nothing(browser_page, tmp_path):
    """The heads grid's PNG, npz, SVG and PDF, each clicked twice: every file arrives (the SVG and PDF with the
    panel's title as text), no spinner is left, and the explorer is not rebuilt (a rerun with on_click="rerun" once re-ran the page behind each click)."""
    pg, _, server = browser_page
    _open(pg, server, "/heads?intro=0&layer=10", unless=_heads_at(10))
    paints = pg.evaluate(VIEW_JS)["paints"]
    files = {}
    for _ in range(2):
        for label in ["Image (png)", "Data (npz)", "Image (svg)", "Image (pdf)"]:
            button = pg.get_by_role("button", name=label).first
            button.scroll_into_view_if_needed()
            with pg.expect_download(timeout=60_000) as info:
                button.click()
            path = tmp_path / info.value.suggested_filename
            info.value.save_as(path)
            files[label] = path
    assert files["Image (png)"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "layer10" in files["Image (png)"].name  # the files follow the browser's view
    # For papers: the same panel with vector text (tests/test_vector_figures.py reads them the same way).
    import xml.etree.ElementTree as ET

    from test_vector_figures import _pdf_text

    title = "Layer 10, every head, CLS query"
    svg = ET.parse(files["Image (svg)"]).getroot()
    assert title in ["".join(t.itertext()).strip() for t in svg.iter() if t.tag.endswith("text")]
    assert title in _pdf_text(files["Image (pdf)"].read_bytes())
    with np.load(files["Data (npz)"]) as npz:
        assert npz["maps"].shape == (6, 16, 16) and (npz["maps"] >= 0).all() and (npz["maps"] <= 1).all()
    assert pg.locator('[data-testid="stDownloadButton"] [data-testid="stSpinner"]').count() == 0
    assert pg.evaluate(VIEW_JS)["paints"] == paints


def test_an_upload_survives_f5_and_the_uploaders_own_x_removes_it(browser_page, tmp_path):
    """Upload, remove with the uploader's own x, upload again, move the layer, F5: image, page and layer are back,
    and the sidebar's list of loaded images (the uploader itself is empty after a reload) removes it."""
    pg, _, server = browser_page
    photo = tmp_path / "my_cat.jpg"  # not a sample's name: only the kept upload can bring it back
    photo.write_bytes((ASSETS / "chelsea.jpg").read_bytes())
    up = pg.context.browser.new_context(viewport=VIEWPORT).new_page()
    up.set_default_timeout(120_000)
    up.goto(f"{server}/heads?intro=0")
    up.wait_for_selector(READY, timeout=300_000)
    heading = lambda name: up.get_by_role("heading", name=f"Attention heads · {name}")  # noqa: E731
    uploader = up.locator('[data-testid="stFileUploader"]', has_text="Upload images")  # not the Head box's uploader
    uploader.locator('input[type="file"]').set_input_files(photo)
    heading("my_cat.jpg").wait_for()
    assert "img=" in up.url
    uploader.locator('[data-testid="stFileChipDeleteBtn"] button, button[data-testid="stFileChipDeleteBtn"]').first.click()  # the widget's own x
    heading("astronaut.jpg").wait_for()
    up.wait_for_function(IDLE_JS, arg=1500, polling=200)
    assert "img=" not in up.url and up.get_by_text("my_cat.jpg").count() == 0
    # Another file (the same file again did not come back here within 240 s: seen, not examined).
    again = tmp_path / "my_cat_again.jpg"
    again.write_bytes(photo.read_bytes() + b"\0")  # the same picture (a byte after the JPEG's end), another name
    uploader.locator('input[type="file"]').set_input_files(again)
    heading("my_cat_again.jpg").wait_for()
    up.wait_for_selector(READY)
    up.wait_for_function(IDLE_JS, arg=1500, polling=200)
    slider = up.locator('.vv-explorer input[data-key="layer"]')
    slider.focus()
    slider.press("ArrowLeft")
    up.wait_for_function(f"() => ({VIEW_JS})().view.layer === 11")
    up.wait_for_url(re.compile(r".*[?&]layer=11(&|$).*"))  # the debounced report (a reload reads the URL)
    up.reload()
    heading("my_cat_again.jpg").wait_for()
    up.wait_for_selector(READY, timeout=300_000)
    assert "/heads" in up.url and up.evaluate(VIEW_JS)["view"]["layer"] == 11
    up.screenshot(path=str(SHOTS / "upload_after_reload.png"))
    # The uploader is empty after F5; the sidebar's list says what is loaded and removes it.
    assert uploader.locator('[data-testid="stFileChip"]').count() == 0
    remove = up.locator('[class*="st-key-remove_"] button').first
    remove.wait_for()
    assert "my_cat_again.jpg" in up.locator('[data-testid="stSidebar"]').inner_text()
    remove.click()
    heading("astronaut.jpg").wait_for()
    assert "img=" not in up.url
    up.context.close()


def test_a_link_opens_the_view_it_names(browser_page):
    pg, _, server = browser_page
    _open(pg, server, "/heads?intro=0&layer=6&query=patch&patch=100&style=heatmap&scale=shared+across+heads&sinks=0&cmap=Viridis")
    view = pg.evaluate(VIEW_JS)["view"]
    assert (view["layer"], view["query"], view["patch"], view["style"], view["cmap"]) == (6, "patch", 100, "heatmap", "Viridis")
    pg.screenshot(path=str(SHOTS / "heads_patch100_heatmap.png"))
    _assert_tiles_equal_export(pg, "layer 6, patch 100 as query, heatmap, shared scale")


def test_a_first_visit_explains_and_one_click_opens_the_heads_page(browser_page):
    pg, _, server = browser_page
    first = pg.context.browser.new_context(viewport=VIEWPORT).new_page()  # a new visitor: no session, no URL state
    first.set_default_timeout(240_000)
    first.goto(server)
    first.get_by_text("New here? What vitviz shows").wait_for()
    first.wait_for_function(IDLE_JS, arg=1500, polling=200)  # the sample thumbnails drawn, not their placeholders
    first.screenshot(path=str(SHOTS / "first_visit.png"))
    first.get_by_role("button", name="Open chelsea").click()
    first.wait_for_selector(READY)
    assert "/heads" in first.url and "image=chelsea.jpg" in first.url
    assert first.get_by_role("heading", name="Attention heads · chelsea.jpg").is_visible()
    assert not first.get_by_text("New here?").count()
    first.context.close()


def test_a_collapsed_explanation_stays_closed_after_a_reload(browser_page):
    pg, _, server = browser_page
    first = pg.context.browser.new_context(viewport=VIEWPORT).new_page()
    first.set_default_timeout(240_000)
    first.goto(f"{server}/rollout")
    first.get_by_text("New here? What vitviz shows").click()  # the expander's header: collapse
    first.wait_for_url(re.compile(r".*intro=0.*"))
    first.wait_for_function(IDLE_JS, arg=1500, polling=200)
    assert first.get_by_text("New here? What vitviz shows").count() == 1  # a one-line header, to reopen it
    assert not first.get_by_role("button", name="Open chelsea").is_visible()
    first.reload()
    first.get_by_role("heading", name=re.compile("Attention rollout")).wait_for()
    first.wait_for_function(IDLE_JS, arg=1500, polling=200)
    assert first.get_by_text("New here?").count() == 0
    first.context.close()


def test_faithfulness_screenshot_for_the_readme(browser_page):
    """The README's picture of the faithfulness page as it opens: its methods, protocol and run button (a run takes
    minutes on a shared CPU; its numbers are tested in tests/test_faithfulness.py)."""
    pg, _, server = browser_page
    pg.goto(f"{server}/faithfulness?intro=0")
    pg.locator(".st-key-faith_run button").wait_for(timeout=300_000)
    pg.wait_for_function(IDLE_JS, arg=1500, polling=200, timeout=300_000)
    pg.screenshot(path=str(ROOT / "docs" / "faithfulness.png"))


# ---- the other views of the same component: Compare layers (heads page) and rollout after a chosen layer ----
CANVASES_JS = f"""(cls) => [...{ROOT_JS}.querySelectorAll('canvas.' + cls)].map(c => ({{...c.dataset,
  w: c.width, h: c.height, px: ({PIXELS_JS})(c)}}))"""


def _canvas_hash(pg, cls: str) -> str:
    return hashlib.sha256(b"".join(base64.b64decode(t["px"]) for t in pg.evaluate(CANVASES_JS, cls))).hexdigest()


def _repaints_offline(pg, held, act, cls: str) -> dict:
    """Run ``act`` (a slider key press, a click) with every message to the server held back: the canvases of class
    ``cls`` are repainted before anything is sent, and the view goes out afterwards. Returns the new view."""
    before, paints, sent = _canvas_hash(pg, cls), pg.evaluate(VIEW_JS)["paints"], pg.evaluate(SEND_SPY_JS)
    held["on"], held["held"] = True, 0
    try:
        act()
        pg.wait_for_function(f"() => ({VIEW_JS})().paints > {paints}", timeout=10_000)
        assert _canvas_hash(pg, cls) != before  # new pixels, drawn while no message could reach the server
        # The repaint did not wait for the server: nothing was sent before it (by the page's clock).
        assert pg.evaluate(SENT_BEFORE_PAINT_JS, [sent, paints]) == []
        _wait_until_held(pg, held)  # afterwards the view went out (and was held back here)
    finally:
        held["on"] = False
    return pg.evaluate(VIEW_JS)["view"]


def _press(pg, key: str, button: str = "ArrowLeft"):
    def act():
        slider = pg.locator(f'.vv-explorer input[data-key="{key}"]')
        slider.focus()
        slider.press(button)
    return act


def test_compare_layers_are_drawn_in_the_browser_and_a_panel_move_repaints_offline(browser_page):
    pg, held, server = browser_page
    _open(pg, server, "/heads?intro=0&chead=2&cn=3&cl=1,6,12")
    view = pg.evaluate(VIEW_JS)["view"]
    assert (view["chead"], view["cn"], view["cl"]) == (2, 3, [1, 6, 12])
    panels = lambda: sorted(pg.evaluate(CANVASES_JS, "vv-ctile"), key=lambda t: int(t["panel"]))  # noqa: E731
    _assert_equal_export(panels(), *_compare_reference(view), view["cmap"], "compare: head 2, layers 1, 6, 12, CLS")
    grid = _tile_hash(pg)
    view = _repaints_offline(pg, held, _press(pg, "cl1"), "vv-ctile")
    assert view["cl"] == [1, 5, 12] and [t["layer"] for t in panels()] == ["1", "5", "12"]
    assert _tile_hash(pg) == grid  # a compare slider repaints the compare panels only, not the heads grid
    _assert_equal_export(panels(), *_compare_reference(view), view["cmap"], "compare: head 2, layers 1, 5, 12, CLS")
    pg.wait_for_function("() => location.search.includes('cl=1%2C5%2C12') || location.search.includes('cl=1,5,12')")
    # Two to four panels spreads the layers over the depth (the walk found 1, 12, 8, 12).
    pg.locator('.vv-explorer select[data-key="cn"]').select_option("4")
    pg.wait_for_function(f"() => ({VIEW_JS})().view.cl.length === 4")
    assert pg.evaluate(VIEW_JS)["view"]["cl"] == [1, 5, 8, 12]
    pg.locator(".vv-explorer .vv-compare").scroll_into_view_if_needed()
    pg.screenshot(path=str(SHOTS / "heads_compare_layers.png"))


@functools.lru_cache(maxsize=4)
def _rollout(patch: int | None) -> np.ndarray:
    from vitviz.analyses.rollout import rollout

    attention, layout, _ = _forward()
    return rollout(attention, layout, query=patch).per_layer


def _rollout_reference(depth: int, patch: int | None, smooth: bool = False):
    """The rollout page's PNG export (pages/3_rollout.py: panel_download of per_layer[depth - start] with the
    sinks of the range and the clicked patch marked), with the page's default display choices."""
    from ui.display import Display
    from vitviz.figures.overlay import render_maps

    attention, layout, fwd = _forward()
    d = Display(smooth=smooth)
    shown = _rollout(patch)[depth - 1][None]
    rendered = render_maps(fwd.batch.images[0], shown, scale_mode=d.scale_mode, cmap=d.cmap, style=d.style,
                           opacity=d.opacity, smooth=d.smooth, query=patch,
                           sinks=fwd.sinks[0].patch_sinks(layout, range(0, attention.shape[0])))
    return shown, rendered, layout


def _assert_rollout_tile(pg, depth: int, patch: int | None, name: str, smooth: bool = False) -> None:
    """The canvas equals the export after ``depth`` within the float16 tolerance, and is nearer to it than to the
    exports after the neighbouring layers: rollout converges with depth, so adjacent layers' pictures differ by
    less than the tolerance in most pixels and the tolerance alone would not tell a depth off by one."""
    tiles = pg.evaluate(CANVASES_JS, "vv-tile")
    _assert_equal_export(tiles, *_rollout_reference(depth, patch, smooth), "Inferno", name)
    got = _rgb(tiles[0])
    distance = {d: np.abs(got - np.asarray(_rollout_reference(d, patch, smooth)[1].tiles[0], dtype=int)).mean()
                for d in (depth - 1, depth, depth + 1) if 1 <= d <= 12}
    assert min(distance, key=distance.get) == depth, distance


def test_rollout_after_a_layer_is_drawn_in_the_browser_and_moves_offline(browser_page):
    pg, held, server = browser_page
    _open(pg, server, "/rollout?intro=0&depth=12&readout=readout")
    pg.screenshot(path=str(SHOTS / "rollout_explorer.png"))
    view = pg.evaluate(VIEW_JS)["view"]
    assert (view["depth"], view["readout"]) == (12, "readout")
    _assert_rollout_tile(pg, 12, None, "rollout of CLS, layers 1-12")
    view = _repaints_offline(pg, held, _press(pg, "depth"), "vv-tile")
    assert view["depth"] == 11
    _assert_rollout_tile(pg, 11, None, "rollout of CLS, layers 1-11")
    # A click on the picker reads out that patch's row, also with the server cut off (every patch's rows are here).
    box = pg.locator(".vv-explorer canvas.vv-picker").bounding_box()
    click = lambda: pg.mouse.click(box["x"] + box["width"] * 9.5 / 16, box["y"] + box["height"] * 6.5 / 16)  # noqa: E731
    view = _repaints_offline(pg, held, click, "vv-tile")
    assert (view["readout"], view["patch"]) == ("patch", 6 * 16 + 9)
    _assert_rollout_tile(pg, 11, 105, "rollout of patch 105, layers 1-11")
    pg.wait_for_url(re.compile(r".*depth=11.*"))
    pg.screenshot(path=str(SHOTS / "rollout_patch105_depth11.png"))


def test_rollout_smoothed_in_the_browser_equals_the_export(browser_page):
    """The page's Display choices come with the payload: "Smooth" (bilinear between patch centres, as Pillow resizes
    a float image) is drawn in the browser as in the PNG.

    In a page of its own, with no route between it and the server (the shared page's WebSocket runs through the
    test's holding route). Twice under load (2026-11-25, a CI run on 2026-11-27) this test waited 120 s for a
    repaint after the click; on 2026-11-27 a whole-file run beside busy processes showed why it can: the Smooth
    switch still read off after the click. So the click waits until the Display box has stopped opening (a click
    during its animation can land beside the label), and the switch must read on before the repaint is awaited."""
    from playwright.sync_api import expect

    shared, _, server = browser_page
    pg = shared.context.browser.new_page(viewport=VIEWPORT)
    try:
        pg.set_default_timeout(240_000)
        pg.goto(f"{server}/rollout?intro=0&depth=11&readout=patch&patch=105", timeout=300_000)
        pg.wait_for_selector(READY, timeout=300_000)
        pg.wait_for_function(IDLE_JS, arg=1500, polling=200, timeout=300_000)
        paints = pg.evaluate(VIEW_JS)["paints"]
        pg.get_by_text("Display", exact=True).first.click()
        switch = pg.get_by_role("switch", name="Smooth (bilinear between patch centres)")
        label = pg.get_by_text("Smooth (bilinear between patch centres)")
        boxes = []
        while len(boxes) < 3 or (boxes[-1] != boxes[-2] or boxes[-2] != boxes[-3]) and len(boxes) < 50:  # still twice
            label.wait_for(state="visible")
            boxes.append(label.bounding_box())
            pg.wait_for_timeout(200)
        pg.get_by_text("Smooth (bilinear between patch centres)").click()
        try:
            expect(switch).to_be_checked(timeout=15_000)
        except AssertionError:
            # Seen in a whole-file run beside busy processes before the wait above (a rerun after the page settled
            # had also moved the URL's keys): recorded, clicked once more, then required.
            (SHOTS / "smooth_click_lost.txt").write_text(f"the Smooth switch read off 15 s after a click at {pg.url}\n")
            pg.get_by_text("Smooth (bilinear between patch centres)").click()
        expect(switch).to_be_checked(timeout=30_000)
        try:
            pg.wait_for_function(f"() => (window.__vvPaintCount || 0) > {paints}", timeout=120_000)
        except Exception:
            pg.screenshot(path=str(SHOTS / "rollout_smoothed_no_repaint.png"))
            raise
        pg.wait_for_selector(READY)
        view = pg.evaluate(VIEW_JS)["view"]
        assert (view["depth"], view["patch"]) == (11, 105)  # a new payload keeps the view
        _assert_rollout_tile(pg, 11, 105, "rollout of patch 105, layers 1-11, smoothed", smooth=True)
    finally:
        pg.close()


OUTLINED_JS = f"""() => [...{ROOT_JS}.querySelectorAll('.vv-outlined canvas.vv-tile')].map(c => Number(c.dataset.head))"""
CHEAD_JS = f"""() => Number({ROOT_JS}.querySelector('select[data-key="chead"]').value)"""


@pytest.mark.parametrize("compare_head_before", [None, 2])
def test_a_distance_dot_opens_its_layer_outlines_its_head_and_sets_compare_layers(browser_page, compare_head_before):
    """A click on a dot of the depth plot opens the heads page on that layer with that head's tile outlined and
    picked under Compare layers, in a fresh view and in one whose Compare head was set before (its last report
    must not win over the click)."""
    from test_browser import POINT_JS

    pg, _, server = browser_page
    if compare_head_before:
        _open(pg, server, f"/heads?intro=0&chead={compare_head_before}")
        assert pg.evaluate(CHEAD_JS) == compare_head_before
        assert pg.evaluate(OUTLINED_JS) == [compare_head_before]
    HELD["dropped"] = True  # the next _open loads the link
    pg.goto(f"{server}/distance?intro=0", timeout=300_000)
    dots = pg.locator(".js-plotly-plot .scatterlayer .point")
    dots.first.wait_for(state="visible")
    pg.wait_for_function(IDLE_JS, arg=1500, polling=200, timeout=300_000)
    dot = dots.nth(dots.count() // 2 + 3)  # a middle layer, not head 1 of layer 1 (the defaults)
    layer, head = dot.evaluate(POINT_JS)[:2]
    assert (layer, head) != (12, compare_head_before or 1)
    dot.scroll_into_view_if_needed()
    box = dot.bounding_box()
    pg.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    pg.get_by_text(re.compile(r"Opened from the distance plot")).wait_for(timeout=120_000)
    pg.wait_for_selector(READY, timeout=300_000)
    pg.wait_for_function(IDLE_JS, arg=1500, polling=200, timeout=300_000)
    shots = ROOT / "test-artifacts" / "walk"
    shots.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(shots / f"heads_from_distance_dot{'_after_chead' if compare_head_before else ''}.png"))
    view = pg.evaluate(VIEW_JS)["view"]
    assert (view["layer"], view["chead"]) == (layer, head), (view, layer, head)
    assert pg.evaluate(OUTLINED_JS) == [head]
    assert pg.evaluate(CHEAD_JS) == head
    HELD["dropped"] = True  # leave the next test a fresh load: this one's view is not the default


NOTE_JS = f"""() => {ROOT_JS}.querySelector('.vv-controls .vv-small').textContent"""


def test_the_browser_pickers_name_a_patch_as_every_page_does_and_rollout_reading_cls_selects_none(browser_page):
    """The heads picker names patch 148 as the Overview grid labels it ("patch 148 (row 10, col 5)", 0-based raster
    number, rows and columns from 1); the rollout page reading out CLS neither outlines nor calls selected the patch
    clicked on the heads page, and calls it selected once it reads the clicked patch out."""
    pg, _, server = browser_page
    _open(pg, server, "/heads?intro=0&query=patch&patch=148")
    assert pg.evaluate(NOTE_JS).endswith("Selected: patch 148 (row 10, col 5)")
    shots = ROOT / "test-artifacts" / "walk"
    shots.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(shots / "heads_patch148.png"))
    _open(pg, server, "/rollout?intro=0&patch=148&readout=readout")
    assert pg.evaluate(NOTE_JS) == "Click a patch to roll out its row. Read out now: CLS."
    pg.screenshot(path=str(shots / "rollout_cls_with_patch148_kept.png"))
    _open(pg, server, "/rollout?intro=0&patch=148&readout=patch")
    assert pg.evaluate(NOTE_JS).endswith("Selected: patch 148 (row 10, col 5)")
    HELD["dropped"] = True
