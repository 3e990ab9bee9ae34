"""Documentation a researcher uses, typed by the tests: the README's "From Python" example (its printed lines are
the README's), the two scripts in examples/ on the bundled model, and the API reference built from the docstrings."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str], cwd: Path, timeout: int = 900) -> str:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return done.stdout


def _from_python() -> tuple[str, str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## From Python"):]
    section = section[:section.index("\n## ", 3)]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    printed = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    return code, printed


@pytest.mark.slow
def test_the_readme_python_example_prints_what_the_readme_says(tmp_path, bundled):
    code, printed = _from_python()
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    (tmp_path / "example.py").write_text(code)
    assert _run(["example.py"], tmp_path) == printed
    assert (tmp_path / "out" / "trace" / "trace.npz").is_file()


@pytest.mark.slow
def test_the_heads_figure_example_writes_one_row_per_image(tmp_path, bundled):
    from PIL import Image

    out = _run([str(ROOT / "examples" / "heads_figure.py"), str(ROOT / "assets"), "--layer", "12", "--max-images", "2",
                "--out", str(tmp_path / "heads.png")], tmp_path)
    assert out.strip() == f"wrote {tmp_path / 'heads.png'}: 2 images x 6 heads, layer 12"
    with Image.open(tmp_path / "heads.png") as im:
        assert im.size[0] > 2 * im.size[1]  # 7 columns (the image and 6 heads) by 2 rows


@pytest.mark.slow
def test_the_faithfulness_example_prints_a_verdict_per_method(tmp_path, bundled):
    out = _run([str(ROOT / "examples" / "attnlrp_vs_rollout.py"), str(ROOT / "assets"), "--max-images", "2",
                "--steps", "3"], tmp_path).splitlines()
    assert out[0].startswith("2 images, DINOv2 ViT-S/14")
    rows = {line.split()[0]: line for line in out[2:]}
    assert set(rows) == {"attnlrp", "random", "rollout"}
    for method in ("attnlrp", "rollout"):
        assert rows[method].endswith(("within chance", "random seed"))


def test_every_public_name_has_a_docstring_and_is_in_the_api_reference(tmp_path):
    import vitviz

    for name in vitviz.__all__:
        if name == "__version__":
            continue
        value = getattr(vitviz, name)
        assert (value.__doc__ or "").strip(), name
    _run(["-m", "pdoc", "vitviz", "vitviz.lens", "vitviz.explainers", "-o", str(tmp_path / "api")], ROOT)
    lens_page = (tmp_path / "api" / "vitviz" / "lens.html").read_text()
    for name in ("Lens", "Trace", "open", "load_trace"):
        assert f'id="{name}"' in lens_page, name
    assert "(B, L, H, N, N)" in lens_page  # the shapes are in the reference, not only in the code
    assert 'id="explain"' in (tmp_path / "api" / "vitviz" / "explainers.html").read_text()
