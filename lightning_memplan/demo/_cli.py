"""``memplan demo``: the command-line face of :func:`lightning_memplan.demo.run_demo`."""
from __future__ import annotations

import argparse
from pathlib import Path

SOLVERS = ("dp", "hirschberg", "greedy", "ilp", "remat")


def _budget(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budget {text!r}: expected 'auto' or a number in [0, 1]") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"--budget {text!r}: expected 'auto' or a number in [0, 1]")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` subcommand to the ``memplan`` parser."""
    p = subparsers.add_parser(
        "demo", help="the main job: train a small GPT on shipped text with MemPlanCallback and report",
        description="Train a small character-level GPT on text shipped with the package, with "
                    "MemPlanCallback(budget='auto'); print the chosen plan, predicted vs measured peak "
                    "memory per epoch, and where the Pareto-front and memory-timeline PNGs are.")
    p.add_argument("--model-size", choices=("tiny", "small"), default="tiny",
                   help="tiny: 2 blocks x 64 wide (default); small: 4 blocks x 128 wide")
    p.add_argument("--budget", type=_budget, default="auto",
                   help="'auto' (search candidate plans; default) or an activation memory budget in [0, 1]")
    p.add_argument("--max-memory", default=None,
                   help="byte target for parameters + optimizer state + batch + step peak, e.g. 16MiB")
    p.add_argument("--solver", choices=SOLVERS, default="dp", help="solver: a knapsack solver or remat (default: dp)")
    p.add_argument("--epochs", type=int, default=2, help="training epochs (default: 2)")
    p.add_argument("--batches", type=int, default=12, help="training batches per epoch (default: 12)")
    p.add_argument("--backend", choices=("inductor", "aot_eager"), default=None,
                   help="torch.compile backend (default: inductor on CUDA, aot_eager on CPU)")
    p.add_argument("--candidate-budgets", type=float, nargs="+", default=None, metavar="B",
                   help="budgets the search tries with each checkpoint set (default: 1.0 0.3)")
    p.add_argument("--remat-budgets", type=float, nargs="*", default=None, metavar="B",
                   help="budgets of the whole-graph remat plans the search adds (default: 0.55 0.4 0.25; "
                        "none: give the flag alone)")
    p.add_argument("--out", type=Path, default=Path("memplan_out"),
                   help="directory for the logs and PNGs (default: ./memplan_out)")
    p.add_argument("--no-progress-bar", action="store_true", help="hide Lightning's progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo with the parsed flags; returns 0 (raises SystemExit on a bad option)."""
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
