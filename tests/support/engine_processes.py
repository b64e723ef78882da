"""Bodies of the processes the engine-API tests spawn: a cache manager and a creator that hold a cache."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

from kv_requests import kv_request
from warm_processes import warm

from fd_platforms.engine import KVCache, ManagedCache, manage_kv_cache
from fd_platforms.fastdeploy import FASTDEPLOY
from fd_platforms.kit.device_facts import write_element
from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config
from fd_platforms.rules.layout import CacheLayout, build_layout

QWEN = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "qwen3-30b-a3b")


def qwen_layout(rank: int = 0, tp: int = 1, device_id: int = 0, **cache: object) -> CacheLayout:
    return build_layout(
        load_model_config(QWEN),
        CacheConfig(**cache),
        ParallelConfig(tp, rank),  # type: ignore[arg-type]
        device_id=device_id,
    )


def manage(signal_name: str, num_blocks: int, num_cpu_blocks: int, cache: dict, conn: Connection) -> None:
    """A cache manager for rank 0: publish, write 5.0 into the first key element, then :func:`serve`."""
    import fd_platforms

    platform = fd_platforms.current_platform()
    managed = manage_kv_cache(
        platform, kv_request(qwen_layout(**cache), num_blocks, num_cpu_blocks=num_cpu_blocks, instance=signal_name)
    )
    managed.kv_cache.tensors[0][0, 0, 0, 0] = 5.0
    serve(conn, managed, managed.kv_cache)


def serve(conn: Connection, managed: ManagedCache, read_from: KVCache) -> None:
    """Say ``ready``, then serve ``read`` (the last element of ``read_from``), ``clear`` (with a timeout)
    and ``stop``."""
    conn.send(("ready", os.getpid()))
    while True:
        kind, payload = conn.recv()
        if kind == "read":
            conn.send(read_from.tensors[-1][-1, -1, -1, -1].item())
        elif kind == "clear":
            try:
                managed.clear(payload)
            except Exception as exc:  # noqa: BLE001 - any failure goes to the test, which asserts on it
                conn.send((type(exc).__name__, str(exc), getattr(exc, "ranks", None)))
            else:
                conn.send(("cleared", None, None))
        elif kind == "stop":
            return


def export_and_hold(nbytes: int, conn: Connection) -> None:
    """Export one uint8 tensor of ``nbytes`` through the cpu platform, report its handle, then hold it."""
    import fd_platforms

    platform = fd_platforms.current_platform()
    shared = platform.export_cache_tensor("fd_kv.test-hold.blob", (nbytes,), "uint8", "cpu")
    shared.tensor[0] = 42
    conn.send(shared.handle)
    conn.recv()


DRIVEN_ROUNDS = int(os.environ.get("FD_TEST_DRIVEN_ROUNDS", "3"))
"""Clear/update rounds each driven test runs: enough for a round to follow a round (the creators' and the
runners' second creation and attach) in the suite; the soak runs them long, e.g. ``FD_TEST_DRIVEN_ROUNDS=200
python -m pytest tests/fastdeploy/test_fastdeploy_protocol.py -k "driven or rl_flow"``. docs/lifecycle.md quotes it."""

#: Our runner sent to attach beside FastDeploy: swap space in a mixed instance, where only rule 2026-01
#: (FastDeploy before PR #7471, whose cache transfer manager creates: the stand-in ``creator``) attaches.
FASTDEPLOY_ATTACH = {
    "profile": False,
    "num_cpu_blocks": 4,
    "storage_backend": None,
    "splitwise_role": "mixed",
    "rule": "2026-01",
}


def first_bytes(cache: object, index: int) -> set[int]:
    """Byte ``index`` of every tensor of ``cache``, read through a raw uint8 view."""
    return {int(_raw_byte(tensor, index).item()) for tensor in cache.tensors}  # type: ignore[attr-defined]


def write_byte(cache: object, index: int, value: int) -> None:
    """Write ``value`` into byte ``index`` of every tensor of ``cache``, into its own memory on every device."""
    for tensor in cache.tensors:  # type: ignore[attr-defined]
        raw = tensor.view("uint8")
        write_element(raw, (0,) * (raw.ndim - 1) + (index,), value)


def _raw_byte(tensor: object, index: int) -> object:
    raw = tensor.view("uint8")  # type: ignore[attr-defined]
    return raw[(0,) * (raw.ndim - 1) + (index,)]


def fastdeploy_runner(
    suffix: str, rank: int, tp: int, num_blocks: int, cycles: int, device_id: int, conn: Connection
) -> None:
    """Our runner beside FastDeploy's processes: attach rank ``rank`` (on ``device_id``) by FastDeploy's
    names, check byte 0 of every tensor is ``rank + 1`` (the stand-in creator's mark) and write byte 1
    = 0x5A; then follow ``cycles`` clear/update rounds (let go on CLEARING, attach again once the slot
    is set)."""
    import fd_platforms
    from fd_platforms.engine import initialize_kv_cache
    from fd_platforms.fastdeploy.signals import KV_CACHE_STATUS, FastDeploySignal, KVCacheStatus

    platform = fd_platforms.current_platform()
    layout = qwen_layout(rank, tp, device_id)

    def attach() -> object:
        cache = initialize_kv_cache(
            platform,
            kv_request(layout, num_blocks, instance=suffix, protocol=FASTDEPLOY, timeout=30, **FASTDEPLOY_ATTACH),
        )
        assert not cache.created and first_bytes(cache, 0) == {rank + 1}, first_bytes(cache, 0)
        write_byte(cache, 1, 0x5A)
        return cache

    cache = attach()
    conn.send(("attached", cache.wait_seconds, str(cache.tensors[0].place)))
    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        for _ in range(cycles):
            status.wait_for(0, KVCacheStatus.CLEARING, 30, what=f"rank {rank} waiting for a clear")
            cache.clear()  # type: ignore[attr-defined]
            cache = attach()
    conn.send(("done", cycles))
    conn.recv()
    cache.clear()  # type: ignore[attr-defined]
    conn.send(("cleared", None))


def fastdeploy_manager(suffix: str, rank: int, tp: int, num_blocks: int, device_id: int, conn: Connection) -> None:
    """Our cache manager for rank ``rank`` (on ``device_id``) with FastDeploy's protocol: publish, report
    where, then answer ``bytes`` (byte 1 of every tensor, as a stand-in attacher wrote it) and ``clear``."""
    import fd_platforms

    platform = fd_platforms.current_platform()
    managed = manage_kv_cache(
        platform,
        kv_request(
            qwen_layout(rank, tp, device_id),
            num_blocks,
            num_cpu_blocks=4,
            instance=suffix,
            protocol=FASTDEPLOY,
            rule="2026-01",
        ),
    )
    conn.send(("published", str(managed.kv_cache.tensors[0].place)))
    while True:
        kind = conn.recv()
        if kind == "bytes":
            conn.send(sorted(first_bytes(managed.kv_cache, 1)))
        elif kind == "clear":
            managed.clear(30)
            conn.send("cleared")
            return


def mtp_layout(ratio: float = 2.0) -> CacheLayout:
    """A small GQA model with one MTP layer (4 main layers, the draft layer is layer 4), the whole layout."""
    from fd_platforms.rules.config.model import ModelConfig

    model = ModelConfig(
        "gqa-mtp",
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        num_nextn_predict_layers=1,
        use_mtp=True,
    )
    return build_layout(model, CacheConfig(block_size=16, num_gpu_block_expand_ratio=ratio), ParallelConfig())


def manage_with_draft(signal_name: str, num_blocks: int, conn: Connection) -> None:
    """A cache manager for rank 0 of :func:`mtp_layout` publishing main and draft layers in one call: writes
    5.0 into the first main element and 6.0 into the first draft element, then :func:`serve` (reading the draft)."""
    import fd_platforms

    whole = mtp_layout()
    managed = manage_kv_cache(
        fd_platforms.current_platform(),
        kv_request(whole.main(), num_blocks, num_cpu_blocks=2, instance=signal_name, draft=whole.draft()),
    )
    assert managed.draft is not None
    managed.kv_cache.tensors[0][0, 0, 0, 0] = 5.0
    managed.draft.tensors[0][0, 0, 0, 0] = 6.0
    serve(conn, managed, managed.draft)


def hold_with_draft(suffix: str, num_blocks: int, conn: Connection) -> None:
    """FastDeploy's cache transfer manager as rule 2026-04 has it, with MTP: wait for rank 0's worker to
    publish main and draft layers, attach both and carve the host swap cache for all of them; report the
    first draft element and the host tensor names, then serve ``clear`` (its let-go) and ``stop``."""
    import fd_platforms

    whole = mtp_layout()
    managed = manage_kv_cache(
        fd_platforms.current_platform(),
        kv_request(
            whole.main(),
            num_blocks,
            num_cpu_blocks=2,
            instance=suffix,
            protocol=FASTDEPLOY,
            rule="2026-04",
            timeout=30,
            draft=whole.draft(),
        ),
    )
    assert not managed.created  # the rule in force lets the worker create: the manager attaches
    assert managed.draft is not None and managed.host_cache is not None
    conn.send(("ready", managed.draft.tensors[0][0, 0, 0, 0].item(), managed.host_cache.names))
    serve_clear(conn, managed)


def serve_clear(conn: Connection, managed: ManagedCache) -> None:
    """Serve ``clear`` (the manager's let-go, with a timeout; answered ``cleared``) until ``stop``."""
    while True:
        kind, payload = conn.recv()
        if kind == "clear":
            managed.clear(payload)
            conn.send(("cleared",))
        elif kind == "stop":
            return


def attach_beside_worker(suffix: str, num_blocks: int, num_cpu_blocks: int, backend: str, conn: Connection) -> None:
    """Our cache transfer manager of rank 0 as FastDeploy's since PR #8046 launches it (no ``--create_cache_tensor``,
    ``prefix_cache_manager.py`` ``launch_cache_manager``): in a mixed instance with a storage backend it waits for the
    worker's cache and attaches, with or without swap space; reports its host cache, then serves ``clear``/``stop``."""
    import fd_platforms

    managed = manage_kv_cache(
        fd_platforms.current_platform(),
        kv_request(
            qwen_layout(),
            num_blocks,
            num_cpu_blocks=num_cpu_blocks,
            storage_backend=backend,
            instance=suffix,
            protocol=FASTDEPLOY,
            rule="2026-06",
            timeout=30,
        ),
        attach=True,
    )
    assert not managed.created
    conn.send(("ready", managed.host_cache is not None))
    serve_clear(conn, managed)


@contextmanager
def spawned_manager(target: Callable[..., None], *args: object) -> Iterator[tuple[Connection, int]]:
    """``target(*args, its_pipe_end)`` spawned as a cache manager that says ``ready``: yields (our pipe end, its
    pid); stopped (killed if it will not stop) after."""
    ours, theirs = warm.Pipe()
    process = warm.Process(target=target, args=(*args, theirs))
    process.start()
    try:
        assert ours.poll(60), "the cache manager never became ready"
        assert ours.recv()[0] == "ready"
        assert process.pid is not None
        yield ours, process.pid
    finally:
        if process.is_alive():
            ours.send(("stop", None))
            process.join(30)
        if process.is_alive():
            process.kill()
            process.join(10)


def fastdeploy_rl_runner(suffix: str, rank: int, tp: int, num_blocks: int, barrier: Any, conn: Connection) -> None:
    """Our runner replacing FastDeploy's worker loop: attach rank ``rank`` by FastDeploy's names, then follow
    ``model_weights_status`` (``follow_model_weights_status``, the ranks meeting at ``barrier``, a
    multiprocessing barrier standing in for the tp group's) until told to report: let go on a clear request,
    attach again (the stand-in creator's mark checked) on an update request."""
    import fd_platforms
    from fd_platforms.engine import initialize_kv_cache
    from fd_platforms.fastdeploy import follow_model_weights_status

    platform = fd_platforms.current_platform()
    held: list[object] = []

    def attach() -> None:
        cache = initialize_kv_cache(
            platform,
            kv_request(
                qwen_layout(rank, tp), num_blocks, instance=suffix, protocol=FASTDEPLOY, timeout=30, **FASTDEPLOY_ATTACH
            ),
        )
        assert not cache.created and first_bytes(cache, 0) == {rank + 1}, first_bytes(cache, 0)
        held.append(cache)

    def clear() -> None:
        held.pop().clear()  # type: ignore[attr-defined]

    attach()
    conn.send(("attached", None, None))
    rounds = follow_model_weights_status(
        suffix,
        rank,
        clear=clear,
        restore=attach,
        timeout=30,
        tp=tp,
        until=conn.poll,
        barrier=lambda: barrier.wait(30),
    )
    conn.recv()
    conn.send(("done", rounds))
    assert conn.recv() == "stop"
    clear()
    conn.send(("cleared", None))


def fastdeploy_serving_manager(suffix: str, rank: int, tp: int, num_blocks: int, conn: Connection) -> None:
    """Our cache manager for rank ``rank`` (one process per rank, as FastDeploy's transfer managers): publish,
    then serve ``kv_cache_status`` (reusing the host swap space a clear keeps) until told to stop, then clear."""
    import fd_platforms
    from fd_platforms.fastdeploy import serve_kv_cache_status

    platform = fd_platforms.current_platform()
    made: list[object] = []

    def create(rank: int) -> object:
        kept = made[-1].host_cache if made else None  # type: ignore[attr-defined]
        made.append(
            manage_kv_cache(
                platform,
                kv_request(
                    qwen_layout(rank, tp),
                    num_blocks,
                    num_cpu_blocks=4,
                    instance=suffix,
                    protocol=FASTDEPLOY,
                    rule="2026-01",
                    host_cache=kept,
                ),
            )
        )
        return made[-1]

    conn.send(("published", str(create(rank).kv_cache.tensors[0].place)))  # type: ignore[attr-defined]
    held = serve_kv_cache_status(
        [made[-1]],
        create,
        instance=suffix,  # type: ignore[list-item,arg-type]
        until=conn.poll,
        timeout=30,
        tp=tp,
    )
    assert conn.recv() == "stop"
    for cache in held:
        cache.clear(30, clear_host=True)
    conn.send(("cleared", len(made)))


def decode_runner(suffix: str, conn: Connection, num_cpu_blocks: int = 4, storage_backend: str | None = None) -> None:
    """Our runner of rank 0 in P/D decode (by default with host swap space: the cache messager's cache, two
    attachers per rank): it attaches, reports, then on ``"clear"`` lets go and says ``"cleared"``; it holds the cache
    until told or killed."""
    import fd_platforms
    from fd_platforms.engine import initialize_kv_cache

    cache = initialize_kv_cache(
        fd_platforms.current_platform(),
        kv_request(
            qwen_layout(),
            4,
            profile=False,
            num_cpu_blocks=num_cpu_blocks,
            storage_backend=storage_backend,
            splitwise_role="decode",
            protocol=FASTDEPLOY,
            instance=suffix,
            timeout=30,
            tp=1,
        ),
    )
    conn.send(("attached", cache.created))
    if conn.recv() == "clear":
        cache.clear()
        conn.send("cleared")
        conn.recv()


#: P/D decode with host swap space (FastDeploy's ``prefix_cache_manager.py`` ``launch_cache_manager``): the cache
#: messager creates, the worker and the cache transfer manager attach.
PD_BLOCKS, PD_CPU_BLOCKS = 4, 4


def pd_process(role: str, name: str, protocol: str, conn: Connection) -> None:
    """One process of rank 0 in P/D decode with swap space, through the public calls: ``messager`` creates
    (``manage_kv_cache`` with no swap space of its own), ``worker`` attaches (``initialize_kv_cache``, as the rule
    decides), ``transfer`` attaches and carves its host swap cache (``manage_kv_cache(..., attach=True)``). Reports
    (``up``, created, host swap blocks, byte 0 of every tensor), writes byte 1 = 0x5A, then serves ``clear`` (with
    a timeout; the error's type and text come back) and ``stop``."""
    import fd_platforms
    from fd_platforms.engine import initialize_kv_cache

    platform = fd_platforms.current_platform()
    names = {"instance": name, "tp": 1} if protocol == "fastdeploy" else {"instance": name}
    wire = FASTDEPLOY if protocol == "fastdeploy" else protocol
    common = {"protocol": wire, "splitwise_role": "decode", "timeout": 30, **names}
    if role == "messager":
        held: Any = manage_kv_cache(platform, kv_request(qwen_layout(), PD_BLOCKS, num_cpu_blocks=0, **common))
    elif role == "worker":
        held = initialize_kv_cache(
            platform,
            kv_request(
                qwen_layout(), PD_BLOCKS, profile=False, num_cpu_blocks=PD_CPU_BLOCKS, storage_backend=None, **common
            ),
        )
    else:
        held = manage_kv_cache(
            platform, kv_request(qwen_layout(), PD_BLOCKS, num_cpu_blocks=PD_CPU_BLOCKS, **common), attach=True
        )
    cache = held.kv_cache if isinstance(held, ManagedCache) else held
    host = held.host_cache.num_blocks if isinstance(held, ManagedCache) and held.host_cache else 0
    bytes0 = first_bytes(cache, 0)
    if role != "messager":
        write_byte(cache, 1, 0x5A)
    conn.send(("up", cache.created, host, sorted(bytes0)))
    while True:
        kind, payload = conn.recv()
        if kind == "clear":
            try:
                held.clear(payload)
            except Exception as exc:  # noqa: BLE001 - any failure goes to the test, which asserts on it
                conn.send((type(exc).__name__, str(exc)))
            else:
                conn.send(("cleared", ""))
        elif kind == "stop":
            return


def fastdeploy_control_manager(suffix: str, rank: int, tp: int, num_blocks: int, port: int, conn: Connection) -> None:
    """Our cache manager for rank ``rank`` in place of FastDeploy's transfer manager: publish, then answer FastDeploy's
    ControlRequests (serve_control_requests; the host swap space a sleep keeps is reused) until told to stop; then
    report how many caches it made and clear what it holds."""
    import fd_platforms
    from fd_platforms.fastdeploy.control import serve_control_requests
    from fd_platforms.fastdeploy.control_wire import ControlPlace

    platform = fd_platforms.current_platform()
    made: list[ManagedCache] = []

    def create(rank: int) -> ManagedCache:
        kept = made[-1].host_cache if made else None
        request = kv_request(
            qwen_layout(rank, tp),
            num_blocks,
            num_cpu_blocks=4,
            instance=suffix,
            protocol=FASTDEPLOY,
            rule="2026-01",
            host_cache=kept,
        )
        made.append(manage_kv_cache(platform, request))
        conn.send(("created", made[-1].host_cache is kept and kept is not None))
        return made[-1]

    first = create(rank)
    shm = os.environ.get("FD_ENGINE_TASK_QUEUE_WITH_SHM", "1") == "1"
    held = serve_control_requests(
        first, create, ControlPlace(port, tp, rank, shm_socket=shm, pod_ip="127.0.0.1"), until=conn.poll, timeout=25
    )
    assert conn.recv() == "stop"
    if held is not None:
        held.clear(30, clear_host=True)
    conn.send(("cleared", len(made), held is not None))


def dropping_worker(protocol: str, name: str, conn: Connection) -> None:
    """Our worker of rank 0 in a mixed instance with swap space (it attaches to the cache manager's cache): on
    ``"drop"`` it keeps a reference to its first tensor, drops its ``KVCache`` without ``clear()`` and collects it,
    then says ``("dropped", WARNINGs logged)``; on ``"write"`` it writes byte 2 = 0x6B through the kept tensor; it
    exits on ``"stop"``."""
    import gc
    import logging

    import fd_platforms
    from fd_platforms.engine import initialize_kv_cache

    warned: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warned.append(record.getMessage())

    logging.getLogger("fd_platforms").addHandler(Keep(logging.WARNING))
    wire = {"protocol": FASTDEPLOY, "tp": 1, "rule": "2026-01"} if protocol == "fastdeploy" else {}
    cache: Any = initialize_kv_cache(
        fd_platforms.current_platform(),
        kv_request(qwen_layout(), 4, num_cpu_blocks=4, profile=False, instance=name, timeout=30, **wire),
    )
    conn.send(("attached", cache.created))
    kept = None
    while True:
        kind = conn.recv()
        if kind == "drop":
            kept = cache.tensors[0]
            del cache
            gc.collect()
            conn.send(("dropped", warned))
        elif kind == "write":
            raw = kept.view("uint8")  # type: ignore[attr-defined]
            write_element(raw, (0,) * (raw.ndim - 1) + (2,), 0x6B)
            conn.send("written")
        elif kind == "stop":
            return
