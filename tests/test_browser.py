"""End to end in a real browser: `streamlit run app.py` driven by Debian's Chromium through Playwright.

Screenshots go to test-artifacts/browser/ (the path is printed). Skipped when Chromium is not
installed, except under CI, where .ci/run installs it and a missing browser is a failure.
"""
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import ASSETS

pytestmark = [pytest.mark.slow, pytest.mark.browser]
ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = ROOT / "test-artifacts" / "browser"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing: .ci/run should have installed the Debian package 'chromium'.")
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    port = _free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
                             "--server.address", "127.0.0.1", "--server.headless", "true"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"streamlit did not start: {proc.stdout.read().decode()[-2000:]}")
    yield url
    proc.terminate()
    proc.wait(timeout=20)


def _wait_idle(page, timeout=120_000):
    """Wait until Streamlit has finished the current run (no 'Running...' status)."""
    page.wait_for_timeout(300)
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=timeout)
    page.wait_for_timeout(300)


def _changed_screenshot(page, locator, old: bytes, path, timeout_s: float = 60) -> bytes:
    """Screenshot ``locator`` until it differs from ``old`` (Streamlit reruns asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        _wait_idle(page)
        shot = locator.screenshot(path=path)
        if shot != old or time.monotonic() > deadline:
            return shot
        page.wait_for_timeout(500)


def test_upload_heads_slider_and_click_in_a_real_browser(server):
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    print(f"\nbrowser screenshots: {SHOTS}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.goto(server, timeout=60_000)
        page.wait_for_selector('[data-testid="stFileUploaderDropzoneInput"]', state="attached", timeout=120_000)
        _wait_idle(page)
        page.set_input_files('[data-testid="stFileUploaderDropzoneInput"] >> nth=0', str(ASSETS / "coffee.jpg"))
        _wait_idle(page)
        page.get_by_role("link", name="Attention heads").click()
        _wait_idle(page)
        grid = page.locator(".js-plotly-plot").first
        grid.wait_for(timeout=120_000)
        page.screenshot(path=SHOTS / "1_heads_page.png", full_page=True)
        before = grid.screenshot(path=SHOTS / "2_grid_last_layer.png")

        slider = page.get_by_role("slider").first
        slider.focus()
        for _ in range(6):
            slider.press("ArrowLeft")
        expect(page.get_by_test_id("stSliderThumbValue").first).to_have_text("6", timeout=10_000)
        after_slider = _changed_screenshot(page, grid, before, SHOTS / "3_grid_layer_moved.png")
        assert after_slider != before

        frame = page.frame_locator('iframe[title*="streamlit_image_coordinates"]').first
        frame.locator("img").wait_for(state="visible", timeout=60_000)
        page.wait_for_timeout(1000)  # the component attaches its click listener after the image loads
        frame.locator("img").click(position={"x": 150, "y": 260})
        expect(page.get_by_text("Selected: patch")).to_be_visible(timeout=60_000)
        _wait_idle(page)
        page.get_by_text("clicked patch").click()
        after_click = _changed_screenshot(page, grid, after_slider, SHOTS / "4_grid_clicked_patch.png")
        page.screenshot(path=SHOTS / "5_after_click.png", full_page=True)
        assert after_click != after_slider
        browser.close()
