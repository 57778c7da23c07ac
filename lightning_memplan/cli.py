"""The ``memplan`` command line: ``memplan demo | bench | place | estimate``.

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

    from lightning_memplan.demo import _cli as _demo_cli

    _demo_cli.register(sub)
    from lightning_memplan.planner import _estimate_cli

    _estimate_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``memplan`` console script; returns the process exit code."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
