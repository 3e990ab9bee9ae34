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
```

- :mod:`.data`: labelled images from class folders or a CSV/Parquet label file, checked once.
- :mod:`.features`: per-layer pooled features from one forward per image (``lens.trace`` + the adapter's readout).
- :mod:`.linear`: scikit-learn logistic regression, nested cross-validation, the head exported as one linear layer.
- :mod:`.probe`: :func:`fit` and :class:`ProbeResult` (the table, the head, the files).
- :mod:`.head`: a probe file attached to a loaded model (:func:`attach_head`), checked against the backbone.
- :mod:`.cli`: ``python -m vitviz probe``.
"""
from __future__ import annotations

from .. import lazy_attributes

# public name -> the module that defines it (loaded on first use: the CLI's parser imports this package)
_PUBLIC = {"LabelError": "data", "LabelledImages": "data", "from_folders": "data", "from_label_file": "data",
           "POOLINGS": "features", "layer_features": "features", "LayerScore": "linear", "ProbeResult": "probe",
           "fit": "probe", "attach_head": "head", "read_probe": "head"}

__all__ = sorted(_PUBLIC)
__getattr__ = lazy_attributes(__name__, _PUBLIC)
