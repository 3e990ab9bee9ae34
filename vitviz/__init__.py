"""vitviz: see what a Vision Transformer does with an image — from a notebook as from the app and the CLI.

```python
import vitviz
lens = vitviz.open("bundled")                          # any --model spelling
x = lens.preprocess(["assets/chelsea.jpg"])            # x.tensor (B, 3, H, W), x.images
trace = lens.trace(x, keep=("attn", "resid_post"))     # trace["attn", 11] (B, H, N, N); trace.stack("attn")
m = vitviz.explain(lens, x, "attnlrp")                 # m.patches (B, gh, gw); vitviz.methods() lists them all
sae = vitviz.SAE.fit(tokens, latents=1024, topk=16)    # sparse features (vitviz.features); vitviz.LatentTarget(sae, j)
                                                       # painted concepts: vitviz.ConceptTarget(concept, layer) (vitviz.probes)
r = vitviz.readout(lens, x, target=vitviz.ClassLogit(3))  # r.table(): each head's, MLP's, ... share of the logit
ll = vitviz.logit_lens(lens, x)                        # ll.logits (B, L, C): the head read after every block
# CLIP (a whole CLIPModel folder): lens.encode_text([...]) (T, P); vitviz.TextTarget("a photo of a dog") for explain
# and readout; vitviz.textspan(lens, images) names each late head's directions in words
s = vitviz.similarity(lens, lens, paths)               # layer x layer CKA: s.cka, s.low, s.high (L_a, L_b); s.table()
```

The public names are loaded on first use (``import vitviz`` itself imports no torch); nothing in this package
imports Streamlit.
"""
from __future__ import annotations

import importlib
import sys

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC = {
    "open": "lens", "Lens": "lens", "Trace": "trace", "load_trace": "trace", "PointNotKept": "trace",
    "save": "runs.analyze", "load": "runs.analyze",
    "ModelSpec": "sources.models", "TokenLayout": "layout",
    "VitvizError": "errors", "ModelError": "errors", "ImageError": "errors",
    "ClassLogit": "explainers.targets", "Projection": "explainers.targets", "Target": "explainers.targets",
    "methods": "explainers", "explain": "explainers", "register_method": "explainers", "MapMethod": "explainers",
    "Map": "explainers",
    "faithfulness": "runs.faithfulness_run", "FaithfulnessTables": "runs.faithfulness_run",
    "SAE": "features.sae", "LatentTarget": "features.splice", "load_sae": "features.public",
    "ConceptTarget": "probes.concepts",
    "readout": "residual", "Readout": "residual", "logit_lens": "residual", "LogitLens": "residual",
    "TunedLens": "residual", "ReadoutNotApplicable": "residual", "head_effects": "residual",
    "TextTarget": "explainers.text", "textspan": "residual.textspan",
    "similarity": "runs.similarity_run", "Similarity": "runs.similarity_run", "CNNFeatures": "runs.layer_features",
    "LensFeatures": "runs.layer_features",
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def lazy_attributes(package: str, public: dict[str, str]):
    """A module ``__getattr__`` for ``package`` whose public names load on first use (PEP 562).

    Args:
        package: the package's ``__name__``.
        public: public name -> the submodule defining it, relative to ``package``.
    """
    def __getattr__(name: str):
        module = public.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value
    return __getattr__


__getattr__ = lazy_attributes(__name__, _PUBLIC)


def __dir__() -> list[str]:
    return __all__
