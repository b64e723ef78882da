"""A loaded platform: one plugin manager holding the core's defaults and one platform plugin.

Callers use :class:`Platform` methods; each calls its hook with keyword arguments and checks the
record it returns, so a plugin's mistake is reported with its name, not as a later ``TypeError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import pluggy

from . import defaults, hookspecs
from .api_version import check_api_compatibility
from .discovery import Candidate, core_version
from .drift import refuse_drift
from .errors import FdPlatformsError, PluginContractError, PluginError, PluginHookError, PluginLoadError
from .types import CacheDecision, Detection, DeviceMemory, HostBuffer, PlatformIdentity, PlatformLimit, Plan

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .config import CacheConfig
    from .kv_cache import AllocationProgress, KVCache
    from .layout import CacheLayout

RecordT = TypeVar("RecordT")


class Platform:
    """The selected (or inspected) platform, with the hooks as typed methods."""

    def __init__(self, candidate: Candidate, manager: pluggy.PluginManager, identity: PlatformIdentity) -> None:
        self.candidate = candidate
        self.manager = manager
        self.identity = identity

    @property
    def name(self) -> str:
        return self.candidate.name

    @property
    def distribution(self) -> str:
        return self.candidate.distribution

    @property
    def version(self) -> str:
        return self.candidate.version

    def __repr__(self) -> str:
        return f"<Platform {self.name} from {self.distribution} {self.version}>"

    def implemented_hooks(self) -> set[str]:
        """Names of the hooks the platform plugin itself implements (the core's defaults excluded)."""
        return implemented_hooks(self.manager, self.manager.get_plugin(self.name))

    def detect(self) -> Detection:
        """The plugin's detection record."""
        return self._call("detect_platform", Detection)

    def confirm(self) -> Detection | None:
        """Detection confirmed through Paddle, or ``None`` where the cheap one is all there is."""
        result = self._call("confirm_platform", object)
        return None if result is None else check_type(self.candidate, "confirm_platform", result, Detection)

    def should_create_cache_tensor(
        self, *, profile: bool, num_cpu_blocks: int, storage_backend: str | None, splitwise_role: str
    ) -> CacheDecision:
        """Create the KV cache in this worker, or attach to the cache manager's (see the hook spec)."""
        return self._call(
            "should_create_cache_tensor",
            CacheDecision,
            profile=profile,
            num_cpu_blocks=num_cpu_blocks,
            storage_backend=storage_backend,
            splitwise_role=splitwise_role,
        )

    def device_memory(self, device_id: int = 0) -> DeviceMemory:
        """Memory facts of one local device."""
        return self._call("device_memory", DeviceMemory, device_id=device_id)

    def declared_limits(self) -> tuple[PlatformLimit, ...]:
        """The platform's declared KV-cache limits, each with its reason."""
        limits = self._call("declared_limits", tuple)
        for limit in limits:
            check_type(self.candidate, "declared_limits", limit, PlatformLimit)
        return limits

    def max_num_blocks(
        self,
        *,
        layout: CacheLayout,
        cache: CacheConfig,
        memory: DeviceMemory | None = None,
        device_id: int = 0,
        non_cache_bytes: int | None = None,
    ) -> Plan:
        """Plan one rank's blocks on ``memory`` (default: this platform's live facts of ``device_id``)."""
        return self._call(
            "max_num_blocks",
            Plan,
            layout=layout,
            memory=memory if memory is not None else self.device_memory(device_id),
            cache=cache,
            limits=self.declared_limits(),
            non_cache_bytes=non_cache_bytes,
        )

    def host_alloc(self, nbytes: int, *, require_pinned: bool = False) -> HostBuffer:
        """Host memory, pinned where the platform can pin it (see the hook spec)."""
        return self._call("host_alloc", HostBuffer, nbytes=nbytes, require_pinned=require_pinned)

    def wait_cache_ready(
        self, signal_name: str, rank: int, *, timeout: float | None = None, setter_pid: int | None = None
    ) -> float:
        """Block until ``rank``'s cache-ready slot is set; seconds waited."""
        return self._call(
            "wait_cache_ready", float, signal_name=signal_name, rank=rank, timeout=timeout, setter_pid=setter_pid
        )

    def allocate_kv_cache(
        self, layout: CacheLayout, num_blocks: int, *, progress: AllocationProgress | None = None
    ) -> KVCache:
        """Allocate one rank's KV cache tensors on the device the layout was built for (the creator path).

        ``progress(done_bytes, total_bytes)`` is called after each tensor.
        """
        from .kv_cache import allocate_kv_cache

        device = self.identity.device_string(layout.device_id)
        return allocate_kv_cache(layout, num_blocks, device, progress=progress)

    def _call(self, hook: str, expected: type[RecordT], **kwargs: Any) -> RecordT:
        return call_hook(self.candidate, self.manager, hook, expected, **kwargs)


def implemented_hooks(manager: pluggy.PluginManager, plugin: object) -> set[str]:
    """Names of the hooks ``plugin`` implements in ``manager``."""
    return {caller.name for caller in manager.get_hookcallers(plugin) or []}


def call_hook(
    candidate: Candidate, manager: pluggy.PluginManager, hook: str, expected: type[RecordT], **kwargs: Any
) -> RecordT:
    """Call ``hook`` with keyword arguments; the result must be an ``expected`` record.

    A plugin's stray exception becomes a PluginError naming it; a wrong result type a
    PluginContractError. Deliberate fd-platforms errors pass through unchanged.
    """
    try:
        result = getattr(manager.hook, hook)(**kwargs)
    except FdPlatformsError:
        raise
    except Exception as exc:
        raise PluginError(
            candidate.name, candidate.distribution, f"hook {hook} raised {type(exc).__name__}: {exc}"
        ) from exc
    return check_type(candidate, hook, result, expected)


def check_type(candidate: Candidate, hook: str, result: object, expected: type[RecordT]) -> RecordT:
    """``result`` when it is an ``expected``, else a PluginContractError naming the plugin and hook."""
    if not isinstance(result, expected):
        raise PluginContractError(
            candidate.name,
            candidate.distribution,
            f"hook {hook} returned {type(result).__name__} ({result!r:.80}); it must return {expected.__name__}",
        )
    return result


def load_platform(candidate: Candidate, *, drift_guard: bool = True) -> Platform:
    """Import a candidate, register it beside the core defaults and validate it.

    Checks, in order: the hooks match the specs and the required ones are there, the declared
    plugin API range holds the core's, the identity's name is the entry point's, and (unless
    ``drift_guard`` is off, as the conformance kit does to report the cases itself) a plugin
    answering ``should_create_cache_tensor`` agrees with the rule on the whole truth table.
    """
    try:
        plugin = candidate.load()
    except Exception as exc:
        raise PluginLoadError(
            candidate.name,
            candidate.distribution,
            f"importing {candidate.entry_point.value!r} failed: {type(exc).__name__}: {exc}. "
            f"Fix: reinstall {candidate.distribution} or uninstall it",
        ) from exc
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    manager.register(defaults, name="fd_platforms.defaults")
    try:
        manager.register(plugin, name=candidate.name)
        manager.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginHookError(
            candidate.name,
            candidate.distribution,
            f"{exc}. Fix: use only the hook names and arguments defined in fd_platforms.hookspecs",
        ) from exc
    implemented = implemented_hooks(manager, plugin)
    missing = [hook for hook in hookspecs.REQUIRED_HOOKS if hook not in implemented]
    if missing:
        raise PluginHookError(
            candidate.name,
            candidate.distribution,
            f"required hook(s) {', '.join(missing)} not implemented. Fix: add them with @fd_platforms.hookimpl",
        )
    declared = call_hook(candidate, manager, "supported_api_versions", object)
    check_api_compatibility(declared, candidate.name, candidate.distribution, core_version())
    identity = call_hook(candidate, manager, "platform_identity", PlatformIdentity)
    if identity.name != candidate.name:
        raise PluginContractError(
            candidate.name,
            candidate.distribution,
            f"platform_identity says name {identity.name!r} but the entry point registers {candidate.name!r}. "
            "Fix: make them equal",
        )
    platform = Platform(candidate, manager, identity)
    if drift_guard:
        refuse_drift(platform)
    return platform
