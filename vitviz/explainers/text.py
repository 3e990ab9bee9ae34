"""CLIP's image–text score as a target: ``vitviz.TextTarget("a photo of a dog")``.

s(x) = logit_scale.exp() · ⟨e(x), t⟩ / ‖e(x₀)‖,   e(x) = visual_projection(pooled(x)),  t = the text's unit embedding

At the image itself (x = x₀) this is transformers' ``logits_per_image`` for that text. The image embedding's norm is
frozen at the image's own value when the target is bound (as :class:`~vitviz.explainers.targets.Projection` fixes
its reference), so the score is linear in the pooled vector: the direct readout splits it exactly, and relevance
methods conserve it (a cosine is scale-invariant in e, so Gradient × Input of the cosine itself sums to zero at the
pooled vector). ``live=True`` divides by the perturbed image's own norm instead: the model's score on every
perturbed copy (occlusion, Integrated Gradients' path); the readout always freezes it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..sources.text import TextNotAvailable
from .targets import Target


@dataclass(frozen=True)
class TextTarget(Target):
    """The image–text score of CLIP for a text, or for the best of several texts.

    Args:
        texts: one text, or several: each image is then scored against the text it matches best (zero-shot
            top-1 among them, as :class:`~vitviz.explainers.targets.ClassLogit` picks the top-1 class).
        live: divide by each (perturbed) image's own embedding norm rather than the unperturbed image's.

    The other fields are filled by :meth:`for_lens` (the text embeddings (T, P), ``visual_projection`` (P, D), the
    scale) and :meth:`bind` (the text chosen per image, ‖e(x₀)‖ (B,)); ``vitviz.explain`` and ``vitviz.readout`` call
    both.
    """

    texts: tuple[str, ...] | str = ()
    live: bool = False
    embeds: torch.Tensor | None = field(default=None, compare=False, repr=False)
    projection: torch.Tensor | None = field(default=None, compare=False, repr=False)
    scale: float | None = field(default=None, compare=False)
    chosen: tuple[int, ...] | None = field(default=None, compare=False)
    norms: torch.Tensor | None = field(default=None, compare=False, repr=False)
    point = "pooled"

    def __post_init__(self):
        texts = (self.texts,) if isinstance(self.texts, str) else tuple(str(t) for t in self.texts)
        if not texts:
            raise TextNotAvailable("TextTarget needs at least one text, e.g. vitviz.TextTarget(\"a photo of a dog\").")
        object.__setattr__(self, "texts", texts)

    def for_lens(self, lens, linear: bool = False) -> "TextTarget":
        """This target with ``lens``'s text embeddings, projection and scale (``linear``: the norm frozen whatever
        ``live`` says, as the direct readout needs).

        Raises:
            TextNotAvailable: ``lens`` has no text tower or no tokenizer.
        """
        if self.embeds is not None:
            return replace(self, live=self.live and not linear)
        tower = lens.text_tower
        return replace(self, live=self.live and not linear, embeds=tower.encode(self.texts),
                       projection=tower.visual_projection.detach(), scale=tower.scale)

    def bind(self, points: dict[str, torch.Tensor]) -> "TextTarget":
        if self.embeds is None:
            raise ValueError("a TextTarget is read with a model's text tower: pass it to vitviz.explain or "
                             "vitviz.readout (or call target.for_lens(lens) first).")
        if self.chosen is not None:
            return self
        with torch.no_grad():
            e = self._embed(points["pooled"].detach())
            norms = e.norm(dim=-1)
            scores = (e / norms[:, None]) @ self.embeds.to(e).T  # (B, T)
        return replace(self, chosen=tuple(int(i) for i in scores.argmax(-1)), norms=norms)

    def _embed(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled @ self.projection.to(device=pooled.device, dtype=pooled.dtype).T

    def __call__(self, points: dict[str, torch.Tensor]) -> torch.Tensor:  # -> (B,)
        pooled = points["pooled"]
        e = self._embed(pooled)
        t = self.embeds.to(e)[torch.tensor(self.chosen, device=e.device)]
        norm = e.norm(dim=-1) if self.live else self.norms.to(e)
        return self.scale * (e * t).sum(-1) / norm

    def repeat(self, index: int, n: int) -> "TextTarget":
        """The bound target of image ``index`` applied to ``n`` copies of it (perturbations, interpolation steps)."""
        return replace(self, chosen=(self.chosen[index],) * n, norms=self.norms[index:index + 1].expand(n))

    def describe(self) -> dict:
        out = {"kind": "text", "texts": list(self.texts),
               "norm": "each image's own" if self.live else "frozen at the unperturbed image's",
               "definition": "s(x) = logit_scale.exp() * <W p(x), t> / ||W p(x0)||, W = visual_projection, "
                             "p = the pooled vector, t = the text's unit embedding, x0 = the unperturbed image"}
        if len(self.texts) > 1:
            out["rule"] = "each image's best-matching text"
        if self.scale is not None:
            out["scale"] = self.scale
        if self.chosen is not None:
            out["chosen"] = [self.texts[i] for i in self.chosen]
        return out

    def text(self) -> str:
        if self.chosen is not None and len(set(self.chosen)) == 1:
            return f"image-text score of \"{self.texts[self.chosen[0]]}\""
        if len(self.texts) == 1:
            return f"image-text score of \"{self.texts[0]}\""
        return f"image-text score of each image's best of {len(self.texts)} texts"

