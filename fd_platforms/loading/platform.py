"""A loaded platform: one plugin manager holding the core's defaults and one platform plugin.

Callers use :class:`Platform` methods. Each one, in order:

1. validates the caller's arguments in the core, so a bad argument is the caller's
   :class:`~fd_platforms.contract.errors.ConfigError` before any plugin code runs;
2. calls the hook in the caller's thread: a hook the plugin implements runs as untrusted code
   (:mod:`fd_platforms.loading.isolation`: isolated from every exception, and a call past its bound
   ends the process, :mod:`fd_platforms.loading.watchdog`); a hook answered by the core's default
   runs directly;
3. checks the answer on every call: its record type, and for the rule hooks the rule itself
   (:mod:`fd_platforms.rules.drift`): a decision other than the core rule's, or a plan that breaks the
   planner's invariants, is a :class:`~fd_platforms.contract.errors.PlatformDriftError` naming the case.
"""

from __future__ import annotations

import math
import re
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import pluggy

from ..contract import hookspecs
from ..contract.api_version import check_api_compatibility
from ..contract.errors import ConfigError, PluginContractError, PluginHookError
from ..contract.integers import INT32_MAX, SHAPE_ALLOWED, check_int, decimal, is_shape
from ..contract.types import (
    CacheDecision,
    CacheShapeRequest,
    Detection,
    DeviceMemory,
    HostBuffer,
    Plan,
    PlatformIdentity,
    PlatformLimit,
    SharedTensor,
)
from ..kit.host_memory import check_host_nbytes, host_bytes_for_swap, system_memory
from ..rules.decision import DEFAULT_RULE, RULE_VERSIONS, DecisionInputs, decide_cache_creation
from ..rules.drift import DecisionDrift, drift_error, plan_drift_error, refuse_drift, shape_drift_error
from ..rules.sizes import parse_size
from . import defaults
from .discovery import Candidate, core_version
from .isolation import call_plugin, import_plugin
from .watchdog import Bound, alloc_bound, detect_bound

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..kit.allocator_flags import FlagReading
    from ..rules.config.settings import CacheConfig
    from ..rules.layout import CacheLayout

RecordT = TypeVar("RecordT")  #: the record type a hook must answer with

WAIT_MARGIN_SECONDS = 5.0  # what a plugin's own wait_cache_ready gets beyond the wait's timeout


