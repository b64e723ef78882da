"""The values that say where an engine's nodes are, checked: a node count, a node's rank, the master's
``HOST:PORT`` (Paddle's launcher's ``--nnodes``, ``--rank``, ``--master``). Configuration like the rest of this
package: a ConfigError naming the flag, read by ``fd-platforms run`` before anything starts."""

from __future__ import annotations

import re
import socket

from ...contract.errors import ConfigError
from ...contract.integers import check_int

MAX_NODES = 4096
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.\-]*[A-Za-z0-9])?")


def check_nodes(nnodes: object, node_rank: object, master: object) -> None:
    """A ConfigError naming the first bad one of ``--nnodes``, ``--node-rank`` and ``--master``, else nothing."""
    nnodes = check_int("--nnodes", nnodes, 1, MAX_NODES, what="", fix="pass how many nodes (machines) the engine spans")
    check_int(
        "--node-rank",
        node_rank,
        0,
        nnodes - 1,
        what="",
        note="one per node; node 0 hosts the master",
        fix=f"give each of the {nnodes} nodes its own --node-rank from 0 to {nnodes - 1}",
    )
    parse_master(master, "--master")


def parse_master(master: object, field: str = "master") -> tuple[str, int]:
    """``HOST:PORT`` as (host, port)."""
    allowed = "HOST:PORT with an IPv4 address or a host name and a port from 1 to 65535"
    fix = f"pass {field} as node 0's address, e.g. 10.0.0.1:29500, the same on every node"
    if not isinstance(master, str) or master.count(":") != 1:
        raise ConfigError(field, master, allowed, fix)
    host, _, port = master.partition(":")
    if not _HOST.fullmatch(host) or not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
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
