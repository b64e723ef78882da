"""Typed errors: each says what was wrong, the value, what is allowed and how to fix it.

Every error fd-platforms raises on purpose derives from :class:`FdPlatformsError`. The CLI prints
its message on one line of stderr and exits with its ``exit_code`` (2 for configuration and usage
errors), never with a traceback.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable


class FdPlatformsError(Exception):
    """Base of every deliberate fd-platforms error."""

    exit_code = 1


MAX_SHOWN = 120  #: characters of a value's repr an error message shows


def show_value(value: object) -> str:
    """``repr(value)`` for a message, safe for any value: a huge integer is described by its digits,
    a long repr is cut at :data:`MAX_SHOWN` characters."""
    if isinstance(value, int) and value.bit_length() > 1000:  # a bool's bit_length is at most 1
        digits = int(math.log10(abs(value))) + 1
        digits -= 10 ** (digits - 1) > abs(value)  # log10 rounds up just below a power of ten
        return f"<an integer of {digits} digits>"
    try:
        shown = repr(value)
    except Exception as exc:  # noqa: BLE001 - a repr that fails must not hide the error being reported
        shown = f"<{type(value).__name__} whose repr raised {type(exc).__name__}>"
    return shown if len(shown) <= MAX_SHOWN else shown[: MAX_SHOWN - 3] + "..."


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line and 200 characters, for an error of ours."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text if len(text) <= 200 else text[:197] + "..."


class ConfigError(FdPlatformsError, ValueError):
    """A value given by the user (env var, CLI flag, config field) is not allowed.

    The message names the field, the value, what is allowed and the fix; ``source`` names the
    file the value came from, when it came from one.
    """

    exit_code = 2

    def __init__(self, field: str, value: object, allowed: str, fix: str, *, source: str | None = None) -> None:
        self.field, self.value, self.allowed, self.fix, self.source = field, value, allowed, fix, source
        where = f"{source}: " if source else ""
        given = " is not given" if value is None else f"={show_value(value)} is not valid"
        super().__init__(f"{where}{field}{given}; allowed: {allowed}. Fix: {fix}")


class RecordError(FdPlatformsError, TypeError):
    """A record of :mod:`fd_platforms.contract.types` was built with a field of the wrong type or value.

    Raised where the record is built; a record a plugin builds badly is reported as that plugin's
    :class:`~fd_platforms.contract.errors.PluginContractError`.
    """

    exit_code = 2

    def __init__(self, record: str, field: str, value: object, allowed: str) -> None:
        self.record, self.field, self.value, self.allowed = record, field, value, allowed
        fix = f"build {record} with {field} as allowed"
        if field.endswith("bytes"):
            fix += " (a size such as '80GiB' becomes an int with fd_platforms.rules.sizes.parse_size)"
        super().__init__(f"{record}.{field}={show_value(value)} is not valid; allowed: {allowed}. Fix: {fix}")


def closest_name(name: str, known: Iterable[str]) -> str | None:
    """The known name ``name`` most likely means: one that differs only in case first (``Cpu`` is ``cpu``, not
    ``xpu``), else the closest spelling, case aside; None where none is close."""
    options = list(known)
    folded = {option.casefold(): option for option in options}
    if name.casefold() in folded:
        return folded[name.casefold()]
    close = difflib.get_close_matches(name.casefold(), list(folded), n=1)
    return folded[close[0]] if close else None


class SelectionError(FdPlatformsError):
    """The platform named or detected cannot be used (a configuration error)."""

    exit_code = 2


class UnknownPlatformError(SelectionError, ConfigError):
    """``FD_PLATFORM``, a ``--platform`` flag or an allow-list entry names a platform that is not
    installed; the fix starts with the closest installed name, where one is close."""

    def __init__(self, variable: str, name: str, installed: Iterable[str], fix: str, *, also: str = "") -> None:
        self.installed = sorted(installed)
        close = closest_name(name, [*self.installed, *filter(None, [also])])
        ConfigError.__init__(
            self,
            variable,
            name,
            f"{also + ', or ' if also else ''}an installed platform. Choose one of: {', '.join(self.installed)}",
            (f"did you mean {close!r}? " if close else "") + fix,
        )


class PlatformUnavailableError(SelectionError):
    """The selected platform is installed but its detection says it cannot run here."""


class AcceleratorUnusableError(SelectionError):
    """An accelerator's device nodes are here but no platform can drive it: selection refuses to fall
    back to the host's memory silently (``FD_PLATFORM=cpu`` chooses it on purpose)."""


class AmbiguousPlatformError(SelectionError):
    """Several platforms were detected and ``FD_PLATFORM`` does not choose between them."""


class DuplicatePlatformError(SelectionError):
    """Two distributions register the same platform name."""


