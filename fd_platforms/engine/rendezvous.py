"""Deprecated with :meth:`~fd_platforms.engine.cluster.Cluster.join`, its only user, and goes with it in 0.3
(Paddle's launcher makes the process group instead): the handshake every rank made before joining Paddle's
process group.

It runs on Paddle's own key-value store (``paddle.base.core.TCPStore``): global rank 0 hosts it at
the master's ``HOST:PORT``, every other rank connects. Each rank claims its global rank (a second
node started with the same ``--node-rank`` is refused), publishes its node's facts (``--nnodes``,
the model, ...) and waits until every node has joined with the same facts. So a mismatch is a
``ConfigError`` naming both values, and a node that never comes is named, instead of a process
group that waits for ranks that will never connect. Every store call is bounded
(:mod:`.bounded`): Paddle's store waits endlessly for a master that does not answer.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping
from functools import partial
from typing import Any

from ..contract.errors import ConfigError, NodeError
from ..contract.paddle_import import import_paddle
from ..ipc.timeouts import knob
from .bounded import bounded
from .facts import compare_facts, read_facts
from .launched_group import PADDLE_ERRORS, POLL_SECONDS, first_line, store_call, wait_for_listener
from .nodes import NodeSpec

PREFIX = "fd-platforms/"
LINGER_SECONDS = 3.0  # the most the store's host waits, when refusing a node, for the others to read its facts


class Rendezvous:
    """One rank's connection to the handshake's store; the master rank's keeps it serving."""

    def __init__(self, nodes: NodeSpec, local_rank: int, timeout: float, limit: str) -> None:
        """``timeout`` bounds the whole handshake; ``limit`` is the variable it was read from (for the fix)."""
        self.nodes, self.local_rank, self.timeout, self.limit = nodes, local_rank, timeout, limit
        self.deadline = time.monotonic() + timeout
        self.global_rank = nodes.global_rank(local_rank)
        self.me = nodes.describe(self.global_rank)
        self.store: Any = None

    def handshake(self, facts: Mapping[str, object]) -> None:
        """Connect, claim this rank, publish this node's ``facts`` and wait for every node's."""
        self.store = self._connect()
        claims = self._call(lambda: self.store.add(f"{PREFIX}rank/{self.global_rank}", 1), "claiming its rank")
        if claims > 1:
            raise ConfigError(
                "--node-rank",
                self.nodes.node_rank,
                "a node rank no other node of this engine uses",
                f"another node already joined as node {self.nodes.node_rank}: give each of the {self.nodes.nnodes} "
                f"nodes its own --node-rank from 0 to {self.nodes.nnodes - 1}",
            )
        ours = json.dumps(dict(facts), sort_keys=True)
        node = self.nodes.node_rank
        self._call(lambda: self.store.set(f"{PREFIX}node/{node}", ours.encode()), "publishing its node's facts")
        self._call(lambda: self.store.add(f"{PREFIX}node/{node}/joined", 1), "joining")
        try:
            self._wait_for_nodes(dict(facts))
        except ConfigError:
            if self.global_rank == 0:
                self._linger()
            raise

    def _linger(self) -> None:
        """The store's host refusing a node keeps the store up until the nodes that joined have read
        its facts (at most LINGER_SECONDS), so they refuse it too, naming both values."""
        deadline = time.monotonic() + LINGER_SECONDS
        others = range(1, self.nodes.nnodes)
        try:
            while time.monotonic() < deadline:
                joined = sum(
                    bounded(partial(self.store.add, f"{PREFIX}node/{n}/joined", 0), 1.0, _gave_up) for n in others
                )
                if bounded(lambda: self.store.add(f"{PREFIX}node/0/read", 0), 1.0, _gave_up) >= joined:
                    return
                time.sleep(POLL_SECONDS)
        except (NodeError, *PADDLE_ERRORS):
            return  # the refusal is what matters; the others then see the master gone

    def _connect(self) -> Any:
        core = import_paddle().base.core  # the selected platform's process imports paddle anyway

        master = self.global_rank == 0
        seconds = max(1, int(self.deadline - time.monotonic()) + 1)

        def timed_out() -> NodeError:
            return NodeError(
                f"{self.me}: the master {self.nodes.master} did not answer within {self._limit_seconds()}. "
                f"Fix: start node 0 with --master {self.nodes.master}, check the address and that the port is "
                f"reachable from here; raise {knob(self.limit, argument=True)} if node 0 starts later"
            )

        if master:
            for port in (self.nodes.port, self.nodes.port + 1):  # Paddle's store aborts the process on a taken port
                check_free(port, self.nodes.master, self.me)
        else:
            wait_for_listener(self.nodes.host, self.nodes.port, self.deadline, timed_out)
        try:
            # world_size 1: the master serves at once and this handshake counts the nodes itself.
            return bounded(
                lambda: core.TCPStore(self.nodes.host, self.nodes.port, master, 1, seconds),
                self._remaining(),
                timed_out,
            )
        except PADDLE_ERRORS as exc:
            what = (
                f"could not listen on {self.nodes.master}"
                if master
                else f"could not reach the master {self.nodes.master}"
            )
            raise NodeError(
                f"{self.me}: {what}: {first_line(exc)}. Fix: pass --master as node 0's address and a free port "
                f"(node 0 also listens on port {self.nodes.port + 1})"
            ) from exc

    def _wait_for_nodes(self, ours: dict[str, object]) -> None:
        pending = [node for node in range(self.nodes.nnodes) if node != self.nodes.node_rank]
        joined = dict.fromkeys(range(self.nodes.nnodes), 0)
        compared: set[int] = set()
        while True:
            for node in list(pending):
                joined[node] = self._call(lambda n=node: self.store.add(f"{PREFIX}node/{n}/joined", 0), "waiting")
                if joined[node] == 0:
                    continue
                if node not in compared:  # its facts were published before its first join
                    raw = self._call(lambda n=node: self.store.get(f"{PREFIX}node/{n}"), "reading facts")
                    if node == 0:
                        self._call(lambda: self.store.add(f"{PREFIX}node/0/read", 1), "reading facts")
                    compare_facts(ours, read_facts(raw, f"node {node}", self.me), f"node {node}")
                    compared.add(node)
                if joined[node] >= self.nodes.local_ranks:
                    pending.remove(node)
            if not pending:
                return
            if time.monotonic() >= self.deadline:
                missing = ", ".join(
                    f"node {node} ({joined[node]} of {self.nodes.local_ranks} ranks)" for node in pending
                )
                raise NodeError(
                    f"{self.me}: waited {self._limit_seconds()} at the master {self.nodes.master} "
                    "for every node to join; "
                    f"missing: {missing}. Fix: start each node with --nnodes {self.nodes.nnodes}, its own --node-rank "
                    f"and --master {self.nodes.master}; raise {knob(self.limit, argument=True)} if a node starts later"
                )
            time.sleep(POLL_SECONDS)

    def _call(self, call: Any, doing: str) -> Any:
        return store_call(
            call,
            self.deadline,
            lambda seconds: NodeError(
                f"{self.me}: the master {self.nodes.master} stopped answering while {doing} "
                f"(no answer within {seconds:g} s). Fix: check node 0's output"
            ),
            lambda first: NodeError(
                f"{self.me}: lost the master {self.nodes.master} while {doing}: {first}. "
                "Fix: check node 0's output (node 0 ends the run for every node)"
            ),
        )

    def _remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def _limit_seconds(self) -> str:
        return f"{self.timeout:g} s"


def _gave_up() -> NodeError:
    return NodeError("the store did not answer")


def check_free(port: int, master: str, me: str) -> None:
    """A NodeError when ``port`` is taken on this machine (Paddle's store would abort the process)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Paddle's server binds
        try:
            probe.bind(("", port))
        except OSError as exc:
            raise NodeError(
                f"{me}: cannot listen on port {port} for --master {master}: {exc.strerror or exc}. "
                "Fix: pick a --master port whose next port is free too (node 0 listens on PORT and PORT+1)"
            ) from exc
