"""The classes a latent's decoder direction points at: a logit lens on the direction, for models with a head (their
own, or a probe head: ``vitviz.open(..., head="probe.safetensors")``).

The method, precisely. Let d (D,) be latent j's decoder row (the direction it adds to the tokens at its point; the
SAE's scale s only rescales it). The readout of the model (its final norm, pooling and head; ``Adapter.readout``) is
run on a token set whose tokens all equal t + δ, where t (D,) is the SAE's reconstruction with no latent active
(``decode(0)``: b_dec / s, about the data mean at the point) and δ (D,) is one shift added to every token, with the
final norm under AttnLRP's rule (its spread held constant: LayerNorm becomes (x − mean(x)) / σ_t · γ + β, a linear map
of x). The class's readout direction is the gradient

    r_c = ∂ logit_c / ∂δ  at δ = 0          (D,)   =  P (γ ⊙ w_c) / σ_t

for a LayerNorm, CLS or mean pooling and a linear head with class row w_c (P = I − 11ᵀ/D centres; RMSNorm has no
P), with w_c the sum of the CLS and the mean halves of the row for a ``cls+mean`` probe (a shift of every token
moves both). The latent's nearest classes are the classes with the largest cosine(r_c, d): the classes whose logits
its direction raises most per unit length, read directly by the head, **later blocks skipped** (the logit lens;
nostalgebraist 2020) — what the direction says, not what the model does with it downstream (that is
:func:`vitviz.features.splice.feature_attribution`). σ_t is one positive number, so the ranking and the cosines do
not depend on t for these heads; a head that pools by attention (SigLIP's MAP) or a norm outside the spelled-out
readout (timm's ``fc_norm``) is linearised at t as it is.

The point must be in the residual stream's basis (resid_pre, attn_out, resid_mid, mlp_out, resid_post); a probe head
reads its own layer, so the SAE's layer must not be past it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..errors import VitvizError
from .sae import SAE

# Points whose vectors live in the residual stream's basis (the readout reads that basis)
RESIDUAL_POINTS = ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post")
DEFINITION = ("cosine of the latent's decoder row d with each class's readout direction r_c = d logit_c / d delta, "
              "delta (D,) added to every token of a token set equal to the SAE's decode(0), through the model's final "
              "norm (spread held constant: AttnLRP's rule), pooling and head; later blocks skipped (logit lens)")


class NoReadout(VitvizError):
    """Nearest classes asked of a model without a head, or of an SAE whose point the head does not read."""


def why_no_classes(lens, sae: SAE) -> str | None:
    """One sentence saying why ``sae``'s latents have no nearest classes on ``lens``'s model, or None."""
    kind, layer = sae.info.get("point_kind"), sae.info.get("layer")
    if not lens.has_head:
        return (f"Nearest classes need a classifier head; {lens.label} has none: give a probe head "
                "(vitviz.open(..., head='probe.safetensors'), --head, or the sidebar's Head box).")
    if kind not in RESIDUAL_POINTS:
        return (f"Nearest classes read a latent's direction in the residual stream; this SAE reads {kind!r}, which is "
                f"not in its basis (choose an SAE on {', '.join(RESIDUAL_POINTS)}).")
    if layer is not None and int(layer) > lens.num_layers:
        return (f"This SAE reads layer {layer}, but the head reads layer {lens.num_layers}: the latent's direction "
                "comes after the head, which never sees it.")
    if sae.d_model != _width(lens):
        return f"This SAE reads {sae.d_model}-wide tokens; {lens.label}'s tokens are {_width(lens)} wide."
    return None


def _width(lens) -> int:
    return int(lens.trace(torch.zeros(1, 3, *lens.loaded.data_config["input_size"][-2:]), keep=["blocks.0.resid_pre"],
                          stop_after="blocks.0.resid_pre")["blocks.0.resid_pre"].shape[-1])


def readout_directions(lens, reference: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """Every class's readout direction r_c (see the module docstring) at tokens all equal to ``reference``.

    Args:
        reference: t (D,), the token every position of the token set holds.
        chunk: classes computed per backward (each is one copy of the token set in the batch).

    Returns:
        (C, D) float64 on the CPU, row c = ∂ logit_c / ∂δ.
    """
    from ..adapters import Hooks
    from ..explainers.attribution import AttnLRP

    model, adapter, layout = lens.model, lens.adapter, lens.layout
    param = next(model.parameters())
    ref = reference.detach().to(device=param.device, dtype=param.dtype)
    rows = []
    for start in range(0, lens.num_classes, chunk):
        classes = torch.arange(start, min(start + chunk, lens.num_classes), device=param.device)
        delta = torch.zeros(len(classes), ref.shape[-1], device=param.device, dtype=param.dtype, requires_grad=True)
        with torch.enable_grad():
            tokens = ref.expand(len(classes), layout.num_tokens, -1) + delta[:, None, :]
            hooks = Hooks(keep=("logits",), rules=AttnLRP())
            adapter.readout(model, tokens, hooks)
            score = hooks.kept["logits"].gather(1, classes[:, None]).sum()
            (grad,) = torch.autograd.grad(score, delta)  # copy i's shift only reaches copy i's logits
        rows.append(grad.detach().double().cpu())
    return torch.cat(rows)


@torch.no_grad()
def class_cosines(lens, sae: SAE, latents=None) -> np.ndarray:
    """(n, C) cosine of each latent's decoder row with each class's readout direction (float64; ``latents`` 0-based,
    default all K).

    Raises:
        NoReadout: the model has no head, or the SAE's point is not one the head reads (:func:`why_no_classes`)."""
    why = why_no_classes(lens, sae)
    if why:
        raise NoReadout(why)
    sae = sae.to("cpu")
    reference = sae.decode(torch.zeros(sae.latents, dtype=sae.W_dec.dtype))
    r = readout_directions(lens, reference)
    d = sae.decoder.double() if latents is None else sae.decoder.double()[torch.as_tensor(latents, dtype=torch.long)]
    d = d / d.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    r = r / r.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return (d @ r.T).numpy()


