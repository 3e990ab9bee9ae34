"""One writer per output folder (vitviz.io.lock): a second run is refused at once with a sentence, a killed
run's lock is taken over with a note, and two runs started together write what one run writes."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

from test_faithfulness_cli import _args as faithfulness_args
from test_streaming_rollout import ROOT, make_images, tiny_checkpoint  # noqa: F401
from vitviz.io import lock as L
from vitviz.io.lock import LOCK_NAME, SIDECAR_NAME, OutputBusy, output_lock

ENV = os.environ | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
# A process that takes the lock, says so on stdout and waits to be killed (no torch: it starts in ~0.2 s).
HOLDER = ("import sys, time; from vitviz.io.lock import output_lock\n"
          "with output_lock(sys.argv[1], 'analyze'):\n"
          "    print('held', flush=True); time.sleep(600)\n")


def _holder(folder):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, env=ENV, cwd=ROOT)
    assert proc.stdout.readline().strip() == b"held"
    return proc


def test_a_second_writer_is_refused_with_the_holders_pid_and_start(tmp_path):
    proc = _holder(tmp_path / "out")
    try:
        record = json.loads((tmp_path / "out" / SIDECAR_NAME).read_text())
        assert record["pid"] == proc.pid and record["command"] == "analyze"
        with pytest.raises(OutputBusy) as caught:
            with output_lock(tmp_path / "out", "stats"):
                pytest.fail("the folder was entered while another process held it")
        assert str(caught.value) == (f"{tmp_path / 'out'} is being written by another run (pid {proc.pid}, started at "
                                     f"{L._when(record['started'])}); wait for it or choose another --out.")
    finally:
        proc.kill()
        proc.wait()


def test_a_kill_9_runs_lock_is_taken_over_with_a_note(tmp_path):
    proc = _holder(tmp_path / "out")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (tmp_path / "out" / SIDECAR_NAME).exists()  # left behind: the run could not clean up
    notes = []
    with output_lock(tmp_path / "out", "analyze", note=notes.append):
        assert json.loads((tmp_path / "out" / SIDECAR_NAME).read_text())["pid"] == os.getpid()
    assert len(notes) == 1 and notes[0].startswith(f"took over {tmp_path / 'out'} from a run that stopped without "
                                                   f"releasing it (pid {proc.pid}, analyze, started at ")
    assert not list((tmp_path / "out").iterdir())  # released: neither the lock file nor the sidecar is left


def test_a_sidecar_whose_pid_now_runs_another_process_is_taken_over_by_its_old_heartbeat(tmp_path, monkeypatch):
    # pid reuse: the sidecar's pid runs (this test's own), but nobody holds the OS lock and the heartbeat is old.
    folder = tmp_path / "out"
    folder.mkdir()
    old = time.time() - 10 * L.STALE_S
    stale = {"pid": os.getpid(), "host": socket.gethostname(), "command": "stats", "started": old, "heartbeat": old}
    (folder / SIDECAR_NAME).write_text(json.dumps(stale))
    assert not L.holder_alive(stale)
    assert L.holder_alive(stale | {"heartbeat": time.time()})
    assert L.holder_alive(stale | {"heartbeat": time.time(), "host": "elsewhere", "pid": 2 ** 22 + 1})
    notes = []
    with output_lock(folder, "stats", note=notes.append):
        pass
    assert len(notes) == 1 and f"(pid {os.getpid()}, stats, started at {L._when(old)}" in notes[0]


def test_the_heartbeat_is_renewed_while_the_lock_is_held(tmp_path, monkeypatch):
    monkeypatch.setattr(L, "HEARTBEAT_S", 0.05)
    with output_lock(tmp_path / "out", "analyze"):
        first = json.loads((tmp_path / "out" / SIDECAR_NAME).read_text())["heartbeat"]
        deadline = time.time() + 10
        while json.loads((tmp_path / "out" / SIDECAR_NAME).read_text())["heartbeat"] == first:
            assert time.time() < deadline, "no heartbeat in 10 s"
            time.sleep(0.05)


def test_a_nested_writer_passes_and_another_thread_is_refused(tmp_path):
    refused = []

    def other():
        try:
            with output_lock(tmp_path / "out", "stats"):
                pass
        except OutputBusy as exc:
            refused.append(str(exc))

    with output_lock(tmp_path / "out", "analyze"):
        with output_lock(tmp_path / "out", "analyze"):  # a store opened inside the command
            pass
        assert (tmp_path / "out" / LOCK_NAME).exists()  # the inner exit released nothing
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert len(refused) == 1 and f"(pid {os.getpid()}, started at " in refused[0]
    with output_lock(tmp_path / "out", "stats"):  # free again
        pass


def test_an_error_inside_the_block_releases_the_folder(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with output_lock(tmp_path / "out", "analyze"):
            raise KeyboardInterrupt
    assert not list((tmp_path / "out").iterdir())
    with output_lock(tmp_path / "out", "analyze"):
        pass


def _cli(*args):
    return subprocess.Popen([sys.executable, "-m", "vitviz", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV, cwd=ROOT, text=True)


@pytest.mark.slow  # three faithfulness runs in fresh interpreters (torch's import alone is seconds)
def test_two_runs_started_at_once_on_one_folder_one_writes_the_other_is_refused(tmp_path, tiny_checkpoint, capsys):
    from vitviz.cli import main

    make_images(tmp_path / "img", 2)
    shared, single = tmp_path / "shared", tmp_path / "single"
    started = time.monotonic()
    procs = [_cli(*faithfulness_args([tmp_path / "img"], shared, tiny_checkpoint), "--engine", "local", "--methods", "rollout,random")
             for _ in range(2)]
    ended = {}
    while len(ended) < 2:
        for i, p in enumerate(procs):
            if i not in ended and p.poll() is not None:
                ended[i] = time.monotonic() - started
        time.sleep(0.02)
    results = [(p.returncode, *p.communicate()) for p in procs]
    winners = [i for i, (rc, _, _) in enumerate(results) if rc == 0]
    assert len(winners) == 1, results
    loser = 1 - winners[0]
    rc, out, err = results[loser]
    assert rc == 2 and "Traceback" not in err, err
    assert err.strip().startswith(f"error: {shared} is being written by another run (pid {procs[winners[0]].pid}, "
                                  "started at ") and err.strip().endswith("wait for it or choose another --out."), err
    assert ended[loser] < 5, ended
    # The reference run here: two racing runs and one killed outright need processes of their own, it does not.
    assert main([*faithfulness_args([tmp_path / "img"], single, tiny_checkpoint), "--engine", "local", "--methods",
                 "rollout,random"]) == 0
    for name in ("faithfulness.parquet", "auc.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(shared / name), pd.read_parquet(single / name))
    assert not (shared / LOCK_NAME).exists() and not (shared / SIDECAR_NAME).exists()
    # A run killed outright (its parts folder may be half written) leaves its sidecar; the next run takes over
    # with a note, resumes, and writes what one uninterrupted run writes.
    killed = tmp_path / "killed"
    proc = _cli(*faithfulness_args([tmp_path / "img"], killed, tiny_checkpoint), "--engine", "local", "--methods", "rollout,random")
    deadline = time.monotonic() + 120
    while not (killed / ".vitviz-faithfulness-parts").exists() and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.kill()
    proc.communicate()
    assert (killed / SIDECAR_NAME).exists()
    capsys.readouterr()
    code = main([*faithfulness_args([tmp_path / "img"], killed, tiny_checkpoint), "--engine", "local", "--methods",
                 "rollout,random"])
    err = capsys.readouterr().err
    assert code == 0 and f"note: took over {killed} from a run that stopped without releasing it " \
        f"(pid {proc.pid}, faithfulness, started at " in err, err
    for name in ("faithfulness.parquet", "auc.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(killed / name), pd.read_parquet(single / name))
