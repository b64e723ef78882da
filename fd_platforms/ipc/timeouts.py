"""Timeouts: how long the core waits for something, from an argument or an environment variable.

Every timeout is a finite number of seconds greater than 0 and at most :data:`MAX_SECONDS`
(7 days). Longer limits are hangs in all but name, and the operating system's waits do not take
them (``poll`` counts int32 milliseconds, about 24.8 days), so they are refused as configuration
errors instead of failing deep inside a wait. The one exception is a wait that may have no limit
at all, as FastDeploy's own waits have none (``unbounded=True``: the cache-ready wait's
``FD_CACHE_READY_TIMEOUT``): :data:`UNBOUNDED` (``inf``, ``math.inf`` as an argument) says so, in that
one spelling, and such a wait logs what it waits for every few seconds (:mod:`.waiting`).

A limit's error says what to raise: the environment variable it was read from, the caller's
``timeout`` argument, or the command-line flag that set it (:func:`set_by_flag`, e.g. ``run
--timeout``), so a message never sends a user to a knob that would not change anything.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from ..contract.errors import ConfigError

MAX_SECONDS = 7 * 24 * 3600  #: the longest finite bound a wait takes: 7 days
ALLOWED = f"a finite number of seconds > 0 and at most {MAX_SECONDS} (7 days)"
UNBOUNDED = "inf"  #: no limit: FD_CACHE_READY_TIMEOUT=inf, timeout=math.inf (float("inf"))
ALLOWED_UNBOUNDED = f"{ALLOWED}, or {UNBOUNDED} for no limit"


_flags: dict[str, str] = {}  # environment variable -> the command-line flag that set it in this process


def set_by_flag(variable: str, flag: str, seconds: float) -> None:
    """A command's ``flag`` sets the limit read from ``variable``: exported for this process and those
    it starts (their bounds follow the flag), and named by :func:`knob` in every timeout message."""
    os.environ[variable] = repr(seconds)
    _flags[variable] = flag


def knob(variable: str, *, argument: bool = False) -> str:
    """What to raise to lengthen a limit read from ``variable`` (``argument``: the caller passed it):
    the command's flag that set it, else the caller's ``timeout`` argument, else the variable."""
    if variable in _flags:
        return f"{_flags[variable]} (seconds)"
    return "the timeout argument (seconds)" if argument else f"{variable} (seconds)"


def check_seconds(field: str, value: object, fix: str, *, shown: object = None, unbounded: bool = False) -> float:
    """``value`` as float seconds (``unbounded``: also ``math.inf``, no limit), or a ConfigError naming
    ``field`` (showing ``shown`` if given)."""
    if unbounded and isinstance(value, float) and value == math.inf:
        return value
    # compared before any float(): a huge int cannot overflow here
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_SECONDS:
        return float(value)
    raise ConfigError(field, value if shown is None else shown, ALLOWED_UNBOUNDED if unbounded else ALLOWED, fix)


def env_seconds(
    variable: str,
    default: float,
    environ: Mapping[str, str] | None = None,
    *,
    unbounded: bool = False,
    fix: str | None = None,
) -> float:
    """Seconds from environment ``variable`` (unset or empty: ``default``; ``unbounded``: also
    :data:`UNBOUNDED`, spelled so, for ``math.inf``); a ConfigError naming it, with ``fix`` where the
    caller has its own (default: set the variable to seconds)."""
    raw = (os.environ if environ is None else environ).get(variable)
    if raw is None or raw.strip() == "":
        return default
    if unbounded and raw.strip() == UNBOUNDED:
        return math.inf
    if fix is None:
        example = int(default) if math.isfinite(default) else 60  # an unbounded default is no example of seconds
        fix = f"set {variable} to seconds, e.g. {variable}={example}"
        if unbounded:
            fix += f", or to {UNBOUNDED} for no limit"
    value = _number(raw)  # any other spelling of infinity ("Infinity", "1e999") is refused below
    return check_seconds(variable, value if math.isfinite(value) else math.nan, fix, shown=raw, unbounded=unbounded)


def env_bound(variable: str, default: float, environ: Mapping[str, str] | None = None) -> float | None:
    """A bound's seconds from environment ``variable`` as :func:`env_seconds` reads them, where ``0``
    turns the bound off (None); a ConfigError naming the variable and both choices otherwise."""
    raw = (os.environ if environ is None else environ).get(variable)
    if raw is None or raw.strip() == "":
        return default
    value = _number(raw)
    if value == 0:
        return None
    fix = f"set {variable} to seconds, e.g. {variable}={int(default)}, or to 0 for no bound"
    try:
        return check_seconds(variable, value, fix, shown=raw)
    except ConfigError:
        raise ConfigError(variable, raw, f"{ALLOWED}, or 0 for no bound", fix) from None


def _number(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        return math.nan
