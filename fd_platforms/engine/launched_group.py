"""The process group this process is already in: made by ``python -m paddle.distributed.launch``'s
workers with ``fleet.init`` / ``init_parallel_env``, or about to be (the launcher's variables set).

Read, never written: the launcher's ``PADDLE_*`` variables and Paddle's default group, looked up at
each call (an RL weight update shuts the group down and restarts it between agreements). No port or
store of ours: a rank counts itself in on the group's own store (:class:`Arrival`) before each
collective, so a rank that never comes is named instead of a collective that waits for it.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any, TypeVar

from ..contract.errors import ConfigError, NodeError
from ..contract.integers import decimal
from ..contract.paddle_import import import_paddle
from ..ipc.console import printable
from .bounded import bounded

ARRIVED = "fd-platforms/arrived/"
#: What Paddle's store and collectives raise when a peer or the store's host fails.
PADDLE_ERRORS = (RuntimeError, OSError, SystemError, ValueError)
POLL_SECONDS = 0.02
OP_SECONDS = 2.0  #: the least a store call is allowed, however close the deadline
_FLAGS_BANNER = re.compile(r"=+ Modified FLAGS detected =+\n(FLAGS\(.*\)\n)*=+\n")
T = TypeVar("T")  #: what the call returns, returned as it is


def paddle_as_is() -> ModuleType:
    """Paddle, imported without leaving any variable of this process changed."""
    return sys.modules["paddle"] if "paddle" in sys.modules else import_paddle(leave_environment=True)


def enter_group(timeout: float, timed_out: Callable[[], NodeError]) -> tuple[int, int]:
    """(rank, world size) of the group this process is in; joins the launcher's group first when the
    launcher started this process and nothing joined it yet (Paddle reads the launcher's variables)."""
    paddle = paddle_as_is()
    dist = paddle.distributed
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    world = os.environ.get("PADDLE_TRAINERS_NUM")
    if world is None or not decimal(world) or "PADDLE_TRAINER_ID" not in os.environ:
        raise ConfigError(
            "PADDLE_TRAINERS_NUM",
            world,
            "set by python -m paddle.distributed.launch, or a process group made by "
            "fleet.init(is_collective=True) / paddle.distributed.init_parallel_env()",
            "start each worker with python -m paddle.distributed.launch, or call fleet.init(is_collective=True) "
            "before Cluster.current",
        )
    if int(world) == 1:
        return 0, 1  # Paddle makes no group for one process
    deadline = time.monotonic() + timeout
    host, _, port = os.environ.get("PADDLE_MASTER", "").rpartition(":")
    if os.environ["PADDLE_TRAINER_ID"] != "0" and decimal(port) is not None:  # rank 0 hosts the group's store
        wait_for_listener(host, int(port), deadline, timed_out)
    without_flags_banner(lambda: bounded(dist.init_parallel_env, max(0.0, deadline - time.monotonic()), timed_out))
    return dist.get_rank(), dist.get_world_size()


def without_flags_banner(call: Callable[[], T]) -> T:
    """``call()``, with the banner of every modified FLAG that Paddle's ``init_parallel_env`` prints taken out
    of what it writes to ``sys.stderr``."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return call()
    finally:
        sys.stderr.write(printable(_FLAGS_BANNER.sub("", said.getvalue())))


@dataclass(frozen=True)
class Place:
    """Where one rank runs: its host (the launcher's endpoint), its index there, and the launcher that
    started it (``POD_NAME``: two launchers on one host are two nodes)."""

    host: str
    local_rank: int
    pod: str = ""

    @classmethod
    def here(cls, environ: Mapping[str, str], rank: int) -> Place:
        endpoint = environ.get("PADDLE_CURRENT_ENDPOINT", "")
        host = environ.get("POD_IP") or endpoint.rpartition(":")[0] or os.uname().nodename
        local = decimal(environ.get("PADDLE_LOCAL_RANK", environ.get("PADDLE_RANK_IN_NODE", "")))
        return cls(host, rank if local is None else local, environ.get("POD_NAME", ""))


@dataclass(frozen=True)
class GroupRanks:
    """Every rank's :class:`Place`, in the launcher's rank order; a node is a launcher on a host, numbered in
    the order its first rank comes. A rank whose host is not known yet is only its global rank."""

    places: tuple[Place, ...]

    @classmethod
    def from_launcher(cls, environ: Mapping[str, str], world: int) -> GroupRanks:
        """What the launcher's endpoints say, before the ranks have said where they are."""
        endpoints = environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")
        hosts = [endpoint.rpartition(":")[0] for endpoint in endpoints] if len(endpoints) == world else [""] * world
        return cls(tuple(Place(host, hosts[:rank].count(host)) for rank, host in enumerate(hosts)))

    @property
    def world_size(self) -> int:
        return len(self.places)

    def locate(self, global_rank: int) -> tuple[int, int]:
        """(node, local rank) of ``global_rank``."""
        nodes = list(dict.fromkeys((place.host, place.pod) for place in self.places))
        place = self.places[global_rank]
        return nodes.index((place.host, place.pod)), place.local_rank

    def describe(self, global_rank: int) -> str:
        """``node 1 (10.0.0.2) rank 0 (global rank 8)``."""
        if not self.places[global_rank].host:
            return f"global rank {global_rank}"
        node, local = self.locate(global_rank)
        return f"node {node} ({self.places[global_rank].host}) rank {local} (global rank {global_rank})"


class Arrival:
    """Before each collective, every rank counts itself in on the group's store and waits, bounded,
    until all have; a rank that has not is named. One key per rank and one per round: a few calls."""

    def __init__(self, rank: int, world: int, describe: Callable[[int], str], limit: str) -> None:
        """``describe(rank)`` names a rank in errors; ``limit`` says what to raise for a longer wait."""
        self.rank, self.world, self.describe, self.limit = rank, world, describe, limit

    def me(self) -> str:
        return self.describe(self.rank)

    def wait(self, what: str, seconds: float) -> None:
        if self.world == 1:
            return
        deadline = time.monotonic() + seconds
        core = paddle_as_is().base.core
        store = self._call(core.create_or_get_global_tcp_store, what, deadline)
        round_ = self._call(lambda: store.add(f"{ARRIVED}rank/{self.rank}", 1), what, deadline)
        key = f"{ARRIVED}round/{round_}"
        count = self._call(lambda: store.add(key, 1), what, deadline)
        while count < self.world:
            if time.monotonic() >= deadline:
                raise self._missing(store, round_, what, seconds, deadline)
            time.sleep(POLL_SECONDS)
            count = self._call(lambda: store.add(key, 0), what, deadline)

    def _missing(self, store: Any, round_: int, what: str, seconds: float, deadline: float) -> NodeError:
        counts = [self._call(partial(store.add, f"{ARRIVED}rank/{r}", 0), what, deadline) for r in range(self.world)]
        missing = [self.describe(r) for r, n in enumerate(counts) if n < round_]
        return NodeError(
            f"{self.me()}: {', '.join(missing) or 'a rank'} did not come to {what} within {seconds:g} s. "
            f"Fix: check those ranks' output (the launcher's log directory); {self.limit}"
        )

    def _call(self, call: Callable[[], Any], what: str, deadline: float) -> Any:
        return store_call(
            call,
            deadline,
            lambda seconds: NodeError(
                f"{self.me()}: the group's store (hosted by global rank 0) stopped answering "
                f"while {what}. Fix: check global rank 0's output"
            ),
            lambda first: NodeError(
                f"{self.me()}: lost the group's store (hosted by global rank 0) while {what}: "
                f"{first}. Fix: check global rank 0's output"
            ),
        )


def store_call(
    call: Callable[[], Any], deadline: float, timed_out: Callable[[float], NodeError], lost: Callable[[str], NodeError]
) -> Any:
    """``call()`` on a Paddle store, bounded by the time left to ``deadline`` but at least :data:`OP_SECONDS`
    (a poll near the deadline is not the store's host failing): ``timed_out(seconds)`` is raised when it
    does not answer, ``lost(Paddle's first line)`` when Paddle raises."""
    seconds = max(OP_SECONDS, deadline - time.monotonic())
    try:
        return bounded(call, seconds, lambda: timed_out(seconds))
    except PADDLE_ERRORS as exc:
        raise lost(first_line(exc)) from exc


def first_line(exc: BaseException) -> str:
    """The first non-blank line of a Paddle error (its C++ stack follows), else its type's name."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def wait_for_listener(host: str, port: int, deadline: float, timed_out: Callable[[], NodeError]) -> None:
    """Return once ``host:port`` accepts a connection (closed at once): Paddle's store client retries a
    refused connection only every 3 s, holding the interpreter lock, so a rank that started before the
    store's host would wait that long, past any bound of ours."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise timed_out()
        try:
            socket.create_connection((host, port), timeout=min(1.0, remaining)).close()
            return
        except OSError:
            time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
