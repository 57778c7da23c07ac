from __future__ import annotations

import pytest

from lightning_memplan.units import format_bytes, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("20GiB", 20 * 2**30), ("20 GiB", 20 * 2**30), ("512MB", 512 * 10**6), ("1.5gb", 1_500_000_000),
        ("100", 100), ("0", 0), (4096, 4096), ("2KiB", 2048), ("1TB", 10**12), (".5MiB", 2**19),
    ],
)
def test_parse_bytes(text: int | str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["20 gigs", "GiB", "-5GB", "1e3MB", "", "nan GB", 3.5, None, True])
def test_parse_bytes_rejects_with_named_argument(bad: object) -> None:
    with pytest.raises(ValueError, match=r"`max_memory=.*` is not a byte size\. Expected an int number of bytes"):
        parse_bytes(bad)  # type: ignore[arg-type]


def test_parse_bytes_takes_any_integer_type_and_whole_floats() -> None:
    np = pytest.importorskip("numpy")
    assert parse_bytes(np.int64(2**33)) == 2**33 and type(parse_bytes(np.int64(5))) is int
    assert parse_bytes(20e9) == 20_000_000_000 and parse_bytes(np.float32(1024.0)) == 1024
    with pytest.raises(ValueError, match=r"`max_memory=inf` is not a byte size"):
        parse_bytes(float("inf"))


def test_parse_bytes_negative_int() -> None:
    with pytest.raises(ValueError, match=r"`limit=-1` is negative"):
        parse_bytes(-1, argument="limit")


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 2**20) == "3.00 MiB"
    assert format_bytes(-1536) == "-1.50 KiB"
    assert format_bytes(5 * 2**40) == "5120.00 GiB"
    assert format_bytes(None) == "-"
