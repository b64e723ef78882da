"""Integer arguments and record fields: the one check, and the general limits it checks against; and the one
check of a positive real number (a fraction or a ratio: :func:`check_positive`).

An integer here is an ``int`` that is not a ``bool`` (Python counts ``True`` as the int 1; no count,
id or index of ours is a bool). :func:`check_int` refuses anything else, or an integer out of its
range, with the typed error of :mod:`~fd_platforms.contract.errors`: a
:class:`~fd_platforms.contract.errors.ConfigError` for a caller's argument or a config field (the
config loaders add the file as ``source``), a :class:`~fd_platforms.contract.errors.RecordError` for
a field of a record. Each names the field, the value, what is allowed and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeGuard

from .errors import ConfigError, RecordError

MAX_COUNT = 2**63 - 1  #: bytes, blocks and elements are int64 counts
INT32_MAX = 2**31 - 1  # device ids and device-string indices, int32 words (FastDeploy's, a futex's)


_DECIMAL = re.compile(r"[0-9]{1,19}")  # ASCII only; 19 digits hold every int64 count


def decimal(text: str, maximum: int = 2**63 - 1) -> int | None:
    """The count ``text`` writes in ASCII digits, at most ``maximum``, else None: ``str.isdigit`` also takes ``"²"``
    and ``"٣"``, which ``int`` then refuses or reads as another number. Every digit string read from outside goes
    here."""
    number = int(text) if _DECIMAL.fullmatch(text) else None
    return number if number is not None and number <= maximum else None


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an int and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_shape(value: object, *, lists: bool = False) -> TypeGuard[Sequence[int]]:
    """Whether ``value`` is a non-empty tuple (or list, with ``lists``) of integers from 1 to :data:`MAX_COUNT`:
    a tensor's shape (:data:`SHAPE_ALLOWED` says so in a message)."""
    kinds = (tuple, list) if lists else (tuple,)
    return isinstance(value, kinds) and bool(value) and all(is_int(axis) and 0 < axis <= MAX_COUNT for axis in value)


def bound_text(bound: int) -> str:
    """``bound`` as a message writes it: ``2**63 - 1`` for one below a power of two from ``2**31``
    on (``-(2**63 - 1)`` below zero), else its digits."""
    size = abs(bound)
    if size.bit_length() < 31 or size & (size + 1):
        return str(bound)
    text = f"2**{size.bit_length()} - 1"
    return text if bound > 0 else f"-({text})"


def check_int(
    field: str,
    value: object,
    minimum: int,
    maximum: int | None = MAX_COUNT,
    *,
    fix: str = "",
    what: str = "an integer",
    note: str = "",
    record: str | None = None,
) -> int:
    """``value`` if it is an integer from ``minimum`` to ``maximum`` (None: no upper bound), else the error.

    What is allowed reads ``{what} from {minimum} to {maximum} ({note})``, or ``{what} >= {minimum}``
    (an empty ``what``: the range alone). The error is a RecordError for field ``field`` of the record
    named ``record`` (whose fix is RecordError's own), else a ConfigError naming ``field`` with ``fix``
    (by default: set it to a whole number in that range).
    """
    if is_int(value) and minimum <= value and (maximum is None or value <= maximum):
        return value
    span = f"{bound_text(minimum)} to {bound_text(maximum)}" if maximum is not None else f">= {minimum}"
    allowed = f"{what} {'from ' if maximum is not None else ''}{span}" if what else span
    if note:
        allowed += f" ({note})"
    if record is not None:
        raise RecordError(record, field, value, allowed)
    raise ConfigError(field, value, allowed, fix or f"set {field} to a whole number in that range")


def check_positive(field: str, value: object, maximum: float, fix: str) -> float:
    """``value`` as a float if it is a finite int or float (not a bool or text) greater than 0 and at most
    ``maximum``, else a ConfigError naming ``field`` with ``fix``."""
    if (is_int(value) or isinstance(value, float)) and 0 < value <= maximum:  # NaN and infinity fail the range
        return float(value)
    raise ConfigError(field, value, f"a number greater than 0 and at most {maximum:g} (not a bool or text)", fix)


SHAPE_ALLOWED = f"a non-empty tuple of integers from 1 to {bound_text(MAX_COUNT)}"
"""What :func:`is_shape` allows, as an error message says it."""
