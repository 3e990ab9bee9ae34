"""timm's pretrained weights on this machine and off it: where a tag's file is cached (:func:`weights_on_disk`, the
loader's offline check), its download before any model is built, and the names a search offers
(:func:`search_models`). Nothing here builds a model; :mod:`vitviz.sources.models` loads them and re-exports these
names.
"""
from __future__ import annotations

import difflib
from pathlib import Path

import torch

from ..errors import ModelError, first_line


def _local_weights(pretrained_cfg: dict) -> Path | None:
    """The file holding a timm pretrained tag's weights if it is already on disk, else None.

    Looks where timm would download to: the Hugging Face cache (``hf_hub_id``, safetensors
    alternatives first, as timm prefers them) or torch hub's checkpoint folder (``url``).
    """
    from huggingface_hub import try_to_load_from_cache
    from timm.models._hub import HF_WEIGHTS_NAME, _get_safe_alternatives

    if pretrained_cfg.get("hf_hub_id"):
        repo_id, _, revision = pretrained_cfg["hf_hub_id"].partition("@")
        filename = pretrained_cfg.get("hf_hub_filename") or HF_WEIGHTS_NAME
        for candidate in [*_get_safe_alternatives(filename), filename]:
            found = try_to_load_from_cache(repo_id, candidate, revision=revision or None)
            if isinstance(found, str):
                return Path(found)
    if pretrained_cfg.get("url"):
        found = Path(torch.hub.get_dir()) / "checkpoints" / Path(pretrained_cfg["url"]).name
        if found.is_file():
            return found
    return None


def _download_weights(pretrained_cfg: dict, name: str) -> Path | None:
    """Fetch a pretrained tag's weights into the cache timm reads from, before any model is built.

    timm builds the full model first and downloads after; a failed download (or a name whose
    weights are huge) then costs the whole build. Returns the file, or None when timm loads this
    tag some other way (it then downloads itself).

    Raises:
        ModelError: the download failed.
    """
    from timm.models._hub import HF_WEIGHTS_NAME, _get_safe_alternatives

    try:
        if pretrained_cfg.get("hf_hub_id"):
            from huggingface_hub import hf_hub_download
            from huggingface_hub.utils import EntryNotFoundError

            repo_id, _, revision = pretrained_cfg["hf_hub_id"].partition("@")
            filename = pretrained_cfg.get("hf_hub_filename") or HF_WEIGHTS_NAME
            candidates = [*_get_safe_alternatives(filename), filename]
            for candidate in candidates:
                try:
                    return Path(hf_hub_download(repo_id, candidate, revision=revision or None))
                except EntryNotFoundError:
                    if candidate == candidates[-1]:
                        raise
        if pretrained_cfg.get("url"):
            from timm.models._hub import download_cached_file

            return Path(download_cached_file(pretrained_cfg["url"]))
    except Exception as exc:  # noqa: BLE001 - network and hub errors alike mean "no weights"
        raise ModelError(f"Model {name!r} could not be loaded: downloading its weights failed "
                         f"({first_line(exc)}). Use the bundled model, or give a local checkpoint file for "
                         "this architecture.") from exc
    return None


def weights_on_disk(names: list[str]) -> set[str]:
    """The timm names among ``names`` whose pretrained weights are already on this machine, so they load offline.

    Looks where the loader looks (:func:`_local_weights`: the Hugging Face cache, torch hub's checkpoint folder)
    from each name's pretrained config alone: no model is built, no network is asked (~1 ms a name).
    """
    from timm.models import get_pretrained_cfg

    found = set()
    for name in names:
        cfg = get_pretrained_cfg(name)
        if cfg is not None and _local_weights(cfg.to_dict()) is not None:
            found.add(name)
    return found


def search_models(query: str, limit: int = 200) -> list[str]:
    """timm model names with pretrained tags containing ``query`` (case-insensitive), at most ``limit``.

    The query is a search, never itself a model name: it is in the result only when timm has a
    model of exactly that name (an architecture without its tag, e.g. ``deit3_small_patch16_224``,
    comes first, then its tags).
    """
    import timm

    query = query.strip().lower()
    if not query:
        return []
    found = timm.list_models(f"*{query}*", pretrained=True)[:limit]
    return [query] + found if query not in found and timm.is_model(query) else found


def _unknown_model_error(name: str) -> ModelError:
    import timm

    close = difflib.get_close_matches(name, timm.list_models(pretrained=True), n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(close)}?" if close else " See timm.list_models('vit*', pretrained=True)."
    return ModelError(f"Unknown model {name!r}: timm has no model of that name.{hint}")
