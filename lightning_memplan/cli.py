"""The ``memplan`` command line: ``memplan demo | bench | place``.

Each subcommand lives next to the code it drives and registers itself here through a small
``register(subparsers)`` function, so this module stays a dispatcher.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memplan", description="Train under a memory limit without guessing."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    from lightning_memplan.bench import _cli as _bench_cli

    _bench_cli.register(sub)
    try:
        from lightning_memplan.placement import _cli as _place_cli
    except ImportError:  # pragma: no cover - placement not built yet
        pass
    else:
        _place_cli.register(sub)

    demo = sub.add_parser("demo", help="the main job: for now, the solver benchmark in its quick mode")
    demo.set_defaults(func=_run_demo)
    return parser


def _run_demo(args: argparse.Namespace) -> int:
    from lightning_memplan.bench import _cli as _bench_cli

    return _bench_cli.run(_bench_cli.quick_args())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``memplan`` console script; returns the process exit code."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
