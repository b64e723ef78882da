"""One engine over several nodes: every rank of every node agrees on its KV cache through Paddle's
collective runtime.

:meth:`Cluster.current` takes the process group Paddle's launcher made (``python -m
paddle.distributed.launch``, as FastDeploy starts its workers; :mod:`.launched_group`) and compares every
rank's facts (:mod:`.facts`). :meth:`Cluster.agree` gathers every rank's plan (``all_gather``) and
returns the minimum and the rank that bound it, as FastDeploy's worker takes
``all_reduce(num_blocks, MIN)``. :meth:`Cluster.barrier` and
:meth:`Cluster.gather_text` keep the nodes in step. Every call is bounded; a peer that dies or
stops answering is a :class:`~fd_platforms.contract.errors.NodeError` naming its node and rank.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from ..contract.errors import ConfigError, FdPlatformsError, NodeError
from ..contract.integers import is_int
from ..contract.types import Plan
from ..ipc.cache_signal import ENV_TIMEOUT
from ..ipc.timeouts import check_seconds, knob
from .bounded import bounded
from .facts import compare_facts, read_facts
from .launched_group import (
    PADDLE_ERRORS,
    Arrival,
    GroupRanks,
    Place,
    enter_group,
    first_line,
    paddle_as_is,
)

T = TypeVar("T")  #: what the call returns, returned as it is

#: Largest text one rank may contribute to :meth:`Cluster.gather_text` (a plan is ~300 bytes).
MAX_TEXT_BYTES = 1 << 20
_PAIR_RANK = re.compile(r"pair_rank\s*=\s*(\d+)")


def _check_facts(facts: object) -> None:
    try:
        valid = (
            isinstance(facts, Mapping) and all(isinstance(key, str) for key in facts) and bool(json.dumps(dict(facts)))
        )
    except (TypeError, ValueError):
        valid = False
    if not valid:
        raise ConfigError(
            "facts",
            facts,
            "a mapping of str to JSON values (what every node must agree on)",
            'pass e.g. {"model": "deepseek-v3", "tp": 16}',
        )


@dataclass(frozen=True)
class RankPlan:
    """One rank's own plan, and where the rank is."""

    global_rank: int
    node: int
    local_rank: int
    plan: Plan


@dataclass(frozen=True)
class Agreement:
    """What every rank of every node uses: ``plan`` (the fewest blocks), the rank whose plan it is,
    every rank's plan, and the seconds the agreement took."""

    plan: Plan
    bound_by: RankPlan
    ranks: tuple[RankPlan, ...]
    seconds: float


