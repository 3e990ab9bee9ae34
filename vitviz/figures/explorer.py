"""One image's maps packed for drawing in the browser: the rows a view needs, in float16.

Two views read these payloads (``header["view"]``): ``"heads"`` (every head of a layer, and one head's
layers side by side: :func:`explorer_payload`) and ``"rollout"`` (the cumulative rollout after a chosen
layer, of the readout or a clicked patch: :func:`rollout_payload`). The browser then redraws layer, head,
depth and query changes itself (``components/explorer/``) with the same colour maps, colour-scale rules
and overlay arithmetic as :func:`vitviz.figures.overlay.render_maps`.

The packing is one byte string: a little-endian uint32 with the length of a JSON header, the
header, zero padding to a multiple of 8, then the arrays the header lists (``name``, ``dtype``,
``shape``, ``offset`` from the start of the binary part, ``nbytes``).
"""
from __future__ import annotations

import hashlib
import io
import json
import struct
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .colour import SCALE_MODES, SEQUENTIAL, ROBUST_PERCENTILE, lookup_table
from ..layout import TokenLayout
from .overlay import (CLIPPED_COLOUR, OVERLAY_HELP, OVERLAY_LABELS, OVERLAY_STYLES, PADDING_COLOUR, QUERY_COLOUR,
                      SINK_COLOUR)
from ..analyses.rollout import readout_label, rollout, rollout_patch_rows
from ..tensors import as_tensor

# All patch rows go to the browser while they fit in this many bytes (bundled model @224: 9.4 MB);
# above it only the CLS and mean rows, plus the selected patch's row and column once a patch is picked.
PATCH_ROWS_BUDGET = 16 * 2**20
# float16: 11 significant bits, so a normal value is within 2^-11 relative of the float32 one;
# below 2^-14 (6.1e-5) float16 is subnormal with a fixed step of 2^-24, i.e. within 2^-25 absolute.
FLOAT16_RELATIVE = 2.0 ** -11
FLOAT16_ABSOLUTE = 2.0 ** -25


def quantisation_note(what: str = "attention weight") -> str:
    """What the browser's copy of the maps lost, in one sentence for the page."""
    return (f"The browser draws from a float16 copy: each {what} is within "
            f"{FLOAT16_RELATIVE:.1e} relative ({FLOAT16_ABSOLUTE:.0e} absolute below 6e-5) of the float32 value, "
            "so a patch's colour can differ from the exported PNG's by at most one step of the 256-step colour map.")


@dataclass
class ExplorerPayload:
    """The packed bytes and what they hold.

    Attributes:
        data: the byte string the component reads.
        digest: sha256 of the arrays and header (16 hex digits): the component keeps its view while it is unchanged.
        arrays: name -> nbytes of each array sent.
        patch_rows: whether every patch's row is included (else only the selected patch's).
        selected: the patch whose row and column are included when not every row is.
    """

    data: bytes
    digest: str
    arrays: dict[str, int]
    patch_rows: bool
    selected: int | None = None

    @property
    def nbytes(self) -> int:
        return len(self.data)


def _pack(header: dict, arrays: dict[str, np.ndarray]) -> tuple[bytes, str]:
    """(packed bytes, digest of the arrays): the digest names the content, so the browser keeps its view
    across reruns that send the same image's attention again."""
    blobs, offset, listing = [], 0, []
    digest = hashlib.sha256()
    for name, array in arrays.items():
        raw = np.ascontiguousarray(array).tobytes()
        digest.update(raw)
        listing.append({"name": name, "dtype": array.dtype.name, "shape": list(array.shape), "offset": offset,
                        "nbytes": len(raw)})
        pad = (-len(raw)) % 8
        blobs.append(raw + b"\0" * pad)
        offset += len(raw) + pad
    digest.update(json.dumps(header, sort_keys=True).encode())
    name = digest.hexdigest()[:16]
    text = json.dumps(header | {"id": name, "arrays": listing}, separators=(",", ":")).encode()
    text += b" " * ((-(4 + len(text))) % 8)
    return struct.pack("<I", len(text)) + text + b"".join(blobs), name


