"""What the eager code between compiled region calls makes and something still holds.

A frame that loops over blocks compiled on their own runs eagerly between their calls (two
embeddings summed and dropped out before the first block). :class:`EagerGlue` counts, at each call
the recorded step makes, the bytes of that code's tensors: by position in the step's calls, each
storage once in the step, the step's inputs, parameters, buffers and the regions' outputs left out.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch
import torch.nn as nn

from lightning_memplan._torch.storages import storage_key, storage_weakref
from lightning_memplan.forecasting.autograd_walk import saved_tensors_of

__all__ = ["EagerGlue"]


class EagerGlue:
    """The eager code's tensors at each recorded region call (positions index the step's calls)."""

    def __init__(self) -> None:
        #: ``{position: bytes}`` the eager code before that call made and something holds at the
        #: call: its tensor arguments computed by eager autograd ops and the tensors those ops saved
        #: (dropout's mask), and, once :meth:`settle` has run, its arguments that need no gradient
        #: and died with the step.
        self.made: dict[int, int] = {}
        #: Of :attr:`made`, the bytes those eager ops saved for their backward (an argument they
        #: saved included): live until their backward runs, after the call's backward, whatever
        #: the call's own backward keeps.
        self.saved: dict[int, int] = {}
        self._seen: set[int] = set()  # storage keys counted (or left open) already
        self._nodes: set[int] = set()  # ids of the eager autograd nodes walked
        self._open: list[tuple[int, Any, int]] = []  # (position, storage weakref, bytes) for settle

    def clear(self) -> None:
        """Forget everything noted, before a step is recorded anew."""
        self.made.clear()
        self.saved.clear()
        self._seen.clear()
        self._nodes.clear()
        self._open.clear()

    def note(self, position: int, args: Sequence[Any], skip: Collection[int]) -> None:
        """Count the call at ``position`` with ``args``: arguments with a ``grad_fn`` that is no
        compiled region's, and what the eager autograd nodes below them saved, down to the compiled
        regions' nodes; an argument that needs no gradient and no autograd op made is left open
        for :meth:`settle`. Parameters and storages in ``skip`` are not counted."""
        made: dict[int, int] = {}  # storage key -> bytes, the arguments computed eagerly
        saved: dict[int, int] = {}  # storage key -> bytes, what the eager nodes saved

        def add(t: torch.Tensor, into: dict[int, int]) -> None:
            key = storage_key(t)
            if not isinstance(t, nn.Parameter) and key not in skip and key not in self._seen:
                into[key] = int(t.untyped_storage().nbytes())

        stack = []
        for a in args:
            if not isinstance(a, torch.Tensor):
                continue
            if a.grad_fn is not None and "CompiledFunction" not in a.grad_fn.name():
                add(a, made)
                stack.append(a.grad_fn)
            elif a.grad_fn is None and not a.requires_grad:
                # needs no gradient (made from frozen parameters, or by no autograd op): the eager
                # code's if it dies with the step, a tensor the model keeps if not (settle)
                loose: dict[int, int] = {}
                add(a, loose)
                if loose:
                    self._open.append((position, storage_weakref(a), sum(loose.values())))
                    self._seen.update(loose)
        while stack:
            node = stack.pop()
            if node is None or id(node) in self._nodes or "CompiledFunction" in node.name():
                continue
            self._nodes.add(id(node))
            for t in saved_tensors_of(node):
                add(t, saved)
            stack.extend(n for n, _ in node.next_functions)
        self._seen.update(made, saved)
        kept = sum(saved.values())
        total = kept + sum(n for key, n in made.items() if key not in saved)
        if total:
            self.made[position] = self.made.get(position, 0) + total
        if kept:
            self.saved[position] = self.saved.get(position, 0) + kept

    def settle(self) -> None:
        """Once the recorded step has run: count in :attr:`made` the arguments left open whose
        storage is gone (the eager code made them: a frozen embedding's output dropped out); a
        tensor the model keeps between steps (a cache in a plain attribute) is still live and is
        not counted."""
        for position, ref, n in self._open:
            if ref.expired():
                self.made[position] = self.made.get(position, 0) + n
        self._open.clear()
