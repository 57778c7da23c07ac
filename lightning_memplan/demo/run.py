"""``memplan demo``: train the small GPT on the shipped text with ``MemPlanCallback`` and report.

:func:`run_demo` builds the model and data, fits a Lightning ``Trainer`` with
``MemPlanCallback(budget="auto")`` (or the budget / byte target given), then prints the candidate
plans the search forecast, the per-epoch predicted vs measured peak (as logged to the Trainer's
CSV logger) and where the pictures are. It returns the same facts as a :class:`DemoResult`.
"""
from __future__ import annotations

import csv
import logging
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from tabulate import tabulate

from lightning_memplan.demo.data import make_dataloader
from lightning_memplan.demo.model import GPT, MODEL_SIZES, Block
from lightning_memplan.callback.reporter import candidates_table
from lightning_memplan.planner.search import DEFAULT_REMAT_BUDGETS
from lightning_memplan.planner.settings import auto_backend
from lightning_memplan.text import COLUMNS, fill
from lightning_memplan.units import format_bytes, parse_bytes

__all__ = ["DemoOptions", "DemoResult", "EpochRow", "default_backend", "run_demo"]

DEMO_BUDGETS: tuple[float, ...] = (1.0, 0.3)
"""Budgets the demo's search tries with each checkpoint set: few, so the demo stays short on a
2-core CPU (each candidate is one compile of the training step, a few seconds there)."""


