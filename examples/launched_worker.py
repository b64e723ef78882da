"""A FastDeploy-style worker under Paddle's own launcher: each rank plans on its own device memory,
then every rank agrees on the fewest blocks over the group the launcher made (``Cluster.current``:
no port, store or environment variable of ours), and local rank 0 hands the count to its engine.

``python examples/launched_worker.py`` runs ``python -m paddle.distributed.launch --nproc_per_node 2``
on this machine with 96 and 64 MiB and prints each rank's line; under a launcher of yours, run it as
the launcher's script with ``--memory-mib`` (one value per global rank). Runs from any folder.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import fd_platforms
from fd_platforms.contract.types import DeviceMemory
from fd_platforms.engine import Cluster, hand_off_block_count
from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config
from fd_platforms.rules.decision import RULE_VERSIONS
from fd_platforms.rules.layout import build_layout

MODEL = Path(__file__).resolve().parent / "qwen3-30b-a3b"
CACHE = CacheConfig(rule="2026-04")  # the FastDeploy beside it: from PR #7471 on (its IPC cannot say which)
TIMEOUT = 60.0  # bounds every wait of the agreement


def plan_this_rank(memory_mib, tp=2):
    """This rank's own plan on ``memory_mib`` of device memory, and the facts every node must share."""
    platform = fd_platforms.current_platform()
    layout = build_layout(load_model_config(MODEL), CACHE, ParallelConfig(tensor_parallel_size=2, local_rank=0))
    memory = DeviceMemory(memory_mib << 20, None, None, "this example's --memory-mib")
    plan = platform.max_num_blocks(layout=layout, cache=CACHE, memory=memory)
    facts = {"model": MODEL.name, "tp": tp, "bytes_per_block": layout.bytes_per_block,
             "rule": f"{CACHE.rule}: {RULE_VERSIONS[CACHE.rule].text}"}  # fmt: skip
    return plan, facts


def worker(memory_mib):
    import paddle.distributed as dist
    from paddle.distributed import fleet

    fleet.init(is_collective=True)  # as FastDeploy's worker does; Cluster.current also works before it
    plan, facts = plan_this_rank(memory_mib[dist.get_rank()])
    cluster = Cluster.current(facts=facts, timeout=TIMEOUT)
    agreement = cluster.agree(plan)  # every rank of every node: the fewest blocks
    node, local = cluster.nodes.locate(cluster.global_rank)
    if local == 0 and os.environ.get("ENGINE_SUFFIX"):  # the node's FastDeploy engine waits on this word
        hand_off_block_count(os.environ["ENGINE_SUFFIX"], agreement.plan.num_blocks)
    bound = agreement.bound_by
    print(f"rank {cluster.global_rank}: planned {plan.num_blocks} blocks, uses {agreement.plan.num_blocks} "
          f"(node {bound.node} rank {bound.local_rank}'s plan)", flush=True)


def main(argv):
    if "PADDLE_TRAINER_ID" in os.environ:  # started by the launcher
        worker([int(mib) for mib in argv[argv.index("--memory-mib") + 1].split(",")])
        return 0
    with tempfile.TemporaryDirectory() as logs:
        done = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
                               "--log_dir", logs, __file__, "--memory-mib", "96,64"],
                              capture_output=True, text=True, timeout=TIMEOUT + 60)  # fmt: skip
        for rank in range(2):  # each rank's line from its log, among Paddle's own
            for line in (Path(logs) / f"workerlog.{rank}").read_text().splitlines():
                if line.startswith(f"rank {rank}: "):
                    print(line)
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
