"""``fd-platforms run``: the KV-cache initialization lifecycle across real processes, with a report.

The engine (this process) creates the cache-ready signal; one worker process per local rank
plans its blocks (every rank then uses the minimum) and asks the platform whether it creates its
KV cache; creators allocate it, the others wait while one cache-manager process allocates it
(plus host swap space). Rank ``r`` uses local device ``r``; on cpu every rank shares the host's
memory, and without ``--device-memory`` each plans on an even share of it. With ``--nnodes N``
this node is one of N running the same command: Paddle's launcher starts the workers (``python -m
paddle.distributed.launch``, :mod:`fd_platforms.lifecycle.launcher`) and every rank of every node agrees on
the blocks over the process group it made (``Cluster.current``). Progress goes to
stderr (not with ``--json``), and after a report the last line says what to try next. Exit codes: 0,
1 a process (or another node) failed, 2 a configuration or memory error (also a child's), 130 Ctrl-C,
143 SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..contract.errors import ConfigError
from ..contract.integers import check_int
from ..lifecycle.interrupts import sigint_says_stopping, sigterm_raises
from ..rules.config.settings import SchedulerConfig
from ..rules.sizes import format_size
from .deploy_args import add_deploy_arguments, deploy_config, given_flags, memory_sizes
from .output import emit, flush_output
from .table import format_table

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..lifecycle.report import RankReport, RunReport


MAX_CYCLES = 100_000


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser("run", help="run the KV cache start-up lifecycle across processes, with a report")
    deployment = add_deploy_arguments(parser)
    parser.add_argument("--ranks", type=int, metavar="N", help="local ranks, one worker process each (default: --tp)")
    parser.add_argument("--profile", action="store_true", help="a profiling run: every worker creates its cache")
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="limit of each phase and of the wait for the cache, in seconds "
        "(default: FD_CACHE_READY_TIMEOUT, else 600)",
    )
    parser.add_argument(
        "--cycles",
        type=int,
        default=0,
        metavar="N",
        help="then clear every rank's cache and initialize it again N times (sleep mode)",
    )
    parser.add_argument(
        "--platform",
        metavar="NAME",
        help="platform to run on, as FD_PLATFORM would name it (default: the selected one)",
    )
    parser.add_argument(
        "--nnodes",
        type=int,
        default=1,
        metavar="N",
        help="nodes (machines) the engine spans; each runs --tp / N ranks and all agree on the blocks (default: 1)",
    )
    parser.add_argument("--node-rank", type=int, metavar="I", help="this node's index, 0 to N-1 (with --nnodes)")
    parser.add_argument(
        "--master",
        metavar="HOST:PORT",
        help="node 0's address, the same on every node: Paddle's launcher meets the other nodes' there (with --nnodes)",
    )
    parser.add_argument(
        "--block-count-suffix",
        metavar="SUFFIX",
        help="with --protocol fastdeploy: the suffix of get_profile_block_num, which FastDeploy's engine names apart "
        "from its other signals (its workers' engine_pid; default: the run's signal suffix)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON, without progress lines")
    parser.set_defaults(run=run, deployment=deployment)  # the deployment flags, repeated in the next-step line
    return parser


def run(args: argparse.Namespace) -> int:
    # Imported here: the other commands never pay for multiprocessing and the lifecycle.
    from ..ipc.cache_signal import ENV_TIMEOUT
    from ..ipc.timeouts import set_by_flag
    from ..lifecycle.children import start_method
    from ..lifecycle.engine import run_lifecycle, select_run_platform
    from ..lifecycle.progress import Progress
    from ..lifecycle.spec import NodeFlags, RunSpec, run_device_ids
    from ..rules.config.nodes import check_resolves

    deploy = deploy_config(args)
    tp = deploy.parallel.tensor_parallel_size
    per_node = _ranks_per_node(args, tp)
    ranks = per_node if args.ranks is None else args.ranks
    if not 1 <= ranks <= per_node:
        across = f" / --nnodes {args.nnodes}" if args.nnodes > 1 else ""
        raise ConfigError(
            "--ranks",
            ranks,
            f"1 to tensor_parallel_size={tp}{across} = {per_node} (each local rank is one tensor-parallel rank)",
            f"pass --ranks between 1 and {per_node}, or raise --tp",
        )
    nodes = None if args.nnodes == 1 else NodeFlags(args.nnodes, args.node_rank, args.master)
    if nodes is not None:
        check_resolves(nodes.master, "--master")
    check_int("--cycles", args.cycles, 0, MAX_CYCLES, what="", fix="pass how many clear/re-initialize cycles to run")
    block_count_suffix = _block_count_suffix(args.block_count_suffix, deploy.scheduler.protocol)
    device_memory, non_cache, host_memory = memory_sizes(args)
    timeout = _phase_limit(args.timeout)
    method = start_method()
    set_by_flag(ENV_TIMEOUT, "--timeout", timeout)  # the children's bounds follow it; messages name --timeout
    # before SIGTERM is ours: it may import paddle, which sets a handler
    platform = select_run_platform(ranks, args.platform)
    spec = RunSpec(
        deploy=deploy,
        platform=platform.name,
        device_type=platform.identity.device_type,
        ranks=ranks,
        timeout=timeout,
        profile=args.profile,
        device_memory=device_memory,
        non_cache=non_cache,
        host_memory=host_memory,
        quiet=args.json,
        cycles=args.cycles,
        nodes=nodes,
        block_count_suffix=block_count_suffix,
        device_ids=run_device_ids(platform.identity, ranks),
        start_method=method,
    )
    say = Progress(quiet=args.json)
    with sigterm_raises(), sigint_says_stopping():
        report = run_lifecycle(spec, say, platform)
    emit(json.dumps(report.to_json(), indent=2) if args.json else format_report(report))
    flush_output()  # the report first: the hint is the last line on a terminal too
    say(next_steps(args))
    return 0


def next_steps(args: argparse.Namespace) -> str:
    """The last line of a run that reported: what to try next, as commands for this deployment."""
    plan = shlex.join(["fd-platforms", "plan", "--platform", "all", *given_flags(args, args.deployment)])
    again = "" if args.cycles else "--cycles 2 clears and re-creates every rank's cache; "
    size = "" if args.device_memory is not None else " --device-memory SIZE"
    return f"next: {again}{plan}{size} compares every platform's plan; docs/lifecycle.md explains each line"


def _block_count_suffix(suffix: str | None, protocol: str) -> str | None:
    """``--block-count-suffix`` checked: FastDeploy's suffix format, and only with its protocol."""
    from ..fastdeploy import FASTDEPLOY
    from ..fastdeploy.signals import check_suffix

    if suffix is None:
        return None
    if protocol != FASTDEPLOY.name:
        raise ConfigError(
            "--block-count-suffix",
            suffix,
            f"only with --protocol {FASTDEPLOY.name} (only FastDeploy's engine waits for a block count)",
            f"pass --protocol {FASTDEPLOY.name}, or drop --block-count-suffix",
        )
    return check_suffix(suffix, "--block-count-suffix")


