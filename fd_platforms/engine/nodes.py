"""Where one process stands in an engine spread over several nodes (machines): a plain record.

Node ``I`` of ``N`` runs ``local_ranks`` ranks; global rank = ``I * local_ranks + local rank``, as
``paddle.distributed.launch --nnodes N`` numbers them. Node 0 hosts the rendezvous at ``master``
(``HOST:PORT``): the handshake's store on ``PORT`` and Paddle's process-group store on ``PORT + 1``.
No paddle here: the CLI checks these values before starting anything.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

from ..contract.errors import ConfigError
from ..contract.integers import check_int

MAX_NODES = 4096
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.\-]*[A-Za-z0-9])?")


@dataclass(frozen=True)
class NodeSpec:
    """Node ``node_rank`` of ``nnodes``, each running ``local_ranks`` ranks; ``master`` is ``HOST:PORT``."""

    nnodes: int
    node_rank: int
    master: str
    local_ranks: int

    def __post_init__(self) -> None:
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


def check_nodes(nnodes: object, node_rank: object, master: object, local_ranks: object, *, flags: bool = False) -> None:
    """A ConfigError naming the first bad value (as ``--nnodes`` ... when ``flags``), else nothing."""
    name = {"nnodes": "--nnodes", "node_rank": "--node-rank", "master": "--master", "local_ranks": "--ranks"}
    field = (lambda key: name[key]) if flags else (lambda key: key)
    nnodes = check_int(field("nnodes"), nnodes, 1, MAX_NODES, what="",
                       fix="pass how many nodes (machines) the engine spans")  # fmt: skip
    check_int(field("node_rank"), node_rank, 0, nnodes - 1, what="", note="one per node; node 0 hosts the master",
              fix=f"give each of the {nnodes} nodes its own {field('node_rank')} from 0 to {nnodes - 1}")  # fmt: skip
    check_int(field("local_ranks"), local_ranks, 1, None, fix="pass how many ranks this node runs")
    parse_master(master, field("master"))


def parse_master(master: object, field: str = "master") -> tuple[str, int]:
    """``HOST:PORT`` as (host, port); PORT + 1 must be a port too (Paddle's process-group store)."""
    allowed = "HOST:PORT with an IPv4 address or a host name and a port from 1 to 65534 (node 0 listens on PORT and PORT+1)"
    fix = f"pass {field} as node 0's address, e.g. 10.0.0.1:29500, the same on every node"
    if not isinstance(master, str) or master.count(":") != 1:
        raise ConfigError(field, master, allowed, fix)
    host, _, port = master.partition(":")
    if not _HOST.fullmatch(host) or not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65534:
        raise ConfigError(field, master, allowed, fix)
    return host, int(port)


def check_resolves(master: str, field: str = "master") -> None:
    """A ConfigError naming ``field`` when ``master``'s host has no IPv4 address here: a typo would
    otherwise wait the whole timeout for a master that cannot exist."""
    host, port = parse_master(master, field)
    try:
        socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(
            field, master, f"a host this machine resolves to an IPv4 address ({host!r}: {reason})",
            "fix the host name, or pass node 0's IPv4 address",
        ) from None


def free_master(host: str = "127.0.0.1", attempts: int = 100) -> str:
    """``HOST:PORT`` on this machine with PORT and PORT + 1 free now: for tests and demos that run
    every node here (another process may still take them before node 0 listens)."""
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
