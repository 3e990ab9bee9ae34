"""Public SAEs in their libraries' own files, read without running code from them.

- **saev** (OSU-NLP-Group/saev, ``saev.nn.modeling.dump``): one JSON header line (``schema``, ``cfg`` with ``d_vit``,
  ``exp_factor``, ``activation`` {``cls``: ``Relu`` / ``TopK`` / ``BatchTopK``, ``params``: {``top_k``}}), then
  ``torch.save(state_dict)`` with ``W_enc`` (D, K), ``b_enc`` (K), ``W_dec`` (K, D), ``b_dec`` (D); encode is
  act(x W_enc + b_enc) (no b_dec subtracted), TopK keeps the top k values as they are (no ReLU). saev trains on
  activations it scaled by one scalar that the file does not hold: pass it as ``scale`` (default 1). The header
  names neither model nor layer: pass them.
- **ViT-Prisma** (soniajoseph/ViT-Prisma, Prisma-Multimodal on the Hub): ``config.json`` (``d_in``, ``d_sae``,
  ``activation_fn_str``, ``activation_fn_kwargs`` {``k``}, ``hook_point`` such as ``blocks.8.hook_mlp_out``,
  ``model_name``, ``normalize_activations``) beside a ``.pt`` written by ``torch.save({"cfg": config object,
  "state_dict": ...})`` with ``W_enc`` (D, K), ``W_dec`` (K, D); encode is act((x − b_dec) W_enc + b_enc), TopK with
  ReLU by default.

Every ``.pt`` is read with ``torch.load(weights_only=True)``: tensors and plain containers only. Prisma's pickled
config object is let through as an inert record (its class is never imported: the name is mapped to a stub that
only stores the fields); a file that names any other class or function — a pickle that would run code — is
refused with a sentence naming it.
"""
from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path

import torch

from .sae import SAE, SAEError

SAEV_ACTIVATIONS = {"TopK": "topk", "BatchTopK": "topk", "Relu": "relu"}
PRISMA_CONFIG_CLASS = "vit_prisma.sae.config.VisionModelSAERunnerConfig"
PRISMA_POINTS = {"hook_resid_pre": "resid_pre", "hook_resid_mid": "resid_mid", "hook_resid_post": "resid_post",
                 "hook_mlp_out": "mlp_out", "hook_attn_out": "attn_out", "ln1.hook_normalized": "ln1",
                 "ln2.hook_normalized": "ln2", "mlp.hook_post": "mlp_hidden"}


class _InertRecord:
    """What a pickled config object becomes: its fields in ``__dict__``, no behaviour, its class never imported."""

    def __setstate__(self, state):
        self.__dict__.update(state if isinstance(state, dict) else {"state": state})


def _torch_load(data: bytes, where: Path, allow: tuple = ()) -> object:
    try:
        with torch.serialization.safe_globals(list(allow)):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f"the code object {found.group(1)}" if found else "code"
        raise SAEError(f"{where}: this file is a pickle that would import and run {what} to load; vitviz reads "
                       "only tensors and plain values from SAE files. Save the state dict alone (torch.save("
                       "sae.state_dict(), ...)) or as safetensors.") from None
    except Exception as exc:  # zip / format errors of a damaged or foreign file
        raise SAEError(f"{where}: not readable as a torch file ({type(exc).__name__}: {exc}).") from None


