"""A FastDeploy-style worker for ``python -m paddle.distributed.launch`` (tests/engine/test_launched_group.py):
``examples/launched_worker.py`` with the faults and checks the tests need.

Like FastDeploy's ``worker_process.py``: imports paddle, joins the launcher's group (``fleet.init``
unless ``--init none``), plans its rank on its own device memory, then agrees with every rank
through :meth:`Cluster.current`; local rank 0 hands the count to its node's engine in
``get_profile_block_num``; the user's own ``all_reduce`` follows on the same group. Each rank
writes what happened to ``<out>/rank<R>.json`` (an error as its one line).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import paddle  # every FastDeploy worker imports paddle first; its import sets OMP_NUM_THREADS and CUSTOM_DEVICE_ROOT

from fd_platforms.engine import Cluster, FdPlatformsError
from fd_platforms.fastdeploy import hand_off_block_count

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("launched_example", ROOT / "examples" / "launched_worker.py")
example = importlib.util.module_from_spec(_spec)  # the guide's worker: its plan and facts
_spec.loader.exec_module(example)  # type: ignore[union-attr]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--memory-mib", required=True, help="device memory of each global rank, comma-separated")
    parser.add_argument("--init", choices=("fleet", "none"), default="fleet")
    parser.add_argument("--tp", default="2", help="this node's tp fact, or RANK=TP,... per global rank")
    parser.add_argument("--absent", type=int, default=-1, help="this global rank never comes to the agreement")
    parser.add_argument(
        "--restart", action="store_true", help="replace the default group (a restart), then agree again"
    )
    parser.add_argument("--timeout", type=float, default=60.0)
    return parser.parse_args()


def tp_of(spec: str, rank: int) -> int:
    if "=" not in spec:
        return int(spec)
    return dict(map(int, pair.split("=")) for pair in spec.split(","))[rank]


def restart_group() -> bool:
    """What an RL weight update does between two agreements. FastDeploy calls
    ``shutdown_process_group()`` / ``restart_process_group()``; a gloo group has no ``shutdown`` in
    Paddle 3.3 (the call raises AttributeError), so the closest here is a new default group over the
    same store and the old one made unusable: anything that kept the old group fails. True when a
    collective on the old group does fail."""
    from paddle.distributed import collective
    from paddle.distributed.communication.group import Group, _GroupManager

    dist = paddle.distributed
    old = dist.collective._get_global_group()
    backend = collective._group_map_backend[old]
    store = paddle.base.core.create_or_get_global_tcp_store()
    fresh = collective._new_process_group_impl(backend, store, old.rank, old.nranks, "_default_pg", None, group_id=900)
    new = Group(old.rank, 0, old.ranks, pg=fresh, name="_default_pg")
    _GroupManager.group_map_by_id[0] = collective._group_map[0] = collective._group_map_by_name["_default_pg"] = new
    collective._group_map_backend[new] = backend
    old._pg = None  # the old group has no process group left: a collective on it fails
    try:
        dist.all_reduce(paddle.to_tensor([1], dtype="int64", place=paddle.CPUPlace()), group=old)
    except AttributeError:
        return True
    return False  # the emulation would prove nothing


def main() -> int:
    args = parse()
    rank = int(os.environ["PADDLE_TRAINER_ID"])
    out = Path(args.out) / f"rank{rank}.json"
    result: dict[str, object] = {"rank": rank}
    if args.init == "fleet":
        from paddle.distributed import fleet

        fleet.init(is_collective=True)  # as FastDeploy's worker: before profiling
    before = dict(os.environ)
    try:
        plan, facts = example.plan_this_rank(int(args.memory_mib.split(",")[rank]), tp_of(args.tp, rank))
        if rank == args.absent:
            time.sleep(args.timeout * 3)  # alive, but never at the agreement (the launcher stops it)
            return 0
        cluster = Cluster.current(facts=facts, timeout=args.timeout)
        agreements = [cluster.agree(plan)]
        if args.restart:
            result["old_group_unusable"] = restart_group()
            agreements.append(cluster.agree(plan))
        node, local = cluster.nodes.locate(cluster.global_rank)
        if local == 0 and os.environ.get("FD_TEST_ENGINE_SUFFIX"):
            hand_off_block_count(os.environ["FD_TEST_ENGINE_SUFFIX"], agreements[-1].plan.num_blocks)
        changed = sorted(key for key in before.keys() | os.environ.keys() if before.get(key) != os.environ.get(key))
        mine = paddle.to_tensor([1000 + rank], dtype="int64", place=paddle.CPUPlace())
        paddle.distributed.all_reduce(mine, op=paddle.distributed.ReduceOp.MIN)  # the user's own, on the same group
        result.update(
            planned=plan.num_blocks,
            uses=[a.plan.num_blocks for a in agreements],
            node=node,
            local=local,
            bound_by=cluster.nodes.describe(agreements[0].bound_by.global_rank),
            env_changed=changed,
            user_all_reduce=int(mine.numpy()[0]),
            me=cluster.me,
        )
    except FdPlatformsError as error:
        result["error"] = f"{type(error).__name__}: {error}"
        print(result["error"], file=sys.stderr, flush=True)
        out.write_text(json.dumps(result))
        return 1
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
