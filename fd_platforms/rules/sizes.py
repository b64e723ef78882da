"""Byte sizes as people write them (``80GiB``, ``1.5GiB``, ``80GB``) and as tables show them."""

from __future__ import annotations

import difflib
import math
import re
from decimal import Decimal

from ..contract.errors import ConfigError
from ..contract.integers import MAX_COUNT, bound_text

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
_SPELLING = {unit: unit.upper().replace("I", "i") for unit in _UNITS}  # as written: KiB, KB
_DECIMAL = ("kb", "mb", "gb", "tb")
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)
_UNITS_TEXT = (
    "a number with a unit: B, KB, MB, GB, TB (powers of 1000), KiB, MiB, GiB, TiB (powers of 1024), "
    f"at most 8 EiB ({bound_text(MAX_COUNT)} bytes)"  # an int64 byte count, beyond any machine: larger is a typo
)
_ALLOWED = f"a non-negative byte count or {_UNITS_TEXT}"
_FIX = "write it like 80GiB, 81920MiB, 1.5GiB, 80GB or 1073741824"


def _fix(bare: str) -> str:
    """How to write a size, where a number alone counts in ``bare``."""
    return (
        _FIX
        if bare == "B"
        else f"write it like 80GiB, 81920MiB, 1.5GiB, 80GB or 85899345920B (a number alone is {bare})"
    )


_TABLE_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def parse_size(text: str | float, field: str, *, bare: str = "B") -> int:
    """Bytes in ``text``; units are case-insensitive, fractions round down to whole bytes.

    A number without a unit counts in ``bare`` (bytes by default; ``"GiB"`` for swap space, as
    FastDeploy's and vLLM's ``swap_space`` are GiB); only then may it be a float. Raises
    ConfigError naming ``field`` for negative values, unknown units (with what was likely meant),
    sizes above :data:`~fd_platforms.contract.integers.MAX_COUNT` and anything else.
    """
    bare_factor = _UNITS[bare.lower()]
    allowed = _ALLOWED if bare == "B" else f"{_UNITS_TEXT}; a number alone counts in {bare}"
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        # a float only where a bare number has a unit other than B, and finite; bounds compared before any conversion
        if (isinstance(text, float) and (bare == "B" or not math.isfinite(text))) or not 0 <= text <= MAX_COUNT:
            raise ConfigError(field, text, allowed, _fix(bare))
        number, unit = Decimal(repr(text)) if isinstance(text, float) else Decimal(text), ""
    elif isinstance(text, str) and (match := _SIZE.fullmatch(text)) is not None:
        number, unit = Decimal(match.group(1)), match.group(2)
    else:
        raise ConfigError(field, text, allowed, _fix(bare))
    factor = _UNITS.get(unit.lower()) if unit else bare_factor
    if factor is None:
        raise ConfigError(field, text, allowed, f"unknown unit {unit!r}; {_did_you_mean(number, unit, bare)}")
    size = int(number * factor)
    if size > MAX_COUNT:
        raise ConfigError(field, text, allowed, _fix(bare))
    return size


def _did_you_mean(number: Decimal, unit: str, bare: str) -> str:
    """What an unknown unit most likely meant (``80G``: 80GiB or 80GB)."""
    close = difflib.get_close_matches(unit.lower(), list(_UNITS), n=1, cutoff=0.75)  # a typo: GIiB, Gbi
    if close:
        return f"did you mean {number}{_SPELLING[close[0]]}?"
    letter = unit[:1].upper()
    if letter in "KMGT":  # a unit letter alone (80G) is ambiguous: name both meanings
        return f"did you mean {number}{letter}iB (powers of 1024) or {number}{letter}B (powers of 1000)?"
    return _fix(bare)


def decimal_note(text: object, nbytes: int) -> str | None:
    """For a size written in a decimal unit (``80GB``), one line with its binary value; else None."""
    match = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if match is None or match.group(2).lower() not in _DECIMAL:
        return None
    return (
        f"{match.string.strip()} is {nbytes} bytes (powers of 1000) = {format_size(nbytes)}; "
        f"write {match.group(1)}{match.group(2)[0].upper()}iB for powers of 1024"
    )


def format_size(n: int) -> str:
    """``n`` bytes for a table: ``512 B`` below 1 KiB, else two decimals of the largest binary unit."""
    sign, magnitude = ("-" if n < 0 else ""), abs(n)
    for name, factor in _TABLE_UNITS:
        if magnitude >= factor:
            return f"{sign}{magnitude / factor:.2f} {name}"
    return f"{sign}{magnitude} B"