def nearest_classes(lens, sae: SAE, latents=None, n: int = 5) -> pd.DataFrame:
    """Each latent's ``n`` nearest classes by :func:`class_cosines`, largest cosine first.

    Returns:
        DataFrame (latent int32 0-based, rank int32 1-based, class int32 0-based, label str, cosine float64).
    """
    latents = list(range(sae.latents)) if latents is None else [int(j) for j in latents]
    cos = class_cosines(lens, sae, latents)
    n = min(n, cos.shape[1])
    order = np.argsort(-cos, axis=1, kind="stable")[:, :n]
    labels = lens.class_labels or tuple(str(c) for c in range(lens.num_classes))
    rows = [(j, r + 1, int(c), labels[c] if c < len(labels) else str(c), float(cos[i, c]))
            for i, j in enumerate(latents) for r, c in enumerate(order[i])]
    table = pd.DataFrame(rows, columns=["latent", "rank", "class", "label", "cosine"])
    return table.astype({"latent": np.int32, "rank": np.int32, "class": np.int32})


def classes_json(lens, sae: SAE, latents, n: int = 5) -> dict:
    """What ``features top`` writes to nearest_classes.json: the method, the model and head, and per latent (0-based,
    as a string key) its ``n`` nearest classes, nearest first."""
    table = nearest_classes(lens, sae, latents, n)
    return {"definition": DEFINITION, "model": lens.label, "head": lens.spec.head, "point": sae.info.get("point"),
            "layer": sae.info.get("layer"), "classes_are": "0-based indices into the head's classes",
            "latents": {str(j): [{"class": int(r["class"]), "label": r["label"], "cosine": round(float(r.cosine), 6)}
                                 for _, r in rows.iterrows()] for j, rows in table.groupby("latent", sort=True)}}