def load_saev(path: str | Path, *, model: str | None = None, point: str = "resid_post", layer: int | None = None,
              scale: float = 1.0) -> SAE:
    """An SAE saved by saev's ``dump`` (one JSON line, then the state dict).

    Args:
        model, point, layer: what it reads (1-based layer), recorded in ``info`` (the file does not say).
        scale: the scalar saev multiplied the activations by before training (its data loader's; default 1).

    Raises:
        SAEError: not a saev file, an unknown schema or activation, or a pickle that would run code.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SAEError(f"{path}: cannot be read ({exc.strerror or exc}).") from exc
    line, _, rest = raw.partition(b"\n")
    try:
        header = json.loads(line)
        cfg = header["cfg"] if "schema" in header else header
        d_vit, exp = int(cfg["d_vit"]), int(cfg["exp_factor"])
    except (ValueError, KeyError, TypeError):
        raise SAEError(f"{path}: not a saev checkpoint (its first line is not saev's JSON header with cfg.d_vit and "
                       "cfg.exp_factor).") from None
    if header.get("schema", 0) not in (0, 1, 2):
        raise SAEError(f"{path}: saev schema {header['schema']} is newer than the ones vitviz reads (0 to 2).")
    act = cfg.get("activation", {"cls": "Relu", "params": {}})
    if isinstance(act, dict):
        cls, params = act.get("cls"), act.get("params", {})
    else:
        cls, params = header.get("cls", "Relu"), {"top_k": cfg.get("top_k", 32)}
    if cls not in SAEV_ACTIVATIONS:
        raise SAEError(f"{path}: saev activation {cls!r} is not one vitviz reads ({', '.join(SAEV_ACTIVATIONS)}).")
    state = _torch_load(rest, path)
    sae = SAE(d_vit, d_vit * exp, params.get("top_k") if cls != "Relu" else None, scale=scale,
              activation=SAEV_ACTIVATIONS[cls], centre_input=False,
              info=_reads(model, point, layer) | {"source": {"library": "saev", "file": str(path),
                                                             "header": header}})
    _copy(sae, state, path, transpose_encoder=True)
    return sae.eval()


def load_prisma(path: str | Path, weights: str | Path | None = None) -> SAE:
    """An SAE in ViT-Prisma's layout: ``config.json`` and a ``.pt`` in the folder ``path`` (or ``path`` the ``.pt``
    with ``config.json`` beside it; ``weights`` picks one ``.pt`` of several).

    Raises:
        SAEError: no config.json, an activation or normalisation vitviz does not reproduce, or a pickle that would
            run code.
    """
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise SAEError(f"{folder / 'config.json'}: a ViT-Prisma SAE needs its config.json ({exc}).") from None
    if weights is None:
        candidates = [path] if path.is_file() else sorted(folder.glob("*.pt"))
        if len(candidates) != 1:
            raise SAEError(f"{folder}: {'no' if not candidates else len(candidates)} .pt weights files; name the one "
                           "to read.")
        weights = candidates[0]
    weights = Path(weights)
    try:
        d_in, d_sae = int(cfg["d_in"]), int(cfg["d_sae"] or cfg["d_in"] * cfg["expansion_factor"])
    except (KeyError, TypeError):
        raise SAEError(f"{folder / 'config.json'}: no d_in and d_sae (or expansion_factor): not a ViT-Prisma SAE "
                       "config.") from None
    norm = cfg.get("normalize_activations") or "none"
    if norm != "none":
        raise SAEError(f"{folder / 'config.json'}: normalize_activations {norm!r} rescales every token on the fly; "
                       "vitviz reproduces only 'none'.")
    fn = cfg.get("activation_fn_str", "relu")
    if fn not in ("relu", "topk"):
        raise SAEError(f"{folder / 'config.json'}: activation {fn!r} is not one vitviz reads (relu, topk).")
    k = (cfg.get("activation_fn_kwargs") or {}).get("k")
    state = _torch_load(weights.read_bytes(), weights, allow=[(_InertRecord, PRISMA_CONFIG_CLASS)])
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    hook = str(cfg.get("hook_point", ""))
    found = re.fullmatch(r"blocks\.(\d+)\.(.+)", hook)
    kind = PRISMA_POINTS.get(found.group(2)) if found else None
    sae = SAE(d_in, d_sae, k if fn == "topk" else None, activation="topk_relu" if fn == "topk" else "relu",
              centre_input=True,
              info=_reads(cfg.get("model_name"), kind, int(found.group(1)) + 1 if found and kind else None)
              | {"source": {"library": "ViT-Prisma", "file": str(weights), "hook_point": hook}})
    _copy(sae, state, weights, transpose_encoder=True)
    return sae.eval()


def _reads(model, point, layer) -> dict:
    out = {}
    if model:
        out["model"] = {"name": model}
    if point and layer:
        out |= {"point": f"blocks.{int(layer) - 1}.{point}", "point_kind": point, "layer": int(layer)}
    return out


def _copy(sae: SAE, state, where: Path, transpose_encoder: bool) -> None:
    if not isinstance(state, dict):
        raise SAEError(f"{where}: holds a {type(state).__name__}, not a state dict of tensors.")
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if transpose_encoder and "W_enc" in tensors:
        tensors["W_enc"] = tensors["W_enc"].T
    sae.load_tensors({k: v.float() for k, v in tensors.items()}, where)


def load_sae(path: str | Path, **kwargs) -> SAE:
    """An SAE from any format vitviz reads, told apart by its files: a folder with ``sae.json`` (vitviz), a folder or
    ``.pt`` with ``config.json`` (ViT-Prisma), else a file whose first line is JSON (saev; ``kwargs`` go to
    :func:`load_saev`).

    Raises:
        SAEError: none of these (the sentence says what was looked for).
    """
    path = Path(path)
    if path.is_dir() and (path / "sae.json").exists():
        return SAE.load(path)
    if (path if path.is_dir() else path.parent).joinpath("config.json").exists():
        return load_prisma(path)
    if path.is_file():
        return load_saev(path, **kwargs)
    raise SAEError(f"{path}: no SAE here: vitviz reads a folder with sae.json (features train), a ViT-Prisma folder "
                   "(config.json + .pt) or a saev checkpoint file.")


def check_width(sae: SAE, lens, point: str, layer: int) -> None:
    """Refuse an SAE whose input width is not the width of ``point`` at 1-based ``layer`` of ``lens``'s model."""
    from .data import check_point

    name = check_point(lens, point, layer)
    size = lens.layout.grid_size[0] * lens.layout.patch_size[0], lens.layout.grid_size[1] * lens.layout.patch_size[1]
    probe = torch.zeros(1, 3, *size)
    width = lens.trace(probe, keep=[name], stop_after=name)[name].shape[-1]
    if width != sae.d_model:
        raise SAEError(f"this SAE reads {sae.d_model}-wide tokens, but {point} of layer {layer} of {lens.label} is "
                       f"{width} wide: it was trained on another model or point.")
