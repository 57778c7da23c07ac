"""MemPlanCallback's forecast of a Lightning step whose loss is computed eagerly in ``training_step``.

A small language model (embedding, 2 transformer encoder layers d=128 with dropout, a linear head
over the vocabulary; batch 16 x 64 tokens, SGD with momentum) computes ``F.cross_entropy`` on its
logits in ``training_step``, outside the compiled forward. Four kinds of step:

- ``loss``: the loss alone;
- ``metric``: also a torchmetrics ``MulticlassAccuracy`` updated on the logits (its update makes a
  bincount of vocabulary**2 int64 bins between the forward and the backward);
- ``manual``: manual optimization (``zero_grad``, ``manual_backward``, ``step`` in training_step);
- ``two_calls``: the forward called twice per step (the sequence and the sequence shifted by one
  token), each call with its own loss;
- ``in_model``: the loss computed inside the forward after a graph break, returned beside the
  logits (Hugging Face's ``model(ids, labels=ids)``; its loss function breaks the graph).

For each kind, vocabulary size and backend one ``Trainer.fit`` of 2 epochs (CPU, budget 0.5)
reports the prediction error of the last epoch. The named peer is the same fit with the eager-code
measurement switched off: the forecast of the compiled graphs alone, as it was before the eager
code was measured (``lightning_memplan.forecasting.eager_loss``).

    python benchmarks/eager_loss.py                       # aot_eager, vocabularies 500, 8000, every kind
    python benchmarks/eager_loss.py --vocabs 8000 32000 --steps loss --backends aot_eager inductor
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightning.pytorch import LightningModule, Trainer  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from tabulate import tabulate  # noqa: E402

import lightning_memplan.callback.first_batch as callback_mod  # noqa: E402
from lightning_memplan import MemPlanCallback  # noqa: E402

MiB = 2**20
STEPS = ("loss", "metric", "manual", "two_calls", "in_model")


class LM(LightningModule):
    """Next-token prediction; the loss on the logits is computed eagerly in training_step."""

    def __init__(self, vocab: int, step: str = "loss", d: int = 128, seq: int = 64, batch: int = 16) -> None:
        super().__init__()
        self.step = step
        self.automatic_optimization = step != "manual"
        if step == "metric":
            from torchmetrics.classification import MulticlassAccuracy

            self.acc = MulticlassAccuracy(num_classes=vocab)
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(d, vocab)
        self.vocab, self.seq, self.batch = vocab, seq, batch

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        logits = self.out(self.enc(self.emb(ids)))
        if labels is None:
            return logits
        torch._dynamo.graph_break()
        return logits, nn.functional.cross_entropy(logits.reshape(-1, self.vocab), labels.reshape(-1))

    def _loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(inputs).reshape(-1, self.vocab)
        if self.step == "metric":
            self.acc(logits, targets.reshape(-1))
            self.log("train_acc", self.acc)
        return nn.functional.cross_entropy(logits, targets.reshape(-1))

    def training_step(self, batch: tuple[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (ids,) = batch
        if self.step == "in_model":
            return self(ids[:, :-1], ids[:, 1:])[1]
        if self.step == "two_calls":
            return self._loss(ids[:, :-1], ids[:, 1:]) + self._loss(ids[:, 1:], ids[:, :-1])
        if self.step != "manual":
            return self._loss(ids[:, :-1], ids[:, 1:])
        opt = self.optimizers()
        opt.zero_grad()
        loss = self._loss(ids[:, :-1], ids[:, 1:])
        self.manual_backward(loss)
        opt.step()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, self.vocab, (self.batch * 4, self.seq + 1), generator=g)
        return DataLoader(TensorDataset(ids), batch_size=self.batch)


@contextlib.contextmanager
def _unmeasured() -> Iterator[None]:
    """The peer: the callback as it was before the eager code was measured."""
    original = callback_mod.measure_eager_losses

    def off(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("eager-loss measurement switched off (peer)")

    callback_mod.measure_eager_losses = off  # type: ignore[assignment]
    try:
        yield
    finally:
        callback_mod.measure_eager_losses = original  # type: ignore[assignment]


def fit(vocab: int, step: str, backend: str, measured_loss: bool) -> dict[str, float]:
    """One fit; the last logged epoch's predicted and measured peaks (bytes above the baseline)."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cb = MemPlanCallback(0.5, backend=backend, verbose=False, log_plots=False)  # type: ignore[arg-type]
        trainer = Trainer(max_epochs=2, callbacks=[cb], logger=CSVLogger(tmp), enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
        with contextlib.nullcontext() if measured_loss else _unmeasured():
            trainer.fit(LM(vocab, step))
        rows = [r for r in csv.DictReader(open(Path(trainer.logger.log_dir) / "metrics.csv"))
                if r.get("memplan/budget")]
    last = rows[-1]
    return {"predicted": float(last["memplan/predicted_peak_bytes"]),
            "measured": float(last["memplan/measured_peak_bytes"])}


def _row(vocab: int, step: str, backend: str) -> list[Any]:
    ours = fit(vocab, step, backend, measured_loss=True)
    peer = fit(vocab, step, backend, measured_loss=False)
    logits = 16 * 64 * vocab * 4
    return [step, vocab, backend, f"{logits / MiB:.2f}", f"{ours['measured'] / MiB:.2f}",
            f"{ours['predicted'] / MiB:.2f}", f"{ours['predicted'] / ours['measured'] - 1:+.2%}",
            f"{peer['predicted'] / MiB:.2f}", f"{peer['predicted'] / peer['measured'] - 1:+.2%}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocabs", type=int, nargs="+", default=[500, 8000])
    ap.add_argument("--steps", nargs="+", default=list(STEPS), choices=list(STEPS))
    ap.add_argument("--backends", nargs="+", default=["aot_eager"], choices=["aot_eager", "inductor"])
    args = ap.parse_args(argv)
    rows = []
    for backend in args.backends:
        for step in args.steps:
            for vocab in args.vocabs:
                rows.append(_row(vocab, step, backend))
                print(rows[-1], flush=True)
    print(tabulate(rows, headers=["step", "vocab", "backend", "logits MiB", "measured MiB", "predicted MiB", "error",
                                  "peer: compiled graphs alone MiB", "peer error"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
