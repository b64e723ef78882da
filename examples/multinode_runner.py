"""One engine over two nodes through Paddle's launcher, on the public engine API: each node's worker plans its
rank, the workers agree on the fewest blocks over the process group the launcher made (``Cluster.current``), and
each node creates its cache.

``python examples/multinode_runner.py`` starts two launchers on this machine as node 0 (96 MiB) and node 1
(64 MiB): ``python -m paddle.distributed.launch --nnodes 2 --rank I --master 127.0.0.1:PORT --nproc_per_node 1``
with this file as the script, which each launcher runs with ``--memory-mib M``; on two machines, run one such
launcher on each with node 0's address as ``--master``. Runs from any folder."""

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import fd_platforms
from fd_platforms.engine import (
    CacheConfig,
    CacheReadySignal,
    CacheRequest,
    Cluster,
    DeviceMemory,
    ParallelConfig,
    build_layout,
    initialize_kv_cache,
    load_model_config,
)

MODEL = Path(__file__).resolve().parent / "qwen3-30b-a3b"
CACHE = CacheConfig()
TIMEOUT = 60.0  # bounds every wait below


def worker(memory_mib: int) -> None:
    """One node's rank, started by the launcher."""
    platform = fd_platforms.current_platform()
    layout = build_layout(load_model_config(MODEL), CACHE, ParallelConfig(tensor_parallel_size=2, local_rank=0))
    memory = DeviceMemory(memory_mib << 20, None, None, "this example's --memory-mib")
    plan = platform.max_num_blocks(layout=layout, cache=CACHE, memory=memory)  # this node's rank alone
    cluster = Cluster.current(facts={"model": MODEL.name, "tp": 2}, timeout=TIMEOUT)
    agreement = cluster.agree(plan)  # every rank of every node: the fewest blocks
    node, _ = cluster.nodes.locate(cluster.global_rank)
    bound = agreement.bound_by
    with CacheReadySignal.create(1) as signal:  # each node's engine owns its own signal
        request = CacheRequest(
            layout=layout,
            num_blocks=agreement.plan.num_blocks,
            num_cpu_blocks=0,
            splitwise_role="mixed",
            instance=signal.name,
            timeout=TIMEOUT,
        )
        cache = initialize_kv_cache(platform, request)
        cluster.barrier("every node's cache is ready")
        print(
            f"node {node}: planned {plan.num_blocks} blocks, uses {agreement.plan.num_blocks} "
            f"(node {bound.node} rank {bound.local_rank}'s plan), created={cache.created}",
            flush=True,
        )
        cache.clear(TIMEOUT)


def main(argv: list[str]) -> int:
    if "PADDLE_TRAINER_ID" in os.environ:  # started by the launcher
        worker(int(argv[argv.index("--memory-mib") + 1]))
        return 0
    with socket.socket() as probe:  # a free port for node 0's launcher to meet node 1's at
        probe.bind(("127.0.0.1", 0))
        master = f"127.0.0.1:{probe.getsockname()[1]}"
    flags = f"--nnodes 2 --nproc_per_node 1 --master {master} --rank".split()
    launch = [sys.executable, "-m", "paddle.distributed.launch", *flags]
    with tempfile.TemporaryDirectory() as logs:
        nodes = [
            subprocess.Popen(
                [*launch, str(rank), "--log_dir", f"{logs}/node{rank}", __file__, "--memory-mib", str(memory)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for rank, memory in ((0, 96), (1, 64))
        ]
        codes = [process.wait(timeout=TIMEOUT + 60) for process in nodes]
        for rank in range(2):  # each node's line from its worker's log, among Paddle's own; the log's end on failure
            log = (Path(logs) / f"node{rank}" / "workerlog.0").read_text()
            print("".join(line for line in log.splitlines(keepends=True) if line.startswith(f"node {rank}: ")), end="")
            print(log[-2000:] if codes[rank] else "", end="", file=sys.stderr)
    return max(codes)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
