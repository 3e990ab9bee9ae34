"""scripts/ensure_venv.sh's stamps: after the test install (``--dev``, what scripts/test.sh runs), the start
command's install (scripts/app.sh runs ensure_venv.sh without ``--dev``) has nothing to do.

Until 2026-11-25 only the ``--dev`` stamp was written, so in CI the first browser test that started the app through
scripts/app.sh ran pip over requirements.txt and byte-compiled the stack again, in the venv the other test processes
were importing from (tens of seconds of CI's two cores, inside that test's setup).
"""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_start_commands_install_is_a_no_op_after_the_test_install():
    runs = {}
    for args in (("--dev",), ()):  # the first is a no-op when scripts/test.sh ran it, as in CI
        runs[args] = subprocess.run(["bash", "scripts/ensure_venv.sh", *args], cwd=ROOT, capture_output=True,
                                    text=True, timeout=1800)
        assert runs[args].returncode == 0, runs[args].stderr
    assert "Installing" not in runs[()].stderr, runs[()].stderr
