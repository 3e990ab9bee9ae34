"""What each head does.

- :mod:`vitviz.heads.qk` — one head's queries and keys in one picture (AttentionViz, Yeh et al. 2023): the
  queries and keys of a layer's head over an image set, AttentionViz's two corrections (translate the keys,
  then scale keys and queries, both exact on the softmax), how well distance in the joint space keeps the dot
  product, and 2-D projections (PCA, t-SNE, UMAP) coloured by kind, patch position or image.
- :mod:`vitviz.heads.corrections` — those two corrections and the scores split into the scaled dot product and a
  bias, as arrays (re-exported by :mod:`vitviz.heads.qk`).
- :mod:`vitviz.heads.patching` — heads switched off (ablation: zero or the image-set mean) or swapped between
  two images (activation patching) through the Trace's ``edit=`` points, and how far the output moves.

Everything here reads activations through :meth:`vitviz.Lens.trace` and takes a :class:`vitviz.layout.TokenLayout`,
never a family name. Arrays are 0-based (layers, heads, tokens); the CLI and the screen count layers and heads
from 1.
"""
