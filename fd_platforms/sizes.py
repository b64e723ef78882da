"""Byte sizes as people write them (``80GiB``, ``1.5GiB``, ``80GB``) and as tables show them."""

from __future__ import annotations

import re
from decimal import Decimal

from .errors import ConfigError

_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
MAX_BYTES = 2**63 - 1  # an int64 byte count: 8 EiB, beyond any machine; larger sizes are typos
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)
_ALLOWED = (
    "a non-negative byte count or a number with a unit: "
    "B, KB, MB, GB, TB (powers of 1000), KiB, MiB, GiB, TiB (powers of 1024), at most 8 EiB (2**63 - 1 bytes)"
)
_FIX = "write it like 80GiB, 81920MiB, 1.5GiB, 80GB or 1073741824"
_TABLE_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def parse_size(text: str | int, field: str) -> int:
    """Bytes in ``text``; units are case-insensitive, fractions round down to whole bytes.

    Raises ConfigError naming ``field`` for negative values, unknown units, sizes above
    :data:`MAX_BYTES` and anything else.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if not 0 <= text <= MAX_BYTES:
            raise ConfigError(field, text, _ALLOWED, _FIX)
        return text
    if not isinstance(text, str):
        raise ConfigError(field, text, _ALLOWED, _FIX)
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ConfigError(field, text, _ALLOWED, _FIX)
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower() or "b")
    if factor is None:
        raise ConfigError(field, text, _ALLOWED, f"unknown unit {unit!r}; {_FIX}")
    size = int(Decimal(number) * factor)
    if size > MAX_BYTES:
        raise ConfigError(field, text, _ALLOWED, _FIX)
    return size


def format_size(n: int) -> str:
    """``n`` bytes for a table: ``512 B`` below 1 KiB, else two decimals of the largest binary unit."""
    sign, magnitude = ("-" if n < 0 else ""), abs(n)
    for name, factor in _TABLE_UNITS:
        if magnitude >= factor:
            return f"{sign}{magnitude / factor:.2f} {name}"
    return f"{sign}{magnitude} B"
