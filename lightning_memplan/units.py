"""Byte sizes: parse user input such as ``"20GiB"`` and format bytes for tables."""
from __future__ import annotations

import math
import numbers
import re

__all__ = ["format_bytes", "parse_bytes"]

_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
_ALLOWED = "an int number of bytes, or a string like '20GiB' or '512MB' (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"


def parse_bytes(value: int | str, *, argument: str = "max_memory") -> int:
    """Bytes from an int (>= 0; any integer type, ``numpy.int64`` too, or a float with no
    fraction, ``20e9``) or a string with a unit (``"20GiB"``, ``"1.5 GB"``, ``"512MB"``).

    Decimal units (KB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, ...) powers of 1024;
    units are case-insensitive; a bare number is bytes. Fractions round down to whole bytes.

    Raises:
        ValueError: naming ``argument`` and showing the value, for anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"`{argument}={value!r}` is not a byte size. Expected {_ALLOWED}.")
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        if not (math.isfinite(value) and float(value).is_integer()):
            raise ValueError(f"`{argument}={value!r}` is not a byte size. Expected {_ALLOWED}.")
        value = int(value)
    if isinstance(value, numbers.Integral):
        if value < 0:
            raise ValueError(f"`{argument}={value!r}` is negative. Expected {_ALLOWED}.")
        return int(value)
    if isinstance(value, str):
        match = _PATTERN.match(value)
        if match:
            unit = match.group(2).lower() or "b"
            if unit in _UNITS:
                number = float(match.group(1))
                if math.isfinite(number):
                    return int(number * _UNITS[unit])
    raise ValueError(f"`{argument}={value!r}` is not a byte size. Expected {_ALLOWED}.")


def format_bytes(n: float | None) -> str:
    """``n`` bytes as a short binary-unit string (``"1.50 GiB"``); ``"-"`` for None."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            if unit == "B":
                return f"{sign}{n:.0f} B"
            return f"{sign}{n:.2f} {unit}"
        n /= 1024
    return f"{sign}{n:.2f} TiB"  # pragma: no cover - loop returns at GiB
