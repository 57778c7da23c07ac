"""Modules the user compiled already, and the originals to run while a plan is compiled for them.

Two ways users compile a Lightning model themselves:

* ``trainer.fit(torch.compile(model))``: Lightning's ``from_compiled`` wraps the LightningModule's
  ``forward``, ``training_step``, ``validation_step``, ``test_step`` and ``predict_step`` in the
  user's ``torch.compile`` and keeps the originals in ``model._compiler_ctx``;
* ``self.model = torch.compile(net)``: the submodule is an ``OptimizedModule`` whose ``forward``
  is ``net.__call__`` compiled, so planning ``submodule="model"`` planned the wrapper, which has
  no ``forward`` of its own to compile.

The plan's compile must be the only one around the planned forward: under the user's compile,
dynamo traced the callback's own bookkeeping around the forward (it recompiled it for every call,
and the forecast failed), and ``training_step`` itself did not compile under torch 2.13 with
Lightning 2.6's ``self.log``. :func:`compiled_by_user` gives the attributes to set for as long as
the plan is in force (``instance_attributes``), so the user's model runs as written, compiled by
the plan; the user's compiled methods come back when they are restored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = ["UserCompile", "compiled_by_user"]

#: The methods Lightning's ``from_compiled`` wraps (``_compiler_ctx["original_<name>"]``).
LIGHTNING_COMPILED_METHODS: tuple[str, ...] = (
    "forward", "training_step", "validation_step", "test_step", "predict_step")


@dataclass(frozen=True)
class UserCompile:
    """What the user compiled of a module, and how to run it as written."""

    #: The module to plan: ``module`` itself, or the module an ``OptimizedModule`` wraps.
    module: nn.Module
    #: ``(object, attribute, value)``: the originals to set while the plan is in force.
    patches: tuple[tuple[Any, str, Any], ...]
    #: What was compiled, for a warning (``""``: nothing).
    what: str


def _lightning_compiled(module: nn.Module) -> tuple[tuple[Any, str, Any], ...]:
    ctx = getattr(module, "_compiler_ctx", None)
    if not isinstance(ctx, dict) or ctx.get("compiler") != "dynamo":
        return ()
    return tuple((module, name, ctx[f"original_{name}"]) for name in LIGHTNING_COMPILED_METHODS
                 if ctx.get(f"original_{name}") is not None)


def compiled_by_user(lightning_module: nn.Module, target: nn.Module) -> UserCompile:
    """The user's compiles of ``lightning_module`` (Lightning's ``from_compiled``) and of the
    planned ``target`` (an ``OptimizedModule``: ``torch.compile(net)``), undone by ``patches``: the
    LightningModule's original methods, and the wrapper's ``forward`` calling the module it wraps
    uncompiled (hooks included). ``module`` is the one to plan and compile."""
    from lightning_memplan._torch.version import require

    try:
        optimized_module: Any = require("torch._dynamo.eval_frame", "OptimizedModule")
    except RuntimeError:  # a torch without it: nothing can be its instance
        optimized_module = ()
    patches = list(_lightning_compiled(lightning_module))
    what = []
    if patches:
        what.append("the LightningModule (`trainer.fit(torch.compile(model))`)")
    module = target
    if isinstance(target, optimized_module):
        while isinstance(module, optimized_module):  # torch.compile(torch.compile(net)) too
            module = module._orig_mod
        patches.append((target, "forward", module.__call__))
        what.append(f"the planned submodule (class {type(module).__name__}, `torch.compile(...)`)")
    return UserCompile(module=module, patches=tuple(patches), what=" and ".join(what))
