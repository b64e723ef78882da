"""The worker process of one local rank: plan, then the public engine call, then what the engine asks.

Paddle is imported first, in parallel across ranks, so that a rank told to wait for a cache
manager already waits by the time that manager could fail. Messages with the engine, in order:
send ``("imported", seconds)`` (the seconds ``import paddle`` took); receive ``("plan", None)`` (sent
once every worker has imported, so the engine's line saying so comes before any plan's); send
``("plan", (plan, seconds, agreement, (global_rank, join_seconds)))`` (the agreement across nodes, this
rank's global rank and the seconds joining took; None on one node); receive ``("final",
(plan, manager_pid))`` (the minimum across ranks, and the cache manager's pid when there is one);
call :func:`~fd_platforms.engine.initialize_kv_cache`, which creates or attaches; send ``("ready",
WorkerResult)``. Then serve until ``("stop", None)``: ``verify`` (an attacher reads the cache
manager's tokens and writes its own), ``clear`` and ``init`` (clear and re-initialize, for
``--cycles``), ``rss``; across nodes also ``sync`` (a barrier of every rank of every node) and
``share`` (every rank's text, gathered from every node).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, cast

from ..contract.errors import FdPlatformsError
from ..contract.paddle_import import import_paddle
from ..contract.types import CacheDecision, DeviceMemory, Plan
from ..engine import Agreement, Cluster, KVCache, initialize_kv_cache, protocol_named
from ..fastdeploy import FASTDEPLOY  # noqa: F401 - registers protocol "fastdeploy", which [scheduler] protocol may name
from ..kit.host_memory import resident_bytes
from ..loading.platform import Platform
from ..rules.planner import memory_per_rank
from ..rules.sizes import format_size
from .child import child_platform, expect, killed_with_the_parent, run_child, serve
from .progress import Progress
from .report import Allocation
from .spec import RunSpec
from .tokens import read_tokens, verify_attached, write_tokens


@dataclass(frozen=True)
class WorkerResult:
    """A ready rank: its decision, what it created (creators) or how it attached (the others)."""

    decision: CacheDecision
    allocation: Allocation | None
    wait_seconds: float | None
    attached_tensors: int
    attach_seconds: float | None


def worker_main(spec: RunSpec, rank: int, instance: str, conn: Connection) -> None:
    """Process target of rank ``rank``'s worker."""
    run_child(f"rank {rank}", conn, spec, _work, spec, rank, instance)


def rank_memory(spec: RunSpec, platform: Platform, rank: int) -> DeviceMemory:
    """The memory ``rank`` plans on: ``--device-memory``, its device's live facts, or on cpu
    (one host shared by every rank) an even share of the host's live facts."""
    if spec.device_memory is not None:
        return DeviceMemory(spec.device_memory, None, None, "--device-memory")
    return memory_per_rank(platform.device_memory(spec.local_device(rank)), spec.device_type, spec.ranks)


def plan_rank(spec: RunSpec, platform: Platform, rank: int) -> Plan:
    """``rank``'s plan: the platform's most blocks on the memory the rank plans on (:func:`rank_memory`)."""
    return platform.max_num_blocks(
        layout=spec.layout(rank),
        cache=spec.deploy.cache,
        memory=rank_memory(spec, platform, rank),
        non_cache_bytes=spec.non_cache,
        host_memory=spec.host_memory,
    )


