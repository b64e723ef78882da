"""FastDeploy's config values, each kind checked by one function: what :mod:`fd_platforms.fastdeploy.config` reads.

Each function takes the value as FastDeploy holds it and ``field``, the name the error gives it: FastDeploy's own
attribute (``fd_config.parallel_config.tensor_parallel_size``) or command-line flag (``--mp_num``). It returns the
value read, or raises a :class:`~fd_platforms.contract.errors.ConfigError` naming ``field``, the value, what is
allowed and ``fix``. Nothing is coerced: an integer is an ``int`` (not a bool, a float or text), text holds ASCII
digits only (``"²"`` and ``"٣"`` are digits to ``str.isdigit`` and ``int``, not to FastDeploy's shapes and ports),
a number is finite, an index is within its list (no index from the end).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..contract.errors import ConfigError
from ..contract.integers import INT32_MAX, MAX_COUNT, check_int, decimal, is_int
from ..contract.integers import check_positive as positive  # a positive number: the core's one check
from ..rules.config.limits import MAX_WIDTH

MAX_PORT = 65_535
SUFFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
"""A signal suffix as FastDeploy's names allow it (its engine's port, a run's ``fdp<pid>-<hex>``): the one pattern,
which ``fd_platforms.fastdeploy.signals.check_suffix`` uses too."""


def integer(field: str, value: object, minimum: int, maximum: int, fix: str, *, note: str = "") -> int:
    """An int (not a bool, a float or text) from ``minimum`` to ``maximum`` (``note`` says why, where it is not
    the value's own bound)."""
    return check_int(field, value, minimum, maximum, fix=fix, what="an integer (not a bool, float or text)", note=note)


def _listed_integer(field: str, value: object, allowed: str, bounds: tuple[int, int], fix: str, entry: object) -> int:
    """``entry`` of a list ``value`` FastDeploy writes as text (``"4,5"``, ``"900,2,64,128"``) or holds as a Python
    list: ASCII digits, or an int in a list, within ``bounds``; else the error for the whole ``value``."""
    number = decimal(entry.strip()) if isinstance(entry, str) else entry
    if is_int(number) and bounds[0] <= number <= bounds[1]:
        return number
    raise ConfigError(field, value, allowed, fix)


def port(field: str, value: object, fix: str) -> int:
    """A TCP port FastDeploy listens on (its ``engine_worker_queue_port``, which suffixes its signals)."""
    return integer(field, value, 1, MAX_PORT, fix)


def ports(field: str, value: object, fix: str) -> tuple[int, ...]:
    """A port list in any form FastDeploy's ``parse_ports`` takes (``fastdeploy/utils.py``): one int, text
    ``"8002,8003"``, or a list; not empty, each entry a port."""
    allowed = f"one port or more, each from 1 to {MAX_PORT}: an int, ASCII-digit text such as '8002,8003', or a list"
    if is_int(value):
        entries: Sequence[object] = [value]
    elif isinstance(value, str):
        entries = value.split(",")
    elif isinstance(value, (list, tuple)):
        entries = value
    else:
        entries = []
    if not entries:
        raise ConfigError(field, value, allowed, fix)
    return tuple(_listed_integer(field, value, allowed, (1, MAX_PORT), fix, entry) for entry in entries)


def index(field: str, value: object, listed: Sequence[object], of: str, fix: str) -> int:
    """An index into ``listed`` (named ``of``): from 0 to its last entry, never from its end."""
    return check_int(
        field,
        value,
        0,
        len(listed) - 1,
        note=f"{of} has {len(listed)}: {list(listed)}",
        fix=fix,
        what="an index (not a bool, float or text)",
    )


def device_ids(field: str, value: object, fix: str) -> tuple[int, ...]:
    """A device list as FastDeploy's ``parallel_config.device_ids`` holds it: text of indices, ``"4,5"``
    (its ``CUDA_VISIBLE_DEVICES``; ``fastdeploy/config.py`` ``FDConfig.__init__``)."""
    entry = "comma-separated device indices as text (4,5), not UUIDs: FastDeploy names a rank's tensors with them"
    if not isinstance(value, str):
        raise ConfigError(field, value, entry, fix)
    return tuple(_listed_integer(field, value, entry, (0, INT32_MAX), fix, part) for part in value.split(","))


def shape(field: str, value: object, fix: str) -> tuple[int, ...]:
    """A cache shape as FastDeploy's ``launch_cache_manager`` writes it: ``blocks,heads,block_size,head_dim``."""
    allowed = f"four whole numbers in ASCII digits, blocks,kv_heads,block_size,head_dim, from 1 ({MAX_WIDTH} at most "
    allowed += "but the blocks)"
    parts = value.split(",") if isinstance(value, str) else []
    if len(parts) != 4:
        raise ConfigError(field, value, allowed, fix)
    bounds = [(1, MAX_COUNT), (1, MAX_WIDTH), (1, MAX_WIDTH), (1, MAX_WIDTH)]
    return tuple(
        _listed_integer(field, value, allowed, limit, fix, part) for limit, part in zip(bounds, parts, strict=True)
    )


def one_of(field: str, value: object, choices: Sequence[str], fix: str) -> str:
    """``value`` if it is one of ``choices`` exactly (FastDeploy compares its words as they are written)."""
    if isinstance(value, str) and value in choices:
        return value
    raise ConfigError(field, value, f"one of {', '.join(choices)}", fix)


def optional_one_of(field: str, value: object, choices: Sequence[str], fix: str) -> str | None:
    """None (FastDeploy's "not set"), else one of ``choices`` exactly."""
    if value is None:
        return None
    if isinstance(value, str) and value in choices:
        return value
    raise ConfigError(field, value, f"one of {', '.join(choices)} or None", fix)


def suffix(field: str, value: object, fix: str) -> str:
    """A signal suffix as FastDeploy passes one as text (``--ipc_suffix``): letters, digits, '_' and '-'."""
    if isinstance(value, str) and SUFFIX.fullmatch(value):
        return value
    raise ConfigError(field, value, "letters, digits, '_' and '-', at most 64, starting with a letter or digit", fix)


def text(field: str, value: object, fix: str) -> str:
    """Text that is not empty (a path, a name)."""
    if isinstance(value, str) and value.strip():
        return value
    raise ConfigError(field, value, "non-empty text", fix)


__all__ = [
    "MAX_PORT",
    "SUFFIX",
    "device_ids",
    "index",
    "integer",
    "one_of",
    "optional_one_of",
    "port",
    "ports",
    "positive",
    "shape",
    "suffix",
    "text",
]
