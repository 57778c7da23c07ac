"""The largest batch that fits a memory limit: ``MemPlanCallback(batch_size="max")`` side by side with
Lightning's ``BatchSizeFinder`` on the same model and limit, in one run.

The model is a zoo model (``tests/zoo/zoo_models.py``: transformers from small configs with random
weights, offline), ``training_step`` written the usual way (``self.model(**batch).loss``), AdamW,
its train dataloader built from ``self.batch_size`` (as both finders expect). For each finder:

- **search**: MemPlanCallback forecasts each candidate size on fake tensors at fit start (nothing is
  allocated, no step runs; ``training_step`` is probed once without autograd on the first batch);
  ``BatchSizeFinder(mode="binsearch", steps_per_trial=3)`` runs real training steps at each size
  until one runs out of memory. Both start at the same size. Reported: the training steps the search
  ran (optimizer steps before training starts), its wall time, the batch chosen.
- **fit**: a fit of a few batches at the chosen batch (MemPlanCallback with the plan it chose;
  BatchSizeFinder's batch with the model as written), its measured peak total against the limit,
  and its throughput (samples per second, median step).

On the CPU nothing runs out of memory, so the limit is emulated for both, by one meter: a step's
total is the bytes of the tensors live when it starts (parameters, gradients, optimizer state, the
batch; each storage once) plus the profiler's peak above them during the step (forward, backward,
optimizer step; the first step of each run of measured steps is a warm-up, as the callback's own
meter has it). During ``BatchSizeFinder``'s search a step whose total exceeds the limit raises the
error CUDA raises (``RuntimeError("CUDA out of memory ...")``), which the finder catches as an OOM;
MemPlanCallback gets the limit as ``max_memory``. On CUDA the limit is the device itself: real OOMs
for ``BatchSizeFinder``, the device's memory for MemPlanCallback (no ``max_memory``), and the fit's
total is ``torch.cuda.max_memory_reserved``; with ``--limits`` the device is capped there
(``torch.cuda.set_per_process_memory_fraction``: the finder's OOMs are CUDA's own) and
MemPlanCallback gets the cap as ``max_memory``.

    python benchmarks/batch_size.py                          # llama, limits 24 MiB and 48 MiB, CPU
    python benchmarks/batch_size.py --models llama gpt2 --limits 32MiB
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightning.pytorch import Callback, LightningModule, Trainer  # noqa: E402
from lightning.pytorch.tuner import Tuner  # noqa: E402
from tabulate import tabulate  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from lightning_memplan import MemPlanCallback  # noqa: E402
from lightning_memplan._torch.storages import unique_storages  # noqa: E402
from lightning_memplan.measure import PeakWindow  # noqa: E402
from lightning_memplan.units import format_bytes, parse_bytes  # noqa: E402
from tests.zoo.zoo_models import ZooData, ZooModule  # noqa: E402

#: Samples in each model's dataset: more than any batch the limits here allow.
ROWS = 4096


class Batched(ZooModule):
    """A zoo model whose train dataloader reads ``self.batch_size`` (``loss`` way), each training
    step measured by ``meter``. The meter sits in the module's own hooks: ``BatchSizeFinder`` runs
    its trials with the Trainer's callbacks removed."""

    def __init__(self, name: str, batch_size: int, meter: StepMeter) -> None:
        super().__init__(name, "loss")
        self.batch_size, self.meter = batch_size, meter
        self._data = ZooData(self.task, n=ROWS)
        #: Training steps run before the first ``on_train_start`` (``None`` before it).
        self.steps_before_training: int | None = None

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self._data, batch_size=self.batch_size)

    def on_train_start(self) -> None:
        if self.steps_before_training is None:
            self.steps_before_training = self.meter.steps

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.meter.start(self, batch, batch_idx)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.meter.end(self, batch_idx)


def _live_bytes(module: LightningModule, batch: Any) -> int:
    """Bytes of the tensors a step starts with: parameters, gradients, optimizer state, the batch
    (each storage once)."""
    tensors = [*module.parameters(), *(p.grad for p in module.parameters() if p.grad is not None),
               *(v for opt in module.trainer.optimizers for state in opt.state.values() for v in state.values()),
               *(batch.values() if isinstance(batch, dict) else batch)]
    return sum(n for n, _ in unique_storages([t for t in tensors if isinstance(t, torch.Tensor)], set()))


