"""Attributes set on object instances for the duration of a block, then put back.

The callback, the forecast and the tuner change a module's behaviour only through instance
attributes (a submodule's ``forward`` wrapped in activation checkpointing or compiled on its own,
``self.log`` silenced while ``plan_memory`` runs ``training_step``); the user's classes are never
changed. An attribute the instance did not have is removed again; one it had is restored.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["instance_attributes"]

_MISSING = object()


@contextlib.contextmanager
def instance_attributes(patches: Sequence[tuple[Any, str, Any]]) -> Iterator[None]:
    """Within the block, ``setattr(obj, name, value)`` for each ``(obj, name, value)``, in order;
    on exit (an exception too) each is undone in reverse order: deleted from the instance when its
    ``__dict__`` did not hold ``name`` before, else set back to what it held."""
    saved: list[tuple[Any, str, Any]] = []
    try:
        for obj, name, value in patches:
            saved.append((obj, name, obj.__dict__.get(name, _MISSING)))
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, old in reversed(saved):
            if old is _MISSING:
                obj.__dict__.pop(name, None)
            else:
                setattr(obj, name, old)
