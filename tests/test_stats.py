"""Per-head statistics over image sets (vitviz.analyses.stats) and the ``stats`` command."""
import numpy as np
import pytest

from vitviz.analyses.distance import patch_distances
from vitviz.layout import TokenLayout
from vitviz.analyses.stats import STATS_COLUMNS, LayerHeadSummary, sinks_table, statistics_table

CLS_LAYOUT = TokenLayout(prefix_tokens=("cls",), grid_size=(4, 4), patch_size=(16, 16), global_pool="token",
                         pos_embed_prefix_rows=1)
REG_LAYOUT = TokenLayout(prefix_tokens=("cls", "reg0", "reg1"), grid_size=(3, 5), patch_size=(14, 14),
                         global_pool="token", pos_embed_prefix_rows=1)
NO_CLS_LAYOUT = TokenLayout(prefix_tokens=(), grid_size=(4, 4), patch_size=(16, 16), global_pool="map",
                            pos_embed_prefix_rows=0)


def uniform(layout):
    n = layout.num_tokens
    return np.full((n, n), 1 / n)


def self_only(layout):
    a = np.eye(layout.num_tokens)
    if layout.has_class_token:  # the CLS row must reach a patch for CLS focus to be defined
        a[layout.cls_index] = 0
        a[layout.cls_index, layout.num_prefix_tokens + 5] = 1
    return a


def single_key(layout, key=6, on_prefix=0.0):
    """Every query puts ``on_prefix`` on the first token (when there is a prefix) and the rest on patch ``key``."""
    n, k = layout.num_tokens, layout.num_prefix_tokens + key
    a = np.zeros((n, n))
    a[:, k] = 1 - on_prefix
    a[:, 0] += on_prefix
    return a


def expected(layout, pattern):
    """The formulas of every column, written out for the hand-made patterns."""
    d, p = patch_distances(layout), layout.num_patches
    uniform_distance = d.mean()
    focus = 0.0 if layout.has_class_token else np.nan
    if pattern == "uniform":
        share = layout.num_prefix_tokens / layout.num_tokens
        return dict(mean_distance=uniform_distance, mean_distance_with_prefix=(1 - share) * uniform_distance,
                    entropy=np.log(p), cls_focus=focus, prefix_received=share)
    if pattern == "self":
        return dict(mean_distance=0.0, mean_distance_with_prefix=0.0, entropy=0.0,
                    cls_focus=1.0 if layout.has_class_token else np.nan, prefix_received=0.0)
    on_prefix = 0.25 if layout.num_prefix_tokens else 0.0
    key_distance = d[:, 6].mean()
    return dict(mean_distance=key_distance, mean_distance_with_prefix=(1 - on_prefix) * key_distance, entropy=0.0,
                cls_focus=1.0 if layout.has_class_token else np.nan, prefix_received=on_prefix)


@pytest.mark.parametrize("layout", [CLS_LAYOUT, REG_LAYOUT, NO_CLS_LAYOUT], ids=["cls", "registers", "no_cls"])
def test_statistics_of_hand_made_attention_equal_the_formulas(layout):
    patterns = {"uniform": uniform(layout), "self": self_only(layout),
                "key": single_key(layout, on_prefix=0.25 if layout.num_prefix_tokens else 0.0)}
    names = list(patterns)
    # Image b, layer l, head h gets pattern (b + l + h) % 3: a row in the wrong place fails.
    B, L, H = 3, 2, 4
    attention = np.empty((B, L, H, layout.num_tokens, layout.num_tokens), dtype=np.float32)
    for b in range(B):
        for l in range(L):
            for h in range(H):
                attention[b, l, h] = patterns[names[(b + l + h) % 3]]
    table = statistics_table(attention, layout, ["a.jpg", "sub/b.png", "c.jpg"], "tiny")

    assert list(table.columns) == list(STATS_COLUMNS)
    assert {c: str(t) for c, t in table.dtypes.items()} == {
        c: ("object" if t == "str" else t) for c, t in STATS_COLUMNS.items()}
    assert len(table) == B * L * H
    for row in table.itertuples():
        b = ["a.jpg", "sub/b.png", "c.jpg"].index(row.image)
        want = expected(layout, names[(b + row.layer + row.head) % 3])
        assert row.model == "tiny"
        for column, value in want.items():
            np.testing.assert_allclose(getattr(row, column), value, atol=1e-5, err_msg=f"{column} {row}")


