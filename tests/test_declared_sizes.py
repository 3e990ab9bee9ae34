"""Hostile files built from a few bytes that declare gigabytes: each is refused with a sentence naming
the file, the declared size and the budget, before anything is allocated (peak memory of a fresh
process under 2 GiB), and nothing is left behind.

Each case runs in a fresh subprocess that reports its own peak resident memory (``VmHWM``); the
parent kills it past 3 GiB so that a regression cannot take the machine down. Run this module's
``main`` with ``--root DIR`` to measure another checkout's code the same way (the numbers in the
merge note were taken so).
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IMAGE = ROOT / "assets" / "chelsea.jpg"
PEAK_LIMIT_MIB = 2048   # the bar
KILL_MIB = 3072         # a regression is stopped here, not at the machine's end
BUDGET_MB = 1024        # VITVIZ_CACHE_MB for every case: the declared sizes are 10-150x this


def _run_probe(code: str, env_extra: dict, root: Path = ROOT) -> dict:
    """Run ``code`` in a fresh interpreter with ``root``'s vitviz first on the path.

    Returns: rc, out (stdout + stderr), peak_mib (VmHWM; None when killed), killed.
    """
    wrapper = textwrap.dedent("""
        import sys, traceback
        try:
            exec(compile(sys.argv[1], "<probe>", "exec"))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:
            print(f"RAISED {type(exc).__name__}: {exc}", file=sys.stderr)
            code = 3
        else:
            code = 0
        sys.stderr.flush()
        peak = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
        print(f"VMHWM_KIB {peak}", flush=True)
        sys.exit(code)
    """)
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "VITVIZ_CACHE_MB": str(BUDGET_MB),
           "OMP_NUM_THREADS": "1", **env_extra}
    proc = subprocess.Popen([sys.executable, "-c", wrapper, code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, cwd=str(root), text=True)
    killed = False
    while proc.poll() is None:
        try:
            rss = int(next(l for l in open(f"/proc/{proc.pid}/status") if l.startswith("VmRSS")).split()[1])
        except (OSError, StopIteration):
            rss = 0
        if rss > KILL_MIB << 10:
            proc.kill()
            killed = True
            break
        time.sleep(0.02)
    out = proc.communicate()[0]
    peak = [int(l.split()[1]) >> 10 for l in out.splitlines() if l.startswith("VMHWM_KIB")]
    return {"rc": proc.returncode, "out": out, "peak_mib": peak[0] if peak else None, "killed": killed}


# ---------------------------------------------------------------------------------------------
# The hostile files, each a few bytes (or a sparse file: no disk blocks)


def giant_vit_config(folder: Path) -> Path:
    """A ~600-byte transformers config declaring a 3.9e10-parameter ViT (hidden 16384, MLP 65536, 12 blocks),
    next to a 16-byte weights file holding no tensor."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["ViTForImageClassification"], "model_type": "vit", "hidden_size": 16384,
              "num_hidden_layers": 12, "num_attention_heads": 128, "intermediate_size": 65536,
              "image_size": 224, "patch_size": 16, "num_channels": 3, "hidden_act": "gelu", "qkv_bias": True,
              "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
              "initializer_range": 0.02, "encoder_stride": 16, "transformers_version": "5.0.0"}
    (folder / "config.json").write_text(json.dumps(config))
    # An empty but valid weights file: transformers then builds the model from the config before it
    # finds that no weight fits (without one it stops at "no file named model.safetensors").
    header = b"{}      "
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return folder


