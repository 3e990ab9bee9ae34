"""Machinery for the load test (tests/test_load.py) and benchmarks/load.py: a cold app server started
with the README's command in its own process group, and N browser sessions arriving at once.

One Chromium, one browser context per session (separate cookies, so separate Streamlit sessions),
driven by Playwright's async API so the sessions really overlap. Each session opens the app and uploads its own
image, either on the "Attention heads" page after opening it (``"heads"``), or on the landing page as soon as the
uploader appears and then opens "Attention heads" at once (``"landing"``: what a person does; on a busy server the
upload's rerun is then still waiting when the page switch arrives), and waits until that image's maps are drawn.
"""
from __future__ import annotations

import asyncio
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
VIEWPORT = {"width": 1280, "height": 800}
PAGE = "Attention heads"

# The heads page shows ``name``: its header names the image, its maps are drawn (the browser explorer's grid, which
# sits in a shadow root and says data-ready="1" once its canvases are painted, or a Plotly map when the server draws),
# and the script has finished (no spinner text left).
READY_JS = """(name) => {
  const h = document.querySelector('h2');
  if (!h || !h.innerText.includes(name)) return false;
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
  if (/Loading the model|Running the model|Computing/.test(document.body.innerText)) return false;
  const explorer = [...document.querySelectorAll('*')].map(e => e.shadowRoot && e.shadowRoot.querySelector(
    '.vv-explorer[data-ready="1"]')).find(Boolean) || document.querySelector('.vv-explorer[data-ready="1"]');
  return !!explorer || !!document.querySelector('[data-testid="stPlotlyChart"] .main-svg');
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_mib(pid: int, key: str) -> float:
    """A /proc/<pid>/status memory line (VmRSS, VmHWM) in MiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(key + r":\s+(\d+)", text).group(1)) / 1024


@dataclass
class Server:
    url: str
    pid: int  # streamlit's own: scripts/app.sh ends with exec, which keeps the shell's pid
    log: Path

    def peak_mib(self) -> float:
        return status_mib(self.pid, "VmHWM")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def app_tracebacks(self) -> list[str]:
        """The whole log's tracebacks, less the web server's own reports of a browser that left mid-handshake.

        Streamlit's Starlette server logs a traceback when a client closes its websocket while the server is
        still opening or closing it (a page switched or reloaded in that instant); it ends in Starlette's
        ``WebSocketDisconnected`` and passes through no file of this project. Every other traceback is kept."""
        return [block for block in tracebacks(self.log.read_text(errors="replace"))
                if not _client_left(block)]


PROJECT_FRAMES = re.compile(r'File "[^"]*/(?:app\.py|ui/|pages/|vitviz/)')


def tracebacks(log: str) -> list[str]:
    """Each traceback report of a log, its chained causes included, from its first "Traceback" line to its final
    exception line."""
    lines, reports, i = log.splitlines(), [], 0
    while i < len(lines):
        if not lines[i].startswith("Traceback (most recent call last)"):
            i += 1
            continue
        start = i
        while True:
            i += 1
            while i < len(lines) and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
                i += 1  # the frames, down to the exception line at column 0
            end, j = i, i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            if j < len(lines) and lines[j].startswith(("During handling", "The above exception")):
                j += 1
                while j < len(lines) and not lines[j].strip():
                    j += 1
                if j < len(lines) and lines[j].startswith("Traceback"):
                    i = j
                    continue
            break
        reports.append("\n".join(lines[start:end + 1]))
        i = end + 1
    return reports


def _client_left(block: str) -> bool:
    last = [l for l in block.splitlines() if l.strip()][-1]
    return last.startswith("starlette.websockets.WebSocketDisconnected") and not PROJECT_FRAMES.search(block)


