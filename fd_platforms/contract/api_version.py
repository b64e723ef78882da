"""The plugin API version, its compatibility policy, and the check that refuses plugins written for another one.

The plugin API is the hook specs (:mod:`fd_platforms.contract.hookspecs`), the records they pass and the names
:mod:`fd_platforms.plugin` exports (``__all__``: everything a plugin may use, from that one module). Its version is
``MAJOR.MINOR``, and a plugin declares the versions it supports as a PEP 440 specifier (``">=1.0,<2"``) through its
``supported_api_versions`` hook; the core refuses a plugin whose range does not hold :data:`API_VERSION`.

What a 1.x release may do, so a plugin written for 1.0 loads and behaves the same under every later 1.x:

- **MINOR** grows with an addition a plugin written for the previous MINOR cannot notice: a new optional hook
  (the core's default answers for a plugin that lacks it), a new record field with a default, a new name in
  ``fd_platforms.plugin``.
- **MAJOR** grows when anything a plugin may already use changes or goes away: a hook, its name, a parameter
  or its meaning, a record field, a name of ``fd_platforms.plugin``, or the module itself. No 1.x release may
  rename, remove or move any of them, nor keep an old spelling beside a new one: a change of that kind waits
  for 2.0, and the CHANGELOG says what it was.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable

from .errors import PluginContractError, PluginVersionError

#: The plugin API this core provides: a plugin's ``supported_api_versions`` range must hold it.
API_VERSION = "1.0"
PLUGIN_API_MODULES = ("fd_platforms.plugin",)
"""The modules a plugin may import: one, whose ``__all__`` is the whole plugin API."""
API_MAJOR = API_VERSION.split(".")[0]
RECOMMENDED_RANGE = f">={API_VERSION},<{int(API_MAJOR) + 1}"


def check_api_compatibility(declared: object, plugin: str, distribution: str, core_version: str) -> None:
    """Refuse a plugin whose declared range does not contain :data:`API_VERSION`.

    Raises :class:`~fd_platforms.contract.errors.PluginContractError` for a declaration that is not a specifier
    string and :class:`~fd_platforms.contract.errors.PluginVersionError` naming both versions and the fix when the
    range excludes ours.
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
