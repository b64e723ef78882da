"""The processes the tests start themselves, started warm: forked from a server that imported Paddle once.

FastDeploy runs a process per rank, and so do the tests; spawned, each of those processes imported Paddle from
nothing (about 2 s of CPU). :data:`warm` is a drop-in for ``multiprocessing.get_context("spawn")``: its processes
come from ``multiprocessing``'s forkserver, one per test process (each xdist worker), started at the first warm
process with Paddle and numpy preloaded (:data:`PRELOAD`), and stopped and reaped at the end of the session
(:func:`stop_server`, from ``tests/conftest.py``), so its CPU counts where the suite's rusage looks.

What a spawned child gets, a warm one gets too: its own pid; the parent's ``sys.path``, ``sys.argv`` and working
directory (``multiprocessing``'s preparation data, as for spawn); the parent's environment at ``start()``
and its stdout and stderr (pytest's capture of them, where a test captures) at ``start()``
(:func:`_in_parents_environment`); the signal dispositions of a fresh interpreter that imported Paddle; the
``/dev/shm`` of its test process (the server is started from it, in its mount namespace); one thread. One thing
differs and is no test's business: its parent is the server, not the test process.

Paddle reads some of its environment when it is imported (``FLAGS_*``, ``CUSTOM_DEVICE_ROOT`` for custom devices,
the library paths). A process whose environment differs from the server's in anything but :data:`READ_LATER` is
spawned as before, so a test that points a child at a fake device runtime gets a Paddle that loaded it.
``tests/test_warm_processes.py`` holds a warm child to a spawned one.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.reduction
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

PRELOAD = ("paddle", "numpy")  #: what the server imports once, before it forks anything
#: Variables a warm child may have other than the server had: read after Paddle's import (ours and FastDeploy's
#: settings, pytest's bookkeeping), so they take effect in the child as in a spawned one.
READ_LATER = ("FD_", "PYTEST_")

multiprocessing.forkserver.set_forkserver_preload(list(PRELOAD))
_spawn = multiprocessing.get_context("spawn")
_server_started_with: dict[str, str] = {}  # the environment the running server started with, before its import


def import_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """The part of ``environment`` that Paddle's import may read: all but :data:`READ_LATER`."""
    return {name: value for name, value in environment.items() if not name.startswith(READ_LATER)}


class _ParentsStreams:
    """The parent's descriptors 1 and 2 at ``start()``, sent to the warm child with its target (pickled while the
    process starts: ``multiprocessing`` passes them to the server as it passes a pipe's)."""

    def __reduce__(self) -> tuple[Callable[..., int], tuple[Any, ...]]:
        return _streams_of_the_parent, (multiprocessing.reduction.DupFd(1), multiprocessing.reduction.DupFd(2))


def _streams_of_the_parent(stdout: Any, stderr: Any) -> int:
    """In the warm child: the parent's descriptors on 1 and 2, where a spawned child has them."""
    for fd, passed in ((1, stdout), (2, stderr)):
        received = passed.detach()
        os.dup2(received, fd)
        os.close(received)
    return 2


def _in_parents_environment(
    environment: dict[str, str],
    server_started_with: dict[str, str],
    _streams: int,
    target: Callable[..., object],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """The warm child's target: the parent's environment, as a spawned child inherits it, with what the server's
    import of Paddle added where the parent has none (Paddle sets ``OMP_NUM_THREADS``, ``CUSTOM_DEVICE_ROOT``
    when unset, as it would in a spawned child), its stdout and stderr (``_streams``, in place once unpickled); then
    ``target``."""
    added = {name: value for name, value in os.environ.items() if name not in server_started_with}
    os.environ.clear()
    os.environ.update(environment)
    for name, value in added.items():
        os.environ.setdefault(name, value)
    target(*args, **kwargs)


class WarmProcess(multiprocessing.context.ForkServerProcess):
    """A process forked from the warm server, which runs ``target`` in the environment of ``start()``."""

    def start(self) -> None:
        self._args = (  # type: ignore[attr-defined]
            dict(os.environ),
            dict(_server_started_with),
            _ParentsStreams(),
            self._target,  # type: ignore[attr-defined]
            tuple(self._args),  # type: ignore[attr-defined]
            dict(self._kwargs),  # type: ignore[attr-defined]
        )
        self._target = _in_parents_environment  # type: ignore[attr-defined]
        self._kwargs = {}  # type: ignore[attr-defined]
        super().start()


def server_running() -> bool:
    """Whether this process's warm server has been started (and not stopped)."""
    return multiprocessing.forkserver._forkserver._forkserver_pid is not None  # type: ignore[attr-defined]


def _warm_enough() -> bool:
    """Whether a process started now can come from the server: started here now if it is not running."""
    if not server_running():
        multiprocessing.forkserver.ensure_running()
        _server_started_with.clear()
        _server_started_with.update(os.environ)
    return import_environment(os.environ) == import_environment(_server_started_with)


def stop_server() -> None:
    """Stop this process's warm server and reap it (its children's CPU is in its rusage); nothing if none."""
    if server_running():
        multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]
    _server_started_with.clear()


class WarmContext:
    """``multiprocessing.get_context("spawn")``'s ``Process``, ``Pipe``, ``Barrier``, ``Queue`` and ``Event``,
    with processes from the warm server where :func:`_warm_enough`, spawned otherwise."""

    Pipe = staticmethod(_spawn.Pipe)
    Barrier = staticmethod(_spawn.Barrier)
    Queue = staticmethod(_spawn.Queue)
    Event = staticmethod(_spawn.Event)

    def Process(self, *args: Any, **kwargs: Any) -> multiprocessing.process.BaseProcess:
        """A warm process, or a spawned one where the environment is not the server's."""
        if _warm_enough():
            return WarmProcess(*args, **kwargs)
        return _spawn.Process(*args, **kwargs)


warm = WarmContext()  #: the tests' context for the processes they start themselves


def what_a_child_sees(shm_probe: str, conn: Connection) -> None:
    """A child's report of what the tests rely on (``tests/test_warm_processes.py``): sent on ``conn``."""
    preloaded, path = "paddle" in sys.modules, list(sys.path)  # Paddle's import appends setuptools' vendored path
    import paddle

    status = dict(line.split(":\t", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":\t" in line)
    conn.send(
        {
            "pid": os.getpid(),
            "paddle preloaded": preloaded,
            "paddle works": float(paddle.to_tensor([1.0, 2.0]).sum()) == 3.0,
            "handlers": {int(sig): repr(signal.getsignal(sig)) for sig in signal.valid_signals() if sig < 32},
            "kernel signal masks": {key: status[key].strip() for key in ("SigBlk", "SigIgn", "SigCgt")},
            "threads": len(os.listdir("/proc/self/task")),
            "python threads": threading.active_count(),
            "environment": dict(os.environ),
            "cwd": os.getcwd(),
            "sys.path": path,
            "/dev/shm": (os.stat("/dev/shm").st_dev, os.path.exists(f"/dev/shm/{shm_probe}")),
            "mount namespace": os.readlink("/proc/self/ns/mnt"),
            "stdout, stderr": [(os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in (1, 2)],
        }
    )
    conn.close()
