"""The app's Streamlit settings that keep a busy shared server's sessions (.streamlit/config.toml)."""
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_busy_server_keeps_its_browsers_connected_for_two_minutes_without_an_answer():
    # Measured with tests/test_load.py's eight landing-page users and three busy processes on 2 cores: at Streamlit's
    # default (30 s) the server closed 7 of 8 connections at ~215 s and every upload was lost; at 120 s and 300 s none
    # closed and 8 of 8 saw their photo (benchmarks/README.md, "The load test under contention").
    server = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())["server"]
    assert server["websocketPingInterval"] >= 120
    # the server Streamlit builds from the app's folder reads it, for the interval and the timeout alike (in its own
    # process: Streamlit's configuration is global)
    code = ("from streamlit import config; from streamlit.web.server.starlette.starlette_server import "
            "_get_websocket_settings as s; config.get_config_options(force_reparse=True); print(*s())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == [str(server["websocketPingInterval"])] * 2, out.stderr