class Platform:
    """The selected (or inspected) platform, with the hooks as typed, checked methods."""

    def __init__(self, candidate: Candidate, manager: pluggy.PluginManager, identity: PlatformIdentity) -> None:
        self.candidate = candidate
        self.manager = manager
        self.identity = identity
        self._implemented = frozenset(implemented_hooks(manager, manager.get_plugin(candidate.name)))
        #: The rule versions the plugin's own decision hook was held to over the truth table (None: no drift guard,
        #: as the conformance kit loads it to report the cases itself); a version an engine registers later is
        #: held to at its first decision (:meth:`should_create_cache_tensor`).
        self.rules_checked: set[str] | None = None

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
        return set(self._implemented)

    def detect(self) -> Detection:
        """The plugin's detection record."""
        return self._call("detect_platform", Detection)

    def confirm(self) -> Detection | None:
        """Detection confirmed through Paddle, or ``None`` where the cheap one is all there is."""
        result = self._call("confirm_platform", object)
        return None if result is None else check_type(self.candidate, "confirm_platform", result, Detection)

    def should_create_cache_tensor(
        self,
        *,
        profile: bool,
        num_cpu_blocks: int,
        storage_backend: str | None,
        splitwise_role: str,
        rule: str = DEFAULT_RULE,
    ) -> CacheDecision:
        """Create the KV cache in this worker, or attach to the cache manager's (see the hook spec).

        The answer must be the core rule's, in the pinned version ``rule``, on these very inputs, on
        every call.
        """
        inputs = DecisionInputs(profile, num_cpu_blocks, storage_backend, splitwise_role, rule)  # validates
        if self.rules_checked is not None and rule not in self.rules_checked:
            refuse_drift(self, rules=(rule,))  # a version registered after the plugin was loaded: the whole table
            self.rules_checked.add(rule)
        got = self.plugin_decision(inputs)
        expected = decide_cache_creation(**inputs.kwargs())
        if (got.create, got.deciding_term) != (expected.create, expected.deciding_term):
            raise drift_error(self, [DecisionDrift(inputs, expected, got)], at_call=True)
        return got

    def plugin_decision(self, inputs: DecisionInputs) -> CacheDecision:
        """The hook's raw answer for ``inputs``, not yet held to the rule (the drift guard's table uses it)."""
        return self._call("should_create_cache_tensor", CacheDecision, **inputs.kwargs())

    def cache_layout(self, layout: CacheLayout, num_blocks: int, tensor_specs: object = None) -> CacheLayout:
        """``layout`` with this platform's shapes and dtypes for ``num_blocks`` blocks (see the
        ``kv_cache_shapes`` hook spec), after the core's platform facts
        (:meth:`~fd_platforms.rules.layout.CacheLayout.on_device_type`); the answer is checked on every call.
        ``tensor_specs`` (one layer's ``CacheRoleShape`` records, as the engine's attention backend states
        them) replaces the hook: checked by :func:`~fd_platforms.rules.shapes.engine_shaped`, no hook runs."""
        from ..rules.layout import check_layout, check_num_blocks  # lazily: selection never needs the layout
        from ..rules.shapes import engine_shaped, shape_request, shape_violations

        layout = check_layout(layout).on_device_type(self.identity.device_type)
        check_num_blocks(num_blocks)
        if tensor_specs is not None:
            return engine_shaped(layout, tensor_specs, num_blocks)
        request = shape_request(layout, num_blocks)
        answer = self.plugin_shapes(request)
        violations = shape_violations(request, answer)
        if violations:
            raise shape_drift_error(self, violations, at_call=True)
        return layout.shaped(answer)  # type: ignore[arg-type]  # checked above

    def plugin_shapes(self, request: CacheShapeRequest) -> object:
        """The hook's raw answer for ``request``, not yet checked (the load-time guard uses it)."""
        return self._call("kv_cache_shapes", tuple, request=request)

    def device_memory(self, device_id: int = 0) -> DeviceMemory:
        """Memory facts of one local device."""
        check_int(
            "device_id", device_id, 0, INT32_MAX, fix="pass the local device index, 0 for the first visible device"
        )
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
        device_id: int | None = None,
        non_cache_bytes: int | None = None,
        host_memory: int | None = None,
    ) -> Plan:
        """Plan one rank's blocks on ``memory`` (default: this platform's live facts of local device
        ``device_id``, None: ``layout.local_device``, the device the rank's tensors live on), for ``layout`` as
        this platform stores it (:meth:`~fd_platforms.rules.layout.CacheLayout.on_device_type`).

        Where the device is the host (cpu), ``memory`` is required, ``device_id`` or not: the live facts
        would be the whole host's, so its absence is a ConfigError naming the host's memory, before any hook.
        The plan must keep the planner's invariants (:func:`~fd_platforms.rules.planner.plan_violations`),
        and its host swap space must fit in ``host_memory`` bytes (default: this host's total).
        """
        from ..rules.planner import (
            check_host_swap,
            check_plan_arguments,
            host_memory_not_given,
            plan_violations,
            shares_one_device,
        )

        check_plan_arguments(layout, cache, memory, non_cache_bytes)
        if host_memory is not None:
            host_memory = parse_size(host_memory, "host_memory")
        if memory is None and shares_one_device(self.identity.device_type):
            raise host_memory_not_given(self.name, system_memory(), cache.memory_utilization, device_id)
        layout = layout.on_device_type(self.identity.device_type)  # the core's platform facts: bytes may change
        if memory is None:
            memory = self.device_memory(layout.local_device if device_id is None else device_id)
        limits = self.declared_limits()
        plan = self._call(
            "max_num_blocks",
            Plan,
            layout=layout,
            memory=memory,
            cache=cache,
            limits=limits,
            non_cache_bytes=non_cache_bytes,
        )
        violations = plan_violations(plan, layout, memory, cache, limits, non_cache_bytes)
        if violations:
            raise plan_drift_error(self, violations)
        host_bytes, measured = host_bytes_for_swap(host_memory)
        check_host_swap(cache, plan.bytes_per_block, host_bytes, measured=measured)
        return plan

    def host_alloc(self, nbytes: int, *, require_pinned: bool = False) -> HostBuffer:
        """Host memory, pinned where the platform can pin it (see the hook spec)."""
        check_host_nbytes(nbytes)
        if not isinstance(require_pinned, bool):
            raise ConfigError("require_pinned", require_pinned, "True or False", "pass a bool")
        buffer = self._call("host_alloc", HostBuffer, nbytes=nbytes, require_pinned=require_pinned)
        if buffer.nbytes < nbytes or (require_pinned and not buffer.pinned):
            raise self.candidate.error(
                PluginContractError,
                f"hook host_alloc returned {buffer.nbytes} bytes, pinned={buffer.pinned}, for a request of {nbytes} "
                f"bytes with require_pinned={require_pinned}. Fix: return at least the bytes asked for, pinned when "
                "required (or raise HostAllocError)",
            )
        return buffer

    def wait_cache_ready(
        self, signal_name: str, rank: int, *, timeout: float | None = None, creator_pid: int | None = None
    ) -> float:
        """Block until ``rank``'s cache-ready slot is set; seconds waited. ``creator_pid``: the process that creates
        the cache; its exit ends the wait."""
        from ..ipc.cache_signal import check_signal_name, resolve_timeout
        from ..ipc.process_watch import PID_MAX_LIMIT
        from ..ipc.shared_words import MAX_LOCAL_RANKS

        check_signal_name(signal_name)
        check_int("rank", rank, 0, MAX_LOCAL_RANKS - 1, what="a local rank", fix="pass this worker's local rank")
        limit = resolve_timeout(timeout)
        if creator_pid is not None:
            check_int(
                "creator_pid",
                creator_pid,
                1,
                PID_MAX_LIMIT,
                what="None or a process id",
                fix="pass the pid of the process that creates the cache (the cache manager), or None",
            )
        waited = self._call(
            "wait_cache_ready", float, signal_name=signal_name, rank=rank, timeout=limit, creator_pid=creator_pid
        )
        if waited < 0:
            raise self.candidate.error(PluginContractError, f"hook wait_cache_ready returned {waited} seconds")
        return waited

    def cache_sharing(self) -> str | None:
        """How a KV cache tensor crosses processes here, or None where it cannot (see the hook spec)."""
        return self._call_text("cache_sharing", "a sentence")

    def memory_ipc(self) -> FlagReading | None:
        """The Paddle allocator flag in force in this process (:mod:`~fd_platforms.kit.allocator_flags`) where the
        platform is a :class:`~fd_platforms.kit.paddle_platform.PaddlePlatform` whose sharing goes through Paddle's
        IPC, read (bounded, as plugin code) before any tensor is exported; None where none is, or the platform is
        another kind (its export's handle is all a protocol can check)."""
        from ..kit.paddle_platform import PaddlePlatform  # lazily: selection never reads Paddle's flags

        plugin = self.manager.get_plugin(self.name)
        if not isinstance(plugin, PaddlePlatform):
            return None
        return call_plugin(self.candidate, "reading Paddle's allocator flags", plugin.memory_ipc, detect_bound())

    def export_cache_tensor(self, name: str, shape: tuple[int, ...], dtype: str, device: str) -> SharedTensor:
        """A zero-filled cache tensor other processes can open by its handle (see the hook spec)."""
        shape = check_tensor_request(name, shape, dtype, device)
        self._check_device(device)
        shared = self._call("export_cache_tensor", SharedTensor, name=name, shape=shape, dtype=dtype, device=device)
        return self._check_shared(shared, name, shape, dtype, exported=True)

    def open_cache_tensor(
        self, name: str, handle: str, shape: tuple[int, ...], dtype: str, device: str
    ) -> SharedTensor:
        """Open, zero-copy, a tensor another process exported (see the hook spec)."""
        shape = check_tensor_request(name, shape, dtype, device)
        self._check_device(device)
        if not isinstance(handle, str) or not handle:
            raise ConfigError("handle", handle, "the exporter's SharedTensor.handle", "pass the published handle")
        shared = self._call(
            "open_cache_tensor", SharedTensor, name=name, handle=handle, shape=shape, dtype=dtype, device=device
        )
        return self._check_shared(shared, name, shape, dtype, exported=False)

    def release_device_memory(self, device: str) -> str | None:
        """Return the memory Paddle's allocator caches for ``device`` to the device (see the hook spec):
        what was called, or None where nothing is cached."""
        self._check_device(device)
        return self._call_text("release_device_memory", "text", device=device)

    def _call_text(self, hook: str, wanted: str, **kwargs: Any) -> str | None:
        """Call ``hook``, whose answer must be ``wanted`` (non-blank text) or None."""
        answer = self._call(hook, object, **kwargs)
        if answer is not None and (not isinstance(answer, str) or not answer.strip()):
            raise self.candidate.error(
                PluginContractError, f"hook {hook} returned {answer!r}; it must return {wanted} or None"
            )
        return answer

    def _check_device(self, device: str) -> None:
        """``device`` must be one of this platform's: ``cpu``, or ``<device_type>:<id>``."""
        kind, _, index = device.partition(":")
        ours = self.identity.device_type
        if kind != ours or (ours == "cpu" and index) or (ours != "cpu" and decimal(index, INT32_MAX) is None):
            example = self.identity.device_string(0)
            raise ConfigError(
                "device",
                device,
                f"a device of platform {self.name} ({example}{'' if ours == 'cpu' else ', ...'})",
                "pass identity.device_string(device_id) of this platform",
            )

    def _check_shared(
        self, shared: SharedTensor, name: str, shape: tuple[int, ...], dtype: str, *, exported: bool
    ) -> SharedTensor:
        """The hook's tensor must be the one asked for; otherwise it is closed and refused. Its close
        is the plugin's code too: it runs as a plugin call, and what it raises is blamed on the plugin."""
        got_shape = tuple(int(extent) for extent in getattr(shared.tensor, "shape", ()))
        got_dtype = str(getattr(shared.tensor, "dtype", "")).removeprefix("paddle.")
        if (shared.name, shared.exported, got_shape, got_dtype) != (name, exported, shape, dtype):
            shared.close()
            raise self.candidate.error(
                PluginContractError,
                f"{'export' if exported else 'open'}_cache_tensor returned {shared.name} {list(got_shape)} {got_dtype} "
                f"(exported={shared.exported}) for {name} {list(shape)} {dtype}. Fix: return the tensor asked for",
            )
        close = shared._close
        shared._close = lambda: call_plugin(self.candidate, f"closing KV cache tensor {name}", close, alloc_bound())
        return shared

    def _call(self, hook: str, expected: type[RecordT], **kwargs: Any) -> RecordT:
        """Call ``hook``: as plugin code where the plugin implements it, else the core's default."""
        caller = getattr(self.manager.hook, hook)
        if hook not in self._implemented:
            return check_type(self.candidate, hook, caller(**kwargs), expected)  # the core's own default
        result = call_plugin(self.candidate, f"hook {hook}", lambda: caller(**kwargs), _bound(hook, kwargs))
        return check_type(self.candidate, hook, result, expected)


