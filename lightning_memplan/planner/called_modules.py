"""Which of a model's modules a piece of code calls: the module to plan when ``training_step``
calls ``self.model(**batch)`` rather than ``self(...)``.

:class:`CallWatch` routes the ``forward`` of every submodule of a root module through a watcher
(an instance attribute, removed by :meth:`CallWatch.close`) and notes the *outermost* calls in
order: a call made while another watched call runs is inside it and is not noted. The first
outermost call of a module with trainable parameters is offered to ``choose``, which may return a
function to run in place of that module's forward (the planned forward); from then on the chosen
module's subtree is no longer watched, so nothing of the watch is traced into its compiled graph.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch import nn

from lightning_memplan.text import listed

__all__ = ["CallWatch", "ModuleCall", "also_called", "module_label", "nothing_to_plan", "planned_path",
           "trainable_bytes"]

_MISSING = object()


def trainable_bytes(module: nn.Module) -> int:
    """Bytes of ``module``'s parameters that require grad (each parameter once)."""
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


def planned_path(path: str) -> str:
    """``path`` without the ``_orig_mod`` steps ``torch.compile`` inserts: the attribute path the
    user wrote (``model._orig_mod.layers`` -> ``model.layers``)."""
    return ".".join(part for part in path.split(".") if part != "_orig_mod")


@dataclasses.dataclass(frozen=True)
class ModuleCall:
    """One outermost call of a watched module."""

    #: The module's attribute path from the root, as the user wrote it (:func:`planned_path`).
    path: str
    #: Its class name.
    kind: str
    #: Bytes of its trainable parameters (0: it has none; it is never chosen).
    trainable_bytes: int


def module_label(call: ModuleCall) -> str:
    """``'model' (LlamaForCausalLM, 13.1 MB of trainable parameters)``, for messages."""
    size = f"{call.trainable_bytes / 1e6:.1f} MB of trainable parameters" if call.trainable_bytes else \
        "no trainable parameters"
    return f"{call.path!r} ({call.kind}, {size})"


class CallWatch:
    """Watch which of ``root``'s submodules (``root`` itself excluded) are called, outermost calls
    only, from :meth:`open` to :meth:`close`.

    ``choose(call, module)`` is asked once, at the first outermost call of a module with trainable
    parameters: it returns the function to run in place of that call's forward (it is called with
    the call's arguments, and the module's subtree is no longer watched), or ``None`` to let the
    module run as written and ask again at the next such call. Invariant: after :meth:`close` every
    module's ``forward`` attribute is as it was before :meth:`open`.
    """

    def __init__(self, root: nn.Module,
                 choose: Callable[[ModuleCall, nn.Module], Callable[..., Any] | None]) -> None:
        self._root = root
        self._choose = choose
        #: Outermost calls, in order, each module once.
        self.calls: list[ModuleCall] = []
        #: The call ``choose`` took, if any.
        self.chosen: ModuleCall | None = None
        self._saved: dict[int, tuple[nn.Module, Any]] = {}
        self._depth = 0

    def open(self) -> CallWatch:
        """Start watching (every submodule's forward is routed through the watch)."""
        self._watch(self._root)
        return self

    def _watch(self, top: nn.Module) -> None:
        """Watch ``top`` and the modules under it (the root itself never), those not watched yet."""
        prefix = next((path for path, m in self._root.named_modules(remove_duplicate=True) if m is top), "")
        for path, module in top.named_modules(prefix=prefix, remove_duplicate=True):
            if module is self._root or id(module) in self._saved:
                continue
            self._saved[id(module)] = (module, module.__dict__.get("forward", _MISSING))
            module.forward = self._watched(planned_path(path), module, module.forward)  # type: ignore[method-assign]

    def close(self) -> None:
        """Stop watching: every module's forward as it was (nothing if not open)."""
        for key in list(self._saved):
            self._unwatch(key)

    def _unwatch(self, key: int) -> None:
        module, saved = self._saved.pop(key)
        if saved is _MISSING:
            module.__dict__.pop("forward", None)
        else:
            module.forward = saved  # type: ignore[method-assign]

    def _watched(self, path: str, module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
        def watched(*args: Any, **kwargs: Any) -> Any:
            run = forward
            if self._depth == 0:
                call = self._note(path, module)
                if call is not None and call.trainable_bytes and self.chosen is None:
                    # nothing of the watch inside the planned module: unwatched before it is chosen,
                    # so that what ``choose`` puts on it stays
                    removed = [key for key in {id(sub) for sub in module.modules()} if key in self._saved]
                    for key in removed:
                        self._unwatch(key)
                    instead = self._choose(call, module)
                    if instead is None:
                        self._watch(module)
                    else:
                        self.chosen, run = call, instead
            self._depth += 1
            try:
                return run(*args, **kwargs)
            finally:
                self._depth -= 1

        return watched

    def _note(self, path: str, module: nn.Module) -> ModuleCall | None:
        """Note an outermost call of ``module`` (once per path); the call, or ``None`` if noted before."""
        if any(c.path == path for c in self.calls):
            return None
        call = ModuleCall(path=path, kind=type(module).__name__, trainable_bytes=trainable_bytes(module))
        self.calls.append(call)
        return call


def nothing_to_plan(submodule: str | None, calls: list[ModuleCall]) -> str:
    """The message for a first batch in which ``training_step`` called nothing to plan: not
    ``self.<submodule>(...)`` (given), or neither ``self(...)`` nor a module with trainable
    parameters (``calls``: the outermost module calls it made)."""
    tail = " so there is no forward to plan and compile; training goes on uncompiled."
    if submodule:
        return (f"training_step did not call `self.{submodule}(...)` (`submodule={submodule!r}`) in the first "
                f"batch,{tail}")
    if not calls:
        return (f"training_step called neither `self(...)` nor any module of the LightningModule in the first "
                f"batch,{tail}")
    called = listed([module_label(c) for c in calls], 4)
    return (f"training_step called neither `self(...)` nor a module with trainable parameters in the first batch "
            f"(it called {called}),{tail} Pass `submodule=` to name the module to plan.")


def also_called(chosen: ModuleCall, calls: list[ModuleCall]) -> tuple[str, bool] | None:
    """What to say of the modules with trainable parameters ``training_step`` called outside the
    planned one (``chosen``), and whether one of them is larger (then it is a warning); ``None``
    when there were none."""
    others = [c for c in calls if c.path != chosen.path and c.trainable_bytes]
    if not others:
        return None
    larger = max(others, key=lambda c: c.trainable_bytes)
    text = (f"training_step also called {', '.join(module_label(c) for c in others)} outside the planned module "
            f"{module_label(chosen)}: they run as written, and what they keep is measured with the eager code "
            "around the planned forward.")
    if larger.trainable_bytes <= chosen.trainable_bytes:
        return text, False
    return (text + f" {larger.path!r} holds more trainable parameters than the planned module: pass "
            f"`submodule={larger.path!r}` to plan it instead."), True
