"""Every error an engine may meet, in one module: ``from fd_platforms.engine import errors``.

:mod:`fd_platforms.engine` itself exports the few a runner catches (``FdPlatformsError``, the base of
them all, ``ConfigError``, ``CacheNotReadyError``, ``CacheInUseError``, ``BufferInUseError``); this
module holds those and the rest, defined where they are raised (mostly
:mod:`fd_platforms.contract.errors`), so ``except errors.NodeError`` and ``except`` on the class from
its own module agree. Each error's ``exit_code`` is what the CLI exits with (2 for configuration).
"""

from __future__ import annotations

from ..contract.errors import (
    AcceleratorUnusableError,
    AmbiguousPlatformError,
    BufferInUseError,
    CacheInUseError,
    CacheNotReadyError,
    CacheSharingError,
    CacheSignalError,
    CacheUpdateError,
    ConfigError,
    ControlWireError,
    DeviceAllocError,
    DeviceFactsUnavailableError,
    DevicePlacementError,
    DuplicatePlatformError,
    ExtraNotInstalledError,
    FdPlatformsError,
    HostAllocError,
    NodeError,
    PaddleNotInstalledError,
    PaddleUnavailableError,
    PickleRefusedError,
    PlatformDriftError,
    PlatformUnavailableError,
    PluginContractError,
    PluginError,
    PluginHookError,
    PluginLoadError,
    PluginTimeoutError,
    PluginVersionError,
    RecordError,
    RunError,
    SelectionError,
    SignalWaitError,
    UnknownPlatformError,
)
from ..ipc.shm import ShmSpaceError
from ..rules.planner import InsufficientMemoryError

__all__ = [
    # the base class: every deliberate error of fd-platforms
    "FdPlatformsError",
    # bad input, before anything runs
    "ConfigError",
    "RecordError",
    # choosing and loading the platform
    "SelectionError",
    "UnknownPlatformError",
    "PlatformUnavailableError",
    "AcceleratorUnusableError",
    "AmbiguousPlatformError",
    "DuplicatePlatformError",
    "PluginError",
    "PluginLoadError",
    "PluginHookError",
    "PluginTimeoutError",
    "PluginContractError",
    "PluginVersionError",
    "PlatformDriftError",
    "DeviceFactsUnavailableError",
    "PaddleUnavailableError",
    # planning and allocating
    "InsufficientMemoryError",
    "HostAllocError",
    "DeviceAllocError",
    "DevicePlacementError",
    "ShmSpaceError",
    # creating, sharing and letting go of a cache
    "CacheSignalError",
    "CacheNotReadyError",
    "SignalWaitError",
    "CacheSharingError",
    "CacheInUseError",
    "BufferInUseError",
    "CacheUpdateError",
    # several processes and nodes
    "NodeError",
    "RunError",
    # FastDeploy's control path (fd_platforms.fastdeploy.control) and the extra it needs
    "ControlWireError",
    "PickleRefusedError",
    "ExtraNotInstalledError",
    "PaddleNotInstalledError",
]