def unpack(data: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """The header and the arrays of a packed payload (what the browser reads; for tests and tools)."""
    (n,) = struct.unpack_from("<I", data)
    header = json.loads(data[4:4 + n])
    start = 4 + n
    arrays = {a["name"]: np.frombuffer(data, dtype=a["dtype"], count=int(np.prod(a["shape"])),
                                       offset=start + a["offset"]).reshape(a["shape"]) for a in header["arrays"]}
    return header, arrays


def _png(image: Image.Image) -> np.ndarray:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, "PNG")
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


def _drawing_header(what: str = "attention weight") -> dict:
    """What every view draws with: the colour maps' lookup tables, the scale and overlay rules, the mark colours."""
    return {
        "luts": {name: lookup_table(name).tolist() for name in SEQUENTIAL},
        "scale_modes": list(SCALE_MODES), "styles": list(OVERLAY_STYLES), "style_labels": [OVERLAY_LABELS[s] for s in OVERLAY_STYLES],
        "style_help": OVERLAY_HELP, "percentile": ROBUST_PERCENTILE,
        "colours": {"clipped": list(CLIPPED_COLOUR), "sink": list(SINK_COLOUR), "query": list(QUERY_COLOUR),
                    "padding": list(PADDING_COLOUR)},
        "quantisation": quantisation_note(what),
    }


def explorer_payload(attention, layout: TokenLayout, image: Image.Image, *, sinks: list[np.ndarray],
                     notes: np.ndarray | None = None, scores: dict[str, tuple[np.ndarray, bool]] | None = None,
                     selected: int | None = None, padding: np.ndarray | None = None,
                     patch_rows_budget: int = PATCH_ROWS_BUDGET) -> ExplorerPayload:
    """Pack one image's attention for the browser explorer.

    Args:
        attention: (L, H, N, N) attention probabilities (numpy or a tensor on any device).
        layout: the token layout (prefix tokens, grid).
        image: the model-input image the maps are drawn over (sent as PNG, decoded exactly).
        sinks: L arrays of sink patches (raster indices), one per layer: marked and kept out of the scale.
        notes: (L, H) strings under each head's title (entropy, focus, distance), or None.
        scores: ranking name -> ((L, H) scores, whether higher ranks first), as :func:`vitviz.analyses.maps.rank_heads`.
        selected: the selected patch; its row and column are sent when not every row fits the budget.
        padding: patches holding padding only (raster indices, :func:`vitviz.sources.preprocess.padding_patches`): the browser
            hatches them and keeps them out of the scale while its Display box says so.
        patch_rows_budget: bytes allowed for every patch's row of every layer and head (float16).

    Returns:
        the payload; arrays (float16 unless said): ``cls`` (L, H, P) the class token's row over patch
        keys, ``mean`` (L, H, P) the mean over patch queries, ``rows`` (L, H, P, P) every patch query's
        row when it fits, else ``row`` and ``col`` (L, H, P) of the selected patch; ``image`` PNG bytes.
    """
    att = as_tensor(attention)
    L, H = att.shape[:2]
    gh, gw = layout.grid_size
    P = layout.num_patches
    ps = layout.patch_slice
    arrays: dict[str, np.ndarray] = {}
    if layout.cls_index is not None:
        arrays["cls"] = att[:, :, layout.cls_index, ps].to("cpu", torch.float16).numpy()
    # The mean in float32 from float32 rows (as maps.query_attention_map), then rounded once.
    arrays["mean"] = torch.stack([att[l, :, ps, ps].float().mean(dim=1) for l in range(L)]).to("cpu", torch.float16).numpy()
    patch_rows = L * H * P * P * 2 <= patch_rows_budget
    if patch_rows:
        arrays["rows"] = att[:, :, ps, ps].to("cpu", torch.float16).numpy()
    elif selected is not None:
        q = layout.num_prefix_tokens + int(selected)
        arrays["row"] = att[:, :, q, ps].to("cpu", torch.float16).numpy()
        arrays["col"] = att[:, :, ps, q].to("cpu", torch.float16).numpy()
    arrays["image"] = _png(image)
    header = {
        "version": 1, "view": "heads", "layers": L, "heads": H, "grid": [gh, gw], "patches": P,
        "size": [image.width, image.height], "has_cls": layout.cls_index is not None,
        "patch_rows": patch_rows, "selected": selected,
        "sinks": [np.asarray(s, dtype=int).tolist() for s in sinks],
        "padding": [] if padding is None else np.asarray(padding, dtype=int).tolist(),
        "notes": None if notes is None else np.asarray(notes, dtype=object).tolist(),
        "rankings": {name: {"scores": np.asarray(v, dtype=np.float64).tolist(), "descending": bool(d)}
                     for name, (v, d) in (scores or {}).items()},
    } | _drawing_header()
    data, digest = _pack(header, arrays)
    return ExplorerPayload(data=data, digest=digest,
                           arrays={k: v.nbytes for k, v in arrays.items()}, patch_rows=patch_rows,
                           selected=None if patch_rows else selected)


