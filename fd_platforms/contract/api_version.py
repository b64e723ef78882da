"""The plugin API version, its compatibility policy, and the check that refuses plugins written for another one.

The plugin API is the hook specs (:mod:`fd_platforms.contract.hookspecs`), the records they pass,
the names :mod:`fd_platforms.plugin` exports (``__all__``: everything a plugin may use) and the
module paths a plugin imports them from. Its version is ``MAJOR.MINOR``, and a plugin declares the
versions it supports as a PEP 440 specifier (``">=1.5,<2"``) through its ``supported_api_versions``
hook; the core refuses a plugin whose range does not hold :data:`API_VERSION`.

- **MINOR** grows with an addition a plugin written for the previous MINOR cannot notice: a new
  optional hook, a new record field with a default, a new name in ``fd_platforms.plugin``, a new
  module (1.1 the sharing hooks, 1.2 ``kv_cache_shapes``, 1.3 ``release_device_memory``, 1.4
  ``VendorDeviceRuntime``, 1.5 ``fd_platforms.plugin`` itself, 1.6 ``RocmFacts``).
- **MAJOR** grows when anything a plugin may already use changes or goes away: a hook, a parameter,
  a record field, a name of ``fd_platforms.plugin``, and a module path a plugin may import.
  Removing or moving such a module is MAJOR, unless an alias keeps the old path importing the same
  names, with a ``DeprecationWarning`` naming the new import, until the next MAJOR; only then may
  the old path go.

Plugin API 1.5 moved the API into one module. The paths plugins imported before
(:data:`DEPRECATED_PLUGIN_MODULES`) keep working until 2.0: API 1.1's top-level modules
(``fd_platforms.types`` ...), which an earlier layout change had removed within 1.x, are aliases
again (:mod:`fd_platforms.aliases`), and the 1.2 to 1.4 paths are the core's own modules, which
keep their paths until then.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable

from .errors import PluginContractError, PluginVersionError

API_VERSION = "1.6"
PLUGIN_API_MODULES = ("fd_platforms.plugin",)
"""The modules a plugin may import: since API 1.5 one, whose ``__all__`` is the whole plugin API."""
DEPRECATED_PLUGIN_MODULES = {
    # API 1.0 and 1.1: aliases built by fd_platforms.aliases, warning at import (DeprecationWarning)
    "fd_platforms.types": "alias",
    "fd_platforms.errors": "alias",
    "fd_platforms.probes": "alias",
    "fd_platforms.paddle_platform": "alias",
    "fd_platforms.device_facts": "alias",
    "fd_platforms.custom_device": "alias",
    "fd_platforms.vendor_host": "alias",
    "fd_platforms.host_memory": "alias",
    "fd_platforms.host_sharing": "alias",
    # API 1.0 to 1.4: the core's own modules at these paths, kept without a warning (the core imports them)
    "fd_platforms": "kept",  # hookimpl, API_VERSION
    "fd_platforms.contract.types": "kept",
    "fd_platforms.contract.errors": "kept",
    "fd_platforms.contract.paddle_import": "kept",
    "fd_platforms.kit.probes": "kept",
    "fd_platforms.kit.paddle_platform": "kept",
    "fd_platforms.kit.device_facts": "kept",
    "fd_platforms.kit.custom_device": "kept",
    "fd_platforms.kit.vendor_host": "kept",
    "fd_platforms.kit.vendor_device": "kept",
    "fd_platforms.kit.host_memory": "kept",
    "fd_platforms.kit.host_sharing": "kept",
    "fd_platforms.kit.cache_shapes": "kept",
}
"""The module paths plugins imported before API 1.5, each importing until API 2.0: ``"alias"`` for
API 1.1's, which warn and name the import from ``fd_platforms.plugin``, ``"kept"`` for the core's
own modules that API 1.2 to 1.4 listed. New plugins import :data:`PLUGIN_API_MODULES` only."""
API_MAJOR = API_VERSION.split(".")[0]
RECOMMENDED_RANGE = f">={API_VERSION},<{int(API_MAJOR) + 1}"


def check_api_compatibility(declared: object, plugin: str, distribution: str, core_version: str) -> None:
    """Refuse a plugin whose declared range does not contain :data:`API_VERSION`.

    Raises :class:`PluginContractError` for a declaration that is not a specifier string and
    :class:`PluginVersionError` naming both versions and the fix when the range excludes ours.
    """
    if not isinstance(declared, str) or not declared.strip():
        raise PluginContractError(
            plugin,
            distribution,
            f"supported_api_versions returned {declared!r}; it must be a PEP 440 version specifier string. "
            f"Fix: return {RECOMMENDED_RANGE!r} for a plugin written against API {API_VERSION}",
        )
    holds = release_range_contains(declared, API_VERSION)
    if holds is None:  # any other PEP 440 form: packaging decides (importing it costs ~25 ms of start-up)
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            holds = SpecifierSet(declared).contains(API_VERSION, prereleases=True)
        except InvalidSpecifier:
            raise PluginContractError(
                plugin,
                distribution,
                f"supported_api_versions returned {declared!r}, which is not a PEP 440 version specifier. "
                f"Fix: return a range such as {RECOMMENDED_RANGE!r}",
            ) from None
    if not holds:
        raise PluginVersionError(
            plugin,
            distribution,
            f"it supports fd-platforms plugin API {declared}, but the installed fd-platforms {core_version} "
            f"provides plugin API {API_VERSION}. Fix: install a release of {distribution} that supports API "
            f"{API_VERSION}, or an fd-platforms release whose plugin API is in {declared}",
        )


_CLAUSE = re.compile(r"\s*(>=|<=|==|!=|<|>)\s*(\d+(?:\.\d+)*)\s*")
_COMPARE: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
}


def release_range_contains(declared: str, version: str) -> bool | None:
    """Whether ``declared`` holds the release ``version``, for the form plugins declare: clauses of
    ``>= <= == != < >`` and a plain release number (``>=1.0,<2``). None for any other form, which
    packaging then decides. For a release version, PEP 440 compares these clauses as release
    tuples padded with zeros; a test holds this equal to packaging's answer."""
    ours = tuple(int(part) for part in version.split("."))
    holds = True
    for clause in declared.split(","):
        match = _CLAUSE.fullmatch(clause)
        if match is None:
            return None
        theirs = tuple(int(part) for part in match.group(2).split("."))
        width = max(len(ours), len(theirs))
        padded = (ours + (0,) * (width - len(ours)), theirs + (0,) * (width - len(theirs)))
        holds = holds and _COMPARE[match.group(1)](*padded)
    return holds
