"""``memplan demo``: the command-line face of :func:`lightning_memplan.demo.run_demo`."""
from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

from lightning_memplan.units import parse_bytes

SOLVERS = ("dp", "hirschberg", "greedy", "ilp", "remat")

# Every flag is checked here, while argparse reads it (exit code 2, the flag named), before the
# command imports torch and Lightning (half a minute on a small machine).


def _invalid(flag: str, text: str, expected: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"`{flag} {text}` is not valid. Expected {expected}.")


def _whole(flag: str) -> Callable[[str], int]:
    """A ``type=`` for a flag that takes a whole number >= 1."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise _invalid(flag, text, "a whole number >= 1")
        return value
    return parse


def _ratio(flag: str) -> Callable[[str], float]:
    """A ``type=`` for a flag that takes activation memory budgets, numbers in [0, 1]."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0.0 <= value <= 1.0:  # NaN fails too
            raise _invalid(flag, text, "a budget in [0, 1] (a fraction of the activation memory)")
        return value
    return parse


def _budget(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return _ratio("--budget")(text)
    except argparse.ArgumentTypeError:
        raise _invalid("--budget", text, "'auto' or a number in [0, 1]") from None


def _max_memory(text: str) -> str:
    """The byte size as given (the demo echoes it), once :func:`parse_bytes` accepts it."""
    try:
        parse_bytes(text, argument="--max-memory")
    except ValueError:
        raise _invalid("--max-memory", text, "a byte size such as 16MiB, 512MB or 1.5GiB, or a whole "
                       "number of bytes (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)") from None
    return text


def _out(text: str) -> Path:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise _invalid("--out", text, "a directory (created if missing), not an existing file")
    return path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` subcommand to the ``memplan`` parser; every flag is validated as it is parsed."""
    p = subparsers.add_parser(
        "demo", help="the main job: train a small GPT on shipped text with MemPlanCallback and report",
        description="Train a small character-level GPT on text shipped with the package, with "
                    "MemPlanCallback(budget='auto'); print the chosen plan, predicted vs measured peak "
                    "memory per epoch, and where the Pareto-front and memory-timeline PNGs are.")
    p.add_argument("--model-size", choices=("tiny", "small"), default="tiny",
                   help="tiny: 2 blocks x 64 wide (default); small: 4 blocks x 128 wide")
    p.add_argument("--budget", type=_budget, default="auto",
                   help="'auto' (search candidate plans; default) or an activation memory budget in [0, 1]")
    p.add_argument("--max-memory", type=_max_memory, default=None,
                   help="byte target for parameters + optimizer state + batch + step peak, e.g. 16MiB")
    p.add_argument("--solver", choices=SOLVERS, default="dp", help="solver: a knapsack solver or remat (default: dp)")
    p.add_argument("--epochs", type=_whole("--epochs"), default=2, help="training epochs (default: 2)")
    p.add_argument("--batches", type=_whole("--batches"), default=12, help="training batches per epoch (default: 12)")
    p.add_argument("--backend", choices=("inductor", "aot_eager"), default=None,
                   help="torch.compile backend (default: inductor on CUDA, aot_eager on CPU)")
    p.add_argument("--candidate-budgets", type=_ratio("--candidate-budgets"), nargs="+", default=None, metavar="B",
                   help="budgets the search tries with each checkpoint set (default: 1.0 0.3)")
    p.add_argument("--remat-budgets", type=_ratio("--remat-budgets"), nargs="*", default=None, metavar="B",
                   help="budgets of the whole-graph remat plans the search adds (default: 0.55 0.4 0.25; "
                        "none: give the flag alone)")
    p.add_argument("--out", type=_out, default=Path("memplan_out"),
                   help="directory for the logs and PNGs (default: ./memplan_out)")
    p.add_argument("--no-progress-bar", action="store_true", help="hide Lightning's progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo with the parsed flags; returns 0 (raises SystemExit on a bad option)."""
    if "torch" not in sys.modules:  # read once, when torch loads; a value the user set is kept
        # torch's C++ warnings off: the CPU peak meter's profiler warns of every block allocated before
        # it started, which it leaves out by design (it measures above the step's starting bytes)
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from lightning_memplan.demo.run import DEMO_BUDGETS, DemoOptions, run_demo
    from lightning_memplan.planner.search import DEFAULT_REMAT_BUDGETS

    try:
        options = DemoOptions(
            model_size=args.model_size, budget=args.budget, max_memory=args.max_memory,
            solver=args.solver, epochs=args.epochs, batches=args.batches, backend=args.backend,
            candidate_budgets=tuple(args.candidate_budgets or DEMO_BUDGETS), out=args.out,
            remat_budgets=DEFAULT_REMAT_BUDGETS if args.remat_budgets is None else tuple(args.remat_budgets),
            progress_bar=not args.no_progress_bar)
        run_demo(options)
    except ValueError as exc:
        raise SystemExit(f"memplan demo: {exc}") from None
    return 0
