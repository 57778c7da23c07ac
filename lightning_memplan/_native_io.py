"""Silence output that native libraries write straight to file descriptors 1 and 2.

HiGHS prints debug lines from C++ and the profiler (kineto) prints ``USDT ... profiler_start`` lines
at every start and stop; neither goes through Python's ``sys.stdout``, so only redirecting the file
descriptor hides them. Used around those calls only, never around user code; always restored.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Literal

__all__ = ["silence_native_output"]


@contextlib.contextmanager
def silence_native_output(*streams: Literal["stdout", "stderr"]) -> Iterator[None]:
    """Point the named streams' file descriptors at ``os.devnull`` for the duration (default both).

    A stream without a real file descriptor (e.g. captured by pytest) is left alone.
    """
    saved: list[tuple[int, int]] = []
    try:
        for name in streams or ("stdout", "stderr"):
            stream = getattr(sys, name)
            try:
                fd = stream.fileno()
            except (AttributeError, OSError, ValueError):
                continue
            stream.flush()
            saved.append((fd, os.dup(fd)))
            with open(os.devnull, "wb") as devnull:
                os.dup2(devnull.fileno(), fd)
        yield
    finally:
        for fd, copy in reversed(saved):
            os.dup2(copy, fd)
            os.close(copy)