def rollout_payload(attention, layout: TokenLayout, image: Image.Image, *, fusion: str = "mean", discard: float = 0.0,
                    start: int = 0, end: int | None = None, exclude_tokens: tuple[int, ...] = (),
                    sinks: np.ndarray | None = None, display: dict | None = None, selected: int | None = None,
                    padding: np.ndarray | None = None, patch_rows_budget: int = PATCH_ROWS_BUDGET) -> ExplorerPayload:
    """Pack one image's cumulative rollout after each layer of a range, for the browser's rollout view.

    The browser picks the depth and the read-out patch; the rows it draws are computed here in float64
    (:func:`vitviz.analyses.rollout.rollout`) and rounded once to float16, so it multiplies nothing itself.

    Args:
        attention: (L, H, N, N) attention probabilities (numpy or a tensor on any device).
        layout: the token layout.
        image: the model-input image (sent as PNG).
        fusion, discard, start, end, exclude_tokens: as :func:`vitviz.analyses.rollout.rollout` (range [start, end), 0-based).
        sinks: sink patches of the range (raster indices): marked and kept out of the scale when ``display`` says so.
        display: how to draw, as the page's display choices: ``cmap``, ``scale``, ``style``, ``opacity``,
            ``sinks`` (mark them), ``smooth`` (bilinear between patch centres), ``clip`` (outline clipped patches).
        selected: the clicked patch; its rows are sent when not every patch's rows are.
        padding: padding patches to hatch and keep out of the scale (raster indices; none when the display's
            choice is off).
        patch_rows_budget: bytes allowed for every patch's rows of every depth (float16).

    Returns:
        the payload; arrays (float16 unless said): ``readout`` (D, P) the readout's rollout after each of
        the D layers of the range; ``rows`` (D, P, P) every patch query's rollout row, sent without
        discard (then all patches share one chain) when it fits, else ``row`` (D, P) of ``selected``;
        ``image`` PNG bytes.
    """
    L = attention.shape[0]
    end = L if end is None else end
    D, P = end - start, layout.num_patches
    settings = dict(fusion=fusion, start=start, end=end, exclude_tokens=tuple(exclude_tokens))
    arrays = {"readout": rollout(attention, layout, discard=discard, **settings).per_layer
              .reshape(D, P).astype(np.float16)}
    patch_rows = discard == 0 and D * P * P * 2 <= patch_rows_budget
    if patch_rows:
        rows = np.empty((D, P, P), np.float16)
        for j, M in enumerate(rollout_patch_rows(attention, layout, **settings)):
            rows[j] = M.to("cpu", torch.float16).numpy()
        arrays["rows"] = rows
    elif selected is not None:
        arrays["row"] = rollout(attention, layout, discard=discard, query=int(selected), **settings).per_layer \
            .reshape(D, P).astype(np.float16)
    arrays["image"] = _png(image)
    gh, gw = layout.grid_size
    display = {"cmap": "Inferno", "scale": SCALE_MODES[0], "style": OVERLAY_STYLES[0], "opacity": 0.8,
               "sinks": True, "smooth": False, "clip": True} | (display or {})
    header = {
        "version": 1, "view": "rollout", "layers": L, "start": start + 1, "end": end, "grid": [gh, gw], "patches": P,
        "size": [image.width, image.height], "readout": readout_label(layout),
        "fusion": fusion, "discard": float(discard), "patch_rows": patch_rows, "selected": selected,
        "discard_rows": discard != 0,
        "sinks": [] if sinks is None else np.asarray(sinks, dtype=int).tolist(), "display": display,
        "padding": [] if padding is None else np.asarray(padding, dtype=int).tolist(),
        "value_name": "rollout mass",
    } | _drawing_header("rollout mass")
    data, digest = _pack(header, arrays)
    return ExplorerPayload(data=data, digest=digest, arrays={k: v.nbytes for k, v in arrays.items()},
                           patch_rows=patch_rows, selected=None if patch_rows else selected)
