"""Forecasts that allocate nothing: a training step forecast for a named target on fake tensors.

A model on the meta device (built under ``with torch.device("meta"):``), or any model given a
``target=``, is copied into fake CPU tensors (:mod:`lightning_memplan._torch.fake`) and its step is
traced, partitioned and laid out as a real forecast does, inside the fake mode: no parameter,
activation or optimizer state is allocated and no kernel of the model runs. Inductor lowers and
plans its buffers but builds nothing (:func:`~lightning_memplan._torch.inductor.codegen_only`).

What differs from a forecast made by running:

- kernel workspaces come from :func:`~lightning_memplan.forecasting.workspace.estimating_workspaces`
  (computed, probed on the host when small and the target is the host, else named in ``problems``);
- for a CUDA target the step's allocations are replayed through the caching-allocator model
  (:func:`~lightning_memplan.forecasting.allocations.simulate_cuda_allocator`): ``peak_bytes`` is
  the allocated blocks, ``cuda_allocator.reserved_peak_bytes`` the segments. The graphs are the
  ones CPU kernels run (traced on fake CPU tensors): attention is CPU's fused kernel, whose saved
  tensors (output, log-sum-exp) are those of CUDA's flash and efficient kernels up to padding;
- ``Forecast.step()`` raises: there is nothing to run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import traceback
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

from lightning_memplan._torch.fake import DATA_DEPENDENT_ERRORS, FakeStep, fake_step_args, has_meta_tensors
from lightning_memplan.forecasting.allocations import StepAllocations, simulate_cuda_allocator
from lightning_memplan.forecasting.result import Forecast
from lightning_memplan.forecasting.workspace import WorkspaceEstimate, estimating_workspaces
from lightning_memplan.targets import TARGETS, Target, resolve_target

__all__ = ["check_target", "estimated", "finish_estimate"]


def check_target(target: object, model: nn.Module, inputs: tuple[Any, ...], call: str) -> Target | None:
    """The :class:`Target` a forecast is made for without running, or ``None`` for a forecast made
    by running (no ``target``, nothing on the meta device).

    Raises:
        ValueError: an unknown target, or a meta-device model or input without one.
    """
    if target is None:
        if has_meta_tensors(model, inputs):
            raise ValueError(
                f"`{call}(target=None)`: the model or its inputs are on the meta device, so the step cannot "
                "run. Name the device it is forecast for: target='cpu', 'cuda', or a GPU such as "
                f"{', '.join(repr(n) for n in list(TARGETS)[2:])}.")
        return None
    return resolve_target(target, call)


@contextlib.contextmanager
def estimated(model: nn.Module, inputs: tuple[Any, ...], optimizer: torch.optim.Optimizer | None,
              target: Target, call: str) -> Iterator[tuple[FakeStep, WorkspaceEstimate]]:
    """Fake copies of the step's arguments, with the fake mode and workspace estimation active.

    Raises:
        ValueError: the step depends on tensor values (a branch on ``x.sum() > 0``, ``.item()``),
            which fake tensors do not have; the message names the user's frame.
    """
    with fake_step_args(model, inputs, optimizer) as fake, estimating_workspaces(target.kind) as ws:
        try:
            yield fake, ws
        except DATA_DEPENDENT_ERRORS as err:
            raise ValueError(
                f"`{call}(target={target.name!r})`: the step depends on the values of a tensor at "
                f"{_asking_frame(fake, err)} ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}), "
                "which a forecast that runs nothing cannot know. Forecast the model on a real device "
                "(without `target=`), or make that code depend on shapes only.") from err


def _asking_frame(fake: FakeStep, err: BaseException) -> str:
    """The frame of the model's code that asked for a tensor's value: compiled code hides it from
    ``err``'s traceback, so the forward is run again eagerly on the fakes to raise it where it is."""
    try:
        with torch.no_grad():
            fake.model(*fake.inputs)
    except DATA_DEPENDENT_ERRORS as eager_err:
        return _user_frame(eager_err)
    except Exception:  # noqa: BLE001 - another failure: the compiled error's own frame
        pass
    return _user_frame(err)


def _user_frame(err: BaseException) -> str:
    """``file:line in function`` of the innermost frame of ``err``'s traceback outside torch and
    this package (the code that asked for a value); ``"an unknown frame"`` when there is none."""
    frames = traceback.extract_tb(err.__traceback__)
    for f in reversed(frames):
        path = f.filename.replace("\\", "/")
        if "/torch/" not in path and "/lightning_memplan/" not in path and "contextlib" not in path:
            return f"{f.filename}:{f.lineno} in {f.name}"
    return "an unknown frame"


def _on_device(step: StepAllocations, device: str) -> StepAllocations:
    return dataclasses.replace(step, baseline=tuple((n, device) for n, _ in step.baseline),
                               new_state=tuple((n, device) for n, _ in step.new_state),
                               events=tuple(e._replace(device=device) for e in step.events))


def _refuse(target: Target) -> Any:
    def step() -> torch.Tensor:
        raise RuntimeError(
            f"This forecast is an estimate for target={target.name!r}, made on fake tensors without running: "
            "it has no step to train. Forecast a model that lives on a real device, without `target=`, "
            "to get a plan you can step.")
    return step


def finish_estimate(fc: Forecast, target: Target, ws: WorkspaceEstimate) -> Forecast:
    """``fc`` (forecast on fake tensors) as an estimate for ``target``: the allocator model run for a
    CUDA target, the unknown workspaces in ``problems``, ``step()`` refusing."""
    problems = list(fc.problems)
    if ws.unknown:
        ops = ", ".join(f"{name} ({n} node{'s' * (n > 1)})" for name, n in sorted(ws.unknown.items()))
        problems.append(f"kernel workspaces not known without running on {target.name}, counted as 0: {ops}")
    peak, allocator = fc.peak_bytes, fc.cuda_allocator
    if target.kind == "cuda" and fc.peak_bytes is not None:
        if fc.allocations is None or fc.allocations.requested_peak_bytes != fc.requested_peak_bytes:
            problems.append("the CUDA caching-allocator model could not run (the step's allocations are not known "
                            "storage by storage): reserved bytes unknown, allocated = requested")
        else:
            try:
                allocator = simulate_cuda_allocator(_on_device(fc.allocations, "cuda"), device="cuda")
                peak = allocator.allocated_peak_bytes
            except Exception as err:  # noqa: BLE001 - the requested peak stands
                problems.append(f"CUDA allocator model failed: {type(err).__name__}: {err}")
    return dataclasses.replace(fc, peak_bytes=peak, cuda_allocator=allocator, problems=tuple(problems),
                               target=target.name, _step=_refuse(target))