class Cluster:
    """This rank's place in the engine's global process group; see the module docstring."""

    def __init__(
        self, nodes: GroupRanks, global_rank: int, place: Callable[[Any], Any], timeout: float, limit: str
    ) -> None:
        """``place(paddle)``: where a collective's tensors live (the group's backend decides)."""
        self.nodes, self.global_rank, self.timeout, self.limit = nodes, global_rank, timeout, limit
        self.me = nodes.describe(global_rank)
        self.join_seconds = 0.0
        self._place = place
        self._arrival: Arrival | None = None  # every rank counts in on the group's store first

    @classmethod
    def current(cls, *, facts: Mapping[str, object], timeout: float, limit: str = ENV_TIMEOUT) -> Cluster:
        """The process group this process is already in (``python -m paddle.distributed.launch``, then
        ``fleet.init`` or ``init_parallel_env``; joined here if only the launcher ran), with the
        launcher's rank numbering. Writes no variable and opens no port or store; Paddle's default
        group is looked up at each call. Every rank's ``facts`` must equal this one's: a
        ``ConfigError`` names the node that differs and both values. Each call within ``timeout``."""
        _check_facts(facts)
        check_seconds("timeout", timeout, "pass the seconds each agreement may take, e.g. 600")
        started = time.monotonic()
        here = f"global rank {os.environ.get('PADDLE_TRAINER_ID', '?')}"
        joining = "joining the launcher's process group"
        try:
            rank, world = enter_group(timeout, lambda: _timed_out(here, joining, timeout, limit))
        except FdPlatformsError:
            raise
        except PADDLE_ERRORS as exc:  # Paddle's own, from its store or its process group
            raise NodeError(f"{here}: {joining} failed: {first_line(exc)}. Fix: check the other ranks' output") from exc
        cluster = cls(GroupRanks.from_launcher(os.environ, world), rank, group_place, timeout, limit)
        slower = f"raise {knob(limit, argument=True)} if a rank is legitimately slower"

        def describe(other: int) -> str:  # by the group's ranks as they stand then: cluster.nodes is replaced below
            return cluster.nodes.describe(other)

        cluster._arrival = Arrival(rank, world, describe, slower)
        ours = json.dumps({"facts": dict(facts), **asdict(Place.here(os.environ, rank))})
        gathered = cluster.gather_text(ours, "comparing every node's facts")
        rows = [_row(row, other, cluster.me) for other, row in enumerate(gathered)]
        cluster.nodes = GroupRanks(tuple(Place(row["host"], row["local_rank"], row["pod"]) for row in rows))
        cluster.me = cluster.nodes.describe(rank)
        for other, row in enumerate(rows):
            compare_facts(dict(facts), row["facts"], cluster.nodes.describe(other))
        cluster.join_seconds = time.monotonic() - started
        return cluster

    def agree(self, plan: Plan) -> Agreement:
        """Every rank's plan, and the one with the fewest blocks (the lowest global rank on ties)."""
        if not isinstance(plan, Plan):
            raise ConfigError("plan", plan, "a Plan (what max_num_blocks returns)", "pass this rank's own plan")
        started = time.monotonic()
        rows = self.gather_text(json.dumps(asdict(plan)), "agreeing on the number of blocks")
        ranks = tuple(RankPlan(rank, *self.nodes.locate(rank), self._plan(rank, row)) for rank, row in enumerate(rows))
        bound = min(ranks, key=lambda ranked: (ranked.plan.num_blocks, ranked.global_rank))
        return Agreement(bound.plan, bound, ranks, time.monotonic() - started)

    def barrier(self, what: str) -> None:
        """Wait until every rank of every node gets here."""
        if self.nodes.world_size > 1:
            self._arrive(what)
            self._collective(paddle_as_is().distributed.barrier, what)

    def gather_text(self, text: str, what: str) -> list[str]:
        """Every rank's ``text``, in global-rank order (``all_gather`` of the lengths, then the bytes)."""
        import numpy as np

        data = text.encode()
        if len(data) > MAX_TEXT_BYTES:
            raise FdPlatformsError(f"gather_text got {len(data)} bytes; at most {MAX_TEXT_BYTES}. Fix: send less")
        if self.nodes.world_size == 1:
            return [text]
        self._arrive(what)
        paddle = paddle_as_is()
        dist = paddle.distributed  # the default group, looked up by each call: a restart between calls is fine
        place = self._place(paddle)
        lengths: list[Any] = []
        self._collective(
            lambda: dist.all_gather(lengths, paddle.to_tensor([len(data)], dtype="int64", place=place)), what
        )
        sizes = [int(length.numpy()[0]) for length in lengths]
        for rank, size in enumerate(sizes):
            if not 0 < size <= MAX_TEXT_BYTES:
                raise NodeError(
                    f"{self.me}: {self.nodes.describe(rank)} sent {size} bytes while {what}; "
                    f"at most {MAX_TEXT_BYTES}. Fix: run the same fd-platforms on every node"
                )
        buffer = np.zeros(max(sizes), dtype=np.uint8)
        buffer[: len(data)] = np.frombuffer(data, dtype=np.uint8)
        parts: list[Any] = []
        self._collective(lambda: dist.all_gather(parts, paddle.to_tensor(buffer, place=place)), what)
        return [bytes(part.numpy()[:size]).decode(errors="replace") for part, size in zip(parts, sizes, strict=True)]

    def _plan(self, rank: int, row: str) -> Plan:
        try:
            return Plan(**json.loads(row))
        except (ValueError, TypeError, FdPlatformsError) as exc:
            raise NodeError(
                f"{self.me}: {self.nodes.describe(rank)} sent a plan this node cannot read ({exc}). "
                "Fix: run the same fd-platforms version on every node"
            ) from exc

    def _arrive(self, what: str) -> None:
        if self._arrival is not None:
            self._arrival.wait(what, self.timeout)

    def _collective(self, call: Callable[[], T], what: str, deadline: float | None = None) -> T:
        seconds = self.timeout if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return bounded(call, seconds, lambda: self._timed_out(what))
        except PADDLE_ERRORS as exc:
            raise NodeError(f"{self.me}: {what} failed: {self._peer(exc)}. Fix: check that node's output") from exc

    def _timed_out(self, what: str) -> NodeError:
        return _timed_out(self.me, what, self.timeout, self.limit)

    def _peer(self, exc: BaseException) -> str:
        """Which rank's failure ``exc`` reports, in words, with Paddle's first line."""
        first = first_line(exc)
        found = _PAIR_RANK.search(str(exc))
        if found and int(found.group(1)) < self.nodes.world_size:
            return f"{self.nodes.describe(int(found.group(1)))} is gone ({first})"
        if self.nodes.world_size == 2:
            return f"{self.nodes.describe(1 - self.global_rank)} is gone ({first})"
        return f"a rank of another node is gone ({first})"


def _timed_out(me: str, what: str, timeout: float, limit: str) -> NodeError:
    return NodeError(
        f"{me}: {what} did not complete within {timeout:g} s: another node is not answering. "
        f"Fix: check every node's output; raise {knob(limit, argument=True)} if a node is legitimately slower"
    )


def group_place(paddle: Any) -> Any:
    """Where ``Cluster.current``'s collectives put their tensors: the host for a gloo group, else the
    device the launcher's group selected for this rank (Paddle's expected place)."""
    return paddle.CPUPlace() if paddle.distributed.get_backend() == "GLOO" else None


def _row(row: str, rank: int, me: str) -> dict[str, Any]:
    """One rank's facts and place, as it sent them to ``Cluster.current``; a NodeError if unreadable."""
    try:
        data = json.loads(row)
        place = Place(data["host"], data["local_rank"], data["pod"])
        valid = isinstance(place.host, str) and isinstance(place.pod, str) and is_int(place.local_rank)
        valid = valid and isinstance(data["facts"], dict)
    except (ValueError, TypeError, KeyError):
        valid = False
    if not valid:
        raise NodeError(
            f"{me}: global rank {rank} sent facts this rank cannot read. "
            "Fix: run the same fd-platforms version on every node"
        )
    read_facts(json.dumps(data["facts"]).encode(), f"global rank {rank}", me)  # plain values only
    return data
