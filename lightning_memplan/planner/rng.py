"""Planning leaves the random number generators as it found them.

A forecast compiles and runs the planned forward on the batch's own inputs; with dropout each run
draws from the generators. Planning on the first batch must not change what the user's training
draws (the first loss with a plan must equal the first loss of a plain ``torch.compile``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["rng_kept"]


@contextlib.contextmanager
def rng_kept() -> Iterator[None]:
    """Within the block, draw as you like: on exit (also on an exception) the CPU generator and,
    where CUDA is initialized, every CUDA device's generator are back in the state they had on entry."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    devices = list(range(torch.cuda.device_count())) if cuda else []
    with torch.random.fork_rng(devices=devices, enabled=True):
        yield
