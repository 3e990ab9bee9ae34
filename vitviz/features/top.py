"""Where each latent fires most: the top-n (image, patch) of every latent over an image set, and one image's top
latents with their activation maps over the patches."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..errors import VitvizError
from .sae import SAE

TOP_COLUMNS = ("latent", "image", "patch", "activation")


def open_for(sae: SAE, device: str = "auto", head: str | Path | None = None):
    """The model an SAE was trained on (sae.json's ``model``), opened with :func:`vitviz.open` (``head``: a probe file
    that becomes its classifier)."""
    import vitviz

    model = sae.info.get("model")
    if not model:
        raise VitvizError("this SAE does not say which model it reads (sae.json has no 'model'): open the model "
                          "yourself and pass the lens.")
    return vitviz.open(model["name"], checkpoint=model.get("checkpoint"), img_size=model.get("img_size"),
                       device=device, head=head)


def point_of(sae: SAE) -> tuple[str, int]:
    """(point kind, 1-based layer) sae.json names."""
    try:
        return sae.info["point_kind"], int(sae.info["layer"])
    except KeyError:
        raise VitvizError("this SAE does not say which point it reads (sae.json has no 'point_kind' / 'layer').") \
            from None


@torch.no_grad()
def latent_maps(sae: SAE, tokens: torch.Tensor, layout) -> np.ndarray:
    """(B, N, D) tokens of the SAE's point -> (B, K, gh, gw) latent activations over the patch grid (float32,
    in the SAE's normalised units; prefix tokens dropped)."""
    z = sae.encode(tokens[:, layout.patch_slice].float().to(sae.W_dec.device))  # (B, n, K)
    gh, gw = layout.grid_size
    return z.permute(0, 2, 1).reshape(len(z), -1, gh, gw).cpu().numpy()


def image_top_latents(maps: np.ndarray, n: int = 8, by: str = "max") -> np.ndarray:
    """(K, gh, gw) one image's latent maps -> the ``n`` latents with the largest ``by`` (``"max"`` or ``"sum"``
    over the patches) that fire at all, largest first."""
    score = maps.reshape(len(maps), -1)
    score = score.max(1) if by == "max" else score.sum(1)
    order = np.argsort(-score, kind="stable")
    return order[score[order] > 0][:n]


@torch.no_grad()
def top_table(sae_dir: str | Path, files: list, n: int = 16, batch_size: int = 8, device: str = "auto",
              lens=None) -> pd.DataFrame:
    """Top-``n`` patches of every latent over ``files``.

    Returns:
        DataFrame (latent int32, image str, patch int32 0-based raster index, activation float32 > 0), for each
        latent its rows by activation, largest first; latents that never fire have none.
    """
    from .data import token_batches

    sae = SAE.load(sae_dir) if not isinstance(sae_dir, SAE) else sae_dir
    lens = lens or open_for(sae, device)
    sae = sae.to(lens.device)
    kind, layer = point_of(sae)
    K = sae.latents
    best = torch.full((K, 0), -1.0)
    where = torch.zeros((K, 0), dtype=torch.int64)  # image number * patches + patch
    names: list[str] = []
    patches = lens.layout.num_patches
    for batch in token_batches(lens, files, kind, layer, batch_size, prefix=True):
        if not batch.names:
            continue
        z = sae.encode(batch.tokens[:, lens.layout.patch_slice]).reshape(-1, K).T.cpu()  # (K, B * n)
        ids = torch.arange(z.shape[1]) + len(names) * patches
        names += batch.names
        vals = torch.cat([best, z], 1)
        idx = torch.cat([where, ids.expand(K, -1)], 1)
        top = vals.topk(min(n, vals.shape[1]), dim=1)
        best, where = top.values, idx.gather(1, top.indices)
    rows = (best > 0).nonzero().numpy()
    flat = where[best > 0].numpy()
    table = pd.DataFrame({"latent": rows[:, 0].astype(np.int32),
                          "image": np.asarray(names, dtype=object)[flat // patches],
                          "patch": (flat % patches).astype(np.int32),
                          "activation": best[best > 0].numpy().astype(np.float32)})
    return table.sort_values(["latent", "activation"], ascending=[True, False], kind="stable").reset_index(drop=True)


def write_png(image, path: str | Path) -> Path:
    """A PIL image as PNG at ``path``, written whole or not at all."""
    import io

    from ..io.atomic import atomic_write_bytes

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return atomic_write_bytes(Path(path), buffer.getvalue())


def write_json(data: dict, path: str | Path) -> Path:
    """``data`` as indented JSON at ``path``, written whole or not at all."""
    import json

    from ..io.atomic import atomic_write_bytes

    return atomic_write_bytes(Path(path), (json.dumps(data, indent=1) + "\n").encode())


def write_top(table: pd.DataFrame, path: str | Path) -> Path:
    """``table`` as Parquet at ``path``, written whole or not at all."""
    import io

    from ..io.atomic import atomic_write_bytes

    buffer = io.BytesIO()
    table.to_parquet(buffer, index=False)
    return atomic_write_bytes(Path(path), buffer.getvalue())


@torch.no_grad()
def latent_sheet(table: pd.DataFrame, latent: int, sae: SAE, lens, files: list) -> "Image.Image":
    """The contact sheet (:func:`vitviz.features.figures.contact_sheet`) of ``latent``'s rows of a top table: its
    images run again (only those) for the latent's maps over them.

    Raises:
        VitvizError: the latent has no rows (it never fired on these images) or is out of range."""
    from ..io.images import load_image
    from .figures import contact_sheet

    if not 0 <= latent < sae.latents:
        raise VitvizError(f"--sheets: latent {latent} is out of range (0 to {sae.latents - 1}).")
    rows = table[table.latent == latent]
    if rows.empty:
        raise VitvizError(f"--sheets: latent {latent} fires on none of these images' patches: no sheet to draw.")
    paths = {getattr(f, "name", str(f)): getattr(f, "path", f) for f in files}
    names = list(dict.fromkeys(rows.image))
    x = lens.preprocess([load_image(paths[n], n).image for n in names])
    kind, layer = point_of(sae)
    point = f"blocks.{layer - 1}.{kind}"
    maps = latent_maps(sae.to(lens.device), lens.trace(x, keep=[point], stop_after=point)[point], lens.layout)[:, latent]
    at = {n: i for i, n in enumerate(names)}
    return contact_sheet([x.images[at[n]] for n in rows.image], maps[[at[n] for n in rows.image]],
                         rows.patch.tolist(), rows.activation.tolist(), rows.image.tolist(), latent, lens.layout)
