"""Detecting the platforms a command will not necessarily select, in a child process.

A plugin's import or detection may do what no thread can contain: ``os._exit``, a signal to its own
process, a crash in native code. When several platforms are detected at once (``list``, or selection
without ``FD_PLATFORM``), they are loaded and detected in a child process, as the in-process prober
would (each bounded, isolated); the child reports each platform as it finishes, on a pipe of its
own. A platform whose detection ends the child is broken, named with how the process ended, and the
others are detected again without it. A platform the child could not blame with certainty (a
standard descriptor closed while several detections ran: :class:`~.isolation.StreamsDisturbed`) is
detected again alone, like the others after an early end. The command itself then imports only the
platform it selects. The child sees the plugins this process sees (its ``sys.path``), and writes
anything the plugins print to this process's stderr.

The child is :mod:`.screening_child`.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from ..contract import errors
from ..contract.errors import FdPlatformsError, PluginError, PluginLoadError, PluginTimeoutError
from ..contract.types import Detection
from ..ipc.process_watch import describe_exit
from .discovery import Candidate
from .isolation import StreamsDisturbed

MARGIN_SECONDS = 10.0
"""What the child gets beyond the detection bound: its own start-up (Python, the core, pluggy)."""


@dataclass(frozen=True)
class Screened:
    """One platform as the child found it: its detection and device type, or its error."""

    detection: Detection | None = None
    device_type: str | None = None
    error: FdPlatformsError | None = None
    again_alone: bool = False
    """The child could not tell whether the error is this platform's: detect it again by itself."""


def screen(candidates: Iterable[Candidate], bound: float) -> dict[str, Screened]:
    """Load and detect ``candidates`` in child processes; every one gets a result, none can end this process."""
    pending = {candidate.name: candidate for candidate in candidates}
    found: dict[str, Screened] = {}
    together = True
    while pending:
        batch = list(pending) if together else [next(iter(pending))]
        reported, ended = _run_child(batch, bound)
        settled = {name: result for name, result in reported.items() if not (result.again_alone and len(batch) > 1)}
        found.update(settled)
        for name in settled:
            pending.pop(name)
        if ended is not None and len(batch) == 1 and batch[0] in pending:
            candidate = pending.pop(batch[0])
            found[candidate.name] = Screened(error=_ended_error(candidate, ended))
        # after a child ended early or could not blame, the rest one at a time, to name the one
        together = together and ended is None and len(settled) == len(reported)
    return found


def _run_child(names: list[str], bound: float) -> tuple[dict[str, Screened], str | None]:
    """The results the child reported, and how it ended when it ended before reporting every name."""
    read, write = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", f"{__package__}.screening_child", str(write), *names],
            stdin=subprocess.DEVNULL, stdout=_stderr_fd(), pass_fds=(write,), env=env,
        )  # fmt: skip
    finally:
        os.close(write)
    reported: dict[str, Screened] = {}
    deadline = time.monotonic() + bound + MARGIN_SECONDS
    try:
        for line in _lines_until(read, deadline, child):
            parsed = _parse(line)
            if parsed is not None and parsed[0] in names:
                reported[parsed[0]] = parsed[1]
        code = child.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        code = None
    finally:  # Ctrl-C, a timeout, anything: the child never outlives the call
        os.close(read)
        if child.poll() is None:
            child.kill()
            child.wait()
    return reported, None if len(reported) == len(names) else _describe_end(code, bound)


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


def _describe_end(code: int | None, bound: float) -> str:
    return f"did not finish within {bound + MARGIN_SECONDS:g} s" if code is None else describe_exit(code)


def _ended_error(candidate: Candidate, ended: str) -> PluginLoadError:
    return PluginLoadError(
        candidate.name,
        candidate.distribution,
        f"loading or detecting it ended the process that did it (it {ended}), so it is broken; the command "
        f"went on without it. Fix: repair or uninstall {candidate.distribution}",
    )


def _parse(line: bytes) -> tuple[str, Screened] | None:
    """One result line; None for anything else (a plugin in the child may write to any descriptor)."""
    try:
        found = json.loads(line)
        if found.get("detection") is not None:
            return found["name"], Screened(Detection(**found["detection"]), found.get("device_type"))
        return found["name"], Screened(error=_rebuilt(found["error"]), again_alone=found.get("again_alone") is True)
    except Exception:  # noqa: BLE001 - any content at all
        return None


def _rebuilt(error: dict[str, object]) -> FdPlatformsError:
    """The child's error as this process's own, of the same type where it is a plugin error."""
    kind = getattr(errors, str(error["type"]), None)
    if not (isinstance(kind, type) and issubclass(kind, PluginError)):
        return FdPlatformsError(str(error["text"]))
    plugin, distribution, message = str(error["plugin"]), str(error["distribution"]), str(error["message"])
    if issubclass(kind, PluginTimeoutError):
        return kind(plugin, distribution, message, step=str(error["step"]), seconds=float(error["seconds"]))  # type: ignore[arg-type]
    return kind(plugin, distribution, message)


def record(name: str, detection: Detection | None, device_type: str | None, error: FdPlatformsError | None) -> dict:
    if error is None:
        return {"name": name, "detection": asdict(detection), "device_type": device_type}  # type: ignore[arg-type]
    described: dict[str, object] = {"type": type(error).__name__, "text": str(error)}
    if isinstance(error, PluginError):
        prefix = f"platform plugin {error.plugin!r} (distribution {error.distribution}): "
        described.update(plugin=error.plugin, distribution=error.distribution, message=str(error).removeprefix(prefix))
    if isinstance(error, PluginTimeoutError):
        described.update(step=error.step, seconds=error.seconds)
    return {"name": name, "error": described, "again_alone": isinstance(error, StreamsDisturbed)}
