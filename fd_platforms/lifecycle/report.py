"""The run report's records: one per rank, and the run's totals."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Allocation:
    """What one process allocated for one rank: device cache, host swap space, and how long it took."""

    rank: int
    device: str
    device_bytes: int
    host_bytes: int
    pinned: bool | None
    host_kind: str | None
    seconds: float
    attached_tensors: int = 0
    attach_seconds: float | None = None


@dataclass(frozen=True)
class RankReport:
    """One rank of the run.

    ``deciding_term`` is the term of the rule that decided ``create`` and ``decided_by`` the same in
    words for a table (``rule: no cache manager needed`` where no term holds); ``allocated_by`` is
    ``worker`` or ``cache manager``; ``planned_blocks`` is the rank's own plan and ``num_blocks``
    the minimum across ranks, which every rank uses; ``planned_cpu_blocks`` is the host swap space
    planned and ``num_cpu_blocks`` the blocks of it allocated (0 where no cache manager runs, as
    in a profile run); ``pinned`` is None when no host memory was allocated;
    ``wait_seconds``, ``attach_seconds`` and ``verified`` are None for a rank that created its
    cache (it did not wait or attach). ``attached_tensors`` counts the cache manager's tensors the
    worker opened zero-copy; ``verified`` says whether a token written by each process was read by
    the other in every one of them (the same memory, not a copy). Across nodes, ``node`` and
    ``global_rank`` place the rank and ``join_seconds`` is how long its handshake and joining
    Paddle's process group took (None on one node).
    """

    rank: int
    device: str
    create: bool
    deciding_term: str
    decided_by: str
    allocated_by: str
    planned_blocks: int
    num_blocks: int
    planned_cpu_blocks: int
    num_cpu_blocks: int
    device_bytes: int
    host_bytes: int
    pinned: bool | None
    host_kind: str | None
    plan_seconds: float
    allocate_seconds: float
    wait_seconds: float | None
    attached_tensors: int
    attach_seconds: float | None
    verified: bool | None
    node: int = 0
    attached_by: str | None = None
    global_rank: int = 0
    join_seconds: float | None = None


@dataclass(frozen=True)
class CycleReport:
    """One clear and re-initialization (``--cycles``): how long each took, and each process's RSS."""

    cycle: int
    clear_seconds: float
    init_seconds: float
    verified: bool | None
    rss: dict[str, dict[str, int | None]]


@dataclass(frozen=True)
class NodesReport:
    """An engine spread over nodes: this node, and the rank whose plan bound every rank's blocks.

    ``all_ranks`` says whether the run's ``ranks`` are every node's (node 0 gathers them) or this
    node's own; ``agree_seconds`` is the slowest local rank's agreement (the gather of the plans).
    """

    nnodes: int
    node_rank: int
    master: str
    bound_by_node: int
    bound_by_rank: int
    bound_by_global_rank: int
    bound_by_blocks: int
    agree_seconds: float
    all_ranks: bool


@dataclass(frozen=True)
class RunReport:
    """The whole run: the platform, the deployment's key settings, every rank, and the wall time."""

    platform: str
    model: str
    signal: str
    splitwise_role: str
    storage_backend: str | None
    profile: bool
    bytes_per_block: int
    manager_pid: int | None
    wall_seconds: float
    ranks: tuple[RankReport, ...]
    cycles: tuple[CycleReport, ...] = ()
    nodes: NodesReport | None = None
    mtp_num_blocks: int | None = None
    """Device blocks of each MTP layer (``int(num_blocks * num_gpu_block_expand_ratio)``); None without MTP."""
    rule: str = ""
    """The create-or-attach rule's version the run pinned."""
    protocol: str = "fd-platforms"
    """The processes' signals and tensor handles: ours, or FastDeploy's own."""

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (``ranks`` a list of dicts)."""
        data = asdict(self)
        data["num_ranks"] = len(self.ranks)
        return data