def _ranks_per_node(args: argparse.Namespace, tp: int) -> int:
    """``--tp / --nnodes``, once ``--nnodes``, ``--node-rank`` and ``--master`` are consistent."""
    from ..rules.config.nodes import MAX_NODES, check_nodes

    check_int("--nnodes", args.nnodes, 1, MAX_NODES, what="", fix="pass how many nodes (machines) the engine spans")
    if args.nnodes == 1:
        for flag, value in (("--node-rank", args.node_rank), ("--master", args.master)):
            if value is not None:
                raise ConfigError(flag, value, "only with --nnodes 2 or more", f"pass --nnodes N, or drop {flag}")
        return tp
    for flag, value in (("--node-rank", args.node_rank), ("--master", args.master)):
        if value is None:
            raise ConfigError(flag, None, f"required with --nnodes {args.nnodes}", f"pass {flag} (see --help)")
    check_nodes(args.nnodes, args.node_rank, args.master)
    if tp % args.nnodes:
        works = ", ".join(str(n) for n in range(2, tp + 1) if tp % n == 0) or "none"
        raise ConfigError(
            "--nnodes",
            args.nnodes,
            f"a number of nodes that divides --tp {tp} (every node runs as many ranks): {works}",
            "pass --nnodes that divides --tp, or change --tp",
        )
    return tp // args.nnodes


def _phase_limit(flag: float | None) -> float:
    """The limit of each of run's phases: ``--timeout``, else ``FD_CACHE_READY_TIMEOUT``, else 600 seconds.
    Finite: run bounds every phase, so its refusal asks for seconds, never for no limit (``inf``), which it refuses."""
    from ..ipc.cache_signal import DEFAULT_TIMEOUT, ENV_TIMEOUT
    from ..ipc.timeouts import check_seconds, env_seconds

    fix = f"run bounds each of its phases by this limit: pass --timeout SECONDS, e.g. --timeout {DEFAULT_TIMEOUT:g}"
    if flag is None:
        return env_seconds(ENV_TIMEOUT, DEFAULT_TIMEOUT, fix=fix)
    return check_seconds("--timeout", flag, fix)


def _attached(tensors: int, by: str | None) -> str | int:
    """Tensors opened zero-copy, and by whom where it is not the worker."""
    if not tensors:
        return "-"
    return f"{tensors} (manager)" if by == "cache manager" else tensors


