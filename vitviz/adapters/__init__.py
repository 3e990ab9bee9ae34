"""Model families: one adapter module each, registered in :mod:`vitviz.adapters.registry`.

Each adapter claims built models, gives their token layout, position table and patch filters, and
runs the model's forward itself, block by block, with the named activation points of
:mod:`vitviz.adapters.base` (``keep=`` to read any of them, ``edit=`` to change them). See
``README.md`` in this folder for how to add a family.
"""
from __future__ import annotations

from .base import (BLOCK_POINTS, MODEL_POINTS, VIEWS, Adapter, Hooks, Observer, Point, Rules, compose_edits, editing,
                   point_name)
from .registry import (ADAPTERS, FAMILY_MODULES, adapter_for, find_adapter, hf_model_types, load_all,
                       register_adapter, supported_families, why_unsupported)

def run(model, x, keep=(), edit=None, stop_after=None, rules: Rules | None = None, fast: bool = False,
        observe=None) -> dict:
    """Run ``model``'s spelled-out forward on ``x`` (B, 3, H, W) in its family's adapter: the kept points.

    Args:
        keep: point names or fnmatch patterns (``"blocks.*.attn"``) to return, or a predicate.
        edit: point name or pattern -> ``fn(value, point) -> value``; never mutates the model.
        stop_after: end the forward after this point.
        rules: how norms, activations and attention products are computed (default: the model's own).
        fast: where nothing inside the blocks is read or changed, allow the library's fused forward (the same
            function to rounding, not bit for bit): for scoring many inputs.
        observe: (point name or pattern, :class:`Observer`) pairs, shown each value after its edit.
    """
    from .base import PLAIN, run as run_adapter

    return run_adapter(adapter_for(model), model, x, keep, edit, stop_after, rules or PLAIN, fast, observe)


__all__ = ["ADAPTERS", "Adapter", "BLOCK_POINTS", "FAMILY_MODULES", "Hooks", "MODEL_POINTS", "Observer", "Point", "Rules", "VIEWS", "adapter_for", "compose_edits", "editing",
           "find_adapter", "hf_model_types", "load_all", "point_name", "register_adapter", "run", "supported_families",
           "why_unsupported"]
