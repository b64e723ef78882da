"""Deprecated with :meth:`~fd_platforms.engine.cluster.Cluster.join`, which alone takes a :class:`NodeSpec`:
both warn and go in 0.3 (Paddle's launcher numbers the nodes and ranks, and takes any free port as its master).

Where one process stands in an engine spread over several nodes (machines): a plain record. Node ``I`` of
``N`` runs ``local_ranks`` ranks; global rank = ``I * local_ranks + local rank``, as
``paddle.distributed.launch --nnodes N`` numbers them. Node 0 hosts the rendezvous at ``master``
(``HOST:PORT``): the handshake's store on ``PORT`` and Paddle's process-group store on ``PORT + 1``.
No paddle here. The values are checked by :mod:`fd_platforms.rules.config.nodes` (configuration, which the
CLI checks before starting anything); this module keeps its names for them.
"""

from __future__ import annotations

import socket
import warnings
from dataclasses import dataclass

from ..aliases import MOVED_REMOVED_IN
from ..rules.config.nodes import MAX_NODES, check_nodes, check_resolves, parse_master

__all__ = ["MAX_NODES", "NodeSpec", "check_nodes", "check_resolves", "free_master", "parse_master"]


@dataclass(frozen=True)
class NodeSpec:
    """Node ``node_rank`` of ``nnodes``, each running ``local_ranks`` ranks; ``master`` is ``HOST:PORT``."""

    nnodes: int
    node_rank: int
    master: str
    local_ranks: int

    def __post_init__(self) -> None:
        deprecated(
            "NodeSpec",
            "it is Cluster.join's alone; python -m paddle.distributed.launch numbers the nodes and ranks, and "
            "Cluster.current(...).nodes says where each rank is",
            stacklevel=4,
        )
        check_nodes(self.nnodes, self.node_rank, self.master, self.local_ranks)

    @property
    def host(self) -> str:
        return self.master.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        """The handshake's port; Paddle's process-group store listens on the next one."""
        return int(self.master.rsplit(":", 1)[1])

    @property
    def world_size(self) -> int:
        return self.nnodes * self.local_ranks

    def global_rank(self, local_rank: int) -> int:
        """This node's ``local_rank`` numbered across every node."""
        return self.node_rank * self.local_ranks + local_rank

    def locate(self, global_rank: int) -> tuple[int, int]:
        """(node, local rank) of ``global_rank``."""
        return divmod(global_rank, self.local_ranks)

    def describe(self, global_rank: int) -> str:
        """``node 1 rank 0 (global rank 2)``."""
        node, local = self.locate(global_rank)
        return f"node {node} rank {local} (global rank {global_rank})"


def free_master(host: str = "127.0.0.1", attempts: int = 100) -> str:
    """``HOST:PORT`` on this machine with PORT and PORT + 1 free now: for tests and demos that run
    every node here (another process may still take them before node 0 listens)."""
    deprecated("free_master", "it is Cluster.join's alone; python -m paddle.distributed.launch takes any free --master")
    for _ in range(attempts):
        with socket.socket() as first:
            first.bind((host, 0))
            port = first.getsockname()[1]
            if port >= 65534:
                continue
            with socket.socket() as second:
                try:
                    second.bind((host, port + 1))
                except OSError:
                    continue
        return f"{host}:{port}"
    raise OSError(f"no two free ports in a row on {host} after {attempts} tries")


def deprecated(name: str, instead: str, stacklevel: int = 3) -> None:
    """A DeprecationWarning at the line that used ``name`` (``stacklevel`` frames up), saying what replaces it."""
    warnings.warn(f"{name} is deprecated and goes in {MOVED_REMOVED_IN}: {instead}", DeprecationWarning, stacklevel)