def default_backend() -> Literal["inductor", "aot_eager"]:
    """The backend the demo's device gets by ``backend="auto"``
    (:func:`~lightning_memplan.planner.settings.auto_backend`): inductor on a CUDA machine, else aot_eager."""
    return auto_backend("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """What the demo trains and how (the ``memplan demo`` flags)."""

    model_size: Literal["tiny", "small"] = "tiny"
    """``"tiny"`` (2 blocks, 64 wide, 64 characters of context) or ``"small"`` (4 blocks, 128, 128)."""
    budget: float | Literal["auto"] = "auto"
    """Activation memory budget in [0, 1], or ``"auto"`` (search)."""
    max_memory: int | str | None = None
    """Byte target for baseline + step peak (``"64MiB"``), or None."""
    solver: str = "dp"
    """Solver: ``"dp"``, ``"hirschberg"``, ``"greedy"``, ``"ilp"`` or ``"remat"``."""
    epochs: int = 2
    """Training epochs."""
    batches: int = 12
    """Training batches per epoch (the corpus has about 19 batches of 16 x 64 characters)."""
    batch_size: int = 16
    """Sequences per batch."""
    backend: Literal["inductor", "aot_eager"] | None = None
    """``torch.compile`` backend; None: :func:`default_backend`."""
    candidate_budgets: tuple[float, ...] = DEMO_BUDGETS
    """Budgets the search tries with each checkpoint set."""
    remat_budgets: tuple[float, ...] = DEFAULT_REMAT_BUDGETS
    """Budgets of the whole-graph rematerialization plans the search adds (``()``: none)."""
    out: Path = Path("memplan_out")
    """Directory for the CSV log, the metrics and the PNGs."""
    progress_bar: bool = True
    """Show Lightning's progress bar."""
    seed: int = 0
    """Seed for the model's initialization and the data order."""

    def __post_init__(self) -> None:
        if self.model_size not in MODEL_SIZES:
            raise ValueError(f"`DemoOptions(model_size={self.model_size!r})` is not valid. Expected one of "
                             f"{sorted(MODEL_SIZES)}.")
        for name in ("epochs", "batches", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`DemoOptions({name}={value!r})` must be an int >= 1.")


@dataclass(frozen=True, kw_only=True)
class EpochRow:
    """One epoch's logged memory metrics (bytes; ``error`` is (predicted - measured) / measured)."""

    epoch: int
    predicted_bytes: float | None
    measured_bytes: float | None
    error: float | None


@dataclass(frozen=True, kw_only=True)
class DemoResult:
    """What the demo did."""

    plan: Any
    """The :class:`~lightning_memplan.plan.MemPlan` in force at the end (None after a fallback)."""
    fallback_reason: str | None
    epochs: tuple[EpochRow, ...]
    log_dir: Path
    pictures: tuple[Path, ...]
    """PNGs the callback wrote (Pareto front, memory timeline)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall seconds: ``total``, ``fit``, and the callback's ``decide_seconds`` / ``install_seconds``."""


def _read_epochs(metrics_csv: Path) -> tuple[EpochRow, ...]:
    """Rows of the CSV logger's ``metrics.csv`` that carry ``memplan/*`` keys, one per epoch."""
    if not metrics_csv.is_file():
        return ()

    def num(row: dict[str, str], key: str) -> float | None:
        v = row.get(key, "")
        return float(v) if v not in ("", None) else None

    rows = [r for r in csv.DictReader(metrics_csv.open()) if r.get("memplan/budget")]
    return tuple(EpochRow(epoch=k, predicted_bytes=num(r, "memplan/predicted_peak_bytes"),
                          measured_bytes=num(r, "memplan/measured_peak_bytes"),
                          error=num(r, "memplan/prediction_error")) for k, r in enumerate(rows))


def epochs_table(rows: Sequence[EpochRow]) -> str:
    """Per-epoch predicted / measured peak and the signed error (github table)."""
    body = [[r.epoch, format_bytes(r.predicted_bytes), format_bytes(r.measured_bytes),
             "-" if r.error is None else f"{100 * r.error:+.1f}%"] for r in rows]
    return tabulate(body, headers=["epoch", "predicted peak", "measured peak", "error"], tablefmt="github")


def run_demo(options: DemoOptions = DemoOptions(), *, echo: bool = True) -> DemoResult:
    """Train the demo model with ``MemPlanCallback`` and (with ``echo``) print the report."""
    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.loggers import CSVLogger

    from lightning_memplan.callback.memplan_callback import MemPlanCallback

    t0 = time.perf_counter()
    say = print if echo else (lambda *a, **k: None)
    backend = options.backend or default_backend()
    callback = MemPlanCallback(
        options.budget, max_memory=options.max_memory, solver=options.solver, backend=backend,
        candidate_budgets=options.candidate_budgets, remat_budgets=options.remat_budgets, verbose=echo,
        # name the block class: with 2 blocks, "auto" would tie with the 2 embeddings
        checkpoint={Block},
    )
    seed_everything(options.seed, verbose=False)
    block = MODEL_SIZES[options.model_size]["block_size"]
    loader, tok = make_dataloader(block, options.batch_size, seed=options.seed)
    model = GPT.from_size(options.model_size, tok.vocab_size)
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    accel = "gpu" if torch.cuda.is_available() else "cpu"
    say(fill(f"memplan demo: a character-level GPT ({options.model_size}: {cfg.n_layer} blocks, "
        f"{cfg.n_embd} wide, {params / 1e6:.2f} M parameters) on {tok.vocab_size}"
        f"-character vocabulary, batches of {options.batch_size} x {block} characters, "
        f"{options.epochs} epochs x {min(options.batches, len(loader))} batches, {accel}, backend {backend}, "
        f"MemPlanCallback(budget={options.budget!r}"
        + (f", max_memory={options.max_memory!r}" if options.max_memory is not None else "")
        + f", solver={options.solver!r})."), flush=True)
    if options.budget == "auto":
        say(fill("The first batch forecasts each candidate plan (budget x checkpointed blocks, and whole-graph "
                 "remat plans) on the real compiled graphs; that takes a few seconds per plan on a CPU.",
                 indent=""), flush=True)
    logger = CSVLogger(options.out, name="demo")
    wrap = _Wrapped()
    for name in _CONSOLE_LOGGERS:
        logging.getLogger(name).addFilter(wrap)
    trainer = Trainer(
        max_epochs=options.epochs, limit_train_batches=options.batches, accelerator=accel, devices=1,
        callbacks=[callback], logger=logger, default_root_dir=options.out, log_every_n_steps=1,
        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=options.progress_bar,
    )
    t_fit = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # Lightning 2.6 on torch >= 2.10: a deprecation inside Lightning, not actionable here
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*")
            trainer.fit(model, loader)
    finally:
        for name in _CONSOLE_LOGGERS:
            logging.getLogger(name).removeFilter(wrap)
    fit_seconds = time.perf_counter() - t_fit
    log_dir = Path(logger.log_dir)
    epochs = _read_epochs(log_dir / "metrics.csv")
    pictures = tuple(p for p in (log_dir / "memplan" / "frontier.png", log_dir / "memplan" / "timeline.png")
                     if p.is_file())
    seconds = {"total": time.perf_counter() - t0, "fit": fit_seconds, **callback.timings}
    result = DemoResult(plan=callback.plan, fallback_reason=callback.fallback_reason, epochs=epochs,
                        log_dir=log_dir, pictures=pictures, seconds=seconds)
    if echo:
        limit = None if options.max_memory is None else parse_bytes(options.max_memory, argument="max_memory")
        _print_report(result, limit)
    return result


#: The loggers Lightning's ``rank_zero_info`` writes the console messages through (its own and the
#: callback's).
_CONSOLE_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _Wrapped(logging.Filter):
    """Breaks a console message's lines longer than :data:`~lightning_memplan.text.COLUMNS` at
    spaces (:func:`~lightning_memplan.text.fill`), so the demo reads in a terminal of that width."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if any(len(line) > COLUMNS for line in text.splitlines()):
            record.msg, record.args = fill(text), ()
        return True


def _print_report(result: DemoResult, limit_bytes: int | None) -> None:
    plan = result.plan
    print()
    if plan is None:
        print(fill(f"MemPlanCallback fell back to the uncompiled model: {result.fallback_reason}"))
    else:
        blocks = ", ".join(plan.checkpoint) if plan.checkpoint else "nothing"
        print(fill(f"Plan in force: budget {plan.budget:g}, solver {plan.solver}, {blocks} checkpointed, backend "
                   f"{plan.backend}; {plan.reason or 'given'}."))
        if (trade_off := plan.trade_off()) is not None:
            print(fill(f"The trade-off: {trade_off}."))
        if plan.candidates:
            print(fill("\nCandidate plans (the peak of the step Lightning runs: the previous step's gradients stay "
                       "live through the forward and are freed in zero_grad, before backward):", indent=""))
            print(candidates_table(plan, limit_bytes=limit_bytes))
    print("\nPeak memory of a training step above its starting bytes, per epoch (as logged under memplan/*):")
    print(epochs_table(result.epochs) if result.epochs else "(nothing logged)")
    if result.pictures:
        print("\nPictures:")
        for p in result.pictures:
            what = "Pareto front, knee and choice" if p.stem == "frontier" else "memory timeline, forecast vs measured"
            print(f"  {what}: {p}")
    print(f"Metrics: {result.log_dir / 'metrics.csv'}")
    s = result.seconds
    parts = [f"total {s['total']:.0f} s", f"fit {s['fit']:.0f} s"]
    if "decide_seconds" in s:
        parts.append(f"plan search {s['decide_seconds']:.0f} s")
    if "install_seconds" in s:
        parts.append(f"final forecast + compile {s['install_seconds']:.0f} s")
    print("Wall time: " + ", ".join(parts) + ".")
