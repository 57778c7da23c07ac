"""The demo: a small GPT-style LightningModule, text shipped with the package, and ``run_demo``.

Also a ready-made model and data for the examples and benchmarks::

    from lightning_memplan.demo import GPT, make_dataloader
    loader, tok = make_dataloader(block_size=64, batch_size=16)
    model = GPT.from_size("tiny", tok.vocab_size)

Names load on first use, so ``memplan --help`` does not import torch.
"""
from __future__ import annotations

from typing import Any

__all__ = ["GPT", "MODEL_SIZES", "CharTokenizer", "DemoOptions", "DemoResult", "GPTConfig",
           "load_corpus", "make_dataloader", "run_demo"]

_LAZY = {
    "GPT": "model", "GPTConfig": "model", "MODEL_SIZES": "model",
    "CharTokenizer": "data", "load_corpus": "data", "make_dataloader": "data",
    "DemoOptions": "run", "DemoResult": "run", "run_demo": "run",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
