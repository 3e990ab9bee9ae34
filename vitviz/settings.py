"""Operator settings read from the environment: memory budget, upload limit, shared-deployment mode.

Local use (the default) keeps every freedom; the memory guards are always on. ``VITVIZ_SHARED=1``
is for a server many people reach through a browser: no server-side checkpoint paths, model
names limited to an allow-list, per-session caps. README.md lists every setting in one table.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import VitvizError

BUNDLED = "bundled"
SUGGESTED_MODELS = (
    "vit_base_patch16_224.augreg2_in21k_ft_in1k", "deit_small_distilled_patch16_224.fb_in1k",
    "deit3_small_patch16_224.fb_in1k", "vit_small_patch16_224.dino", "vit_small_patch14_reg4_dinov2.lvd142m",
    "vit_base_patch16_clip_224.openai", "vit_base_patch16_siglip_224.webli",
)
# Share of the machine's memory the caches may hold when VITVIZ_CACHE_MB is not set.
DEFAULT_CACHE_SHARE = 0.25
DEFAULT_UPLOAD_MB = 50          # also .streamlit/config.toml's server.maxUploadSize (the browser's check)
SHARED_MAX_IMAGES = 8
SHARED_MAX_IMG_SIZE = 518
SHARED_MAX_RUNS = 2


class SettingError(VitvizError):
    """An environment variable the operator set to a value vitviz cannot use."""


def total_memory_bytes() -> int:
    """Physical memory, or the cgroup's limit when the process runs under a smaller one."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def _positive_int(env, name: str, default: int | None) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise SettingError(f"{name}={raw!r} is not a positive whole number.")
    return value


def _names(env, name: str) -> tuple[str, ...] | None:
    raw = env.get(name, "").strip()
    return tuple(n.strip() for n in raw.split(",") if n.strip()) if raw else None


@dataclass(frozen=True)
class Settings:
    """What the operator allows.

    Attributes:
        shared: ``VITVIZ_SHARED=1``: shared-deployment mode.
        cache_bytes: ``VITVIZ_CACHE_MB``: one byte budget for every cached model, image and analysis;
            one image's attention may take at most half of it.
        upload_bytes: ``VITVIZ_UPLOAD_MB``: largest uploaded file, checked by the server.
        models: ``VITVIZ_MODELS``: allowed model names; None allows any (local use).
        max_images: ``VITVIZ_MAX_IMAGES``: images per session; None: no cap.
        max_img_size: ``VITVIZ_MAX_IMG_SIZE``: largest input resolution in pixels; None: only the memory budget.
        devices: ``VITVIZ_DEVICES``: allowed devices (auto, cpu, cuda, mps); None: all present.
        dtypes: ``VITVIZ_DTYPES``: allowed precisions; None: all.
        max_runs: ``VITVIZ_MAX_RUNS``: model runs at once in the server process; None: no limit.
    """

    shared: bool = False
    cache_bytes: int = 4 << 30
    upload_bytes: int = DEFAULT_UPLOAD_MB << 20
    models: tuple[str, ...] | None = None
    max_images: int | None = None
    max_img_size: int | None = None
    devices: tuple[str, ...] | None = None
    dtypes: tuple[str, ...] | None = None
    max_runs: int | None = None

    @property
    def attention_limit_bytes(self) -> int:
        """Largest attention tensor of one image: half the cache budget, so the analysis of one
        image (at most twice its attention while it runs) stays within the budget."""
        return self.cache_bytes // 2

    def allows_model(self, name: str) -> bool:
        return self.models is None or name in self.models

    @classmethod
    def from_env(cls, env=None, memory_share: float = DEFAULT_CACHE_SHARE) -> Settings:
        """The settings in ``env`` (default ``os.environ``).

        ``memory_share``: the machine's share that ``cache_bytes`` defaults to without
        ``VITVIZ_CACHE_MB`` (the app shares it with its caches; ``analyze`` holds one batch, so all).
        """
        env = os.environ if env is None else env
        shared = env.get("VITVIZ_SHARED", "").strip().lower() in ("1", "true", "yes", "on")
        cache_mb = _positive_int(env, "VITVIZ_CACHE_MB", None)
        cache_bytes = cache_mb << 20 if cache_mb else int(total_memory_bytes() * memory_share)
        models = _names(env, "VITVIZ_MODELS")
        if models is None and shared:
            models = (BUNDLED, *SUGGESTED_MODELS)
        return cls(
            shared=shared,
            cache_bytes=cache_bytes,
            upload_bytes=_positive_int(env, "VITVIZ_UPLOAD_MB", DEFAULT_UPLOAD_MB) << 20,
            models=models,
            max_images=_positive_int(env, "VITVIZ_MAX_IMAGES", SHARED_MAX_IMAGES if shared else None),
            max_img_size=_positive_int(env, "VITVIZ_MAX_IMG_SIZE", SHARED_MAX_IMG_SIZE if shared else None),
            devices=_names(env, "VITVIZ_DEVICES"),
            dtypes=_names(env, "VITVIZ_DTYPES"),
            max_runs=_positive_int(env, "VITVIZ_MAX_RUNS", SHARED_MAX_RUNS if shared else None),
        )


def megabytes(n_bytes: float) -> str:
    """``1.5 GiB`` / ``750 MiB``: a size for a sentence."""
    mb = n_bytes / (1 << 20)
    return f"{mb / 1024:.1f} GiB" if mb >= 1024 else f"{mb:.0f} MiB"