_RANK_COLUMNS: tuple[tuple[str, Callable[[RankReport], object]], ...] = (
    ("RANK", lambda rank: rank.rank),
    ("DEVICE", lambda rank: rank.device),
    ("CREATE", lambda rank: "yes" if rank.create else "no"),
    ("DECIDED BY", lambda rank: rank.decided_by),
    ("ALLOCATED BY", lambda rank: rank.allocated_by),
    ("BLOCKS", lambda rank: rank.num_blocks),
    ("CPU BLOCKS", lambda rank: _cpu_blocks(rank.num_cpu_blocks, rank.planned_cpu_blocks)),
    ("DEVICE MEM", lambda rank: format_size(rank.device_bytes)),
    ("HOST MEM", lambda rank: format_size(rank.host_bytes)),
    ("PINNED", lambda rank: "-" if rank.pinned is None else ("yes" if rank.pinned else "no")),
    ("PLAN S", lambda rank: f"{rank.plan_seconds:.3f}"),
    ("ALLOCATE S", lambda rank: f"{rank.allocate_seconds:.3f}"),
    ("WAIT S", lambda rank: _seconds(rank.wait_seconds)),
    ("ATTACHED", lambda rank: _attached(rank.attached_tensors, rank.attached_by)),
    ("ATTACH S", lambda rank: _seconds(rank.attach_seconds)),
    ("VERIFIED", lambda rank: _yes_no(rank.verified)),
)
"""The report's table: each column's header and its cell for a rank."""


def format_report(report: RunReport) -> str:
    """A header line, one table row per rank, then one per clear/re-initialize cycle."""
    protocol = "" if report.protocol == SchedulerConfig.protocol else f", protocol {report.protocol}"
    header = (
        f"platform {report.platform}, model {report.model}, {_rank_count(report)}, "
        f"role {report.splitwise_role}, storage backend {report.storage_backend or 'none'}, rule {report.rule}"
        f"{protocol}"
        f"{', profile run' if report.profile else ''}: {format_size(report.bytes_per_block)} per block, "
        + (f"MTP layers {report.mtp_num_blocks} blocks each, " if report.mtp_num_blocks is not None else "")
        + f"wall {report.wall_seconds:.2f} s"
    )
    headers = tuple(name for name, _ in _RANK_COLUMNS)
    rows = [tuple(cell(rank) for _, cell in _RANK_COLUMNS) for rank in report.ranks]
    if report.nodes is not None:
        nodes = report.nodes
        header += (
            f"\nnode {nodes.node_rank} of {nodes.nnodes} (master {nodes.master}): every rank uses the "
            f"{nodes.bound_by_blocks} blocks of node {nodes.bound_by_node} rank {nodes.bound_by_rank} "
            f"(global rank {nodes.bound_by_global_rank}), agreed in {nodes.agree_seconds * 1000:.1f} ms"
            + ("" if nodes.all_ranks else "; node 0 shows every node's ranks")
        )
        headers = ("NODE", "GLOBAL", *headers, "JOIN S")
        rows = [
            (rank.node, rank.global_rank, *row, _seconds(rank.join_seconds))
            for rank, row in zip(report.ranks, rows, strict=True)
        ]
    table = header + "\n" + format_table(headers, rows)
    if not report.cycles:
        return table
    cycles = [
        (
            cycle.cycle,
            f"{cycle.clear_seconds:.3f}",
            f"{cycle.init_seconds:.3f}",
            _yes_no(cycle.verified),
            ", ".join(f"{label} {_rss(rss['before'])} -> {_rss(rss['after'])}" for label, rss in cycle.rss.items()),
        )
        for cycle in report.cycles
    ]
    return table + "\n\n" + format_table(("CYCLE", "CLEAR S", "INIT S", "VERIFIED", "RSS BEFORE -> AFTER"), cycles)


def _rank_count(report: RunReport) -> str:
    """The engine's ranks, counted the same way on every node (node 0's report lists every node's)."""
    nodes = report.nodes
    if nodes is None:
        return f"{len(report.ranks)} rank(s)"
    local = len(report.ranks) // nodes.nnodes if nodes.all_ranks else len(report.ranks)
    return f"{local * nodes.nnodes} rank(s) on {nodes.nnodes} nodes, {local} on this node"


def _cpu_blocks(allocated: int, planned: int) -> str:
    """The host swap blocks allocated, and the planned ones where none are (no cache manager ran)."""
    return str(allocated) if allocated == planned else f"{allocated} ({planned} planned)"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def _rss(value: int | None) -> str:
    return "?" if value is None else format_size(value)
