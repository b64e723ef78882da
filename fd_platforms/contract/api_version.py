"""The plugin API version and the check that refuses plugins written for another one.

The plugin API is the hook specs (:mod:`fd_platforms.contract.hookspecs`) and the records they pass
(:mod:`fd_platforms.contract.types`). Its version is ``MAJOR.MINOR``: a new optional hook or record field
raises MINOR; removing or changing a hook, a parameter or a record field raises MAJOR. A plugin
declares the versions it supports as a PEP 440 specifier (``">=1.0,<2"``) through its
``supported_api_versions`` hook.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable

from .errors import PluginContractError, PluginVersionError

API_VERSION = "1.4"
PLUGIN_API_MODULES = (
    "fd_platforms",  # hookimpl, API_VERSION
    "fd_platforms.contract.types",  # the records hooks return
    "fd_platforms.contract.errors",  # the errors hooks raise
    "fd_platforms.contract.paddle_import",  # import_paddle: paddle imported quietly, keeping the SIGTERM handler
    "fd_platforms.kit.probes",  # RuntimeFacts: identity and cheap detection from stated facts
    "fd_platforms.kit.paddle_platform",  # PaddlePlatform: a Paddle-driven device platform record
    "fd_platforms.kit.device_facts",  # DeviceFacts, pinned_tensor_buffer, share_ipc_tensor, open_ipc_tensor
    "fd_platforms.kit.custom_device",  # CustomDeviceFacts: Paddle custom devices
    "fd_platforms.kit.vendor_host",  # VendorHostRuntime: a vendor's pinned host allocator via ctypes
    "fd_platforms.kit.vendor_device",  # VendorDeviceRuntime: a vendor's device memory and IPC via ctypes (API 1.4)
    "fd_platforms.kit.host_memory",  # PinningUnavailable, allocate_host, allocate_pageable: the host-memory contract
    "fd_platforms.kit.host_sharing",  # export_host_tensor, open_host_tensor: cache tensors in memfds (API 1.1)
    "fd_platforms.kit.cache_shapes",  # tokens_before_heads, eight_bit_as_int8: kv_cache_shapes answers (API 1.2)
)
"""The modules a plugin may import; everything else in the core may change within an API version."""
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
    ">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt,
}  # fmt: skip


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