class PluginError(FdPlatformsError):
    """A plugin could not be imported, registered, or broke the hook contract.

    ``plugin`` is the platform's name (a wire protocol's, where ``kind`` says so), ``distribution`` the installed
    distribution providing it.
    """

    exit_code = 2

    def __init__(self, plugin: str, distribution: str, message: str, *, kind: str = "platform plugin") -> None:
        self.plugin, self.distribution = plugin, distribution
        super().__init__(f"{kind} {plugin!r} (distribution {distribution}): {message}")


class PluginLoadError(PluginError):
    """Importing the plugin's entry point failed."""


class PluginHookError(PluginError):
    """The plugin's hook implementations do not match the specs (unknown name, bad arguments, missing hook)."""


class PluginTimeoutError(PluginError):
    """A call into plugin code did not return within its bound; ``step`` names it, ``seconds`` the bound."""

    def __init__(self, plugin: str, distribution: str, message: str, *, step: str, seconds: float) -> None:
        self.step, self.seconds = step, seconds
        super().__init__(plugin, distribution, message)


class PluginContractError(PluginError):
    """A hook returned something other than the record its spec promises."""


class PluginVersionError(PluginError):
    """The plugin supports plugin API versions that exclude the installed core's."""


class PlatformDriftError(PluginContractError):
    """The plugin's ``should_create_cache_tensor`` disagrees with the core rule on some inputs.

    ``cases`` lists each differing case as ``(inputs, expected, got)``.
    """

    def __init__(self, plugin: str, distribution: str, message: str, cases: tuple[object, ...] = ()) -> None:
        self.cases = cases
        super().__init__(plugin, distribution, message)


class DeviceFactsUnavailableError(FdPlatformsError):
    """The platform does not report a fact the caller needs (its plugin has no such hook)."""

    exit_code = 2


class PaddleUnavailableError(DeviceFactsUnavailableError):
    """A Paddle-driven platform needs paddle for a fact, and paddle cannot be imported here."""


class HostAllocError(FdPlatformsError, MemoryError):
    """Host memory could not be allocated as asked (size, or pinning the caller demanded)."""


class BufferInUseError(FdPlatformsError):
    """A host buffer was released while numpy or paddle views of it were still alive."""


class CacheSignalError(FdPlatformsError):
    """A cache-ready signal cannot be created or attached: name in use, missing, or not a signal."""


class CacheNotReadyError(FdPlatformsError):
    """A wait for a cache-ready slot ended without the slot being set.

    ``cause`` is ``"timeout"`` or ``"creator_exited"``; ``slots`` holds every rank's slot value
    (1 set, 0 clear) at the moment the wait gave up; another cause the caller knows of ends the
    message (:meth:`with_hint`).
    """

    def __init__(
        self, signal_name: str, rank: int, elapsed: float, slots: tuple[int, ...], cause: str, detail: str, fix: str
    ) -> None:
        self.signal_name, self.rank, self.elapsed, self.slots, self.cause = signal_name, rank, elapsed, slots, cause
        self.detail, self.fix = detail, fix
        states = ", ".join(f"rank {index} {'set' if value else 'clear'}" for index, value in enumerate(slots))
        super().__init__(
            f"cache-ready signal {signal_name!r}: rank {rank} was not set after {elapsed:.1f} s: {detail}. "
            f"Slots: {states}. Fix: {fix}"
        )

    def with_hint(self, hint: str) -> CacheNotReadyError:
        """This error with ``hint`` ending its message."""
        return CacheNotReadyError(
            self.signal_name, self.rank, self.elapsed, self.slots, self.cause, self.detail, f"{self.fix}. {hint}"
        )


class SignalWaitError(CacheNotReadyError):
    """A wait on one of FastDeploy's signal words ended without the word taking the awaited value.

    ``index`` is the word (a local rank, or 0 for a one-word signal), ``value`` the awaited value,
    ``seen`` the last value read; ``cause`` is ``"timeout"`` or ``"watched_exited"``; ``what`` the step;
    ``hint`` another cause the caller knows of, ending the message (:meth:`with_hint`).
    """

    def __init__(
        self,
        signal_name: str,
        index: int,
        value: int,
        seen: int,
        elapsed: float,
        cause: str,
        what: str,
        detail: str,
        hint: str = "",
    ) -> None:
        self.signal_name, self.rank, self.elapsed, self.cause = signal_name, index, elapsed, cause
        self.value, self.seen, self.what, self.slots, self.detail = value, seen, what, (seen,), detail
        step = f"{what}: " if what else ""
        FdPlatformsError.__init__(
            self,
            f"{step}FastDeploy signal {signal_name!r} word {index} is {seen}, not {value}, after {elapsed:.1f} s: "
            f"{detail}. Fix: check that the process which writes it is running and progressing (its log says why "
            "it stopped); raise the timeout if the step legitimately takes longer" + (f". {hint}" if hint else ""),
        )

    def with_hint(self, hint: str) -> SignalWaitError:
        """This error with ``hint`` ending its message."""
        return SignalWaitError(
            self.signal_name, self.rank, self.value, self.seen, self.elapsed, self.cause, self.what, self.detail, hint
        )


