"""``python -m vitviz similarity`` as ``stats`` runs: resumable after a kill, on Ray, one writer per folder."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from test_streaming_rollout import HANG_S, MODEL, ROOT, make_images, tiny_checkpoint  # noqa: F401
from vitviz.cli import main
from vitviz.analyses.similarity import MinibatchCKA
from vitviz.runs.similarity_work import CKASums

ENV = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
PARTS = ".vitviz-similarity-parts"


def cka_args(inputs, out, checkpoint, *extra):
    return ["similarity", *map(str, inputs), "--out", str(out), "--model", MODEL, "--checkpoint", str(checkpoint),
            "--batch-size", "4", *extra]


def read(out) -> tuple[pd.DataFrame, dict]:
    return pd.read_parquet(out / "cka.parquet"), json.loads((out / "settings.json").read_text())


@pytest.mark.slow
def test_similarity_killed_after_some_minibatches_resumes_to_the_uninterrupted_numbers(tmp_path, tiny_checkpoint,
                                                                                     capsys):
    folder = tmp_path / "img"
    make_images(folder, 48)
    out = tmp_path / "resumed"
    # 12 minibatches decoded in-process: the kill lands well before the last one.
    args = cka_args([folder], out, tiny_checkpoint, "--workers", "0")
    child = subprocess.Popen([sys.executable, "-m", "vitviz", *args], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                             env=ENV)
    while not (out / PARTS / "sums.npz").exists() and child.poll() is None:  # no deadline: load is not a bug
        time.sleep(0.02)
    child.send_signal(signal.SIGTERM)
    err = child.communicate(timeout=HANG_S)[1]
    assert child.returncode == 143, err
    assert "Traceback" not in err
    said = [line for line in err.splitlines() if "interrupted" in line]
    assert len(said) == 1, err
    assert re.fullmatch(rf"interrupted: {re.escape(str(out))} keeps (\d+) of 12 minibatches finished; run the "
                        r"same command again to go on\.", said[0]), said
    kept = int(re.search(r"keeps (\d+)", said[0]).group(1))
    assert 0 < kept < 12
    assert not (out / "cka.parquet").exists()  # no estimate over part of the images is passed off as the result

    assert main(args) == 0
    assert f"resuming: {kept} of 12 minibatches already done." in capsys.readouterr().err
    assert main(cka_args([folder], tmp_path / "whole", tiny_checkpoint, "--workers", "1")) == 0
    (resumed, settings), (whole, _) = read(out), read(tmp_path / "whole")
    # The same minibatches through the same kernels, each one's bootstrap weights drawn from (seed, its index) and
    # the terms added in minibatch order in both runs: the same numbers, not merely close ones.
    pd.testing.assert_frame_equal(resumed, whole, check_exact=True)
    assert settings["images"] == 48 and settings["minibatches"] == 12 and len(resumed) == 144
    assert not (out / PARTS).exists() and not list(out.glob(".*"))  # parts merged, lock released

    assert main(args) == 0  # the same command once more: nothing to do, and it says so
    assert "already holds these images with these settings" in capsys.readouterr().err
    pd.testing.assert_frame_equal(read(out)[0], whole, check_exact=True)


def test_parts_of_other_settings_are_dropped_with_a_sentence(tmp_path, tiny_checkpoint, capsys):
    make_images(tmp_path / "img", 4)
    out = tmp_path / "out"
    out.mkdir()
    stale = MinibatchCKA(12, 12, replicates=0)
    stale.add(np.ones((1, 12, 12)), np.ones((1, 12)), np.ones((1, 12)), images=4)
    CKASums(out, "another run").write(1, stale, {}, {})
    args = cka_args([tmp_path / "img"], out, tiny_checkpoint, "--img-size", "112", "--workers", "0", "--bootstrap",
                    "0")
    assert main(args) == 0
    assert "held the sums of a run with other images or settings: they were removed." in capsys.readouterr().err
    table, settings = read(out)
    assert settings["images"] == 4 and (table["images"] == 4).all()
    assert np.allclose(np.diag(table.pivot(index="layer_a", columns="layer_b", values="cka")), 1)


def test_a_second_run_on_the_same_folder_is_refused(tmp_path):
    holder = ("import sys, time; from vitviz.io.lock import output_lock\n"
              "with output_lock(sys.argv[1], 'similarity'):\n"
              "    print('held', flush=True); time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path / "out")], stdout=subprocess.PIPE, env=ENV,
                            cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == b"held"
        assert main(["similarity", str(ROOT / "assets"), "--out", str(tmp_path / "out")]) == 2
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_ray_engine_gives_the_local_engines_numbers(tmp_path, tiny_checkpoint, ray_session, capsys):
    folder = tmp_path / "img"
    make_images(folder, 8)
    (folder / "broken.png").write_bytes(b"")  # nine files: minibatches of 5 and 4, the first left with 4 images

    def args(engine, workers):
        return cka_args([folder], tmp_path / engine, tiny_checkpoint, "--img-size", "112", "--engine", engine,
                        "--workers", workers)

    # The local run here with one thread (ray_session), as a Ray actor of one CPU has: the same kernels, the same
    # numbers. The Ray run joins the session's Ray (2 CPUs, 2 actors).
    for engine, workers in (("local", "1"), ("ray", "2")):
        capsys.readouterr()
        assert main(args(engine, workers)) == 0
    err = capsys.readouterr().err
    assert "skipped broken.png: is empty (0 bytes)" in err and "Traceback" not in err
    (ray, ray_settings), (local, _) = read(tmp_path / "ray"), read(tmp_path / "local")
    assert ray_settings["engine"] == "ray" and ray_settings["images"] == 8 and ray_settings["minibatches"] == 2
    assert ray_settings["layers_a"] == [f"block {i}" for i in range(1, 13)]
    pd.testing.assert_frame_equal(ray, local, check_exact=True)
