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
not depend on t for these heads; a head that pools by attention (SigLIP's MAP) is linearised at t as it is (timm's
``fc_norm`` after pooling runs through the same rule as the final norm).

For a whole CLIP model the same direction is read against words: each description's readout direction is the gradient
of ⟨visual_projection(pooled), t⟩ (t its unit text embedding) and :func:`nearest_descriptions` ranks them by cosine.

The point must be in the residual stream's basis (resid_pre, attn_out, resid_mid, mlp_out, resid_post); a probe head
reads its own layer, so the SAE's layer must not be past it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..errors import GIVE_A_HEAD, VitvizError
from .sae import SAE

# Points whose vectors live in the residual stream's basis (the readout reads that basis)
RESIDUAL_POINTS = ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post")
DEFINITION = ("cosine of the latent's decoder row d with each class's readout direction r_c = d logit_c / d delta, "
              "delta (D,) added to every token of a token set equal to the SAE's decode(0), through the model's final "
              "norm (spread held constant: AttnLRP's rule), pooling and head; later blocks skipped (logit lens)")


class NoReadout(VitvizError):
    """Nearest classes asked of a model without a head, or of an SAE whose point the head does not read."""


def why_no_classes(lens, sae: SAE, give_head: str = GIVE_A_HEAD) -> str | None:
    """One sentence saying why ``sae``'s latents have no nearest classes on ``lens``'s model, or None.
    ``give_head``: how the reader gives a headless model classes, in the reader's words."""
    kind, layer = sae.info.get("point_kind"), sae.info.get("layer")
    if not lens.has_head:
        return (f"Nearest classes need a classifier head; {lens.label} has none: give a probe head "
                f"({give_head}).")
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


def readout_directions(lens, reference: torch.Tensor, chunk: int = 64, scores=None, count: int | None = None
                       ) -> torch.Tensor:
    """Every class's readout direction r_c (see the module docstring) at tokens all equal to ``reference``.

    Args:
        reference: t (D,), the token every position of the token set holds.
        chunk: classes computed per backward (each is one copy of the token set in the batch).
        scores: kept points -> (copies, C) the scores read (default: the logits); ``count`` their number C.

    Returns:
        (C, D) float64 on the CPU, row c = ∂ score_c / ∂δ.
    """
    from ..adapters import Hooks
    from ..explainers.rules import AttnLRP

    model, adapter, layout = lens.model, lens.adapter, lens.layout
    param = next(model.parameters())
    ref = reference.detach().to(device=param.device, dtype=param.dtype)
    scores = scores or (lambda kept: kept["logits"])
    count = lens.num_classes if count is None else count
    rows = []
    for start in range(0, count, chunk):
        classes = torch.arange(start, min(start + chunk, count), device=param.device)
        delta = torch.zeros(len(classes), ref.shape[-1], device=param.device, dtype=param.dtype, requires_grad=True)
        with torch.enable_grad():
            tokens = ref.expand(len(classes), layout.num_tokens, -1) + delta[:, None, :]
            hooks = Hooks(keep=("logits", "pooled"), rules=AttnLRP())
            adapter.readout(model, tokens, hooks)
            score = scores(hooks.kept).gather(1, classes[:, None]).sum()
            (grad,) = torch.autograd.grad(score, delta)  # copy i's shift only reaches copy i's scores
        rows.append(grad.detach().double().cpu())
    return torch.cat(rows)


def text_directions(lens, reference: torch.Tensor, texts: list[str]) -> torch.Tensor:
    """CLIP: each text's readout direction (T, D), ∂ ⟨visual_projection(pooled), t⟩ / ∂δ (t the text's unit
    embedding): the direction of the tokens that raises the image–text score of that text most."""
    embeds = lens.encode_text(texts).clone()  # a plain tensor: it enters the backward below
    param = next(lens.model.parameters())
    projection = lens.text_tower.visual_projection.detach().to(device=param.device, dtype=param.dtype)
    joint = embeds.to(device=param.device, dtype=param.dtype) @ projection  # (T, D): t · W, read at the pooled vector
    return readout_directions(lens, reference, scores=lambda kept: kept["pooled"] @ joint.T, count=len(texts))


def why_no_descriptions(lens, sae: SAE) -> str | None:
    """Why ``sae``'s latents have no nearest descriptions on ``lens``'s model (no text tower, a point off the residual
    stream), or None."""
    if not lens.has_text:
        return f"Nearest descriptions need a whole CLIP model (its text tower); {lens.label} has none."
    kind = sae.info.get("point_kind")
    if kind not in RESIDUAL_POINTS:
        return (f"Nearest descriptions read a latent's direction in the residual stream; this SAE reads {kind!r}.")
    if sae.d_model != _width(lens):
        return f"This SAE reads {sae.d_model}-wide tokens; {lens.label}'s tokens are {_width(lens)} wide."
    return None


@torch.no_grad()
def nearest_descriptions(lens, sae: SAE, latents=None, n: int = 5, texts: list[str] | None = None) -> pd.DataFrame:
    """CLIP: each latent's ``n`` nearest descriptions (vitviz's own pool, or ``texts``): the cosine of its decoder row
    with each text's readout direction (:func:`text_directions`), largest first.

    Returns:
        DataFrame (latent int32 0-based, rank int32 1-based, text str, cosine float64).
    """
    from ..residual.textspan import descriptions

    why = why_no_descriptions(lens, sae)
    if why:
        raise NoReadout(why)
    texts = list(texts) if texts is not None else list(descriptions())
    sae = sae.to("cpu")
    reference = sae.decode(torch.zeros(sae.latents, dtype=sae.W_dec.dtype))
    r = text_directions(lens, reference, texts)
    latents = list(range(sae.latents)) if latents is None else [int(j) for j in latents]
    d = sae.decoder.double()[torch.as_tensor(latents, dtype=torch.long)]
    cos = ((d / d.norm(dim=-1, keepdim=True).clamp_min(1e-300))
           @ (r / r.norm(dim=-1, keepdim=True).clamp_min(1e-300)).T).numpy()
    n = min(n, len(texts))
    order = np.argsort(-cos, axis=1, kind="stable")[:, :n]
    rows = [(j, k + 1, texts[c], float(cos[i, c])) for i, j in enumerate(latents) for k, c in enumerate(order[i])]
    table = pd.DataFrame(rows, columns=["latent", "rank", "text", "cosine"])
    return table.astype({"latent": np.int32, "rank": np.int32})


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
