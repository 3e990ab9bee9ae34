"""What each part of the model says: the residual stream read out in the answer's own terms.

- :func:`readout` (:mod:`.direct`): a target (a class logit, a probe's class, a projection) split into the direct
  contributions of the embedding, every attention head (and, per head, every source patch), every attention bias and
  MLP, and the readout's constant; the parts add up to the model's own value.
- :func:`logit_lens` (:mod:`.logit_lens`): the model's own head applied after every block (per image, and per patch
  on request); :class:`TunedLens`: one affine map per block fitted to the last block's output first.
"""
from .direct import (COMPONENTS, DirectVectors, Readout, direct_vectors, first_names, head_effects, head_names,
                     names_table, readout, readout_points, target_for, why_not)
from .frozen import FrozenNorms, ReadoutNotApplicable
from .logit_lens import LogitLens, TunedLens, logit_lens
from .logit_lens import why_not as logit_lens_why_not

__all__ = ["COMPONENTS", "DirectVectors", "FrozenNorms", "LogitLens", "Readout", "ReadoutNotApplicable", "TunedLens",
           "direct_vectors", "first_names", "head_effects", "head_names", "logit_lens", "logit_lens_why_not",
           "names_table", "readout", "readout_points", "target_for", "why_not"]
