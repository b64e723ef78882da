"""Paths that moved, importing again for a while: plugin API 1.1's module paths (``fd_platforms.types``,
...) until plugin API 2.0, and the FastDeploy modules and engine names that moved into
:mod:`fd_platforms.fastdeploy` (:data:`MOVED_MODULES`, :data:`MOVED_NAMES`) for one minor version.

API 1.1 told plugins to import from nine top-level modules. A later layout change moved them into
``contract/`` and ``kit/`` while the API stayed 1.x, so a plugin declaring ``>=1.0,<2`` passed the
version check and then failed at import; moving a module a plugin may import is a MAJOR change
unless the old path keeps working (:mod:`fd_platforms.contract.api_version`). Each of the nine paths
is an alias module again: importing it warns once (``DeprecationWarning``, pointing at the importing
line and naming the ``from fd_platforms.plugin import ...`` that replaces it) and gives a module
holding every public name the 1.1 module held, defined there or imported there from another
fd_platforms module (its logger aside), taken from where that name lives now.

Why an import hook and one table, rather than nine files: ``import fd_platforms`` must stay cheap,
and nine alias files would each be a module the layering contract (exhaustive) has to place and
the package ships, for paths no new code may use. Here :func:`install`, called by
``fd_platforms/__init__.py``, appends one finder to ``sys.meta_path`` (this module imports only the
standard library's ``sys``, ``types`` and ``typing``, already loaded, until an alias is imported; about
1 ms in all). The finder comes after Python's own, so it is asked only
about a module of the package that does not exist, and answers only for the nine names in
:data:`ALIASES`. An alias module holds the same objects as the new modules, so ``isinstance`` and
``except`` agree across the paths; assigning to an alias's attribute changes only the alias.
"""

from __future__ import annotations

import sys
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the import system takes any object with these methods; importlib.abc costs 11 ms to import
    from collections.abc import Callable
    from importlib.abc import Loader
else:
    Loader = object

PACKAGE = "fd_platforms"
REPLACEMENT = "fd_platforms.plugin"
REMOVED_IN = "2.0"

ALIASES: dict[str, tuple[str, dict[str, str]]] = {
    # alias: (the names fd_platforms.plugin has for it, {the module each name lives in now: names});
    # a name renamed since is written OLD=NEW
    "types": (
        "PlatformIdentity Detection CacheDecision DeviceMemory PlatformLimit Plan SharedTensor HostBuffer",
        {
            "fd_platforms.contract.types": "PlatformIdentity Detection DecidingTerm CacheDecision "
            "DeviceMemory LimitKind PlatformLimit Binding Plan SharedTensor SelectedHow PlatformStatus "
            "PlatformReport HostBuffer",
            "fd_platforms.contract.integers": "MAX_COUNT",
            "fd_platforms.contract.errors": "BufferInUseError RecordError",
        },
    ),
    "errors": (
        "ConfigError RecordError DeviceFactsUnavailableError HostAllocError CacheSharingError DeviceAllocError",
        {
            "fd_platforms.contract.errors": "FdPlatformsError MAX_SHOWN show_value ConfigError RecordError "
            "SelectionError UnknownPlatformError PlatformUnavailableError AmbiguousPlatformError "
            "DuplicatePlatformError PluginError PluginLoadError PluginHookError PluginTimeoutError "
            "PluginContractError PluginVersionError PlatformDriftError DeviceFactsUnavailableError "
            "HostAllocError BufferInUseError CacheSignalError CacheNotReadyError CacheSharingError "
            "CacheInUseError DeviceAllocError RunError",
        },
    ),
    "probes": (
        "RuntimeFacts installed_distribution device_nodes visible_count",
        {
            "fd_platforms.kit.probes": "installed_distribution device_nodes visible_count RuntimeFacts",
            "fd_platforms.contract.hookspecs": "hookimpl",
            "fd_platforms.contract.types": "Detection PlatformIdentity PlatformLimit",
        },
    ),
    "paddle_platform": (
        "PaddlePlatform",
        {
            "fd_platforms.kit.paddle_platform": "PaddlePlatform",
            "fd_platforms.kit.device_facts": "DeviceFacts",
            "fd_platforms.contract.paddle_import": "import_paddle",
            "fd_platforms.contract.errors": "ConfigError",
            "fd_platforms.contract.hookspecs": "hookimpl",
            "fd_platforms.kit.host_memory": "allocate_host",
            "fd_platforms.kit.probes": "RuntimeFacts",
            "fd_platforms.contract.types": "Detection DeviceMemory HostBuffer SharedTensor",
            "fd_platforms.kit.vendor_host": "VendorHostRuntime",
        },
    ),
    "device_facts": (
        "DeviceFacts PinningUnavailable pinned_tensor_buffer import_paddle share_ipc_tensor open_ipc_tensor",
        {
            "fd_platforms.kit.device_facts": "DeviceFacts OnDevice share_ipc_tensor open_ipc_tensor encode_handle "
            "decode_handle pinned_tensor_buffer",
            "fd_platforms.kit.host_memory": "PinningUnavailable",
            "fd_platforms.contract.paddle_import": "import_paddle",
            "fd_platforms.contract.errors": "CacheSharingError HostAllocError",
            "fd_platforms.contract.types": "Detection DeviceMemory HostBuffer SharedTensor",
        },
    ),
    "custom_device": (
        "CustomDeviceFacts",
        {
            "fd_platforms.kit.custom_device": "CustomDeviceFacts",
            "fd_platforms.kit.device_facts": "DeviceFacts",
            "fd_platforms.kit.host_memory": "PinningUnavailable",
            "fd_platforms.contract.types": "Detection DeviceMemory HostBuffer",
        },
    ),
    "vendor_host": (
        "VendorHostRuntime",
        {
            "fd_platforms.kit.vendor_host": "OUT_OF_MEMORY VendorHostRuntime",
            "fd_platforms.kit.host_memory": "PinningUnavailable",
            "fd_platforms.contract.errors": "HostAllocError",
            "fd_platforms.contract.types": "HostBuffer",
        },
    ),
    "host_memory": (
        "allocate_host allocate_pageable system_memory",
        {
            "fd_platforms.kit.host_memory": "check_host_nbytes allocate_pageable allocate_host system_memory "
            "available_host_bytes resident_bytes PinningUnavailable",
            "fd_platforms.contract.errors": "ConfigError HostAllocError",
            "fd_platforms.contract.integers": "MAX_BYTES=MAX_COUNT",
            "fd_platforms.contract.types": "DeviceMemory HostBuffer",
        },
    ),
    "host_sharing": (
        "export_host_tensor open_host_tensor",
        {
            "fd_platforms.kit.host_sharing": "MEMFD_NAME_MAX tensor_bytes export_host_tensor open_host_tensor",
            "fd_platforms.contract.paddle_import": "import_paddle",
            "fd_platforms.contract.errors": "BufferInUseError CacheSharingError DeviceAllocError",
            "fd_platforms.kit.host_memory": "available_host_bytes",
            "fd_platforms.contract.types": "DTYPE_BYTES SharedTensor",
            "fd_platforms.rules.sizes": "format_size",
        },
    ),
}
"""Each API 1.1 module path under ``fd_platforms``, with what replaces it and what it holds."""