ALLOCATION_HOOKS = ("host_alloc", "export_cache_tensor", "open_cache_tensor", "release_device_memory")


def _bound(hook: str, kwargs: dict[str, Any]) -> Bound:
    """How long a plugin's hook may run: an allocation ``FD_PLATFORM_ALLOC_TIMEOUT``, a wait its own
    timeout and a margin (off with the allocations' bound, or where the wait has no limit), every
    other hook the detection bound."""
    if hook == "wait_cache_ready":
        long = alloc_bound()
        if long.seconds is None:
            return long
        if math.isinf(kwargs["timeout"]):
            return Bound(None, "the wait's timeout is inf")
        return Bound(kwargs["timeout"] + WAIT_MARGIN_SECONDS, "its timeout + 5 s")
    return alloc_bound() if hook in ALLOCATION_HOOKS else detect_bound()


TENSOR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,248}")


def check_tensor_request(name: object, shape: object, dtype: object, device: object) -> tuple[int, ...]:
    """A cache tensor request as the caller gave it; the shape as a tuple, or a ConfigError naming the field."""
    from ..contract.types import DTYPE_BYTES

    if not isinstance(name, str) or not TENSOR_NAME.fullmatch(name):
        raise ConfigError(
            "name", name, "letters, digits, '.', '_' and '-', at most 249 characters", "pass the published tensor name"
        )
    if not is_shape(shape, lists=True):
        raise ConfigError("shape", shape, SHAPE_ALLOWED, "pass the tensor's shape, blocks first")
    if dtype not in DTYPE_BYTES:
        raise ConfigError("dtype", dtype, f"one of {', '.join(DTYPE_BYTES)}", "pass the layout's dtype")
    if not isinstance(device, str) or not device:
        raise ConfigError("device", device, "Paddle's device string (gpu:0, cpu)", "pass identity.device_string(id)")
    return tuple(shape)