def sparse_file(path: Path, size: int = 1 << 30) -> Path:
    """A file of ``size`` bytes that takes no disk blocks (a 1 GiB hole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def huge_safetensors(path: Path, declared: int = 100 << 30) -> Path:
    """A safetensors file whose header declares one float32 tensor of ``declared`` bytes; the file is tiny
    (its header says more than it holds: the index is what vitviz reads)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [declared // 4], "data_offsets": [0, declared]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    return path


_BUILT: dict[int, Path] = {}  # rows -> the file as built, in a folder of its own removed when pytest exits


def long_stats_parquet(path: Path, rows: int = 40_000_000) -> Path:
    """A stats.parquet of ``rows`` identical rows in one row group, run-length encoded to a few hundred KiB,
    copied to ``path``. Encoding it takes ~7 s of CPU: it is built once per test process, and each case gets a
    copy of the file as built."""
    if rows not in _BUILT:
        folder = Path(tempfile.mkdtemp(prefix="vitviz-long-parquet-"))
        atexit.register(shutil.rmtree, folder, True)
        _BUILT[rows] = _write_long_stats_parquet(folder / "stats.parquet", rows)
    shutil.copyfile(_BUILT[rows], path)
    return path


def _write_long_stats_parquet(path: Path, rows: int) -> Path:
    """Built from one 1 M-row table referenced ``rows / 1M`` times (a chunked table: no copy), so the
    test process holds 60 MB while the file declares gigabytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from vitviz.runs.stats_store import STATS_SCHEMA

    block = 1 << 20
    columns = {}
    for field in STATS_SCHEMA:
        if pa.types.is_string(field.type):
            columns[field.name] = pa.DictionaryArray.from_arrays(pa.array([0] * block, pa.int32()),
                                                                 pa.array(["a.jpg" if field.name == "image" else "m"]))
        else:
            columns[field.name] = pa.array([1] * block, field.type)
    one = pa.table(columns).cast(pa.schema([(f.name, pa.dictionary(pa.int32(), pa.string())
                                             if pa.types.is_string(f.type) else f.type) for f in STATS_SCHEMA]))
    table = pa.concat_tables([one] * (rows // block))
    pq.write_table(table, path, row_group_size=len(table), compression="zstd")
    return path


CASES = {
    # name: (how the hostile input is laid out in tmp, the code a user's path runs, words the sentence must have)
    "config_39e9_cli": (
        lambda tmp: giant_vit_config(tmp / "giant") and (tmp / "out").mkdir(),
        "from vitviz.cli import main; sys.exit(main(['analyze', '--model', r'{tmp}/giant', r'{image}', "
        "'--out', r'{tmp}/out']))",
        ["giant", "config.json", "3.87e+10 parameters", "144.1 GiB", "1.0 GiB"]),
    "config_39e9_load_model": (
        lambda tmp: giant_vit_config(tmp / "giant"),
        "from vitviz.sources.models import ModelSpec, load_model; load_model(ModelSpec(r'{tmp}/giant'))",
        ["giant", "config.json", "3.87e+10 parameters", "1.0 GiB"]),
    "config_1gib_json": (
        lambda tmp: sparse_file(giant_vit_config(tmp / "big") / "config.json"),
        "from vitviz.sources.models import ModelSpec, load_model; load_model(ModelSpec(r'{tmp}/big'))",
        ["config.json", "1.0 GiB", "16 MiB"]),
    "weights_100gib_header": (
        lambda tmp: (tmp / "w").mkdir() or (tmp / "w" / "config.json").write_text(json.dumps(
            {"model_type": "vit", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, "image_size": 32, "patch_size": 16}))
        and huge_safetensors(tmp / "w" / "model.safetensors"),
        "from vitviz.sources.models import ModelSpec, load_model; load_model(ModelSpec(r'{tmp}/w'))",
        ["model.safetensors", "100.0 GiB", "1.0 GiB"]),
    "parquet_40m_rows_compare": (
        lambda tmp: long_stats_parquet(tmp / "stats.parquet"),
        "from vitviz.analyses.compare import read_stats_table; read_stats_table(r'{tmp}/stats.parquet')",
        ["stats.parquet", "39,845,888 rows", "1.0 GiB"]),
    "parquet_40m_rows_stats_resume": (
        lambda tmp: (tmp / "run").mkdir() or long_stats_parquet(tmp / "run" / "stats.parquet"),
        "from vitviz.cli import main; sys.exit(main(['stats', '--model', 'bundled', r'{image}', "
        "'--out', r'{tmp}/run', '--workers', '0']))",
        ["stats.parquet", "39,845,888 rows", "1.0 GiB"]),
    "list_2gib_txt": (
        lambda tmp: sparse_file(tmp / "list.txt", 1 << 31) and (tmp / "out").mkdir(),
        "from vitviz.cli import main; sys.exit(main(['stats', '--model', 'bundled', r'{tmp}/list.txt', "
        "'--out', r'{tmp}/out', '--workers', '0']))",
        ["list.txt", "2.0 GiB", "128 MiB"]),
    "summary_1gib_json": (
        lambda tmp: sparse_file(tmp / "run" / "summary.json"),
        "from vitviz.cli import main; sys.exit(main(['stats', '--model', 'bundled', r'{image}', "
        "'--out', r'{tmp}/run', '--workers', '0']))",
        ["summary.json", "1.0 GiB", "16 MiB"]),
}


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def run_case(name: str, tmp: Path, root: Path = ROOT) -> dict:
    build, code, _ = CASES[name]
    build(tmp)
    before = _listing(tmp)
    result = _run_probe(code.format(tmp=tmp, image=IMAGE), {"VITVIZ_CACHE": str(tmp / "cache")}, root)
    result["left_behind"] = sorted(p for p in _listing(tmp) - before if p.split("/")[0] != "cache")
    return result


@pytest.mark.slow  # a fresh interpreter per case: torch's import alone is seconds
@pytest.mark.parametrize("name", list(CASES))
def test_hostile_file_is_refused_with_a_sentence_before_allocating(name, tmp_path):
    result = run_case(name, tmp_path)
    assert not result["killed"], f"{name}: the process passed {KILL_MIB} MiB before refusing"
    assert result["rc"] != 0, result["out"]
    words = CASES[name][2]
    assert all(w in result["out"] for w in words), (words, result["out"])
    assert "Traceback" not in result["out"], result["out"]
    assert result["peak_mib"] is not None and result["peak_mib"] < PEAK_LIMIT_MIB, result
    assert result["left_behind"] == [], result["left_behind"]


def test_a_timm_architecture_over_the_budget_is_refused_before_it_is_built(monkeypatch):
    from vitviz.errors import ModelError
    from vitviz.sources.models import ModelSpec, load_model

    monkeypatch.setenv("VITVIZ_CACHE_MB", "1024")
    # vit_giant_patch14_dinov2: 1.14e9 parameters, 4.2 GiB as float32 (counted on the meta device).
    with pytest.raises(ModelError, match=r"vit_giant_patch14_dinov2.*1\.1[34]e\+09 parameters.*4\.[23] GiB.*1\.0 GiB"):
        load_model(ModelSpec("vit_giant_patch14_dinov2"))


def test_a_cached_hub_config_over_the_budget_is_refused(tmp_path, monkeypatch):
    """The ``hf:`` path reads the config from the local hub cache: the same check applies."""
    from vitviz.sources.declared import check_weights
    from vitviz.errors import ModelError

    snapshot = tmp_path / "hub" / "models--someone--giant" / "snapshots" / ("0" * 40)
    giant_vit_config(snapshot)
    (tmp_path / "hub" / "models--someone--giant" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--giant" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelError, match=r"hf:someone/giant.*config\.json.*3\.87e\+10.*over this server's memory budget"):
        check_weights("hf:someone/giant", 1 << 30)


def test_declared_parameters_of_real_configs_are_a_close_lower_bound():
    """The config arithmetic against transformers' own count: never above it (a lower bound may only refuse
    what is too large), and within 1 % for the families vitviz reads (so the budget is honest)."""
    import torch
    import transformers

    from vitviz.sources.declared import FLOAT32, LAYER_OBJECT_BYTES, hf_config_declared

    configs = [transformers.ViTConfig(), transformers.Dinov2Config(),
               transformers.CLIPVisionConfig(), transformers.DeiTConfig(image_size=384, hidden_size=192,
                                                                          intermediate_size=768, num_labels=7)]
    for config in configs:
        with torch.device("meta"):
            model = transformers.AutoModel.from_config(config)
        counted = sum(p.numel() for p in model.state_dict().values())
        declared = hf_config_declared(config.to_dict(), "config.json")
        params = (declared.bytes - config.num_hidden_layers * LAYER_OBJECT_BYTES) / FLOAT32
        assert 0.99 * counted <= params <= counted * 1.001, (type(config).__name__, params, counted)


def main(argv=None) -> int:
    """``python tests/test_declared_sizes.py --root DIR``: every case's peak memory with DIR's vitviz."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("cases", nargs="*", default=list(CASES))
    args = parser.parse_args(argv)
    for name in args.cases:
        with tempfile.TemporaryDirectory() as tmp:
            r = run_case(name, Path(tmp), args.root)
        last = [l for l in r["out"].splitlines() if l.strip() and not l.startswith("VMHWM")][-1:]
        peak = f">{KILL_MIB} MiB (killed)" if r["killed"] else f"{r['peak_mib']} MiB"
        print(f"{name}: rc={r['rc']} peak={peak} left={r['left_behind']} :: {last[0][:160] if last else ''}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
