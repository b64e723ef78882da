"""Detecting the platforms a command did not name, in a child process.

A plugin's import or detection may do what the core cannot contain in its own process: hang past
its bound (which ends the process, :mod:`.watchdog`), ``os._exit``, a signal to its own process, a
crash in native code. When a command considers platforms it was not told to use (``list``, or
selection without ``FD_PLATFORM``), a child process loads, detects and (where detection finds the
device) confirms them one after another, as the in-process prober would, and reports each on a pipe
of its own, saying first which one it starts and, once its plugin has loaded, the device nodes it claims. A
platform that ends the child is broken, named with how the process ended (its step and bound, when it ran past
the bound), its claim kept (so selection on a host with those nodes refuses instead of falling back to cpu), and
a new child screens the rest. The command itself then imports only the platform it selects. The child sees the
plugins this process sees (its ``sys.path``) and writes anything they print to this process's stderr.

The child is :mod:`.screening_child`.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..contract import errors
from ..contract.errors import FdPlatformsError, PluginError, PluginLoadError, PluginTimeoutError
from ..contract.types import Detection
from ..ipc.process_watch import describe_exit
from .accelerators import NodeClaim
from .discovery import Candidate
from .watchdog import ENV_DETECT_TIMEOUT, TIMED_OUT_STATUSES

MARGIN_SECONDS = 10.0
"""What the child gets beyond its plugins' bounds: its own start-up (Python, the core, pluggy)."""
STEPS = 3  # bounded calls per platform in the child: loading, detection, confirmation
_TIMED_OUT = re.compile(r" in fd-platforms: plugin .*?, (?P<step>[^,]+), bound [0-9.e+]+ s \(")


@dataclass(frozen=True)
class Screened:
    """One platform as the child found it: its detection, device type and node claim, or its error."""

    detection: Detection | None = None
    device_type: str | None = None
    error: FdPlatformsError | None = None
    claim: NodeClaim | None = None


@dataclass(frozen=True)
class ChildRun:
    """What one child reported: results by name, the platform it was on when it ended early (if any)
    and how it ended then, with the step that ran past its bound where the watchdog ended it."""

    reported: dict[str, Screened]
    started: str | None
    ended: str | None
    timed_out_step: str | None
    claims: dict[str, NodeClaim | None] = field(default_factory=dict)


def screen(candidates: Iterable[Candidate], bound: float) -> dict[str, Screened]:
    """Load, detect and confirm ``candidates`` in child processes, each step within ``bound`` seconds;
    every one gets a result, and none can end this process."""
    pending = {candidate.name: candidate for candidate in candidates}
    found: dict[str, Screened] = {}
    while pending:
        run = _run_child(list(pending), bound)
        for name, result in run.reported.items():
            found[name] = result
            pending.pop(name)
        if run.ended is None:
            continue
        if run.started in pending:  # the platform the child was on when it ended: broken; a new child for the rest
            candidate = pending.pop(run.started)
            found[candidate.name] = Screened(
                error=_ended_error(candidate, run, bound), claim=run.claims.get(candidate.name)
            )
        else:  # it ended outside any plugin's code: nothing is left to blame, and nothing to learn by retrying
            for candidate in pending.values():
                found[candidate.name] = Screened(error=_unscreened_error(candidate, run.ended))
            pending.clear()
    return found


def _run_child(names: list[str], bound: float) -> ChildRun:
    """Screen ``names`` in one child; what it reported, and how it ended if it ended before reporting all."""
    read, write = os.pipe()
    paths = os.pathsep.join(path for path in sys.path if path)
    env = {**os.environ, "PYTHONPATH": paths, ENV_DETECT_TIMEOUT: repr(bound)}
    command = [sys.executable, "-m", f"{__package__}.screening_child", str(write), *names]
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=_stderr_fd(), pass_fds=(write,), env=env)
    finally:
        os.close(write)
    reported: dict[str, Screened] = {}
    claims: dict[str, NodeClaim | None] = {}
    started: str | None = None
    timed_out_step: str | None = None
    allowed = len(names) * STEPS * bound + MARGIN_SECONDS
    deadline = time.monotonic() + allowed
    try:
        for line in _lines_until(read, deadline, child):
            parsed = _parse(line)
            if isinstance(parsed, str):
                started = parsed
            elif isinstance(parsed, Claimed):
                if parsed.name in names:
                    claims[parsed.name] = parsed.claim
            elif parsed is not None and parsed[0] in names:
                reported[parsed[0]] = parsed[1]
            elif timed_out_step is None and (match := _TIMED_OUT.search(line.decode(errors="replace"))):
                timed_out_step = match.group("step")  # faulthandler's stack: the innermost call named
        code = child.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        code = None
    finally:  # Ctrl-C, a timeout, anything: the child never outlives the call
        os.close(read)
        if child.poll() is None:
            child.kill()
            child.wait()
    if len(reported) == len(names):
        return ChildRun(reported, None, None, None, claims)
    ended = f"did not finish within {allowed:g} s" if code is None else describe_exit(code)
    in_progress = started if started not in reported else None
    step = timed_out_step if code in TIMED_OUT_STATUSES else None  # a watcher's exit, after the named frame
    return ChildRun(reported, in_progress, ended, step, claims)


