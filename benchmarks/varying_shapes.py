"""MemPlanCallback on batches of varying length: each batch judged against the forecast at its shapes.

The demo GPT (4 blocks, d=128, vocabulary 65) trains on batches of 16 random token sequences whose
length varies from batch to batch (dynamic padding, as a length-bucketing sampler gives), budget 0.5,
one ``Trainer.fit`` of 3 epochs on the CPU with every batch measured (but the first, which plans,
and the first of each new length, which measures the loss at it, and warm-ups of the profiler). The loss is a cross-entropy
in ``training_step``. For each length: the measured peak (bytes
above the batch's start; the median of its batches), our forecast at that length
(``forecast_new_shapes=True``, the default) and its error. The named peer is what the callback
logs with ``forecast_new_shapes=False`` (as it did before): every batch judged by the forecast made
at the first batch's shapes, the plan's (``tests/callback/test_callback.py`` checks that this is what
it logs), here from the same fit.

    python benchmarks/varying_shapes.py                          # lengths 16 48 24 64 32, aot_eager
    python benchmarks/varying_shapes.py --lengths 16 46 24 55 33 64 42 20 50 29 59 37   # past recompile_limit
    python benchmarks/varying_shapes.py --lengths 32 16 64 --backend inductor
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightning.pytorch import Trainer  # noqa: E402
from tabulate import tabulate  # noqa: E402

from lightning_memplan import MemPlanCallback  # noqa: E402
from lightning_memplan.demo.model import GPT, MODEL_SIZES, GPTConfig  # noqa: E402

MiB = 2**20
VOCAB = 65


class VaryingGPT(GPT):
    """The demo GPT (its training_step: a cross-entropy on the logits) on batches of ``lengths``."""

    def __init__(self, lengths: list[int]) -> None:
        super().__init__(GPTConfig(vocab_size=VOCAB, **{**MODEL_SIZES["tiny"], "n_layer": 4, "n_embd": 128,
                                                        "block_size": max(lengths)}))
        self.lengths = lengths

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        batches = []
        for length in self.lengths:
            ids = torch.randint(0, VOCAB, (16, length + 1), generator=g)
            batches.append((ids[:, :-1], ids[:, 1:]))
        return DataLoader(batches, batch_size=None)


def fit(lengths: list[int], backend: str) -> tuple[dict[int, tuple[float, float]], float]:
    """One fit; per sequence length, (median measured peak, our forecast for its shapes), and the
    forecast at the first batch's shapes (the peer's prediction for every batch), bytes."""
    torch.manual_seed(0)
    cb = MemPlanCallback(0.5, backend=backend, measure_batches=10 * len(lengths),  # type: ignore[arg-type]
                         verbose=False, log_plots=False)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(max_epochs=3, callbacks=[cb], logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                          default_root_dir=tmp)
        trainer.fit(VaryingGPT(lengths))
    planned = float(cb.plan.predicted_peak_bytes)
    seen: dict[int, list[int]] = {}
    predicted: dict[int, float] = {}
    for peaks, shapes in zip(cb.measured, cb.measured_shapes):
        for peak, sig in zip(peaks, shapes):
            length = sig[0][0][1]
            seen.setdefault(length, []).append(peak)
            forecast = planned if sig == cb.planned_signature else cb.shape_forecasts.get(sig)
            predicted[length] = math.nan if forecast is None else float(forecast)
    return {n: (statistics.median(v), predicted[n]) for n, v in seen.items()}, planned


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[16, 48, 24, 64, 32])
    ap.add_argument("--backend", default="aot_eager", choices=["aot_eager", "inductor"])
    args = ap.parse_args(argv)
    ours, planned = fit(args.lengths, args.backend)
    rows = []
    for n in sorted(ours):
        measured, predicted = ours[n]
        ok = not math.isnan(predicted)  # no forecast: past dynamo's recompile_limit, it ran uncompiled
        rows.append([n, f"{measured / MiB:.2f}", f"{predicted / MiB:.2f}" if ok else "- (ran uncompiled)",
                     f"{predicted / measured - 1:+.2%}" if ok else "-",
                     f"{planned / MiB:.2f}", f"{planned / measured - 1:+.2%}"])
    print(tabulate(rows, headers=["length", "measured MiB", "predicted MiB", "error",
                                  "peer: first batch's forecast MiB", "peer error"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
