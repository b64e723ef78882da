"""The values that say where an engine's nodes are, checked: a node count, a node's rank, the master's
``HOST:PORT``. Configuration like the rest of this package (a ConfigError naming the field or the flag), read
by the CLI before anything starts and by :class:`fd_platforms.engine.NodeSpec` on construction."""

from __future__ import annotations

import re
import socket

from ...contract.errors import ConfigError
from ...contract.integers import check_int

MAX_NODES = 4096
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.\-]*[A-Za-z0-9])?")


def check_nodes(nnodes: object, node_rank: object, master: object, local_ranks: object, *, flags: bool = False) -> None:
    """A ConfigError naming the first bad value (as ``--nnodes`` ... when ``flags``), else nothing."""
    name = {"nnodes": "--nnodes", "node_rank": "--node-rank", "master": "--master", "local_ranks": "--ranks"}
    field = (lambda key: name[key]) if flags else (lambda key: key)
    nnodes = check_int(
        field("nnodes"), nnodes, 1, MAX_NODES, what="", fix="pass how many nodes (machines) the engine spans"
    )
    check_int(
        field("node_rank"),
        node_rank,
        0,
        nnodes - 1,
        what="",
        note="one per node; node 0 hosts the master",
        fix=f"give each of the {nnodes} nodes its own {field('node_rank')} from 0 to {nnodes - 1}",
    )
    check_int(field("local_ranks"), local_ranks, 1, None, fix="pass how many ranks this node runs")
    parse_master(master, field("master"))


def parse_master(master: object, field: str = "master") -> tuple[str, int]:
    """``HOST:PORT`` as (host, port); PORT + 1 must be a port too (the deprecated ``Cluster.join`` listens there)."""
    allowed = "HOST:PORT with an IPv4 address or a host name and a port from 1 to 65534"
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
            field,
            master,
            f"a host this machine resolves to an IPv4 address ({host!r}: {reason})",
            "fix the host name, or pass node 0's IPv4 address",
        ) from None