def test_prefix_conventions_differ_by_the_share_on_prefix_tokens():
    # The pair a user compares with probing-vits: 40% on CLS scales the unrenormalised distance by 0.6.
    attention = single_key(CLS_LAYOUT, key=0, on_prefix=0.4)[None, None, None]
    row = statistics_table(attention, CLS_LAYOUT, ["x"], "m").iloc[0]
    far = patch_distances(CLS_LAYOUT)[:, 0].mean()
    assert row.mean_distance == pytest.approx(far)
    assert row.mean_distance_with_prefix == pytest.approx(0.6 * far)
    assert row.prefix_received == pytest.approx(0.4)


def test_sinks_table_names_the_token_that_takes_all_attention():
    attention = np.stack([uniform(CLS_LAYOUT), single_key(CLS_LAYOUT, key=6)])[None, :, None]  # (1, 2, 1, N, N)
    sinks = sinks_table(attention, CLS_LAYOUT, ["cat.jpg"], "m")
    assert sinks[["image", "layer", "token"]].values.tolist() == [["cat.jpg", 1, 7]]  # layer 0 (uniform) has none
    assert sinks.share.iloc[0] == pytest.approx(1.0)


def test_layer_head_summary_equals_pandas_mean_and_std_over_images():
    rng = np.random.default_rng(0)
    attention = rng.random((5, 2, 3, CLS_LAYOUT.num_tokens, CLS_LAYOUT.num_tokens)).astype(np.float32)
    attention /= attention.sum(-1, keepdims=True)
    table = statistics_table(attention, CLS_LAYOUT, list("abcde"), "m")
    summary = LayerHeadSummary()
    summary.add(table.iloc[:7])
    summary.add(table.iloc[7:])
    result = summary.result()
    grouped = table.groupby(["model", "layer", "head"])
    # float64 entropies, means of 5 images streamed vs pandas: summed(5, EPS64) = 1.1e-15 relative
    np.testing.assert_allclose(result["entropy_mean"], grouped.entropy.mean(), rtol=1e-12)
    np.testing.assert_allclose(result["mean_distance_std"], grouped.mean_distance.std(ddof=0), rtol=1e-6)
    assert (result["images"] == 5).all()


# ---- the stats command --------------------------------------------------------------------------------------

import json  # noqa: E402
import re  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import pandas as pd  # noqa: E402

from test_streaming_rollout import (ATTENTION_MIB, HANG_S, MODEL, ROOT, assert_peak_does_not_grow, make_images,  # noqa: E402,F401
                                    run_cli_measuring_peak_per_batch, tiny_checkpoint)
from conftest import F32_U  # noqa: E402
from vitviz.io.inputs import expand_inputs  # noqa: E402


# Tokens of deit-tiny at --img-size 112: 7 x 7 patches + CLS.
N_112 = 50


def reorder_rtol(tokens: int) -> float:
    """Relative difference allowed between two float32 runs of one model that differ only in batch split or
    thread count (so in summation order).

    This random deit-tiny has logits of order 1e-2, so what earlier layers pass on barely moves the
    softmax; its own rounding dominates: exp, subtract and divide are one rounding each and the
    denominator's sum of N terms is within (N-1)u of exact in any order, so one attention weight is
    within (N+2)u of exact and two orders within 2(N+2)u of each other. A ratio of weighted sums (a
    mean distance Σ a·d / Σ a, an entropy, a share) doubles that: 4(N+2)u, 1.2e-5 at N = 50.
    """
    return 4 * (tokens + 2) * F32_U


