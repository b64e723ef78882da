"""An engine (owning the signal), a spawned cache manager and a model runner that attaches, clears and
attaches again, on the public engine API of docs/engine-integration.md. Runs from any folder."""

import multiprocessing
from multiprocessing.connection import Connection
from pathlib import Path

import fd_platforms
from fd_platforms.engine import (
    CacheConfig,
    CacheLayout,
    CacheReadySignal,
    CacheRequest,
    DeviceMemory,
    ParallelConfig,
    build_layout,
    initialize_kv_cache,
    load_model_config,
    manage_kv_cache,
    min_across_ranks,
)

MODEL = Path(__file__).resolve().parent / "qwen3-30b-a3b"
CACHE = CacheConfig(swap_space_bytes=12 << 20)  # a little host swap space: 12 MiB per rank
MEMORY = DeviceMemory(64 << 20, None, None, "this example's 64 MiB")  # leave out on a device: its live facts
TIMEOUT = 30.0  # bounds every wait below


def rank0_layout() -> CacheLayout:
    return build_layout(load_model_config(MODEL), CACHE, ParallelConfig(tensor_parallel_size=1, local_rank=0))


def receive(conn: Connection, what: str) -> object:
    if not conn.poll(TIMEOUT):
        raise TimeoutError(f"no {what} within {TIMEOUT:g} s")
    return conn.recv()


def cache_manager(instance: str, num_blocks: int, num_cpu_blocks: int, conn: Connection) -> None:
    platform = fd_platforms.current_platform()
    for cycle in (1, 2):
        request = CacheRequest(
            layout=rank0_layout(),
            num_blocks=num_blocks,
            num_cpu_blocks=num_cpu_blocks,
            splitwise_role="mixed",
            instance=instance,
        )
        managed = manage_kv_cache(platform, request)  # zero-fills and publishes, then sets rank 0's slot
        # The slot is set already: the runner may be reading now, so this write is ordered by the message below
        managed.kv_cache.tensors[0][0, 0, 0, 0] = 100.0 + cycle
        assert managed.host_cache is not None  # num_cpu_blocks > 0: the manager holds the host swap space
        conn.send(managed.host_cache.num_blocks)  # sent once the write is done
        receive(conn, '"clear" from the engine')  # sent once the runner has let go
        written = managed.kv_cache.tensors[-1][-1, -1, -1, -1].item()  # the runner's write
        managed.clear(TIMEOUT)
        conn.send(written)


def main() -> int:
    platform = fd_platforms.current_platform()
    layout = rank0_layout()
    plan = min_across_ranks([platform.max_num_blocks(layout=layout, cache=CACHE, memory=MEMORY)])
    print(
        f"platform {platform.name}: {plan.num_blocks} blocks of {plan.bytes_per_block >> 20} MiB, "
        f"{plan.num_cpu_blocks} host swap blocks"
    )
    spawn = multiprocessing.get_context("spawn")
    with CacheReadySignal.create(1) as signal:  # the engine owns the signal
        engine_end, manager_end = spawn.Pipe()
        manager = spawn.Process(
            target=cache_manager, args=(signal.name, plan.num_blocks, plan.num_cpu_blocks, manager_end)
        )
        manager.start()
        try:
            request = CacheRequest(
                layout=layout,
                num_blocks=plan.num_blocks,
                num_cpu_blocks=plan.num_cpu_blocks,
                splitwise_role="decode",
                instance=signal.name,
                creator_pid=manager.pid,
                timeout=TIMEOUT,
            )  # one rank's request, checked once, for every cycle
            for cycle in (1, 2):
                cache = initialize_kv_cache(platform, request)
                swap_blocks = receive(engine_end, "publication from the cache manager")  # sent after its write
                seen = cache.tensors[0][0, 0, 0, 0].item()
                assert cache.decision is not None  # initialize_kv_cache's cache holds the rule's answer
                cache.tensors[-1][-1, -1, -1, -1] = 7.0 * cycle
                print(
                    f"cycle {cycle}: attached={not cache.created} (deciding term {cache.decision.deciding_term}), "
                    f"{len(cache.tensors)} tensors, read {seen} written by the cache manager"
                )
                cache.clear(TIMEOUT)  # the attacher lets go first, then the cache manager clears
                engine_end.send("clear")
                written = receive(engine_end, "clear from the cache manager")
                print(
                    f"cycle {cycle}: cleared; the cache manager ({swap_blocks} host swap blocks) "
                    f"read {written} written by the runner"
                )
        finally:
            engine_end.close()  # a cache manager still waiting for "clear" sees EOF and exits
            manager.join(TIMEOUT)
            if manager.is_alive():
                manager.kill()
                manager.join(TIMEOUT)
    left = Path("/dev/shm", signal.name).exists()
    print(f"done: cache manager exited with {manager.exitcode}, signal {signal.name} removed: {not left}")
    return 0 if manager.exitcode == 0 and not left else 1


if __name__ == "__main__":
    raise SystemExit(main())
