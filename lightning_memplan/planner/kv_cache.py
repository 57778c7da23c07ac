"""Transformers' key/value cache, off for a training fit.

A transformers model built with its default ``use_cache=True`` appends every layer's keys and
values to a cache object in each forward, which its output holds: a training step never reads it,
yet it lives until the loss has been computed, checkpointed layers append to it again when they
are recomputed (the recomputed attention then mismatches), and dynamo guards on it. Transformers
itself turns the cache off when gradient checkpointing is on in training; the callback does the
same for the module it plans, for one fit, and says so.
"""
from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["cache_configs", "cache_off_patches"]


def cache_configs(module: nn.Module) -> list[Any]:
    """The distinct config objects of ``module``'s submodules (the ``config`` attribute of a
    transformers model) whose ``use_cache`` is ``True``, in ``modules()`` order."""
    found: dict[int, Any] = {}
    for m in module.modules():
        config = getattr(m, "config", None)
        if config is not None and getattr(config, "use_cache", None) is True:
            found.setdefault(id(config), config)
    return list(found.values())


def cache_off_patches(module: nn.Module) -> list[tuple[Any, str, bool]]:
    """``(config, "use_cache", False)`` for each of :func:`cache_configs`, the form
    :func:`lightning_memplan.core.instance_patch.instance_attributes` takes (it puts them back)."""
    return [(config, "use_cache", False) for config in cache_configs(module)]