def _work(conn: Connection, say: Progress, spec: RunSpec, rank: int, instance: str) -> None:
    importing = time.monotonic()
    import_paddle()  # before planning, in parallel across ranks: once "final" comes, a rank acts at once
    conn.send(("imported", time.monotonic() - importing))
    expect(conn, "plan", spec.timeout)
    platform = child_platform(spec)
    started = time.monotonic()
    plan = plan_rank(spec, platform, rank)
    seconds = time.monotonic() - started
    say(f"planned {plan.num_blocks} blocks of {format_size(plan.bytes_per_block)} ({plan.binding_reason})")
    cluster, agreement = _agree(spec, plan, say) if spec.nodes is not None else (None, None)
    joined = None if cluster is None else (cluster.global_rank, cluster.join_seconds)
    conn.send(("plan", (plan, seconds, agreement, joined)))
    final, manager_pid = expect(conn, "final", spec.timeout)
    protocol = protocol_named(spec.deploy.scheduler.protocol)
    if rank == 0:
        word = protocol.hand_off_block_count(
            instance, final.num_blocks, block_count_suffix=spec.block_count_suffix, platform=platform, ranks=spec.ranks
        )
        if word is not None:
            say(f"handed the agreed {final.num_blocks} blocks to the engine ({word})")
    state = {"cache": _initialize(platform, spec, rank, instance, final, manager_pid, say)}
    try:
        conn.send(("ready", _result(state["cache"])))

        def reinitialize(_: object) -> WorkerResult:
            state["cache"] = _initialize(platform, spec, rank, instance, final, manager_pid, say)
            return _result(state["cache"])

        handlers: dict[str, Callable[[Any], Any]] = {  # the engine's payloads come off a pipe
            "verify": lambda tokens: verify_attached(state["cache"].tensors, *tokens),
            "mark": lambda token: write_tokens(state["cache"].tensors, token, last=False),
            "check": lambda token: read_tokens(state["cache"].tensors, token, last=True),
            "clear": lambda _: state["cache"].clear(spec.timeout),
            "init": reinitialize,
            "rss": lambda _: resident_bytes(),
        }
        if cluster is not None:
            handlers["sync"] = cluster.barrier
            handlers["share"] = lambda text: cluster.gather_text(text, "sharing the report")
        serve(conn, spec.hold_timeout, handlers)
    except BaseException:  # the real cause goes on at once (a failed clear is not tried again, waiting as long)
        with contextlib.suppress(FdPlatformsError):
            state["cache"].clear(0.001)
        raise
    state["cache"].clear(spec.timeout)


def _agree(spec: RunSpec, plan: Plan, say: Progress) -> tuple[Cluster, Agreement]:
    """Agree with every rank of every node on the fewest blocks, over the process group Paddle's launcher made."""
    assert spec.nodes is not None
    rank = os.environ.get("PADDLE_TRAINER_ID", "?")
    say(f"agreeing with the ranks of {spec.nodes.nnodes} nodes in the launcher's process group as global rank {rank}")
    with killed_with_the_parent():  # the launcher's end; rank 0 waits inside Paddle for every rank to connect
        cluster = Cluster.current(facts=spec.node_facts(), timeout=spec.timeout)
    agreement = cluster.agree(plan)
    bound = agreement.bound_by
    say(
        f"joined in {cluster.join_seconds:.3f} s; every rank of every node uses {agreement.plan.num_blocks} blocks "
        f"(node {bound.node} rank {bound.local_rank}'s plan), agreed in {agreement.seconds * 1000:.1f} ms"
    )
    return cluster, agreement


def _initialize(
    platform: Platform, spec: RunSpec, rank: int, instance: str, final: Plan, manager_pid: int | None, say: Progress
) -> KVCache:
    """The one public call every runner makes: create, or wait and attach."""
    size = format_size(spec.layout(rank).device_bytes(final.num_blocks))
    if manager_pid is None:
        say(f"creating {size} of KV cache")
    else:
        say(f"waiting for the cache manager (pid {manager_pid}) to publish this rank's cache")
    request = spec.cache_request(rank, final, instance, profile=spec.profile, creator_pid=manager_pid)
    cache = initialize_kv_cache(platform, request, progress=say.allocation(f"creating {size}"))
    if cache.created:
        decision = cast(CacheDecision, cache.decision)  # initialize_kv_cache decides every cache it returns
        say(f"created {format_size(cache.nbytes)} of KV cache ({decision.deciding_term}: {decision.reason})")
    else:
        say(f"attached to {len(cache.tensors)} tensors of the cache manager's KV cache in {cache.attach_seconds:.3f} s")
    return cache


def _result(cache: KVCache) -> WorkerResult:
    allocation = None
    if cache.created:
        allocation = Allocation(cache.rank, cache.device, cache.nbytes, 0, None, None, cache.create_seconds or 0.0)
    return WorkerResult(
        decision=cache.decision,  # type: ignore[arg-type]  # initialize_kv_cache sets it
        allocation=allocation,
        wait_seconds=cache.wait_seconds,
        attached_tensors=0 if cache.created else len(cache.tensors),
        attach_seconds=cache.attach_seconds,
    )
