"""The engine's side of ``fd-platforms run``: a thin driver over the public engine API.

Phases, each bounded by the run's timeout: the rule, asked once here (every rank has the same
inputs, none of which needs a plan), tells whether a cache manager is needed, which then starts
beside the workers; the workers' import of Paddle (said when it starts and when every worker is
done, the run's longest silence); the workers' plans (the engine sends the minimum across ranks to
every process); then every worker makes the one public call (``initialize_kv_cache``) and the manager
``manage_kv_cache`` for the ranks it serves. When ranks
attach, the driver proves each maps the manager's memory (tokens both ways). ``--cycles N`` clears
and re-initializes N more times. Whatever happens, leaving :func:`run_lifecycle` stops every child
and removes the signal from ``/dev/shm``.

Across nodes (``spec.nodes``) Paddle's launcher starts the workers (:mod:`.launcher`) once every node has
come; each worker agrees with the other nodes' ranks over the launcher's process group after planning and sends
the agreement (the fewest blocks of every rank of every node) with its plan; the nodes keep in
step with a barrier per cycle and a gather of every rank's report at the end (node 0 shows them all).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict
from typing import Any

from ..contract.errors import (
    CacheSharingError,
    ConfigError,
    FdPlatformsError,
    NodeError,
    PaddleNotInstalledError,
    PluginContractError,
    UnknownPlatformError,
)
from ..contract.paddle_import import paddle_installed
from ..contract.types import CacheDecision, Plan
from ..engine import Agreement, check_can_attach, reclaim_stale_publications
from ..ipc.cache_signal import reclaim_stale_signals
from ..kit.host_memory import available_host_bytes, host_bytes_for_swap, resident_bytes
from ..loading.platform import Platform
from ..loading.selection import ENV_PLATFORM, Prober, select_platform
from ..rules.decision import DecisionInputs, decided_by
from ..rules.planner import check_host_swap, host_swap_blocks, min_across_ranks
from ..rules.roles import TRANSFER_MANAGER, cache_roles
from ..rules.sizes import format_size
from .children import Child, Children
from .launcher import Launcher
from .manager import manager_main
from .progress import Progress
from .report import Allocation, CycleReport, NodesReport, RankReport, RunReport
from .signals import EngineSignals
from .spec import MARGIN_SECONDS, RunSpec
from .worker import WorkerResult, plan_rank, worker_main


def select_run_platform(ranks: int, name: str | None = None) -> Platform:
    """The selected platform (``name``, as ``FD_PLATFORM`` would name it, else the usual selection),
    checked to have a device for each of ``ranks`` local ranks.

    On cpu every rank shares the host's memory, so any number of ranks fits.
    """
    prober = Prober()
    if name == "all":
        raise ConfigError(
            "--platform",
            name,
            "one installed platform: a run starts its processes on one",
            f"to compare every platform, use fd-platforms plan --platform all; to run, name one of: "
            f"{', '.join(prober.found)}",
        )
    if name is not None and name not in prober.found:
        raise UnknownPlatformError("--platform", name, prober.found, "name the platform to run on")
    environ = None if name is None else {**os.environ, ENV_PLATFORM: name}
    platform = select_platform(environ, prober=prober, named_by="--platform" if name else ENV_PLATFORM).platform
    if platform.identity.device_type == "cpu":
        return platform
    detection = prober.probe(platform.name).detection
    count = 0 if detection is None else detection.device_count
    if ranks > count:
        visible = platform.identity.visible_devices_env
        raise ConfigError(
            "--ranks",
            ranks,
            f"at most {count}: platform {platform.name} sees {count} device(s) here and each rank uses its own",
            f"lower --ranks to {count} or less" + (f", or make more devices visible ({visible})" if visible else ""),
        )
    return platform


class _Run:
    """The children of one run and the phases the engine drives them through."""

    def __init__(
        self, spec: RunSpec, platform: Platform, children: Children, workers: list[Child], say: Progress
    ) -> None:
        self.spec, self.platform, self.children, self.workers, self.say = spec, platform, children, workers, say
        self.manager: Child | None = None
        self.attaching: tuple[int, ...] = ()
        self.workers_create = False  # the pinned rule lets the workers create; the manager attaches to them
        self.verified: dict[int, bool] = {}

    @property
    def everyone(self) -> list[Child]:
        return self.workers if self.manager is None else [self.manager, *self.workers]  # a failing manager first

    def import_paddle(self, since: float) -> None:
        """Wait until every worker has imported Paddle (the run's longest silence), saying so at the
        start and the end, then ask each for its plan: the end's line comes before any plan's."""
        self.say(f"importing Paddle in {len(self.workers)} worker(s)")
        imported = self.children.collect(self.workers, "imported", self.spec.timeout)
        self.say(
            f"{len(self.workers)} worker(s) imported Paddle {time.monotonic() - since:.3f} s after they were started "
            f"(import paddle itself: {max(imported.values()):.3f} s in the slowest)"
            + ("; the fork server had imported it once" if self.spec.start_method == "forkserver" else "")
        )
        self.children.send(self.workers, "plan")

    def initialize(self) -> tuple[dict[Child, WorkerResult], tuple[Allocation, ...], bool | None]:
        """Every rank's cache, created or attached; with a manager, the tokens' proof both ways."""
        limit = self.spec.timeout + self.spec.margin  # a waiter that times out reports it itself first
        ready = self.children.collect(self.everyone, "ready", limit)
        published: tuple[Allocation, ...] = () if self.manager is None else ready.pop(self.manager)
        return ready, published, self.verify()

    def verify(self) -> bool | None:
        """Attachers read the creator's tokens and write theirs; the creator reads those back. A rank
        that misses either holds a copy, not the creator's memory: the platform's plugin is blamed."""
        if self.manager is None:
            return None
        ours, theirs = secrets.randbelow(2**31), secrets.randbelow(2**31)
        manager, ranks = self.manager, [self.workers[rank] for rank in self.attaching]
        # the workers created: the manager is every rank's attacher; else it is every rank's creator
        creators, attachers = (ranks, [manager]) if self.workers_create else ([manager], ranks)
        self._ask(creators, "mark", ours)
        seen = self._ask(attachers, "verify", (ours, theirs))
        checked = self._ask(creators, "check", theirs)

        def of_rank(answers: dict[Child, Any], rank: int) -> bool:  # the manager answers for every rank it serves
            return bool(answers[manager][rank] if manager in answers else answers[self.workers[rank]])

        self.verified = {rank: of_rank(seen, rank) and of_rank(checked, rank) for rank in self.attaching}
        copies = [rank for rank, shared in self.verified.items() if not shared]
        if copies:
            raise PluginContractError(
                self.platform.name,
                self.platform.distribution,
                f"rank(s) {', '.join(map(str, copies))}: the attacher's tensors do not share the creator's "
                "memory: a token written on one side was not seen on the other, so open_cache_tensor returned a "
                "copy. Fix: return the exported memory itself from open_cache_tensor (a zero-copy view)",
            )
        return True

    def cycle(self, number: int) -> CycleReport:
        """Clear every rank (attachers first, so the creator can free) and initialize again."""
        before = self.rss()
        started = time.monotonic()
        manager = [] if self.manager is None else [self.manager]
        for clearing in (manager, self.workers) if self.workers_create else (self.workers, manager):
            self._ask(clearing, "clear")  # the attachers first; asking no manager asks nothing
        cleared = time.monotonic()
        self._ask(self.everyone, "init")
        verified = self.verify()
        if self.spec.nodes is not None:
            self._ask(self.workers, "sync", f"cycle {number}")  # every node clears and re-initializes in step
        done = time.monotonic()
        after = self.rss()
        self.say(f"cycle {number}: cleared in {cleared - started:.3f} s, initialized again in {done - cleared:.3f} s")
        return CycleReport(
            number,
            cleared - started,
            done - cleared,
            verified,
            {label: {"before": before[label], "after": after[label]} for label in before},
        )

    def share(
        self, ranks: tuple[RankReport, ...], agreement: Agreement, planned: dict[Child, tuple[Any, ...]]
    ) -> tuple[tuple[RankReport, ...], NodesReport]:
        """Every node's rank reports, gathered through the workers (node 0 reports them all), and
        the agreement's summary; also the barrier that ends the run on every node together."""
        nodes = self.spec.nodes
        assert nodes is not None
        for worker, report in zip(self.workers, ranks, strict=True):  # each worker adds its own row
            self.children.send([worker], "share", json.dumps(asdict(report)))
        rows = self.children.collect(self.workers, "share", self.spec.timeout + MARGIN_SECONDS)  # across nodes
        texts: list[str] = rows[self.workers[0]]
        everyone = nodes.node_rank == 0
        if everyone:
            ranks = tuple(_parse_rank(text, rank) for rank, text in enumerate(texts))
        bound = agreement.bound_by
        return ranks, NodesReport(
            nnodes=nodes.nnodes,
            node_rank=nodes.node_rank,
            master=nodes.master,
            bound_by_node=bound.node,
            bound_by_rank=bound.local_rank,
            bound_by_global_rank=bound.global_rank,
            bound_by_blocks=bound.plan.num_blocks,
            agree_seconds=max(planned[worker][2].seconds for worker in self.workers),
            all_ranks=everyone,
        )

    def rss(self) -> dict[str, int | None]:
        answers = self._ask(self.everyone, "rss")
        return {"engine": resident_bytes(), **{child.label: answers[child] for child in self.everyone}}

    def _ask(self, children: Sequence[Child], kind: str, payload: object = None) -> dict[Child, Any]:
        self.children.send(children, kind, payload)
        return self.children.collect(children, kind, self.spec.timeout + self.spec.margin)


def run_lifecycle(spec: RunSpec, say: Progress, platform: Platform) -> RunReport:
    """Run the lifecycle (and ``spec.cycles`` more clears and re-initializations); raises
    :class:`~fd_platforms.contract.errors.RunError` when a process fails."""
    started = time.monotonic()
    # The rule needs no plan (host swap blocks come from the config and the layout), so the engine
    # decides first, before it touches /dev/shm (bad input is refused with nothing else said), and
    # starts the cache manager beside the workers: it imports paddle while they plan, as an engine
    # starts its cache manager at once.
    per_block = spec.layout(0).bytes_per_block
    host_bytes, measured = host_bytes_for_swap(spec.host_memory)
    check_host_swap(spec.deploy.cache, per_block, host_bytes, measured=measured, ranks=spec.ranks)
    inputs = DecisionInputs(
        spec.profile,
        host_swap_blocks(spec.deploy.cache, per_block),
        spec.deploy.cache.kvcache_storage_backend,
        spec.deploy.scheduler.splitwise_role,
        spec.rule,
    )
    decision = platform.should_create_cache_tensor(**inputs.kwargs())
    refusal = run_refusal(platform, inputs, decision)
    if refusal is not None:
        raise refusal  # before any process starts
    # where the workers create, the cache manager runs where the rule has a transfer manager attach beside them
    workers_create = decision.create and TRANSFER_MANAGER in cache_roles(inputs).attachers
    if spec.shares_device and spec.nodes is None:  # every rank plans on an even share of this host: rank 0's is all
        _check_host_room_first(spec, platform)
    reclaim_stale_signals()  # what engines killed with SIGKILL left behind (each warned about)
    reclaim_stale_publications()
    signals = EngineSignals(spec)
    try:
        with signals, ExitStack() as stack:
            launcher = None if spec.nodes is None else stack.enter_context(Launcher(spec))  # stopped after its workers
            children = stack.enter_context(Children(spec.start_method))
            workers, spawned = _start_workers(spec, children, launcher, signals, say)
            run = _Run(spec, platform, children, workers, say)
            if not decision.create or workers_create:
                run.attaching, run.workers_create = tuple(range(spec.ranks)), workers_create
                run.manager = children.start("cache manager", manager_main, spec, run.attaching, signals.name)
                side = (
                    ": it attaches to the workers' caches, as the transfer manager beside them"
                    if workers_create
                    else ""
                )
                say(
                    f"starting the cache manager (pid {run.manager.pid}) for rank(s) "
                    f"{', '.join(map(str, run.attaching))}{side}"
                )
            run.import_paddle(spawned)
            # across nodes a worker's own bound (its join) must end first: it names the node that is missing
            planned = children.collect(workers, "plan", spec.timeout + (0 if spec.nodes is None else MARGIN_SECONDS))
            agreement: Agreement | None = planned[workers[0]][2]
            final = (
                min_across_ranks([planned[worker][0] for worker in workers]) if agreement is None else agreement.plan
            )
            if spec.shares_device:
                check_host_room(final, spec)
            if agreement is None:
                say(f"every rank planned; each uses {final.num_blocks} blocks (the minimum across ranks)")
            else:
                bound = agreement.bound_by
                say(
                    f"every rank of {spec.nodes.nnodes} nodes planned; each uses {final.num_blocks} blocks "  # type: ignore[union-attr]  # agreed: nodes
                    f"(the minimum, node {bound.node} rank {bound.local_rank}'s plan)"
                )
            creators = {rank: worker.pid for rank, worker in enumerate(workers)} if workers_create else None
            if run.manager is not None:
                children.send([run.manager], "final", (final, creators))
            creator = None if run.manager is None or workers_create else run.manager.pid
            children.send(workers, "final", (final, creator))
            ready, published, verified = run.initialize()
            say(
                "every rank's KV cache is ready" + ("" if verified is None else f"; shared memory verified: {verified}")
            )
            cycles = tuple(run.cycle(number) for number in range(1, spec.cycles + 1))
            managed = {allocation.rank: allocation for allocation in published}
            ranks = tuple(
                _rank_report(spec, rank, final, planned[worker], ready[worker], managed, run.verified)
                for rank, worker in enumerate(workers)
            )
            nodes = None if agreement is None else run.share(ranks, agreement, planned)
            say("stopping")
    finally:  # what processes killed mid-clear left published is this engine's to remove
        signals.reclaim()

    return RunReport(
        platform=spec.platform,
        model=spec.deploy.model.name,
        signal=signals.ready_name,
        splitwise_role=spec.deploy.scheduler.splitwise_role,
        storage_backend=spec.deploy.cache.kvcache_storage_backend,
        profile=spec.profile,
        bytes_per_block=final.bytes_per_block,
        mtp_num_blocks=spec.layout(0).reported_mtp_blocks(final.num_blocks),
        rule=spec.rule,
        protocol=spec.deploy.scheduler.protocol,
        manager_pid=None if run.manager is None else run.manager.pid,
        wall_seconds=time.monotonic() - started,
        ranks=ranks if nodes is None else nodes[0],
        cycles=cycles,
        nodes=None if nodes is None else nodes[1],
    )


def _start_workers(
    spec: RunSpec, children: Children, launcher: Launcher | None, signals: EngineSignals, say: Progress
) -> tuple[list[Child], float]:
    """Every local rank's worker, spawned here, or on several nodes started by Paddle's launcher (which waits
    for every node first); and when they were started."""
    if launcher is None:
        spawned = time.monotonic()
        workers = [children.start(f"rank {rank}", worker_main, spec, rank, signals.name) for rank in range(spec.ranks)]
        pids = ", ".join(str(worker.pid) for worker in workers)
        say(f"platform {spec.platform}: started {spec.ranks} worker(s) (pid {pids}), {signals.describe()}")
        return workers, spawned
    nodes = launcher.nodes
    say(
        f"platform {spec.platform}: node {nodes.node_rank} of {nodes.nnodes}: started python -m "
        f"paddle.distributed.launch (pid {launcher.process.pid}) for {spec.ranks} worker(s), master {nodes.master}, "
        f"{signals.describe()}"
    )
    started = time.monotonic()
    workers = launcher.accept(children, signals.name)
    pids = ", ".join(str(worker.pid) for worker in workers)
    seconds = time.monotonic() - started
    say(f"the launcher started {spec.ranks} worker(s) (pid {pids}) {seconds:.3f} s later, once every node had come")
    return workers, time.monotonic()


def _parse_rank(text: str, rank: int) -> RankReport:
    try:
        return RankReport(**json.loads(text))
    except (ValueError, TypeError) as exc:
        raise NodeError(
            f"global rank {rank} sent a report this node cannot read ({exc}). "
            "Fix: run the same fd-platforms version on every node"
        ) from exc


HOST_ROOM_SHARE = 0.5
"""On cpu, the most of the host's available memory every rank's cache and swap space may take
together: the rest is the host's (the engine, its workers, whatever else runs there)."""


def run_refusal(
    platform: Platform, inputs: DecisionInputs, decision: CacheDecision
) -> CacheSharingError | ConfigError | PaddleNotInstalledError | None:
    """What ``fd-platforms run`` refuses before any process starts (None where it can run): no Paddle to allocate the
    cache with; on a platform that cannot share cache tensors, workers the rule sends to attach
    (:func:`~fd_platforms.engine.check_can_attach`), or creating workers beside which the rule has a transfer manager
    attach (:func:`check_can_hold`). ``plan`` says the same."""
    if not paddle_installed():
        return PaddleNotInstalledError(f"platform {platform.name} (its workers allocate the cache with Paddle)")
    try:
        if not decision.create:
            check_can_attach(platform, decision, f"platform {platform.name}")
        elif TRANSFER_MANAGER in cache_roles(inputs).attachers:
            check_can_hold(platform, inputs.rule)
    except (CacheSharingError, ConfigError) as refused:  # the two refusals; a plugin's own error propagates
        return refused
    return None


def check_can_hold(platform: Platform, rule: str) -> None:
    """Where the pinned rule lets the workers create and has a transfer manager attach beside them (swap space; under
    2026-06 a storage backend too), the cache manager attaches to their caches: refused before any process starts on
    a platform that cannot share."""
    if platform.cache_sharing() is None:
        raise ConfigError(
            "--rule",
            rule,
            f"a rule version under which platform {platform.name}, which cannot share cache tensors, never needs "
            "a cache manager to attach: with swap space on (rule 2026-04), or a storage backend (2026-06), the workers "
            "create and the manager attaches",
            "pin --rule 2026-01 (the default), run without --swap-space and --storage-backend, or use a platform that "
            "can share",
        )


def _check_host_room_first(spec: RunSpec, platform: Platform) -> None:
    """:func:`check_host_room` on rank 0's plan, made here before any process starts (each worker plans the same
    again). A plan that fails is left to the workers, which report it per rank as any planning error."""
    try:
        plan = plan_rank(spec, platform, 0)
    except FdPlatformsError:
        return
    check_host_room(plan, spec)


def check_host_room(final: Plan, spec: RunSpec) -> None:
    """On a platform whose device is the host (cpu), every rank's cache and swap space must fit in
    :data:`HOST_ROOM_SHARE` of the host's available memory before anything is allocated: a run that
    would zero-fill most of the host is refused, naming the sizes (``--device-memory`` may claim more,
    and without it every rank plans on its share of the whole host)."""
    need = spec.ranks * (spec.layout(0).device_bytes(final.num_blocks) + final.num_cpu_blocks * final.bytes_per_block)
    available = available_host_bytes()
    if available is not None and need > available * HOST_ROOM_SHARE:
        raise ConfigError(
            "--device-memory",
            format_size(spec.device_memory) if spec.device_memory is not None else "not given (the host's memory)",
            f"a KV cache that leaves the host most of its memory: {spec.ranks} rank(s) x ({final.num_blocks} + "
            f"{final.num_cpu_blocks} swap) blocks x {final.bytes_per_block} B = {format_size(need)}, more than half "
            f"of the {format_size(available)} available",
            "give --device-memory SIZE per rank (on cpu it is host memory) so that every rank together takes at "
            f"most {format_size(int(available * HOST_ROOM_SHARE))}, or free host memory",
        )


def _rank_report(
    spec: RunSpec,
    rank: int,
    final: Plan,
    planned: tuple[Plan, float, Agreement | None, tuple[int, float] | None],
    result: WorkerResult,
    managed: dict[int, Allocation],
    verified: dict[int, bool],
) -> RankReport:
    allocation = result.allocation if result.allocation is not None else managed[rank]
    held = managed.get(rank)  # the manager's allocation: the cache it published, or the host swap cache it holds
    host = allocation if held is None else held
    holder = None if result.allocation is None else held  # where the workers create, the manager attaches
    attached = result if holder is None else holder
    return RankReport(
        rank=rank,
        device=allocation.device,
        create=result.decision.create,
        deciding_term=result.decision.deciding_term,
        decided_by=decided_by(result.decision)
        if holder is None
        else f"rule {spec.rule}: workers create, manager attaches",
        allocated_by="worker" if result.allocation is not None else "cache manager",
        planned_blocks=planned[0].num_blocks,
        num_blocks=final.num_blocks,
        planned_cpu_blocks=final.num_cpu_blocks,
        num_cpu_blocks=host.host_bytes // final.bytes_per_block,
        device_bytes=allocation.device_bytes,
        host_bytes=host.host_bytes,
        pinned=host.pinned,
        host_kind=host.host_kind,
        plan_seconds=planned[1],
        allocate_seconds=allocation.seconds,
        wait_seconds=result.wait_seconds,
        attached_tensors=attached.attached_tensors,
        attach_seconds=attached.attach_seconds,
        attached_by=("worker" if result.allocation is None else "cache manager") if attached.attached_tensors else None,
        verified=verified.get(rank),
        node=0 if spec.nodes is None else spec.nodes.node_rank,
        global_rank=rank if planned[3] is None else planned[3][0],
        join_seconds=None if planned[3] is None else planned[3][1],
    )