def deprecation_message(path: str) -> str:
    """The warning an import of the alias ``path`` gives: what replaces it, and until when it works."""
    instead = ", ".join(ALIASES[path.rpartition(".")[2]][0].split())
    return (
        f"{path} is deprecated: plugin API 1.1's module path, which goes away in plugin API {REMOVED_IN}. "
        f"Import from {REPLACEMENT}, which holds every name a plugin may use: `from {REPLACEMENT} import {instead}`"
    )


MOVED_IN = "0.2"
MOVED_REMOVED_IN = "0.3"
MOVED_MODULES = {
    # old path: the module it is now (FastDeploy's code in one package, fd_platforms.fastdeploy)
    "fd_platforms.rules.fastdeploy_config": "fd_platforms.fastdeploy.config",
    "fd_platforms.rules.fastdeploy_values": "fd_platforms.fastdeploy.values",
    "fd_platforms.ipc.fastdeploy_signals": "fd_platforms.fastdeploy.signals",
    "fd_platforms.ipc.fault_words": "fd_platforms.fastdeploy.fault_words",
    "fd_platforms.engine.fastdeploy_records": "fd_platforms.fastdeploy.records",
    "fd_platforms.engine.fastdeploy_marks": "fd_platforms.fastdeploy.marks",
    "fd_platforms.engine.fastdeploy_handles": "fd_platforms.fastdeploy.handles",
    "fd_platforms.engine.protocols.fastdeploy": "fd_platforms.fastdeploy.protocol",
    "fd_platforms.engine.protocols.fastdeploy_rule": "fd_platforms.fastdeploy.rule",
    "fd_platforms.engine.block_handoff": "fd_platforms.fastdeploy.block_handoff",
    "fd_platforms.engine.cache_status": "fd_platforms.fastdeploy.cache_status",
    "fd_platforms.engine.cache_server": "fd_platforms.fastdeploy.cache_server",
    "fd_platforms.engine.weights_status": "fd_platforms.fastdeploy.weights_status",
}
MOVED_NAMES = {
    # module: {name it no longer holds: the public module that holds it now}
    "fd_platforms.engine": {
        **dict.fromkeys(
            (
                "ClearReport RestoreReport UpdateReport drive_kv_cache_clear drive_kv_cache_restore "
                "drive_kv_cache_update serve_kv_cache_status hand_off_block_count follow_model_weights_status"
            ).split(),
            "fd_platforms.fastdeploy",
        ),
        # left when its __all__ became the engines' whole API (at most 35 names): the module that has it
        "collective_backend": "fd_platforms.engine.cluster",
        "RankPlan": "fd_platforms.engine.cluster",
    },
    "fd_platforms.engine.protocols": {"FASTDEPLOY": "fd_platforms.fastdeploy"},
}