@contextmanager
def app_server(log: Path, env: dict[str, str] | None = None, start_timeout: float = 300, direct: bool = False):
    """A fresh (cold) server from ``scripts/app.sh`` in its own process group, killed with its group at exit.

    direct: ``streamlit run app.py`` with this interpreter instead (no venv check: for tests of the app itself).
    """
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1") | (env or {})
    log.parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "wb")
    start = [sys.executable, "-m", "streamlit", "run", "app.py"] if direct else ["bash", "scripts/app.sh"]
    proc = subprocess.Popen([*start, "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--server.headless", "true", "--server.fileWatcherType", "none"],
                            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the app exited ({proc.returncode}): {log.read_text()[-3000:]}")
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"streamlit did not start: {log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield Server(url=url, pid=proc.pid, log=log)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=20)
        out.close()


class SharedServers:
    """App servers (``streamlit run app.py``) shared by the browser test files of one test process, one per drawing
    mode (``VITVIZ_DRAW``), each started on first use and stopped when the test session ends (the ``app_servers``
    fixture of tests/conftest.py).

    A server start costs its imports (~10 CPU s of torch and timm), the model's load and the first page's forward;
    the files that need no fresh server share one. The sessions of one server are independent (each browser context is its
    own Streamlit session), and a test process runs one test at a time, so no two files use a server at once.
    The tests that need a cold server (the first visit's deep link, the load test) start their own."""

    def __init__(self):
        self._stack = ExitStack()
        self._servers: dict[str, Server] = {}

    def url(self, draw: str) -> str:
        """The address of the shared server drawing maps ``draw`` ("browser" or "server"), started if need be."""
        if draw not in self._servers:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            self._servers[draw] = self._stack.enter_context(app_server(
                ROOT / "test-artifacts" / f"shared_server_{draw}_{worker}.log", direct=True,
                env={"VITVIZ_DRAW": draw, "PYTHONPATH": str(ROOT)}))
        return self._servers[draw].url

    def close(self) -> None:
        self._stack.close()


def session_image(seed: int) -> bytes:
    """A small PNG, different for every seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:120, 0:160]
    base = np.stack([x * 1.5, y * 2, (x + y + 37 * seed) % 256], axis=-1)
    pixels = np.clip(base + rng.integers(-25, 25, base.shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


@dataclass
class SessionResult:
    name: str
    header: str = ""
    exceptions: list[str] = field(default_factory=list)
    first_map_s: float | None = None  # from opening the app to this image's first map on the heads page
    error: str | None = None
    path: str = "heads"  # where the image was uploaded: "heads" or "landing"
    reopened: int = 0  # landing path: clicks on "Attention heads" again after a late upload rerun went back
    seen: list[str] = field(default_factory=list)  # a failed session: its path and script state, the page's text
    sockets: list[str] = field(default_factory=list)  # when the page's websockets opened and closed
    uploads: list[str] = field(default_factory=list)  # the upload requests' answers, and what the uploader showed


async def _upload(page, name: str, data: bytes) -> None:
    # the images' uploader by its label: the sidebar also holds the Head box's uploader (probe.safetensors), above it
    upload = page.locator('[data-testid="stFileUploader"]', has_text="Upload images").locator(
        '[data-testid="stFileUploaderDropzoneInput"]')
    await upload.wait_for(state="attached")
    await upload.set_input_files({"name": name, "mimeType": "image/png", "buffer": data})


async def _open_heads(page, timeout_ms: int) -> None:
    """Click "Attention heads" until the heads page is open: on a busy server Streamlit's navigation can drop a click
    made while the page's script runs (the link does nothing), and a person clicks again."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        await page.get_by_role("link", name=PAGE, exact=True).click()
        try:
            await page.wait_for_function("() => location.pathname.endsWith('/heads')", polling=250, timeout=15_000)
            return
        except Exception:  # noqa: BLE001 - the click was dropped: click again until the deadline
            if time.monotonic() > deadline:
                raise


async def _session(browser, url: str, name: str, data: bytes, timeout_ms: int, path: str = "heads") -> SessionResult:
    result = SessionResult(name=name, path=path)
    context = await browser.new_context(viewport=VIEWPORT)
    try:
        page = await context.new_page()
        page.set_default_timeout(timeout_ms)
        start = time.monotonic()

        def socket_opened(ws) -> None:  # a failed session says whether its connection to the server dropped
            result.sockets.append(f"opened {time.monotonic() - start:.0f} s")
            ws.on("close", lambda _: result.sockets.append(f"closed {time.monotonic() - start:.0f} s"))
        page.on("websocket", socket_opened)

        def upload_answered(response) -> None:  # a lost photo: did its bytes reach the server?
            if "/_stcore/upload_file/" in response.url:
                result.uploads.append(f"{response.request.method} {response.status} {time.monotonic() - start:.0f} s")
        page.on("response", upload_answered)
        await page.goto(url, timeout=timeout_ms)
        if path == "landing":
            await _upload(page, name, data)
            # The uploader lists the file once its bytes are sent: then the person moves on, while the upload's
            # rerun may not have run yet (the page-switch request can overtake it on a busy server).
            box = page.locator('[data-testid="stFileUploader"]', has_text="Upload images")
            await box.get_by_text(name).wait_for()
            await box.locator('[role="progressbar"]').wait_for(state="detached")
            result.uploads.append(f"uploader: {' '.join((await box.inner_text()).split())[-120:]}")
            await _open_heads(page, timeout_ms)
        else:
            await page.get_by_role("link", name=PAGE, exact=True).click()
            await _upload(page, name, data)
        await page.wait_for_function(READY_JS, arg=name, polling=250, timeout=timeout_ms)
        if path == "landing" and not (await page.locator("h2").first.inner_text()).startswith(PAGE):
            # The photo is there, on the landing page: a late rerun of that page's uploader took the page switch back
            # (Streamlit runs the newest request's page on a busy server). A person clicks again; the count says so.
            result.reopened += 1
            await _open_heads(page, timeout_ms)
            await page.wait_for_function(READY_JS, arg=name, polling=250, timeout=timeout_ms)
        result.first_map_s = time.monotonic() - start
        await page.wait_for_timeout(1000)  # late renders (an exception element arrives after the charts)
        result.header = await page.locator("h2").first.inner_text()
        result.exceptions = await page.locator('[data-testid="stException"]').all_inner_texts()
    except Exception as exc:  # noqa: BLE001 - reported per session, the test asserts on it
        result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        # What the session showed, each read on its own: a page without a heading must still leave its screenshot.
        for read in (lambda: page.screenshot(path=str(ROOT / "test-artifacts" / f"load_failed_{name}.png")),
                     lambda: page.locator('[data-testid="stException"]').all_inner_texts(),
                     lambda: page.locator("h2").first.inner_text(timeout=5000),
                     lambda: page.evaluate("() => location.pathname + ' · ' + (document.querySelector("
                                           "'[data-testid=stApp]')?.getAttribute('data-test-script-state') || '')"
                                           " + ' · ' + (document.querySelector('[data-testid=stStatusWidget]')"
                                           "?.innerText || 'no status widget')"),
                     lambda: page.locator('[data-testid="stSidebarUserContent"]').inner_text(timeout=5000),
                     lambda: page.locator('[data-testid="stMain"]').inner_text(timeout=5000)):
            try:
                got = await read()
            except Exception as exc:  # noqa: BLE001 - one unreadable part does not hide the others
                got = f"({type(exc).__name__})"
            if isinstance(got, list):
                result.exceptions = got
            elif isinstance(got, str) and not result.header:
                result.header = got
            elif isinstance(got, str):
                result.seen.append(" ".join(got.split())[:600])
    finally:
        await context.close()
    return result


async def _sessions(url: str, images: list[tuple[str, bytes]], timeout_ms: int,
                    paths: list[str]) -> list[SessionResult]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            return await asyncio.gather(*[_session(browser, url, name, data, timeout_ms, path)
                                          for (name, data), path in zip(images, paths)])
        finally:
            await browser.close()


def run_sessions(url: str, images: list[tuple[str, bytes]], timeout_s: float = 600,
                 paths: list[str] | None = None) -> list[SessionResult]:
    """Every image's session at once; results in the order of ``images``. ``paths``: per session, where it uploads
    (``"heads"``, the default, or ``"landing"``)."""
    return asyncio.run(_sessions(url, images, int(timeout_s * 1000), paths or ["heads"] * len(images)))