def implemented_hooks(manager: pluggy.PluginManager, plugin: object) -> set[str]:
    """Names of the hooks ``plugin`` implements in ``manager``."""
    return {caller.name for caller in manager.get_hookcallers(plugin) or []}


def call_hook(
    candidate: Candidate, manager: pluggy.PluginManager, hook: str, expected: type[RecordT], **kwargs: Any
) -> RecordT:
    """Call ``hook`` as plugin code (bounded, isolated); the result must be an ``expected`` record."""
    caller = getattr(manager.hook, hook)
    result = call_plugin(candidate, f"hook {hook}", lambda: caller(**kwargs), detect_bound())
    return check_type(candidate, hook, result, expected)


def check_type(candidate: Candidate, hook: str, result: object, expected: type[RecordT]) -> RecordT:
    """``result`` when it is an ``expected``, else a PluginContractError naming the plugin and hook."""
    if not isinstance(result, expected):
        raise candidate.error(
            PluginContractError,
            f"hook {hook} returned {type(result).__name__} ({result!r:.80}); it must return {expected.__name__}",
        )
    return result


def refuse_unmarked_hooks(candidate: Candidate, plugin: object, implemented: set[str]) -> None:
    """A PluginHookError for an attribute named like a hook that pluggy does not call: a method
    overridden in a subclass (of ``PaddlePlatform``) or a module function without ``@hookimpl``
    would otherwise be dropped silently, and the platform would answer with what it replaced."""
    unmarked = [name for name in hookspecs.hook_names() if name not in implemented and hasattr(plugin, name)]
    if unmarked:
        where = type(plugin).__qualname__ if not isinstance(plugin, ModuleType) else f"module {plugin.__name__}"
        raise candidate.error(
            PluginHookError,
            f"{where} defines {', '.join(unmarked)} without @hookimpl, so pluggy would never call "
            f"{'it' if len(unmarked) == 1 else 'them'} (an override without the marker silently drops the hook). "
            "Fix: decorate each with @fd_platforms.hookimpl, or rename it",
        )