def moved_message(old: str, new: str) -> str:
    """The warning a use of the moved ``old`` gives, naming ``new``."""
    return (
        f"{old} is deprecated: it moved to {new} in fd-platforms {MOVED_IN} and the old path goes in "
        f"{MOVED_REMOVED_IN}. Import it from {new}"
    )


def moved_attribute(module: str, name: str) -> Any:
    """``module.name`` where ``name`` moved (:data:`MOVED_NAMES`), with a DeprecationWarning at its user; an
    AttributeError otherwise (a module's ``__getattr__``)."""
    home = MOVED_NAMES.get(module, {}).get(name)
    if home is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    import importlib
    import warnings

    # at the user's line: past this function and the module's __getattr__ that called it
    warnings.warn(moved_message(f"{module}.{name}", home), DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(home), name)


class AliasFinder:
    """A ``sys.meta_path`` finder that answers for the alias paths only (after Python's own finders)."""

    fd_platforms_aliases = True  # how install() recognizes one already in sys.meta_path

    @staticmethod
    def find_spec(fullname: str, path: object = None, target: object = None) -> Any:
        package, _, name = fullname.rpartition(".")
        if fullname in MOVED_MODULES:
            new = MOVED_MODULES[fullname]
            loader = AliasLoader(moved_message(fullname, new), lambda: _moved_names(new))
            origin = f"alias of {new}"
        elif package == PACKAGE and name in ALIASES:
            loader = AliasLoader(deprecation_message(fullname), lambda: _api_1_1_names(name))
            origin = f"alias of plugin API 1.1's {fullname}"
        else:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, loader, origin=origin)


class AliasLoader(Loader):
    """Fills an alias module with the names it stands for (``names()``: the names and the ``__all__``), after
    warning its importer with ``message``."""

    def __init__(self, message: str, names: Callable[[], tuple[dict[str, Any], list[str]]]) -> None:
        self.message, self.names = message, names

    @staticmethod
    def create_module(spec: object) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        warn_importer(self.message)
        names, public = self.names()
        vars(module).update(names)
        module.__doc__ = f"Deprecated alias: {self.message}."
        module.__dict__["__all__"] = public


def _api_1_1_names(name: str) -> tuple[dict[str, Any], list[str]]:
    """What plugin API 1.1's module ``name`` held, from the modules its names live in now."""
    import importlib

    names = {}
    for source, held in ALIASES[name][1].items():
        found = importlib.import_module(source)
        for entry in held.split():
            old, _, new = entry.partition("=")
            names[old] = getattr(found, new or old)
    return names, sorted(names)


def _moved_names(new: str) -> tuple[dict[str, Any], list[str]]:
    """Every name of the module at ``new``, and its ``__all__`` (else its public names)."""
    import importlib

    found = vars(importlib.import_module(new))
    names = {name: value for name, value in found.items() if not (name.startswith("__") and name.endswith("__"))}
    return names, list(found.get("__all__", [name for name in found if not name.startswith("_")]))


def warn_importer(message: str) -> None:
    """A DeprecationWarning located at the line that imported the alias, past the import machinery
    (``import x``, ``from x import y`` and ``importlib.import_module`` alike), so filters by module
    and the ``-W``/pytest reports name the plugin, not this file."""
    import warnings

    frame = importer_frame()
    if frame is None:
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return
    namespace = frame.f_globals
    warnings.warn_explicit(
        message,
        DeprecationWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=namespace.get("__name__", "<unknown>"),
        registry=namespace.setdefault("__warningregistry__", {}),
    )


def importer_frame() -> FrameType | None:
    """The first frame outside this module and importlib (whose frozen bootstrap frames carry the
    names ``importlib._bootstrap...``): the code that imported the alias."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module != __name__ and module != "importlib" and not module.startswith("importlib."):
            return frame
        frame = frame.f_back
    return None


def install() -> None:
    """Put the alias finder at the end of ``sys.meta_path``, once per process."""
    if not any(getattr(finder, "fd_platforms_aliases", False) for finder in sys.meta_path):
        sys.meta_path.append(AliasFinder())