@dataclass
class StepMeter:
    """Each training step's total (bytes: live at its start + the peak above that during it) and
    wall time (seconds), from batch ``first`` on; with ``raise_over``: a step whose total exceeds it
    raises CUDA's out-of-memory error (the emulated device). On CUDA the totals are the allocator's
    peak reserved bytes and nothing is raised (the device raises its own)."""

    raise_over: int | None = None
    first: int = 0
    totals: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    #: Training steps run (every batch, measured or not).
    steps: int = 0
    _window: Any = None
    _start: int = 0
    _t0: float = 0.0
    _streak: int = 0  # consecutive measured steps, this one included
    _last: int = -2  # the batch index of the last measured step

    def start(self, module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._close()
        if batch_idx != self._last + 1:
            self._streak = 0  # a new run of steps (a trial, an epoch): its first is a warm-up again
        if batch_idx < self.first:
            return
        device = module.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        else:
            self._start = _live_bytes(module, batch)
            self._window = PeakWindow(device).__enter__()
        self._t0 = time.perf_counter()

    def end(self, module: LightningModule, batch_idx: int) -> None:
        self.steps += 1
        if batch_idx < self.first:
            return
        self._last = batch_idx
        device = module.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            self.seconds.append(time.perf_counter() - self._t0)
            self.totals.append(int(torch.cuda.max_memory_reserved(device)))
            return
        self.seconds.append(time.perf_counter() - self._t0)
        peak = self._close()
        self._streak += 1
        if peak is None or self._streak == 1:  # a warm-up: the profiler misses frees of older blocks
            return
        total = self._start + peak
        self.totals.append(total)
        if self.raise_over is not None and total > self.raise_over:
            raise RuntimeError(f"CUDA out of memory (emulated on the CPU: a step of {total} bytes over the limit "
                               f"of {self.raise_over} bytes)")

    def _close(self) -> int | None:
        w, self._window = self._window, None
        if w is None:
            return None
        w.__exit__(None, None, None)
        return int(w.peak_bytes)


def _trainer(root: str, callbacks: list[Callback], device: str, batches: int) -> Trainer:
    return Trainer(max_epochs=1, limit_train_batches=batches, callbacks=callbacks, accelerator=device, devices=1,
                   logger=False, enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                   default_root_dir=root)


@dataclass
class Outcome:
    """One finder's search and the fit at its batch."""

    finder: str
    steps: int
    search_seconds: float
    batch: int | None
    total_bytes: int | None = None
    samples_per_second: float | None = None
    note: str = ""


def _fit_at(name: str, batch: int, device: str, callbacks: list[Callback], root: str, batches: int,
            first: int) -> tuple[int | None, float | None]:
    """A fit of ``batches`` batches at ``batch``: its largest measured step total (bytes, from batch
    ``first`` on) and median samples per second."""
    meter = StepMeter(first=first)
    _trainer(root, callbacks, device, batches).fit(Batched(name, batch, meter))
    if not meter.totals:
        return None, None
    return max(meter.totals), batch / statistics.median(meter.seconds[1:] or meter.seconds)


def run_memplan(name: str, start: int, limit: int | None, device: str, batches: int, backend: str) -> Outcome:
    """MemPlanCallback(batch_size="max"): the search at fit start, then a fit at its batch with the
    plan it chose, measured by the meter after the callback's own measured batches (0 and 1)."""
    meter = StepMeter()  # measures nothing here: counts the steps run before training starts
    module = Batched(name, start, meter)
    cb = MemPlanCallback(batch_size="max", max_memory=limit, backend=backend, log_plots=False, verbose=False,
                         measure_batches=1)
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        meter.first = 10**9
        _trainer(root, [cb], device, 1).fit(module)
        wall = time.perf_counter() - t0
        found, plan = cb.batch_size, cb.plan
        steps = module.steps_before_training or 0
        if found is None or found.batch_size is None or plan is None:
            return Outcome("MemPlanCallback", steps, wall, None, note=found.reason if found else "no search")
        given = MemPlanCallback(plan=plan, backend=backend, log_plots=False, verbose=False, measure_batches=1)
        total, rate = _fit_at(name, found.batch_size, device, [given], root, batches, first=3)
    words = f"budget {plan.budget:g}" + (f", {len(plan.checkpoint)} ckpt" if plan.checkpoint else "")
    return Outcome("MemPlanCallback", steps, found.seconds if found.seconds is not None else wall, found.batch_size,
                   total, rate, note=words)


def run_finder(name: str, start: int, limit: int | None, device: str, batches: int) -> Outcome:
    """BatchSizeFinder's binary search from ``start`` (OOMs emulated by the meter on the CPU), then
    the model as written fit at its batch."""
    meter = StepMeter(raise_over=limit)
    module = Batched(name, start, meter)
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Tuner(_trainer(root, [], device, 1)).scale_batch_size(
                module, mode="binsearch", steps_per_trial=3, init_val=start, max_trials=25)
        wall = time.perf_counter() - t0
        chosen = int(module.batch_size)
        total, rate = _fit_at(name, chosen, device, [], root, batches, first=3)
    return Outcome("BatchSizeFinder", meter.steps, wall, chosen, total, rate, note="the model as written")


@contextlib.contextmanager
def capped(limit: int | None) -> Iterator[None]:
    """On CUDA with ``limit``: the caching allocator capped at ``limit`` bytes of this device
    (``torch.cuda.set_per_process_memory_fraction``: a step past it raises CUDA's own out-of-memory
    error), put back afterwards. Elsewhere, or without a limit: nothing changes."""
    if limit is None or not torch.cuda.is_available():
        yield
        return
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / torch.cuda.get_device_properties(0).total_memory))
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def compare(name: str, start: int, limit: int | None, device: str, batches: int,
            backend: str) -> tuple[Outcome, Outcome, int]:
    """Both finders on model ``name`` under ``limit`` (bytes; ``None``: the whole CUDA device): ours,
    the peer's, and the limit they were held to (bytes)."""
    with capped(limit):
        ours = run_memplan(name, start, limit, device, batches, backend)
        peer = run_finder(name, start, limit, device, batches)
    return ours, peer, limit if limit is not None else torch.cuda.get_device_properties(0).total_memory


