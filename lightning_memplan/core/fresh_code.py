"""Functions with a fresh code object: dynamo caches compiled code per code object (with a
recompile limit per code object), so a fresh copy starts with an empty cache."""
from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

__all__ = ["fresh_function"]


def fresh_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with a new code object, so dynamo's per-code cache (and recompile limit) starts empty."""
    code = fn.__code__.replace()
    fresh = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    fresh.__kwdefaults__ = fn.__kwdefaults__
    return fresh
