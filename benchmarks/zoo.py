"""Third-party models with MemPlanCallback: predicted against measured peak, per epoch, side by side
with the plain ``forecast()`` of the same model.

The models are ``tests/zoo/zoo_models.py``'s (transformers from small configs with random weights,
offline, and Lightning's demo Transformer), in the three ways users write training_step:
``loss`` (``self.model(**batch).loss``), ``logits`` (the loss in training_step) and ``self``
(``forward`` calls the model). Each row is one ``Trainer.fit`` of 2 epochs of 3 batches on the CPU
with ``MemPlanCallback(budget, backend=...)`` and nothing else (the module to plan is found), and
with one of the ways users train beside their training_step (``--options``: their own gradient
checkpointing, accumulation, bf16-mixed, a frozen base with adapters; ``tests/zoo/zoo_models.py``'s
``OPTIONS``) or none (``plain``); the error is the largest over the epochs. The peer (plain rows
only) is ``lightning_memplan.forecast`` of the model with its loss compiled in (``labels=``; the
logits' cross-entropy for Lightning's Transformer), which forecasts the compiled step alone: its
error against the same measurement shows what the Lightning step adds (the loss in eager code,
outputs nobody differentiates, the optimizer).

    python benchmarks/zoo.py                                   # every model and way, aot_eager, 1.0 0.5 auto
    python benchmarks/zoo.py --models llama bert_mlm --ways loss --backends aot_eager inductor --plans 0.5
    python benchmarks/zoo.py --models llama gpt2 phi --ways loss --plans auto --options accumulate bf16 lora
"""
from __future__ import annotations

import argparse
import csv
import itertools
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightning.pytorch import Trainer  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from tabulate import tabulate  # noqa: E402

from lightning_memplan import MemPlanCallback, forecast  # noqa: E402
from tests.zoo.zoo_models import OPTIONS, WAYS, ZOO, ZooModule, with_option  # noqa: E402

MiB = 2**20


def fit(name: str, way: str, backend: str, plan: str, option: str = "plain") -> dict[str, Any]:
    """One fit (``option``: one of ``OPTIONS``, or ``"plain"``); the logged predictions,
    measurements and errors."""
    torch.manual_seed(0)
    module = ZooModule(name, way)
    trainer_kwargs = {} if option == "plain" else with_option(module, option)
    budget: Any = plan if plan == "auto" else float(plan)
    cb = MemPlanCallback(budget, backend=backend, verbose=False, log_plots=False)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        trainer = Trainer(max_epochs=2, accelerator="cpu", devices=1, callbacks=[cb], logger=CSVLogger(tmp),
                          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                          num_sanity_val_steps=0, **trainer_kwargs)
        trainer.fit(module)
        seconds = time.perf_counter() - t0
        with (Path(trainer.logger.log_dir) / "metrics.csv").open() as f:  # type: ignore[union-attr]
            rows = [r for r in csv.DictReader(f) if r.get("memplan/measured_peak_bytes")]
    predicted = [float(r["memplan/predicted_peak_bytes"]) for r in rows if r.get("memplan/predicted_peak_bytes")]
    measured = [float(r["memplan/measured_peak_bytes"]) for r in rows]
    errors = [float(r["memplan/prediction_error"]) for r in rows if r.get("memplan/prediction_error")]
    chosen = (cb.plan.candidates[cb.plan.chosen].label if cb.plan and cb.plan.candidates and cb.plan.chosen is not None
              else f"budget {cb.plan.budget:g}" if cb.plan else "none")
    return {"planned": cb._fit.planned.split(":")[0], "chosen": chosen, "fallback": cb.fallback_reason,
            "predicted": max(predicted, default=None), "measured": max(measured, default=None),
            "error": max(errors, key=abs, default=None), "seconds": seconds,
            "budget": cb.plan.budget if cb.plan else None, "checkpoint": cb.plan.checkpoint if cb.plan else ()}


