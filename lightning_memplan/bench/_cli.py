"""``memplan bench``: the solver benchmark on the command line (see :mod:`.solvers` and :mod:`.knee`)."""
from __future__ import annotations

import argparse
import time

from tabulate import tabulate

DESCRIPTION = (
    "Benchmark the knapsack solvers behind activation checkpointing: ours (greedy, dp, hirschberg, "
    "ilp) against torch's four, on the same seeded instances (n items, memory normalized to sum 1, "
    "runtimes in FLOPs). Prints four tables: per (n, solver) the median time, the memory added, the "
    "optimality gap, budget violations, crashes and time-outs; one Pareto-frontier pass against the "
    "100 dp solves of torch's knee search; our dp against the memory-bandwidth floor; and the knee "
    "budget each side picks. torch's ilp runs in a separate process with a time-out."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` subcommand to the ``memplan`` parser (every option's help shows its default)."""
    p = subparsers.add_parser(
        "bench", help="knapsack solvers: ours vs torch's, side by side, on seeded instances",
        description=DESCRIPTION,
    )
    p.add_argument("--sizes", type=int, nargs="+", default=[50, 200, 1000, 3000], metavar="N",
                   help="numbers of items, one table row group each (default: 50 200 1000 3000)")
    p.add_argument("--seeds", type=int, default=3,
                   help="seeded instances per size (default: %(default)s)")
    p.add_argument("--budget", type=float, default=0.5,
                   help="memory budget, normalized units (items sum to 1) (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed repeats per call; the median is reported (default: %(default)s)")
    p.add_argument("--torch-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="seconds before torch's ilp_knapsack is reported as a time-out "
                        "(default: %(default)s)")
    p.add_argument("--frontier-n", type=int, default=300, metavar="N",
                   help="items of the instance the frontier and knee tables use (default: %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the three tables; returns 0."""
    from lightning_memplan.bench.solvers import (
        FLOOR_HEADERS,
        FRONTIER_HEADERS,
        SOLVER_HEADERS,
        floor_row,
        frontier_rows,
        solver_table,
    )

    if args.seeds < 1 or args.repeats < 1 or any(n < 1 for n in args.sizes):
        raise SystemExit(
            f"memplan bench: --seeds, --repeats and --sizes must be >= 1, got seeds={args.seeds!r}, "
            f"repeats={args.repeats!r}, sizes={args.sizes!r}"
        )
    t0 = time.perf_counter()
    print(f"Knapsack solvers, ours vs torch ({args.seeds} seeded instance(s) per size, "
          f"budget {args.budget}, median of {args.repeats}); gap = worst % below the best "
          "feasible plan; torch's ilp runs in a forked process with a time-out.", flush=True)
    rows = solver_table(args.sizes, list(range(args.seeds)), args.budget, args.repeats,
                        args.torch_timeout)
    print(tabulate(rows, headers=SOLVER_HEADERS, tablefmt="github"), flush=True)
    print()
    print(tabulate(frontier_rows(args.frontier_n, 0), headers=FRONTIER_HEADERS,
                   tablefmt="github"))
    print()
    n_floor = 1000 if 1000 in args.sizes else max(args.sizes)
    print(tabulate([floor_row(n_floor, 0, args.budget)], headers=FLOOR_HEADERS,
                   tablefmt="github"))
    print()
    from lightning_memplan.bench.knee import KNEE_HEADERS, knee_rows

    print(tabulate(knee_rows([args.frontier_n]), headers=KNEE_HEADERS, tablefmt="github"))
    print(f"\n(benchmark took {time.perf_counter() - t0:.0f} s)")
    return 0
