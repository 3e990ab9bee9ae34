"""What a layer knows: linear probes that give any backbone a classifier head.

```python
import vitviz
from vitviz import probes
lens = vitviz.open("bundled")
images = probes.from_folders(["photos/"])                  # photos/<class>/*.jpg, or probes.from_label_file("labels.csv")
result = probes.fit(lens, images, pooling="cls")           # every layer scored by nested cross-validation
result.table                                               # [{"layer": 1, "accuracy": ..., "low": ..., "high": ...}, ...]
result.save("probe/")                                      # probe/probe.safetensors (weight (K, D), bias (K,)), probe.json
headed = vitviz.open("bundled", head="probe/probe.safetensors")   # the model with the probe's classes

painted = probes.PaintedImages.of(["chelsea.jpg", "coffee.jpg"], concept=[eyes, None])   # (gh, gw) bool; None: map only
concept = probes.fit_concept(lens, painted)               # a patch probe per layer: .table, .probability (n, L, gh, gw)
vitviz.explain(lens, x, "attnlrp", target=vitviz.ConceptTarget(concept, layer=9))   # which pixels made it fire
```

- :mod:`.data`: labelled images from class folders or a CSV/Parquet label file, checked once.
- :mod:`.features`: per-layer pooled features from one forward per image (``lens.trace`` + the adapter's readout).
- :mod:`.linear`: scikit-learn logistic regression, nested cross-validation, the head exported as one linear layer.
- :mod:`.probe`: :func:`fit` and :class:`ProbeResult` (the table, the head, the files).
- :mod:`.concepts`: concepts painted on patches: a probe per layer on the patch tokens, its maps, :class:`ConceptTarget`;
  :mod:`.painted`: the paintings, their labels and the fitted :class:`ConceptProbe` with its files.
- :mod:`.masks`: mask PNGs (``probe --patch-masks DIR``) on the model's patch grid.
- :mod:`.head`: a probe file attached to a loaded model (:func:`attach_head`), checked against the backbone.
- :mod:`.collect`: ``probe``'s features of every image through the engine, each finished batch kept as a Parquet
  part (a killed run continues); :mod:`.figures`: what the Probes and Concepts pages show.
- ``python -m vitviz probe`` is :mod:`vitviz.cli.probe`.
"""
from __future__ import annotations

from .. import lazy_attributes

# public name -> the module that defines it (loaded on first use: the CLI's parser imports this package)
_PUBLIC = {"LabelError": "data", "LabelledImages": "data", "from_folders": "data", "from_label_file": "data",
           "POOLINGS": "features", "layer_features": "features", "LayerScore": "linear", "ProbeResult": "probe",
           "fit": "probe", "attach_head": "head", "read_probe": "head", "PaintedImages": "concepts",
           "ConceptProbe": "concepts", "ConceptTarget": "concepts", "ConceptError": "concepts",
           "fit_concept": "concepts", "read_concept": "concepts", "painted_from_masks": "masks"}

__all__ = sorted(_PUBLIC)
__getattr__ = lazy_attributes(__name__, _PUBLIC)
