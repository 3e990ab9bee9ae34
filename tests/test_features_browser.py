"""The Features page in Chromium: Cancel stops a training run and keeps nothing; Train then trains an SAE on the
sample photos, shows its explained variance and draws its top latents. Screenshots in test-artifacts/features/."""
from pathlib import Path

import pytest

from test_browser import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, _wait_idle, require_chromium

pytestmark = [pytest.mark.slow, pytest.mark.browser]
SHOTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "features"


def test_features_page_trains_in_the_browser_and_cancel_keeps_nothing(app_servers):
    require_chromium()
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    url = app_servers.url("browser")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(f"{url}/features?intro=0", timeout=240_000)
        page.get_by_text("Give an SAE above").wait_for(timeout=600_000)
        _wait_idle(page, timeout=600_000)
        assert page.get_by_text("Give an SAE above").count() == 1

        # the defaults (until converged, four photos) run long enough to be cancelled half way
        page.get_by_role("button", name="Train", exact=True).click()
        page.get_by_text("· explained variance", exact=False).wait_for(timeout=240_000)
        page.screenshot(path=SHOTS / "training.png")
        page.get_by_role("button", name="Cancel").click()
        # Each click is waited for by what it shows: on a loaded machine the page can stay idle (the old run's
        # screen) for longer than the idle wait's quiet time before the server answers the click.
        page.get_by_text("Training cancelled: nothing was kept.").wait_for(timeout=240_000)
        _wait_idle(page, timeout=240_000)
        assert page.get_by_text("Training cancelled: nothing was kept.").count() == 1
        assert page.locator('[data-testid="stPlotlyChart"]').count() == 0

        page.get_by_role("button", name="Train", exact=True).click()
        done = page.get_by_text("Trained here:", exact=False)
        done.wait_for(timeout=600_000)
        _wait_idle(page, timeout=600_000)
        assert done.count() == 1 and "4 images; explained variance 0.9" in done.inner_text()
        assert "converged." in done.inner_text()
        assert page.locator('[data-testid="stPlotlyChart"]').count() >= 2  # top latents, one latent's patches
        assert page.get_by_role("heading", name="Top latents of this image").count() == 1
        page.screenshot(path=SHOTS / "trained_top.png")
        page.get_by_role("heading", name="Top latents of this image").scroll_into_view_if_needed()
        page.mouse.wheel(0, 280)
        _wait_idle(page, quiet=800)
        page.screenshot(path=SHOTS / "trained.png")
        browser.close()
