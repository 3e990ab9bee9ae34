"""Files and numbers unchanged: an ``analyze`` folder written by the code before issue 41 (tests/data/analyze_before,
its README says how) is read by today's ``vitviz.load``, and today's ``analyze`` with the same arguments writes the
same arrays and settings.

Tolerance: the folder was written on another CPU than CI's may be. Each array is a float32 forward through 12 blocks
of width 384 (or a map computed from it); a different BLAS kernel sums in another order, which moves each dot
product by about sqrt(384) * 6e-8 relative and each block by a few of those: about 2e-5 relative after 12 blocks.
The bound below (1e-4 of each array's largest magnitude) is 5x that; a changed analysis moves its array by far more
(a different rollout readout, distance unit or target moves values by 1e-2 or more of their range).
"""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ASSETS
from vitviz.cli import main

pytestmark = pytest.mark.slow

BEFORE = Path(__file__).parent / "data" / "analyze_before"
ARGS = ["--img-size", "56", "--flow", "--attribution",
        "attnlrp,cp-lrp,gradient,integrated_gradients,legrad,gradcam,occlusion"]
RELATIVE = 1e-4
# Recorded per run or per machine, not computed: a run's id, the package versions and the weights cache's path.
PER_RUN = {"run_id", "versions", "weights_source"}


def _arrays(folder: Path) -> dict[str, np.ndarray]:
    with np.load(folder / "analysis.npz", allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def _close(new: np.ndarray, old: np.ndarray, name: str) -> None:
    assert new.shape == old.shape and new.dtype == old.dtype, name
    scale = float(np.abs(old).max()) if old.size else 0.0
    np.testing.assert_allclose(new, old, rtol=RELATIVE, atol=RELATIVE * scale, err_msg=name)


def _same_settings(new, old, path: str = "") -> None:
    if isinstance(old, dict):
        assert set(new) - PER_RUN == set(old) - PER_RUN, path
        for key in set(old) - PER_RUN:
            _same_settings(new[key], old[key], f"{path}.{key}")
    elif isinstance(old, list):
        assert len(new) == len(old), path
        for i, (a, b) in enumerate(zip(new, old)):
            _same_settings(a, b, f"{path}[{i}]")
    elif isinstance(old, float):
        assert new == pytest.approx(old, rel=RELATIVE, abs=RELATIVE), path
    else:
        assert new == old, path


def test_today_s_analyze_writes_the_numbers_and_settings_written_before(tmp_path):
    out = tmp_path / "out"
    assert main(["analyze", str(ASSETS / "chelsea.jpg"), "--out", str(out), *ARGS]) == 0
    old, new = _arrays(BEFORE), _arrays(out)
    assert list(new) == list(old)  # the same arrays in the same order
    for name in old:
        _close(new[name], old[name], name)
    _same_settings(json.loads((out / "settings.json").read_text()),
                   json.loads((BEFORE / "settings.json").read_text()))


def test_today_s_load_reads_the_folder_written_before(tmp_path):
    import vitviz

    folder = tmp_path / "before"
    shutil.copytree(BEFORE, folder)
    trace = vitviz.load(folder)
    old = _arrays(BEFORE)
    assert torch.equal(trace.stack("attn"), torch.from_numpy(old["attention"]))
    assert torch.equal(trace.stack("resid_post.norm"), torch.from_numpy(old["token_norms"]))
    assert torch.equal(trace["final_norm"], torch.from_numpy(old["features"]))
    assert torch.equal(trace.inputs.tensor, torch.from_numpy(old["input"]))
    assert trace.layout.grid_size == (4, 4) and trace.num_layers == 12
    assert set(trace.saved["arrays"]) == set(old) - {"attention", "token_norms", "features", "input"}

    # The folder's trace is the one today's forward of its input keeps.
    lens = vitviz.open("bundled", img_size=56)
    again = lens.trace(trace.inputs, keep=("attn", "resid_post.norm", "final_norm"))
    for kind in ("attn", "resid_post.norm"):
        _close(again.stack(kind).numpy(), old["attention" if kind == "attn" else "token_norms"], kind)
    _close(again["final_norm"].numpy(), old["features"], "final_norm")
