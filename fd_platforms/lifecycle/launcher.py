"""``fd-platforms run --nnodes N``: this node's workers are started by Paddle's launcher, as FastDeploy's are.

The engine starts ``python -m paddle.distributed.launch --nnodes N --rank I --master HOST:PORT
--nproc_per_node R`` (and ``--devices`` on an accelerator) with :mod:`.launched` as the script. The
launchers of every node meet at the master (node 0's launcher serves it), then each starts its node's R
workers in the process group it set up, which the workers agree over (``Cluster.current``). Each worker
connects back to its node's engine on a Unix socket in a folder only this user can enter (its path in
:data:`ENV_ENGINE`), says its local rank and pid, takes the engine's stderr for its progress lines and
from then on speaks :mod:`.worker`'s pipe protocol, as a spawned worker does. Every wait is bounded by
``--timeout``; the launcher's own lines go to a log in that folder, and the last one is quoted when it
fails or keeps waiting.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from contextlib import AbstractContextManager, suppress
from multiprocessing import reduction
from multiprocessing.connection import Connection, wait
from pathlib import Path

from ..contract.errors import NodeError
from .children import Child, Children
from .spec import NodeFlags, RunSpec

#: Where a launched worker finds its node's engine: the path of the engine's socket.
ENV_ENGINE = "FD_PLATFORMS_ENGINE"
LAUNCHED = "fd_platforms.lifecycle.launched"  # the launcher's script: python -u -m LAUNCHED
LAUNCHER_STOP_SECONDS = 1.0  # from SIGTERM to SIGKILL: the launcher's SIGTERM handler stops what it started
#: A line of the launcher's log: ``LAUNCH INFO 2026-11-26 22:04:43,051 Waiting peer start...``.
_LAUNCH_LINE = re.compile(r"^LAUNCH \w+ \S+ \S+ (.*)$", re.MULTILINE)


def launcher_command(spec: RunSpec, log_dir: str) -> list[str]:
    """Paddle's launcher for this node's ``spec.ranks`` workers: ``--devices`` names the ranks' devices
    (the visible devices' labels) where each rank has its own."""
    nodes = _nodes(spec)
    flags = {"--nnodes": nodes.nnodes, "--rank": nodes.node_rank, "--master": nodes.master}
    flags |= {"--nproc_per_node": spec.ranks, "--log_dir": log_dir}
    if not spec.shares_device:
        flags["--devices"] = ",".join(str(spec.device_id(rank)) for rank in range(spec.ranks))
    given = [str(part) for flag in flags.items() for part in flag]
    return [sys.executable, "-m", "paddle.distributed.launch", *given, sys.executable, "-u", "-m", LAUNCHED]


class LaunchedProcess:
    """A worker the launcher started (not the engine's child), watched and signalled through a pidfd, so
    that a pid the kernel has given to another process is never signalled."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.sentinel = os.pidfd_open(pid)
        self.exitcode: int | None = None  # the launcher reaps it: its exit code is not the engine's to read
        weakref.finalize(self, os.close, self.sentinel)

    def join(self, timeout: float | None = None) -> None:
        select.select([self.sentinel], [], [], timeout)

    def is_alive(self) -> bool:
        return not select.select([self.sentinel], [], [], 0)[0]

    def terminate(self) -> None:
        self._send(signal.SIGTERM)
        self._send(signal.SIGCONT)

    def kill(self) -> None:
        self._send(signal.SIGKILL)

    def _send(self, signum: int) -> None:
        with suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.sentinel, signum)


class Launcher(AbstractContextManager["Launcher"]):
    """Paddle's launcher of this node's workers, and the socket they connect back to. Leaving the ``with``
    block (after the workers have been stopped) stops the launcher, bounded, and removes the folder."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec, self.nodes = spec, _nodes(spec)
        self.folder = Path(tempfile.mkdtemp(prefix="fd-platforms-launch-"))  # mode 0700: only this user connects
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(self.folder / "engine"))
        self.server.listen(spec.ranks)
        self.log = (self.folder / "launcher.log").open("wb")
        self.process = subprocess.Popen(
            launcher_command(spec, str(self.folder)),
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, ENV_ENGINE: str(self.folder / "engine")},
        )
        self.ended = os.pidfd_open(self.process.pid)

    def accept(self, children: Children, instance: str) -> list[Child]:
        """This node's workers in local-rank order, adopted by ``children`` once each has connected and said
        who it is; each is sent the run and ``instance``. A NodeError when the launcher ends first or none
        comes within ``--timeout`` (the launcher starts them once every node has come to the master)."""
        deadline = time.monotonic() + self.spec.timeout
        found: dict[int, Child] = {}
        while len(found) < self.spec.ranks:
            ready = wait([self.server, self.ended], timeout=max(0.0, deadline - time.monotonic()))
            if self.ended in ready:
                raise self._failed(
                    f"ended with exit code {self.process.wait()} before it started this node's "
                    f"{self.spec.ranks} worker(s)"
                )
            if not ready:
                raise self._failed(
                    f"started {len(found)} of this node's {self.spec.ranks} worker(s) within {self.spec.timeout:g} s"
                )
            sock, _ = self.server.accept()
            conn = Connection(sock.detach())
            try:
                rank, pid = self._hello(conn, deadline)
                reduction.send_handle(conn, sys.stderr.fileno(), pid)  # its progress lines go where the engine's do
                conn.send((self.spec, instance, os.getpid()))
            except (EOFError, OSError) as exc:
                raise NodeError(
                    f"node {self.nodes.node_rank}: a worker ended while it connected to the engine "
                    f"({str(exc) or type(exc).__name__}). Fix: check the workers' output above"
                ) from exc
            found[rank] = children.adopt(f"rank {rank}", LaunchedProcess(pid), conn)
        return [found[rank] for rank in range(self.spec.ranks)]

    def _hello(self, conn: Connection, deadline: float) -> tuple[int, int]:
        """(local rank, pid) a worker sends first: a NodeError naming anything else."""
        hello = conn.recv() if conn.poll(max(0.0, deadline - time.monotonic())) else None
        if not (isinstance(hello, tuple) and len(hello) == 2 and hello[0] in range(self.spec.ranks)):
            raise NodeError(
                f"node {self.nodes.node_rank}: a process that is not one of this node's workers connected "
                f"to the engine ({hello!r}). Fix: report this as a bug"
            )
        return hello[0], int(hello[1])

    def _failed(self, what: str) -> NodeError:
        nodes, master = self.nodes, self.nodes.master
        said = _LAUNCH_LINE.findall((self.folder / "launcher.log").read_text(errors="replace"))
        return NodeError(
            f"node {nodes.node_rank} of {nodes.nnodes}: python -m paddle.distributed.launch (pid {self.process.pid}) "
            f"{what}; it starts them once all {nodes.nnodes} nodes have come to --master {master} (its last line: "
            f"{said[-1] if said else 'none'!r}). Fix: start each node with --nnodes {nodes.nnodes}, its own "
            f"--node-rank and --master {master}; raise --timeout if a node starts later"
        )

    def __exit__(self, *exc_info: object) -> None:
        self.server.close()
        self.process.terminate()  # its workers are stopped: it has nothing left to wait for
        try:
            self.process.wait(LAUNCHER_STOP_SECONDS)
        except subprocess.TimeoutExpired:  # inside a call that does not see the signal (an HTTP wait of 5 s)
            self.process.kill()
            self.process.wait()
        os.close(self.ended)
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _nodes(spec: RunSpec) -> NodeFlags:
    if spec.nodes is None:
        raise ValueError("a launcher is for a run over several nodes (spec.nodes)")
    return spec.nodes
