"""The planner's warnings: what of the forward a plan does not reach, and steps it covers in part.

Each function returns the message text without a prefix (the caller issues it as
:class:`MemPlanWarning`, prefixed with its own name: ``f"{call}: {message}"``), or nothing when there
is nothing to say.
"""
from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from torch import nn

from lightning_memplan._torch.dynamo import dynamo_allows_rnn
from lightning_memplan.text import listed

if TYPE_CHECKING:
    from lightning_memplan.forecasting.result import Forecast

__all__ = ["MemPlanWarning", "eager_forward_warning", "error_summary", "several_backwards_warning", "uncompiled_warnings"]


class MemPlanWarning(UserWarning):
    """Planning fell back or changed course; training goes on."""


def error_summary(exc: BaseException, limit: int = 400) -> str:
    """``"Type: first line"`` of ``exc`` and, when its chain goes deeper (followed through
    ``inner_exception``, as torch's ``BackendCompilerFailed`` holds it, then ``__cause__`` and an
    unsuppressed ``__context__``), of the error at its root: ``"RuntimeError: no plan left (from
    CheckpointError: ...)"``; at most ``limit`` characters."""
    root, seen = exc, {id(exc)}
    while True:
        nxt = (getattr(root, "inner_exception", None) or root.__cause__
               or (None if root.__suppress_context__ else root.__context__))
        if not isinstance(nxt, BaseException) or id(nxt) in seen:
            break
        root = nxt
        seen.add(id(root))
    def line(e: BaseException) -> str:
        lines = [text.strip() for text in str(e).splitlines() if text.strip()]
        return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__

    text = line(exc) if root is exc else f"{line(exc)} (from {line(root)})"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def uncompiled_warnings(module: nn.Module, fc: Forecast | None) -> list[str]:
    """What of ``module``'s forward ran uncompiled, so that the plan does not reach it and ``fc``
    (its forecast) misses its activations: one message per cause, ``[]`` when nothing is known.

    - No compiled graph reads a trainable parameter (``Forecast.compiled_parameter_bytes`` 0): dynamo
      ran the whole forward eagerly.
    - ``nn.LSTM``/``GRU``/``RNN`` modules while ``torch._dynamo.config.allow_rnn`` is False: dynamo
      runs them eagerly, outside the plan and the forecast (with ``allow_rnn`` they are compiled).
    """
    out: list[str] = []
    trainable = any(p.requires_grad for p in module.parameters())
    if fc is not None and trainable and fc.compiled_parameter_bytes == 0:
        out.append(
            "dynamo compiled none of the forward's own computation (no compiled graph reads a trainable "
            "parameter): it ran it eagerly, so the plan changes nothing and the forecast misses the activations. "
            "A graph break inside a loop makes dynamo skip the whole frame, and of the modules that frame calls "
            "it compiles those of your own classes only, not torch's (wrap an nn.TransformerEncoderLayer in a "
            "module of your own, or shard it with FSDP2's fully_shard: each FSDP2 unit is compiled on its own). "
            "Run with TORCH_LOGS=graph_breaks to see where.")
    rnns = [name for name, m in module.named_modules()
            if isinstance(m, nn.RNNBase) and any(p.requires_grad for p in m.parameters())]
    if rnns and not dynamo_allows_rnn():
        shown = listed([repr(n) for n in rnns], 3)
        out.append(
            f"the recurrent modules {shown} run eagerly: dynamo does not compile nn.LSTM, nn.GRU or nn.RNN "
            "unless `torch._dynamo.config.allow_rnn = True`, so the plan does not reach them and the forecast "
            "misses their activations (the measured peak will be higher). Set `torch._dynamo.config.allow_rnn "
            "= True` before fitting to compile and plan them (torch marks it experimental: where the compile "
            "fails, training goes on uncompiled, with a warning).")
    return out


def eager_forward_warning(module: nn.Module, ids: Collection[int]) -> str | None:
    """A message naming the modules of ``module`` whose trainable parameters (``ids``) the forward
    read outside every compiled graph (their layers ran eagerly inside it: a function dynamo is
    told not to trace, code in a frame it skipped), with their bytes; ``None`` when there are none.
    Their activations are neither planned nor forecast."""
    owners: dict[str, int] = {}
    for name, p in module.named_parameters():
        if id(p) in ids:
            owner = name.rsplit(".", 1)[0] if "." in name else "(the module itself)"
            owners[owner] = owners.get(owner, 0) + p.numel() * p.element_size()
    if not owners:
        return None
    shown = listed([repr(n) for n in owners], 4)
    return (f"the forward ran the layers of {shown} ({sum(owners.values()):,} bytes of trainable parameters) outside "
            "every compiled graph (a function dynamo does not trace, or code in a frame it skipped), so the plan "
            "does not reach them and the forecast misses their activations: the measured peak can be higher than "
            "predicted. TORCH_LOGS=graph_breaks shows why.")


def several_backwards_warning(backwards: int) -> str:
    """The message for a training step that ran ``backwards`` (> 1) backward passes (manual
    optimization): the plan covers the step up to the first one."""
    return (f"training_step ran {backwards} backward passes (manual optimization, e.g. a GAN's generator and "
            "discriminator steps); the plan covers the planned forward's calls, the code on their outputs, the "
            "first backward and one optimizer step, not what runs after the first backward.")
