"""LightningCLI with the callback configured in YAML (``lightning_cli.yaml`` next to this file).

    python examples/lightning_cli.py fit --config examples/lightning_cli.yaml
    python examples/lightning_cli.py fit --config examples/lightning_cli.yaml --fast

The callback is one entry of ``trainer.callbacks``::

    trainer:
      callbacks:
        - class_path: lightning_memplan.MemPlanCallback
          init_args: {budget: auto, max_memory: 64MiB, solver: dp}

Every ``MemPlanCallback`` argument can be set there or on the command line. Needs
``jsonargparse[signatures]`` (``pip install "lightning[pytorch-extra]"``).
"""
from __future__ import annotations

import os
import sys

from lightning.pytorch import LightningDataModule
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader

from lightning_memplan.demo import GPT, MODEL_SIZES, CharTokenizer, GPTConfig, load_corpus, make_dataloader

FAST_OVERRIDES = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=4",
                  "--trainer.enable_progress_bar=false", "--model.n_layer=2",
                  "--trainer.callbacks.init_args.candidate_budgets=[0.5]"]
"""What ``--fast`` (or ``MEMPLAN_FAST=1``) appends to the command line."""


class CharGPT(GPT):
    """The demo GPT with plain arguments (the vocabulary comes from the shipped text)."""

    def __init__(self, size: str = "tiny", n_layer: int = 3, lr: float = 3e-3) -> None:
        vocab = CharTokenizer.from_text(load_corpus()).vocab_size
        sizes = {**MODEL_SIZES[size], "n_layer": n_layer}
        super().__init__(GPTConfig(vocab_size=vocab, lr=lr, **sizes))


class CharData(LightningDataModule):
    """Windows of the shipped text, ``batch_size`` x ``block_size`` characters."""

    def __init__(self, block_size: int = 64, batch_size: int = 16) -> None:
        super().__init__()
        self.block_size, self.batch_size = block_size, batch_size

    def train_dataloader(self) -> DataLoader:
        return make_dataloader(self.block_size, self.batch_size)[0]


def cli_main(args: list[str] | None = None, *, run: bool = True) -> LightningCLI:
    """Build (and with ``run``, execute) the CLI; ``args`` default to ``sys.argv[1:]``."""
    argv = list(sys.argv[1:] if args is None else args)
    if "--fast" in argv or os.environ.get("MEMPLAN_FAST") == "1":
        argv = [a for a in argv if a != "--fast"] + (FAST_OVERRIDES if run else [])
    return LightningCLI(CharGPT, CharData, args=argv, run=run, save_config_kwargs={"overwrite": True})


if __name__ == "__main__":
    cli_main()
