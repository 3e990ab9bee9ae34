"""Features, not only maps: sparse autoencoders (SAEs) on a layer's tokens — trained on your own images, loaded from
the public formats, spliced into the forward, explained and browsed.

```python
import vitviz
from vitviz.features import SAE, LatentTarget
sae = SAE.fit(tokens, latents=1024, topk=16, seed=0)       # tokens (n, D): an array or an iterable of batches;
sae.info["training"]["stop_reason"]                        # trained until converged: "plateau", or "budget" (warned)
z = sae.encode(tokens)                                     # (n, K), at most k non-zero per row
sae.decoder                                                # (K, D) unit-norm directions
sae.save("runs/sae")                                       # sae.safetensors + sae.json; SAE.load("runs/sae")
```

- :mod:`.sae`: the TopK SAE (Gao et al. 2024), its files and metrics (normalised MSE, explained variance, L0, dead
  fraction); :mod:`.trainer`: its training (auxiliary-k loss for dead latents, until a plateau, resumable).
- :mod:`.train`, :mod:`.data`: ``python -m vitviz features train`` (a layer's tokens streamed through ``lens.trace``;
  the command itself is :mod:`vitviz.cli.features`); :mod:`.shards`: those tokens kept on disk as float16 shards;
  :mod:`.session`: the Features page's small run; :mod:`.top`: top patches per latent (``features top``), one
  image's top latents; :mod:`.classes`: the classes a latent's direction points at.
- :mod:`.public`: saev's and ViT-Prisma's files (``load_sae``), read without running code from them.
- :mod:`.splice`: the SAE spliced in at its point (``Splice``, output unchanged bit for bit with the error term),
  ``feature_attribution`` (latent activation x gradient of a target) and ``LatentTarget`` (which pixels made a
  latent fire, through any map method: ``vitviz.explain(lens, x, "attnlrp", target=LatentTarget(sae, 12))``).
- :mod:`.deletion`: concept deletion (zero the top latents by score, one more at a time, against random latents,
  with bootstrap intervals over images); :mod:`.browse`, :mod:`.figures`: what the Features page shows.
"""
from __future__ import annotations

from .. import lazy_attributes

# public name -> the module of this package that defines it (loaded on first use: the CLI parses without torch)
_PUBLIC = {"SAE": "sae", "Trainer": "trainer", "evaluate": "sae", "SAEError": "trainer", "Convergence": "trainer",
           "NotConvergedWarning": "trainer", "load_sae": "public",
           "load_saev": "public", "load_prisma": "public", "Splice": "splice", "LatentTarget": "splice",
           "feature_attribution": "splice", "concept_deletion": "deletion"}

__all__ = sorted(_PUBLIC)
__getattr__ = lazy_attributes(__name__, _PUBLIC)
