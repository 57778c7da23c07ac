"""Routing the planned module's ``forward`` through the callback for one fit, and putting it back."""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lightning_memplan.core.instance_patch import instance_attributes
from lightning_memplan.planner.kv_cache import cache_off_patches
from lightning_memplan.planner.messages import MemPlanWarning
from lightning_memplan.planner.precompiled import compiled_by_user

__all__ = ["ForwardPatch"]

_MISSING = object()


class ForwardPatch:
    """The planned module's ``forward``, replaced by an instance attribute (so every strategy's
    wrapper calls it) while attached. Invariant: after :meth:`detach` the module's ``forward`` and
    any ``torch.compile`` the user applied are exactly as they were before :meth:`attach`; so are the
    transformers configs whose key/value cache it turned off (:mod:`lightning_memplan.planner.kv_cache`)."""

    def __init__(self) -> None:
        #: The module whose forward is routed (the user's module inside their own compile, if any).
        self.module: nn.Module | None = None
        #: The module found at ``submodule`` when attached (the compiled wrapper, if the user compiled it).
        self.attached_to: nn.Module | None = None
        #: The module's forward as it was: what the plan compiles and what runs on a fallback.
        self.original: Callable[..., Any] | None = None
        self._saved: Any = _MISSING
        self._uncompiled = contextlib.ExitStack()  # the user's own torch.compile undone
        self._cache_said = False  # the key/value cache's line, once per fit

    def attach(self, lit: nn.Module, resolved: nn.Module, dispatch: Callable[..., Any], *, backend: str) -> None:
        """Route ``resolved``'s forward (the module at ``submodule`` of ``lit``) through
        ``dispatch``, with the user's own torch.compile undone for the fit (warns when there was one;
        ``backend`` names the one the plan compiles with)."""
        user = compiled_by_user(lit, resolved)
        if user.patches:
            self._uncompiled.enter_context(instance_attributes(user.patches))
            warnings.warn(
                f"MemPlanCallback: {user.what} was compiled with torch.compile before fit. For this fit the "
                f"callback compiles the planned forward itself, with the plan (backend {backend!r}; "
                "torch.compile options go to `compile_kwargs`), and the rest runs as written; your compiled "
                "module is put back after fit.", MemPlanWarning, stacklevel=4)
        target = user.module
        cache = cache_off_patches(target) if target.training else []
        if cache:
            self._uncompiled.enter_context(instance_attributes(cache))
        if cache and not self._cache_said:
            self._cache_said = True
            rank_zero_info("MemPlan: transformers' key/value cache is off for this fit (use_cache=False, put back "
                           "after fit): a training step never reads it, and it would hold every layer's keys and "
                           "values until the loss is computed.")
        self.attached_to = resolved
        self.module = target
        self._saved = target.__dict__.get("forward", _MISSING)
        self.original = target.forward
        target.forward = dispatch  # type: ignore[method-assign]

    def detach(self) -> None:
        """Undo :meth:`attach` (nothing if not attached)."""
        module = self.module
        if module is not None:
            if self._saved is _MISSING:
                module.__dict__.pop("forward", None)
            else:
                module.forward = self._saved  # type: ignore[method-assign]
        self._uncompiled.close()
        self.module = self.attached_to = None