class CacheSharingError(FdPlatformsError):
    """A KV cache cannot cross processes as asked: the platform cannot share tensors, a published
    tensor differs from the attacher's layout, or the creator's cache is gone."""

    exit_code = 2


class CacheInUseError(FdPlatformsError):
    """A cache could not be freed within the bound because other processes still hold it.

    ``ranks`` names the local ranks whose attachers have not let go.
    """

    def __init__(self, message: str, ranks: tuple[int, ...] = ()) -> None:
        self.ranks = ranks
        super().__init__(message)


class CacheUpdateError(FdPlatformsError):
    """A KV-cache clear/update failed, or a new one cannot start after one failed: ``word`` is what
    ``kv_cache_status`` says (an fd-platforms failure word, :mod:`fd_platforms.fastdeploy.cache_status`), ``rank``
    the local rank it names (None: none)."""

    def __init__(self, message: str, word: int, rank: int | None = None) -> None:
        self.word, self.rank = word, rank
        super().__init__(message)

    def with_hint(self, hint: str) -> CacheUpdateError:
        """This error with ``hint`` ending its message."""
        return CacheUpdateError(f"{self}. {hint}", self.word, self.rank)


class DeviceAllocError(FdPlatformsError, MemoryError):
    """A KV cache tensor could not be allocated on the device; nothing allocated before it is kept."""


class DevicePlacementError(FdPlatformsError):
    """This Paddle cannot place tensors on the device's type at all (a configuration error, not a lack of
    memory): ``device`` as given, ``placeable`` the device types this Paddle does place tensors on, ``fix``
    the Paddle build or custom-device plugin that drives the type."""

    exit_code = 2

    def __init__(self, device: str, device_type: str, placeable: tuple[str, ...], fix: str) -> None:
        self.device, self.device_type, self.placeable = device, device_type, placeable
        super().__init__(
            f"device {device!r}: this Paddle cannot place tensors on device type {device_type!r}; it places them "
            f"on {', '.join(placeable)}. A platform whose device Paddle does not drive cannot hold a KV cache "
            f"through the engine API. Fix: {fix}"
        )


class RunError(FdPlatformsError):
    """A process of ``fd-platforms run`` failed or fell silent.

    ``failures`` holds ``(process, what happened)`` pairs (``("rank 1", "CacheNotReadyError: ...")``);
    ``exit_code`` is the first failure's (2 for a child's configuration or memory error). Processes
    failing alike share one line; several different failures are one line each under a heading.
    """

    def __init__(self, failures: tuple[tuple[str, str], ...], exit_code: int = 1) -> None:
        self.failures, self.exit_code = failures, exit_code
        grouped: dict[str, list[str]] = {}
        for process, what in failures:
            grouped.setdefault(what, []).append(process)
        lines = [f"{', '.join(processes)}: {what}" for what, processes in grouped.items()]
        heading = f"{len(failures)} processes failed:"
        super().__init__(lines[0] if len(lines) == 1 else heading + "".join(f"\n  {line}" for line in lines))


class NodeError(FdPlatformsError):
    """Another node of a multi-node engine failed, vanished, or did not answer in time; the
    message names the node (and rank) and what was being waited for."""


class ExtraNotInstalledError(FdPlatformsError, ImportError):
    """A feature needs a package that an optional extra of fd-platforms installs, and it is not installed."""

    def __init__(self, package: str, extra: str, feature: str) -> None:
        self.package, self.extra = package, extra
        super().__init__(f"{feature} needs {package}, which is not installed. Fix: pip install 'fd-platforms[{extra}]'")


class PaddleNotInstalledError(ExtraNotInstalledError):
    """A platform needs PaddlePaddle to allocate or open its cache, and paddle is not installed in this environment."""

    exit_code = 2  # refused before anything starts, as a bad setting is

    def __init__(self, needed_by: str) -> None:
        FdPlatformsError.__init__(
            self,
            f"{needed_by} needs PaddlePaddle, which is not installed here. Fix: pip install "
            "'fd-platforms[paddle]' (Paddle's CPU build), or install your accelerator's Paddle build "
            "(paddlepaddle-gpu, paddlepaddle-xpu, ...)",
        )
        self.package, self.extra = "paddlepaddle", "paddle"


class ControlWireError(FdPlatformsError):
    """FastDeploy's control path (its engine cache queue, its FMQ reply queues) could not be spoken: a peer that
    is gone, an answer that did not come in time, or a message refused."""


class PickleRefusedError(ControlWireError):
    """A pickle from FastDeploy's side names a class outside what its control protocol carries; nothing of it ran.
    ``module`` and ``name`` are the class it named."""

    def __init__(self, module: str, name: str, where: str) -> None:
        self.module, self.name = module, name
        super().__init__(
            f"{where}: refused to unpickle {module}.{name}: only the classes FastDeploy's control protocol carries "
            "are unpickled (ControlRequest, CacheStatus, the manager's errors); nothing of it ran. Fix: send only "
            "ControlRequests over this queue, or check what else is listening at this address"
        )
