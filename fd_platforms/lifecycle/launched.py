"""A worker of ``fd-platforms run --nnodes``, started by Paddle's launcher (:mod:`.launcher`):
``python -m fd_platforms.lifecycle.launched``.

It connects to its node's engine (the socket :data:`~.launcher.ENV_ENGINE` names), says its local
rank (the launcher's ``PADDLE_LOCAL_RANK``) and pid, writes its progress lines to the engine's stderr,
ends when the engine does (the launcher, not the engine, is its parent) and then works as a spawned
worker does (:func:`~.worker.worker_main`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
from multiprocessing import reduction
from multiprocessing.connection import Connection

from .launcher import ENV_ENGINE
from .worker import worker_main

CONNECT_SECONDS = 30.0  # the engine answers a worker's hello at once


def main() -> int:
    address, rank = os.environ.get(ENV_ENGINE), os.environ.get("PADDLE_LOCAL_RANK", "")
    if not address or not rank.isdigit():
        print(
            f"fd_platforms.lifecycle.launched: started outside fd-platforms run ({ENV_ENGINE} and PADDLE_LOCAL_RANK "
            "are not set). Fix: run fd-platforms run --nnodes N --node-rank I --master HOST:PORT, which starts it "
            "through python -m paddle.distributed.launch",
            file=sys.stderr,
        )
        return 2
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    conn = Connection(sock.detach())
    conn.send((int(rank), os.getpid()))
    os.dup2(reduction.recv_handle(conn), sys.stderr.fileno())
    if not conn.poll(CONNECT_SECONDS):
        return 1
    spec, instance, engine_pid = conn.recv()
    threading.Thread(target=_end_with, args=(engine_pid,), daemon=True).start()
    worker_main(spec, int(rank), instance, conn)  # ends the process
    return 0


def _end_with(pid: int) -> None:
    """SIGTERM to this process (the worker's stop) once process ``pid`` has ended."""
    with contextlib.suppress(ProcessLookupError):  # gone already
        select.select([os.pidfd_open(pid)], [], [])
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())