def table_rows(name: str, cap: int, ours: Outcome, peer: Outcome) -> list[list[Any]]:
    """The table's rows of one comparison: ours, the peer's, then their ratios."""
    rows = []
    for o in (ours, peer):
        rows.append([name, format_bytes(cap), o.finder, o.steps, f"{o.search_seconds:.1f}", o.batch or "-",
                     format_bytes(o.total_bytes) if o.total_bytes is not None else "-",
                     "-" if o.total_bytes is None else ("yes" if o.total_bytes <= cap else "NO"),
                     f"{o.samples_per_second:.0f}" if o.samples_per_second else "-", o.note])
    if ours.batch and peer.batch:
        rows.append(["", "", "ratio ours / peer", "-", f"{ours.search_seconds / peer.search_seconds:.2f}x",
                     f"{ours.batch / peer.batch:.2f}x", "", "",
                     f"{ours.samples_per_second / peer.samples_per_second:.2f}x"
                     if ours.samples_per_second and peer.samples_per_second else "-", ""])
    return rows


HEADERS = ["model", "limit", "finder", "trial steps", "search s", "batch", "fit total", "under limit", "samples/s",
           "plan"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["llama"])
    p.add_argument("--limits", nargs="+", default=None,
                   help="limits: emulated on the CPU (default 24MiB 48MiB); on CUDA the device capped there "
                        "(default: the whole device)")
    p.add_argument("--start", type=int, default=8, help="the batch size both searches start from")
    p.add_argument("--batches", type=int, default=8, help="batches of the measured fit at the chosen batch")
    p.add_argument("--backend", default="aot_eager", help="MemPlanCallback's compile backend")
    args = p.parse_args(argv)
    device = "gpu" if torch.cuda.is_available() else "cpu"
    given = args.limits if args.limits is not None else (["24MiB", "48MiB"] if device == "cpu" else None)
    limits: list[int | None] = [None] if given is None else [parse_bytes(x, argument="--limits") for x in given]
    rows = []
    for name in args.models:
        for limit in limits:
            ours, peer, cap = compare(name, args.start, limit, device, args.batches, args.backend)
            rows += table_rows(name, cap, ours, peer)
    where = "emulated limit on the CPU" if device == "cpu" else "the device, capped at the limit"
    print(f"\nThe largest batch that fits ({where}; start {args.start}, fit of {args.batches} batches at the "
          f"chosen size, torch {torch.__version__})")
    print(tabulate(rows, headers=HEADERS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
