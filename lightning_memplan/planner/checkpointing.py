"""Activation checkpointing of chosen submodules, for the duration of a fit or a forecast.

A plan is (budget, checkpointed blocks). Wrapping a block makes its forward run under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: inside ``torch.compile`` the
partitioner then recomputes everything inside it in backward. The wrapping is an instance-level
``forward`` attribute on each chosen submodule, removed on exit; the user's classes are never
changed.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightning_memplan.core.instance_patch import instance_attributes
from lightning_memplan.planner.rng import rng_kept

__all__ = ["CheckpointPolicy", "checkpoint_candidates", "checkpointed", "recompute_trial", "resolve_blocks",
           "uncompiled_blocks"]

CheckpointPolicy = Literal["auto"] | Iterable[type[nn.Module]] | None
"""``None`` (never checkpoint), ``"auto"`` (the model's repeated blocks) or a set of module classes
(as Lightning's FSDP ``activation_checkpointing_policy`` takes)."""


def repeated_blocks(model: nn.Module) -> list[str]:
    """Qualified names of the model's repeated blocks, ``[]`` if none.

    Candidates are groups of two or more sibling submodules (children of one parent) of the same
    class that have submodules of their own (a transformer block, not a lone ``Linear`` or
    ``Embedding``: checkpointing a single layer saves nothing) and trainable parameters. The group
    with the most parameters wins; ties go to the larger group, then to the first found in
    ``named_modules`` order.
    """
    best: list[str] = []
    best_key = (0, 0)
    for parent_name, parent in model.named_modules():
        children = list(parent.named_children())
        for cls in dict.fromkeys(type(c) for _, c in children):
            group = [(n, c) for n, c in children if type(c) is cls]
            if len(group) < 2 or not any(True for _ in group[0][1].children()):
                continue
            params = sum(p.numel() for _, c in group for p in c.parameters() if p.requires_grad)
            key = (params, len(group))
            if params > 0 and key > best_key:
                prefix = f"{parent_name}." if parent_name else ""
                best, best_key = [f"{prefix}{n}" for n, _ in group], key
    return best


def resolve_blocks(model: nn.Module, policy: CheckpointPolicy) -> list[str]:
    """Qualified names of the submodules a policy allows to checkpoint, in model order.

    Raises:
        ValueError: when ``policy`` is not None, ``"auto"`` or an iterable of ``nn.Module`` classes.
    """
    if policy is None:
        return []
    if policy == "auto":
        return repeated_blocks(model)
    classes = _policy_classes(policy)
    return [name for name, m in model.named_modules() if name and isinstance(m, classes)
            and not any(name.startswith(f"{outer}.") for outer in _outer_matches(model, classes, name))]


def _outer_matches(model: nn.Module, classes: tuple[type, ...], name: str) -> Iterator[str]:
    parts = name.split(".")
    for k in range(1, len(parts)):
        outer = ".".join(parts[:k])
        if isinstance(model.get_submodule(outer), classes):
            yield outer


def _policy_classes(policy: Any) -> tuple[type[nn.Module], ...]:
    try:
        classes = tuple(policy)
    except TypeError:
        classes = ()
    if not classes or isinstance(policy, str) or not all(
        isinstance(c, type) and issubclass(c, nn.Module) for c in classes
    ):
        raise ValueError(
            f"`checkpoint={policy!r}` is not a checkpoint policy. Expected None, 'auto' (the "
            "model's repeated blocks) or a set of nn.Module classes, e.g. {TransformerBlock}."
        )
    return classes


def checkpoint_candidates(blocks: Sequence[str]) -> list[tuple[str, ...]]:
    """The checkpoint sets a search tries: none, every second block, every block (deduplicated)."""
    sets = [(), tuple(blocks[1::2]), tuple(blocks)]
    out: list[tuple[str, ...]] = []
    for s in sets:
        if s not in out:
            out.append(s)
    return out


def _checkpointed_forward(forward: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


@contextlib.contextmanager
def checkpointed(model: nn.Module, names: Iterable[str]) -> Iterator[None]:
    """Within the block, the named submodules of ``model`` run under activation checkpointing.

    Raises:
        ValueError: a name that is not a submodule of ``model``.
    """
    subs: list[nn.Module] = []
    for name in names:
        try:
            subs.append(model.get_submodule(name))
        except AttributeError:
            raise ValueError(f"checkpoint block {name!r} is not a submodule of the model.") from None
    with instance_attributes([(sub, "forward", _checkpointed_forward(sub.forward)) for sub in subs]):
        yield


def uncompiled_blocks(model: nn.Module, names: Iterable[str], compiled: Collection[int] | None) -> list[str]:
    """Of the checkpointed blocks ``names`` of ``model``, those none of whose trainable parameters a
    compiled graph reads (``compiled``: ids of the parameters the graphs of a forecast with the blocks
    really wrapped read; ``None`` or empty: unknown, nothing is named). dynamo ran them eagerly
    (``torch.utils.checkpoint`` around a block with side effects, on a torch without
    ``skip_fwd_side_effects_in_bwd_under_checkpoint``, or a graph break inside it), so no plan
    reaches them and a forecast misses their activations."""
    if not compiled:
        return []
    eager = []
    for name in names:
        params = [id(p) for p in model.get_submodule(name).parameters() if p.requires_grad]
        if params and not any(i in compiled for i in params):
            eager.append(name)
    return eager


def recompute_trial(module: nn.Module, forward: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any],
                    loss_fn: Callable[[Any], torch.Tensor]) -> None:
    """Run ``loss_fn(forward(*args, **kwargs))`` and its backward once, eagerly, with the blocks as
    they are wrapped now (call it inside :func:`checkpointed`): a block whose recomputation differs
    from its first run (it changes state it was passed, such as a KV cache it appends to) raises
    here, in the planner, instead of in the user's first backward. Leaves no trace: the gradients
    are not accumulated (``torch.autograd.grad``), the buffers (BatchNorm's running statistics) and
    the random number generators are as before. Raises what the step raises."""
    params = [p for p in module.parameters() if p.requires_grad]
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    try:
        with rng_kept(), torch.enable_grad():
            loss = loss_fn(forward(*args, **kwargs))
            if params and loss.requires_grad:
                torch.autograd.grad(loss, params, allow_unused=True)
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