def load_platform(candidate: Candidate, *, drift_guard: bool = True) -> Platform:
    """Import a candidate, register it beside the core defaults and validate it, as bounded plugin code.

    Checks, in order: the hooks match the specs and the required ones are there, the declared
    plugin API range holds the core's, the identity's name is the entry point's, and (unless
    ``drift_guard`` is off, as the conformance kit does to report the cases itself) a plugin
    answering ``should_create_cache_tensor`` agrees with the rule on the whole truth table. The
    whole load runs in the caller's thread within ``FD_PLATFORM_DETECT_TIMEOUT`` seconds.
    """
    return call_plugin(candidate, "loading", lambda: _load(candidate, drift_guard), detect_bound())


def _load(candidate: Candidate, drift_guard: bool) -> Platform:
    return register_platform(candidate, import_plugin(candidate), drift_guard=drift_guard)


def register_platform(candidate: Candidate, plugin: object, *, drift_guard: bool = True) -> Platform:
    """``plugin`` (what ``candidate``'s entry point names, or a copy of it) registered beside the
    core defaults and validated as :func:`load_platform` describes; call it as plugin code
    (:func:`~fd_platforms.loading.isolation.call_plugin`)."""
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    manager.register(defaults, name="fd_platforms.loading.defaults")
    try:
        manager.register(plugin, name=candidate.name)
        manager.check_pending()
    except pluggy.PluginValidationError as exc:
        raise candidate.error(
            PluginHookError,
            f"{exc}. Fix: use only the hook names and arguments defined in fd_platforms.contract.hookspecs",
        ) from exc
    implemented = implemented_hooks(manager, plugin)
    refuse_unmarked_hooks(candidate, plugin, implemented)
    missing = [hook for hook in hookspecs.REQUIRED_HOOKS if hook not in implemented]
    if missing:
        raise candidate.error(
            PluginHookError,
            f"required hook(s) {', '.join(missing)} not implemented. Fix: add them with @fd_platforms.hookimpl",
        )
    declared = call_hook(candidate, manager, "supported_api_versions", object)
    check_api_compatibility(declared, candidate.name, candidate.distribution, core_version())
    identity = call_hook(candidate, manager, "platform_identity", PlatformIdentity)
    if identity.name != candidate.name:
        raise candidate.error(
            PluginContractError,
            f"platform_identity says name {identity.name!r} but the entry point registers {candidate.name!r}. "
            "Fix: make them equal",
        )
    platform = Platform(candidate, manager, identity)
    if drift_guard:
        refuse_drift(platform)
        platform.rules_checked = set(RULE_VERSIONS)
    return platform
