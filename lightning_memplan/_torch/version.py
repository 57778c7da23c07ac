"""torch's version, and the one way the other ``_torch`` modules reach a torch symbol.

:func:`require` imports ``module.name`` when it is called (never at import) and, when this torch
lacks it, raises a :class:`RuntimeError` that names the symbol, the torch version found and the
fix. :func:`check_torch_version` raises one when torch is older than :data:`MIN_TORCH`.
"""
from __future__ import annotations

import importlib
from typing import Any

import torch

__all__ = [
    "MIN_TORCH",
    "check_torch_version",
    "require",
]


#: The oldest torch with ``CustomKnapsackSolver`` (the hook our solver adapter subclasses).
MIN_TORCH: tuple[int, int] = (2, 11)


def torch_version() -> tuple[int, int]:
    """``(major, minor)`` of the installed torch, e.g. ``(2, 13)``."""
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def require(module: str, name: str) -> Any:
    """Return ``module.name`` or raise a RuntimeError that says what is missing and how to fix it."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise RuntimeError(
            f"lightning_memplan needs `{module}.{name}`, which this torch ({torch.__version__!r}) "
            f"does not provide. Supported: torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}; "
            f"upgrade with `pip install 'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}'`."
        ) from err


def check_torch_version() -> None:
    """Raise a RuntimeError when torch is older than :data:`MIN_TORCH`."""
    if torch_version() < MIN_TORCH:
        raise RuntimeError(
            f"lightning_memplan needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} "
            f"(for CustomKnapsackSolver); found torch {torch.__version__!r}. "
            f"Upgrade with `pip install 'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}'`."
        )