def stats_args(inputs, out, checkpoint, *extra):
    return ["stats", *map(str, inputs), "--out", str(out), "--model", MODEL, "--checkpoint", str(checkpoint),
            "--batch-size", "4", *extra]


def read_table(out):
    return pd.read_parquet(out / "stats.parquet").sort_values(["model", "image", "layer", "head"], ignore_index=True)


def test_inputs_expand_folders_recursively_and_list_files_relative_to_the_list(tmp_path):
    for rel in ("set/n01/b.jpg", "set/n01/a.png", "set/n02/c.JPEG", "set/n02/labels.csv", "lists/x.webp"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    listing = tmp_path / "lists" / "files.txt"
    listing.write_text(f"# ImageNet-val subset\nx.webp\n\n{tmp_path / 'set/n01/a.png'}\nmissing.jpg\nx.webp\n")
    files, problems = expand_inputs([tmp_path / "set", listing])
    assert [f.name for f in files] == ["n01/a.png", "n01/b.jpg", "n02/c.JPEG", "x.webp", str(tmp_path / "set/n01/a.png")]
    assert files[3].path == tmp_path / "lists" / "x.webp"
    assert [str(p) for p in problems] == ["missing.jpg: does not exist", "x.webp: is named twice; the first one is used"]


def test_a_list_file_over_the_line_cap_is_refused_with_a_sentence_and_one_at_the_cap_is_read(tmp_path):
    from vitviz.io.inputs import MAX_LIST_LINES

    (tmp_path / "a.png").write_bytes(b"x")
    at_cap = tmp_path / "at_cap.txt"
    at_cap.write_text("a.png\n" + "#\n" * (MAX_LIST_LINES - 1))  # comments count as lines too
    over = tmp_path / "over.txt"
    over.write_text("a.png\n" * (MAX_LIST_LINES + 1))
    files, problems = expand_inputs([at_cap])
    assert [f.name for f in files] == ["a.png"] and problems == []
    files, problems = expand_inputs([over])
    # Refused whole (not its first million lines: no entry of it is taken), with the file, its size and the cap.
    assert files == []
    assert [str(p) for p in problems] == [
        f"{over}: is a list file of more than 1,000,000 lines, the most a list of image paths may have; vitviz "
        "does not read the rest (give the folder, or split the list into several files)."]


def test_a_list_entry_longer_than_a_path_may_be_is_a_sentence(tmp_path):
    listing = tmp_path / "files.txt"
    listing.write_text("a" * 5000 + "\n")
    files, problems = expand_inputs([listing])
    assert files == [] and [p.reason for p in problems] == ["cannot be looked up (File name too long)"]


@pytest.mark.slow
def test_stats_mean_distance_equals_analyze_per_image_and_bad_files_are_skipped(tmp_path, tiny_checkpoint, capsys):
    from vitviz.cli import main

    images = make_images(tmp_path / "img", 5)
    (tmp_path / "img" / "broken.png").write_bytes(b"\x89PNG not really")
    assert main(stats_args([tmp_path / "img", tmp_path / "gone.jpg"], tmp_path / "stats", tiny_checkpoint,
                           "--workers", "1", "--img-size", "112")) == 0
    err = capsys.readouterr().err
    assert f"skipped {tmp_path / 'gone.jpg'}: does not exist" in err  # the path as given
    assert "skipped broken.png: is not an image file Pillow can read" in err
    assert "Traceback" not in err

    assert main(["analyze", *map(str, images), "--out", str(tmp_path / "analyze"), "--model", MODEL,
                 "--checkpoint", str(tiny_checkpoint), "--no-attention", "--img-size", "112"]) == 0
    per_image = np.load(tmp_path / "analyze" / "analysis.npz")["mean_distance_per_image"]  # (5, 12, 3)
    table = read_table(tmp_path / "stats")
    assert table["image"].unique().tolist() == [p.name for p in images]
    assert (table["model"] == MODEL).all() and len(table) == 5 * 12 * 3
    np.testing.assert_allclose(table["mean_distance"].to_numpy().reshape(5, 12, 3), per_image,
                               rtol=reorder_rtol(N_112))

    summary = json.loads((tmp_path / "stats" / "summary.json").read_text())
    assert summary["complete"] and summary["counts"]["images_in_table"] == {MODEL: 5}
    assert {s["name"] for s in summary["skipped"]} == {str(tmp_path / "gone.jpg"), "broken.png"}
    first = summary["layer_head"][MODEL][0]
    assert (first["layer"], first["head"], first["images"]) == (0, 0, 5)
    # The mean and the std over images are 1-Lipschitz in the largest change of one value
    # (|Δmean| <= max|δ_i|, |Δstd| <= ‖δ‖₂/√n <= max|δ_i|): each may be off by what one value may be off
    # by, in absolute terms. Not relative to the std: the near-constant values of a random model give
    # a std 1000x below the values, and rel=1e-6 of it failed on a fresh clone (0.0380694 vs 0.0380691).
    value_error = reorder_rtol(N_112) * np.abs(per_image[:, 0, 0]).max()
    assert first["mean_distance_mean"] == pytest.approx(per_image[:, 0, 0].mean(), rel=0, abs=value_error)
    assert first["mean_distance_std"] == pytest.approx(per_image[:, 0, 0].std(), rel=0, abs=value_error)
    assert not (tmp_path / "stats" / ".vitviz-stats-parts").exists()


def test_stats_fails_only_when_nothing_could_be_analysed(tmp_path, capsys):
    from vitviz.cli import main

    (tmp_path / "broken.jpg").write_bytes(b"")
    assert main(["stats", str(tmp_path / "broken.jpg"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"skipped {tmp_path / 'broken.jpg'}: is empty (0 bytes)" in err and "no image could be analysed" in err


@pytest.mark.slow
def test_stats_peak_memory_does_not_grow_with_the_image_count(tmp_path, tiny_checkpoint):
    # 11 batches of 4; a run holds two batches' attention at once (one reduced while the next runs): the peak
    # after 3 batches is compared with the end of the run.
    n = 44
    make_images(tmp_path / "img", n)
    code, peaks, err = run_cli_measuring_peak_per_batch(stats_args([tmp_path / "img"], tmp_path / "out",
                                                                   tiny_checkpoint, "--workers", "1"))
    assert code == 0, err
    assert f"{n}/{n} images" in err  # plain progress lines when stderr is not a terminal
    assert read_table(tmp_path / "out")["image"].nunique() == n
    assert_peak_does_not_grow(peaks, 12, n, ATTENTION_MIB)


@pytest.mark.slow
def test_stats_killed_after_some_batches_resumes_to_the_uninterrupted_table(tmp_path, tiny_checkpoint):
    folder = tmp_path / "img"
    make_images(folder, 24)
    out = tmp_path / "resumed"
    # 12 batches decoded in-process: the kill lands well before the last one.
    args = stats_args([folder], out, tiny_checkpoint, "--batch-size", "2", "--workers", "0", "--img-size", "112")
    child = subprocess.Popen([sys.executable, "-m", "vitviz", *args], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                             env=os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    parts = out / ".vitviz-stats-parts"
    while not list(parts.glob("stats-*.parquet")) and child.poll() is None:  # no deadline: load is not a bug
        time.sleep(0.02)
    child.send_signal(signal.SIGTERM)
    err = child.communicate(timeout=HANG_S)[1]
    assert child.returncode == 143, err
    assert "Traceback" not in err
    # Exactly one sentence about it, naming the table, what it holds and the way on (two empty lists
    # compared equal before: a run that said nothing passed).
    said = [line for line in err.splitlines() if "interrupted" in line]
    assert len(said) == 1, err
    assert said[0].startswith(f"interrupted: {out / 'stats.parquet'} holds every finished batch (")
    assert re.search(rf"\d+ images? for {re.escape(MODEL)}\); run the same command again to go on\.", said[0]), said[0]
    partial = read_table(out)
    assert 0 < partial["image"].nunique() < 24
    assert not json.loads((out / "summary.json").read_text())["complete"]

    from vitviz.cli import main

    assert main(args) == 0
    whole = tmp_path / "whole"
    assert main(stats_args([folder], whole, tiny_checkpoint, "--workers", "1", "--img-size", "112")) == 0
    resumed, uninterrupted = read_table(out), read_table(whole)
    # Batches of 2 in-process against batches of 4 in a worker: the same maths, other float32 summation
    # orders (reorder_rtol). CLS focus is 1 - H/log P, a difference of close numbers (≈ 3e-4 for this
    # random model): its error is the entropy's absolute error over log P, at most the entropy's
    # relative error, so it gets that as an absolute tolerance, never a relative one.
    rtol = reorder_rtol(N_112)
    pd.testing.assert_frame_equal(resumed.drop(columns="cls_focus"), uninterrupted.drop(columns="cls_focus"),
                                  rtol=rtol, atol=0)
    np.testing.assert_allclose(resumed["cls_focus"], uninterrupted["cls_focus"], rtol=0, atol=rtol)
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "sinks.parquet").sort_values(["image", "layer", "token"], ignore_index=True),
        pd.read_parquet(whole / "sinks.parquet").sort_values(["image", "layer", "token"], ignore_index=True))


@pytest.mark.slow
def test_ray_engine_writes_the_local_engines_table(tmp_path, tiny_checkpoint, ray_session, capsys):
    folder = tmp_path / "img"
    make_images(folder, 6)
    (folder / "broken.png").write_bytes(b"")
    from vitviz.cli import main

    def args(engine, workers):
        return stats_args([folder], tmp_path / engine, tiny_checkpoint, "--batch-size", "3", "--img-size", "112",
                          "--engine", engine, "--workers", workers)

    assert main(args("local", "1")) == 0
    capsys.readouterr()
    assert main(args("ray", "2")) == 0  # joins the session's Ray (2 CPUs), 2 actors
    err = capsys.readouterr().err
    tables = {engine: read_table(tmp_path / engine) for engine in ("local", "ray")}
    assert len(tables["ray"]) == 6 * 12 * 3
    pd.testing.assert_frame_equal(tables["ray"], tables["local"], rtol=1e-5)
    assert "skipped broken.png: is empty (0 bytes)" in err
    assert "Traceback" not in err


def test_ray_engine_without_ray_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    from vitviz.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    monkeypatch.setitem(sys.modules, "ray.data", None)
    make_images(tmp_path / "img", 1)
    assert main(["stats", str(tmp_path / "img"), "--out", str(tmp_path / "out"), "--engine", "ray"]) == 2
    assert "pip install -e '.[ray]'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_readmes_stats_command_does_what_it_says(tmp_path):
    """The README's first stats example, typed as it stands (only --out pointed at a temporary folder)."""
    import subprocess
    import sys
    from pathlib import Path

    import pandas as pd

    from conftest import readme_command

    root = Path(__file__).resolve().parent.parent
    args = readme_command(".venv/bin/python -m vitviz stats assets/", tmp_path / "stats")
    result = subprocess.run([sys.executable, *args], cwd=root, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    table = pd.read_parquet(tmp_path / "stats" / "stats.parquet")
    images = sorted(p.name for p in (root / "assets").glob("*.jpg"))
    assert sorted(table["image"].unique()) == images
    assert len(table) == len(images) * 12 * 6 and set(table["model"]) == {"bundled"}
    assert table["mean_distance"].between(0, 224 * 2 ** 0.5).all()