def _stderr_fd() -> int:
    """This process's stderr descriptor (2 where ``sys.stderr`` has none: a test's capture)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return 2


def _lines_until(fd: int, deadline: float, child: subprocess.Popen[bytes]) -> Iterable[bytes]:
    """The child's result lines until it closes the pipe or the deadline passes (then it is killed)."""
    buffer = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            child.kill()
            return
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from complete


def _ended_error(candidate: Candidate, run: ChildRun, bound: float) -> PluginError:
    if run.timed_out_step is not None:
        step = run.timed_out_step
        return PluginTimeoutError(
            candidate.name,
            candidate.distribution,
            f"{step} did not return within {bound:g} s, so the plugin is marked broken. Fix: repair or uninstall "
            f"{candidate.distribution}; if it legitimately takes longer, raise {ENV_DETECT_TIMEOUT} (seconds)",
            step=step,
            seconds=bound,
        )
    return candidate.error(
        PluginLoadError,
        f"loading or detecting it ended the process that did it (it {run.ended}), so it is broken; the command "
        f"went on without it. Fix: repair or uninstall {candidate.distribution}",
    )


def _unscreened_error(candidate: Candidate, ended: str) -> PluginLoadError:
    return candidate.error(
        PluginLoadError,
        f"the child process that detects platforms ended before it reached this one (it {ended}), so it was not "
        "detected. Fix: run the command again; if this repeats, set FD_PLATFORM to the platform to use",
    )


@dataclass(frozen=True)
class Claimed:
    """The child's word that platform ``name``'s plugin loaded, and the device nodes it claims."""

    name: str
    claim: NodeClaim | None


def claimed_line(name: str, claim: NodeClaim | None) -> str:
    """The child's line saying ``name``'s plugin loaded with ``claim`` (:class:`Claimed`)."""
    return json.dumps({"loaded": name, "claim": None if claim is None else asdict(claim)})


def _parse(line: bytes) -> str | Claimed | tuple[str, Screened] | None:
    """The name of the platform the child starts, its claim once loaded, or one result; None for anything else
    (faulthandler's stack, or a plugin in the child writing to any descriptor)."""
    try:
        found = json.loads(line)
        if "started" in found:
            return str(found["started"])
        claim = None if found.get("claim") is None else NodeClaim(**found["claim"])
        if "loaded" in found:
            return Claimed(str(found["loaded"]), claim)
        if found.get("detection") is not None:
            return found["name"], Screened(Detection(**found["detection"]), found.get("device_type"), claim=claim)
        return found["name"], Screened(error=_rebuilt(found["error"]), claim=claim)
    except Exception:  # noqa: BLE001 - any content at all
        return None


def _rebuilt(error: dict[str, Any]) -> FdPlatformsError:
    """The child's error as this process's own, of the same type where it is a plugin error."""
    kind = getattr(errors, str(error["type"]), None)
    if not (isinstance(kind, type) and issubclass(kind, PluginError)):
        return FdPlatformsError(str(error["text"]))
    plugin, distribution, message = str(error["plugin"]), str(error["distribution"]), str(error["message"])
    if issubclass(kind, PluginTimeoutError):
        return kind(plugin, distribution, message, step=str(error["step"]), seconds=float(error["seconds"]))
    return kind(plugin, distribution, message)


def record(name: str, found: Screened) -> dict[str, object]:
    """One platform's result line: its detection, device type and node claim, or its error."""
    error = found.error
    claimed = None if found.claim is None else asdict(found.claim)
    if error is None:
        detected = asdict(found.detection)  # type: ignore[arg-type]  # no error: a detection
        return {"name": name, "detection": detected, "device_type": found.device_type, "claim": claimed}
    described: dict[str, object] = {"type": type(error).__name__, "text": str(error)}
    if isinstance(error, PluginError):
        prefix = f"platform plugin {error.plugin!r} (distribution {error.distribution}): "
        described.update(plugin=error.plugin, distribution=error.distribution, message=str(error).removeprefix(prefix))
    if isinstance(error, PluginTimeoutError):
        described.update(step=error.step, seconds=error.seconds)
    return {"name": name, "error": described, "claim": claimed}