class _WithLoss(torch.nn.Module):
    """The zoo model with its loss compiled in, for the plain ``forecast()``."""

    def __init__(self, module: ZooModule, keys: list[str]) -> None:
        super().__init__()
        self.m, self.keys = module, keys

    def forward(self, *values: torch.Tensor) -> torch.Tensor:
        batch = dict(zip(self.keys, values))
        if self.m.task == "demo":
            out = self.m.model(batch["input_ids"], batch["labels"])
            return torch.nn.functional.nll_loss(out, batch["labels"].view(-1))
        return self.m.model(**batch).loss


def peer(name: str, backend: str, budget: float, checkpoint: tuple[str, ...], planned: str) -> int | None:
    """``forecast()`` of the model's step at ``budget`` (its loss inside the graph), ``checkpoint``
    (named relative to the planned module: ``planned`` is the fit's, e.g. "`model` (...)")."""
    from lightning_memplan.planner.checkpointing import checkpointed

    torch.manual_seed(0)
    module = ZooModule(name, "loss" if ZOO[name][1] != "demo" else "logits")
    batch = next(iter(module.train_dataloader()))
    wrapped = _WithLoss(module, list(batch))
    prefix = "m.model." if planned.startswith("`model`") else "m."
    with warnings.catch_warnings(), checkpointed(wrapped, [f"{prefix}{n}" for n in checkpoint]):
        warnings.simplefilter("ignore")
        fc = forecast(wrapped, tuple(batch.values()), budget=budget, backend=backend, loss_fn=lambda loss: loss,
                      optimizer=torch.optim.AdamW(module.parameters(), lr=1e-3))
    return fc.peak_bytes


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x / MiB:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(ZOO), choices=list(ZOO))
    ap.add_argument("--ways", nargs="+", default=list(WAYS), choices=list(WAYS))
    ap.add_argument("--backends", nargs="+", default=["aot_eager"], choices=["aot_eager", "inductor"])
    ap.add_argument("--plans", nargs="+", default=["1.0", "0.5", "auto"], help="budgets, or auto")
    ap.add_argument("--options", nargs="+", default=["plain"], choices=["plain", *OPTIONS],
                    help="how the user trains beside training_step (plain: nothing else)")
    args = ap.parse_args(argv)
    table = []
    for name in args.models:
        for way in args.ways:
            if ZOO[name][1] == "demo" and way == "loss":
                continue
            for backend, plan, option in itertools.product(args.backends, args.plans, args.options):
                try:
                    r = fit(name, way, backend, plan, option)
                except Exception as exc:  # noqa: BLE001 - the row says it failed; the others still run
                    print(f"{name} | {way} | {option} | {backend} | {plan} | failed: {type(exc).__name__}: {exc}",
                          flush=True)
                    continue
                peak = None
                if r["budget"] is not None and option == "plain":  # the peer forecasts the plain model
                    try:
                        peak = peer(name, backend, r["budget"], r["checkpoint"], r["planned"])
                    except Exception:  # noqa: BLE001 - the peer's row stays empty
                        peak = None
                peer_err = None if peak is None or not r["measured"] else (peak - r["measured"]) / r["measured"]
                table.append([name, way, option, backend, plan, r["planned"], r["chosen"], _mib(r["predicted"]),
                              _mib(r["measured"]), _pct(r["error"]), _mib(peak), _pct(peer_err),
                              f"{r['seconds']:.0f}"])
                print(" | ".join(map(str, table[-1])), flush=True)
    print(tabulate(table, headers=["model", "way", "option", "backend", "plan", "planned", "chosen", "predicted MiB",
                                   "measured MiB", "error", "forecast() MiB", "forecast() error", "fit s"],
                   tablefmt="github"))
    errors = [abs(float(row[9].rstrip("%"))) for row in table if row[9] != "-"]
    print(f"\n{len(errors)} of {len(table)} rows with a logged error; within 1%: {sum(e <= 1 for e in errors)}, "
          f"within 3%: {sum(e <= 3 for e in errors)}; largest |error| {max(errors, default=0):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
