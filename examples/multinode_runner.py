"""One engine over two nodes, on the public engine API: each node plans its rank, the nodes agree on
the fewest blocks through Paddle's collective runtime, and each node creates its cache.

``python examples/multinode_runner.py`` starts node 0 (96 MiB) and node 1 (64 MiB) on 127.0.0.1;
``... --node-rank I --master HOST:PORT --memory-mib M`` runs one node, as an engine's own launcher
would on each machine. Runs from any folder."""

import subprocess
import sys
from pathlib import Path

import fd_platforms
from fd_platforms.engine import (
    CacheConfig,
    CacheReadySignal,
    Cluster,
    DeviceMemory,
    NodeSpec,
    ParallelConfig,
    build_layout,
    free_master,
    initialize_kv_cache,
    load_model_config,
)

MODEL = Path(__file__).resolve().parent / "qwen3-30b-a3b"
CACHE = CacheConfig()
TIMEOUT = 60.0  # bounds every wait below


def node(node_rank: int, master: str, memory_mib: int) -> None:
    platform = fd_platforms.current_platform()
    layout = build_layout(load_model_config(MODEL), CACHE, ParallelConfig(tensor_parallel_size=2, local_rank=0))
    memory = DeviceMemory(memory_mib << 20, None, None, "this example's --memory-mib")
    plan = platform.max_num_blocks(layout=layout, cache=CACHE, memory=memory)  # this node's rank alone
    nodes = NodeSpec(nnodes=2, node_rank=node_rank, master=master, local_ranks=1)
    cluster = Cluster.join(nodes, 0, facts={"model": MODEL.name, "tp": 2}, timeout=TIMEOUT)
    agreement = cluster.agree(plan)  # every rank of every node: the fewest blocks
    bound = agreement.bound_by
    with CacheReadySignal.create(1) as signal:  # each node's engine owns its own signal
        cache = initialize_kv_cache(
            platform, layout, agreement.plan.num_blocks, profile=False, num_cpu_blocks=0, storage_backend=None,
            splitwise_role="mixed", instance=signal.name, creator_pid=None, timeout=TIMEOUT)
        cluster.barrier("every node's cache is ready")
        print(f"node {node_rank}: planned {plan.num_blocks} blocks, uses {agreement.plan.num_blocks} "
              f"(node {bound.node} rank {bound.local_rank}'s plan), created={cache.created}", flush=True)
        cache.clear(TIMEOUT)


def main(argv: list[str]) -> int:
    if argv:
        node(int(argv[argv.index("--node-rank") + 1]), argv[argv.index("--master") + 1],
             int(argv[argv.index("--memory-mib") + 1]))
        return 0
    master = free_master()  # this machine: node 0 listens on a free port and the next one
    nodes = [subprocess.Popen([sys.executable, __file__, "--node-rank", str(rank), "--master", master,
                               "--memory-mib", str(memory)], stdout=subprocess.PIPE, text=True)
             for rank, memory in ((0, 96), (1, 64))]
    for process in nodes:  # each node's lines whole and in node order, not interleaved
        print(process.communicate(timeout=TIMEOUT + 30)[0], end="")
    return max(process.returncode for process in nodes)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
