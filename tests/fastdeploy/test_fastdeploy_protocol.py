"""Our runner and cache manager beside stand-ins of FastDeploy's unmodified processes.

The stand-ins (``tests/support/fastdeploy_standins.py``) import nothing of ours: plain shared memory and
numpy, FastDeploy's signal arrays, its ``set_data_ipc`` records. Each test checks at the end that
they imported nothing of ours and that nothing is left in ``/dev/shm``.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from engine_processes import (
    DRIVEN_ROUNDS,
    FASTDEPLOY_ATTACH,
    fastdeploy_manager,
    fastdeploy_rl_runner,
    fastdeploy_runner,
    fastdeploy_serving_manager,
    first_bytes,
    qwen_layout,
    write_byte,
)
from kv_requests import kv_request
from run_helpers import QWEN, ROOT, SCRIPT, clean_env, main_in_process
from warm_processes import warm

from fd_platforms.contract.errors import CacheSharingError, CacheSignalError, ConfigError, SignalWaitError
from fd_platforms.contract.types import PlatformIdentity
from fd_platforms.engine import ManagedCache, initialize_kv_cache, manage_kv_cache
from fd_platforms.fastdeploy.block_handoff import hand_off_block_count
from fd_platforms.fastdeploy.cache_server import serve_kv_cache_status
from fd_platforms.fastdeploy.cache_status import drive_kv_cache_clear, drive_kv_cache_restore, drive_kv_cache_update
from fd_platforms.fastdeploy.records import GPU_RECORD
from fd_platforms.fastdeploy.signals import CACHE_READY, KV_CACHE_STATUS, FastDeploySignal, KVCacheStatus
from fd_platforms.loading.platform import Platform

# multi-process: left out of -m "not slow"; FastDeploy's record names are the machine's, taken in turns; the runners it
# starts select cpu
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fastdeploy_record_names", "cpu_for_children")]

STANDINS = Path(__file__).resolve().parents[1] / "support" / "fastdeploy_standins.py"
FD_SIGNAL_NAMES = (
    "cache_ready_signal.",
    "swap_space_ready_signal.",
    "cache_transfer_inited_signal.",
    "kv_cache_status.",
    "get_profile_block_num.",
)
BLOCKS = 4
CYCLES = DRIVEN_ROUNDS
METAX_CYCLES = 3


@pytest.fixture
def metax(fake_device_root, fake_vendor_runtime, monkeypatch) -> None:
    """The fake MetaX device and vendor runtime for the processes the test starts (ours select metax; the
    stand-ins keep their tensors in libmcruntime.so's device memory, as FastDeploy's MetaX build does)."""
    outer = os.environ.get("LD_LIBRARY_PATH")
    monkeypatch.setenv("FD_PLATFORM", "metax")
    monkeypatch.setenv("CUSTOM_DEVICE_ROOT", str(fake_device_root("metax_gpu")))
    monkeypatch.setenv("LD_LIBRARY_PATH", ":".join(path for path in (str(fake_vendor_runtime), outer) if path))
    monkeypatch.setenv("FAKE_DEVICE_TOTAL_MEMORY", str(1 << 30))
    monkeypatch.setenv("FLAGS_allocator_strategy", "auto_growth")
    monkeypatch.setenv("FD_STANDIN_RUNTIME", "libmcruntime.so:mc")


def standin(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(STANDINS), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def expect(process: subprocess.Popen[str], word: str) -> None:
    line = process.stdout.readline().strip()  # type: ignore[union-attr]
    assert line.startswith(word), f"stand-in said {line!r}, expected {word!r}: {process.stdout.read()}"  # type: ignore[union-attr]


def finish(process: subprocess.Popen[str]) -> str:
    """Close its stdin, wait for it; what it printed last (its imports of ours)."""
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    assert "imported of ours: []" in out, out
    return out


def tensor_specs(cpu, rank: int, tp: int) -> str:
    layout = cpu.cache_layout(qwen_layout(rank, tp), BLOCKS)
    return json.dumps([[spec.name, spec.nbytes(BLOCKS)] for spec in layout.tensors])


def device_specs(rank: int, tp: int) -> str:
    """Rank ``rank``'s tensors on device ``rank``: FastDeploy's names (``.device{rank}``) and sizes (MetaX's
    shapes order the same bytes differently)."""
    layout = qwen_layout(rank, tp, rank)
    return json.dumps([[spec.name, spec.nbytes(BLOCKS)] for spec in layout.tensors])


def record_names(tp: int) -> set[str]:
    """FastDeploy's record names of every rank's tensors at this tensor-parallel size (device 0)."""
    return {name for rank in range(tp) for name in qwen_layout(rank, tp).names()}


def shm_names(suffixes: tuple[str, ...], tp: int) -> set[str]:
    """This test's entries in /dev/shm: the signals of its suffixes and its ranks' tensor records (other
    suites may run beside it, with records of other ranks: see test_fastdeploy_handles)."""
    records = record_names(tp)
    return {
        name
        for name in os.listdir("/dev/shm")
        if name.endswith(tuple(f".{suffix}" for suffix in suffixes)) or name in records
    }


@contextmanager
def fastdeploy_engine(tp: int, *block_count: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A stand-in FastDeploy engine's signals under a fresh suffix (``block_count``: the stand-in's
    ``BLOCK_SUFFIX [iluvatar]``); afterwards nothing of the test is left."""
    suffix = f"t{secrets.token_hex(4)}"
    suffixes = (suffix, *block_count[:1])
    before = shm_names(suffixes, tp)
    engine = standin("engine", suffix, tp, *block_count)
    expect(engine, "ready")
    try:
        yield suffix, engine
    finally:
        finish(engine)
        assert shm_names(suffixes, tp) - before == set()


def test_a_standin_cache_manager_wakes_our_runner_which_attaches_by_fastdeploys_names(cpu) -> None:
    with fastdeploy_engine(2) as (suffix, _), ExitStack() as stack:
        runner_layouts = [qwen_layout(rank, 2) for rank in range(2)]
        creators = [standin("creator", suffix, rank, 2, tensor_specs(cpu, rank, 2)) for rank in range(2)]
        for creator in creators:
            stack.callback(creator.kill)
        caches = [
            initialize_kv_cache(
                cpu,
                kv_request(
                    layout,
                    BLOCKS,
                    instance=suffix,
                    protocol="fastdeploy",
                    timeout=30,
                    creator_pid=creator.pid,
                    **FASTDEPLOY_ATTACH,
                ),
            )
            for layout, creator in zip(runner_layouts, creators, strict=True)
        ]
        for rank, (cache, creator) in enumerate(zip(caches, creators, strict=True)):
            expect(creator, "created")
            assert not cache.created and cache.names == runner_layouts[rank].names()
            assert first_bytes(cache, 0) == {rank + 1}, "the stand-in's memory, not a copy"
            write_byte(cache, 1, 0x5A)
            expect(creator, "touched")  # our writes reach the stand-in's memory
        with FastDeploySignal.attach(CACHE_READY, suffix) as ready:
            assert ready.values() == (1, 1)
            for cache in caches:
                cache.clear()
            assert ready.values() == (0, 0), "an attacher's let-go is its slot reset to 0"
        for creator in creators:
            finish(creator)


RUNNER_BY_NAME_ALONE = """
import sys
import fd_platforms
from fd_platforms.engine import CacheConfig, CacheRequest, ParallelConfig, build_layout, initialize_kv_cache
from fd_platforms.engine import load_model_config

suffix, creator, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
layout = build_layout(load_model_config(model), CacheConfig(), ParallelConfig(1, 0))
print("imported before the request:", "fd_platforms.fastdeploy" in sys.modules)
request = CacheRequest(layout=layout, num_blocks=4, num_cpu_blocks=4, splitwise_role="mixed", rule="2026-01",
                       protocol="fastdeploy", instance=suffix, creator_pid=creator, timeout=30)
cache = initialize_kv_cache(fd_platforms.current_platform(), request)
print("attached:", not cache.created, int(cache.tensors[0].view("uint8").reshape([-1])[0]), flush=True)
cache.clear()
"""


def test_a_runner_process_that_never_imported_the_fastdeploy_package_names_its_protocol_and_attaches(cpu) -> None:
    """``protocol="fastdeploy"`` is found through the package's entry point in a process that imported only
    ``fd_platforms`` and ``fd_platforms.engine``, and the runner attaches beside FastDeploy's own signals and
    records (the stand-ins of its engine and cache transfer manager import nothing of ours)."""
    with fastdeploy_engine(1) as (suffix, _):
        creator = standin("creator", suffix, 0, 1, tensor_specs(cpu, 0, 1))
        try:
            expect(creator, "created")
            done = subprocess.run(
                [sys.executable, "-c", RUNNER_BY_NAME_ALONE, suffix, str(creator.pid), str(ROOT / QWEN)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout.splitlines() == ["imported before the request: False", "attached: True 1"], done.stdout
            with FastDeploySignal.attach(CACHE_READY, suffix) as ready:
                assert ready.values() == (0,), "the runner's let-go: its slot reset to 0"
        finally:
            finish(creator)


def test_our_cache_manager_wakes_a_standin_worker_and_tells_the_engine_it_is_up(cpu) -> None:
    with fastdeploy_engine(2) as (suffix, engine):
        attachers = [standin("attacher", suffix, rank, 2, tensor_specs(cpu, rank, 2), 0, 0) for rank in range(2)]
        managed = [
            manage_kv_cache(
                cpu,
                kv_request(
                    qwen_layout(rank, 2),
                    BLOCKS,
                    num_cpu_blocks=4,
                    instance=suffix,
                    protocol="fastdeploy",
                    rule="2026-01",
                ),
            )
            for rank in range(2)
        ]
        for attacher in attachers:
            expect(attacher, "attached")
            expect(attacher, "done")
        for cache in managed:
            assert first_bytes(cache.kv_cache, 1) == {0x5A}, "the stand-in wrote into our tensors"
            names = cache.kv_cache.names
            record = GPU_RECORD.fields.unpack(Path(f"/dev/shm/{names[0]}").read_bytes())
            assert record[0] == 0 and record[1].rstrip(b"\0").decode().startswith(f"memfd:{os.getpid()}:")
        said = {engine.stdout.readline().strip() for _ in range(2)}  # type: ignore[union-attr]
        assert said == {"cache_transfer_inited 2", "swap_space_ready 2"}, "what FastDeploy's engine waits for"
        for attacher in attachers:
            finish(attacher)  # lets go: resets its slot
        for cache in managed:
            cache.clear(10, clear_host=True)  # as with FD_ENABLE_SWAP_SPACE_CLEARING=1 (a clear keeps it by default)
        with FastDeploySignal.attach("swap_space_ready_signal", suffix) as swap:
            assert swap.values() == (0, 0), "the swap space freed, as FastDeploy's transfer manager says"


def test_a_clear_update_driven_from_our_side_completes_round_after_round(cpu) -> None:
    drive_over_standin_creators(cpu, 4, two_events=False)


def test_a_clear_and_a_restore_driven_as_two_events_complete_round_after_round(cpu) -> None:
    """FastDeploy's two events: drive_kv_cache_clear, then separately drive_kv_cache_restore,
    over FastDeploy's cache transfer managers (stand-ins) and our runners."""
    drive_over_standin_creators(cpu, 2, two_events=True)


def drive_over_standin_creators(cpu, tp: int, *, two_events: bool) -> None:  # type: ignore[no-untyped-def]
    """CYCLES clear/updates driven from our side (:func:`drive_rounds`) over ``tp`` stand-in creators and our
    runners."""
    with fastdeploy_engine(tp) as (suffix, _), ExitStack() as stack:
        creators = [standin("creator", suffix, rank, tp, tensor_specs(cpu, rank, tp)) for rank in range(tp)]
        for creator in creators:
            stack.callback(creator.kill)
        links, runners = spawn_all(stack, tp, fastdeploy_runner, lambda rank: (suffix, rank, tp, BLOCKS, CYCLES, 0))
        for link in links:
            assert link.poll(120) and link.recv()[0] == "attached"
        drive_rounds(suffix, CYCLES, creators, runners, links, two_events=two_events)


def test_fastdeploys_rl_flow_over_its_workers_and_our_cache_managers_completes_round_after_round(cpu) -> None:
    """FastDeploy's two events driven by its engine (model_weights_status CLEARING, then UPDATING: the stand-in
    ``rl``), followed by its workers (stand-ins, which write kv_cache_status themselves) and answered by our
    cache managers (serve_kv_cache_status), one process per rank."""
    with fastdeploy_engine(2) as (suffix, _), ExitStack() as stack:
        links, managers = spawn_all(stack, 2, fastdeploy_serving_manager, lambda rank: (suffix, rank, 2, BLOCKS))
        for link in links:
            assert link.poll(120) and link.recv()[0] == "published"
        workers = [standin("worker", suffix, rank, 2, tensor_specs(cpu, rank, 2), CYCLES) for rank in range(2)]
        for worker in workers:
            stack.callback(worker.kill)
            expect(worker, "attached")
        engine_side = standin("rl", suffix, CYCLES)
        stack.callback(engine_side.kill)
        expect(engine_side, "done")
        for worker in workers:
            expect(worker, "done")
            finish(worker)  # lets go: resets its slot
        for link in links:
            link.send("stop")
            assert link.poll(60) and link.recv() == ("cleared", CYCLES + 1), "created once per round, no more"
        for manager in managers:
            manager.join(30)
        finish(engine_side)


def test_fastdeploys_rl_flow_over_our_runners_and_its_cache_transfer_managers_completes_round_after_round(cpu) -> None:
    """FastDeploy's two events driven by its engine (the stand-in ``rl``), followed by our runners
    (follow_model_weights_status: rank 0 drives kv_cache_status's clear and restore) beside FastDeploy's cache
    transfer managers (stand-ins), one process per rank."""
    with fastdeploy_engine(2) as (suffix, _), ExitStack() as stack:
        creators = [standin("creator", suffix, rank, 2, tensor_specs(cpu, rank, 2)) for rank in range(2)]
        for creator in creators:
            stack.callback(creator.kill)
        barrier = warm.Barrier(2)  # the tp group's barrier, stood in
        links, runners = spawn_all(stack, 2, fastdeploy_rl_runner, lambda rank: (suffix, rank, 2, BLOCKS, barrier))
        for link in links:
            assert link.poll(120) and link.recv()[0] == "attached"
        engine_side = standin("rl", suffix, CYCLES)
        stack.callback(engine_side.kill)
        expect(engine_side, "done")
        for link in links:
            link.send("report")  # stop following model_weights_status
        stop_all(CYCLES, creators, runners, links)
        finish(engine_side)


def test_a_clear_update_driven_from_the_standins_side_completes_round_after_round(cpu) -> None:
    with fastdeploy_engine(4) as (suffix, _):
        made: dict[int, ManagedCache] = {}

        def create(rank: int) -> ManagedCache:  # the host swap space a clear kept is reused, as FastDeploy's
            kept = made[rank].host_cache if rank in made else None
            made[rank] = manage_kv_cache(
                cpu,
                kv_request(
                    qwen_layout(rank, 4),
                    BLOCKS,
                    num_cpu_blocks=4,
                    instance=suffix,
                    protocol="fastdeploy",
                    rule="2026-01",
                    host_cache=kept,
                ),
            )
            return made[rank]

        managed = [create(rank) for rank in range(4)]
        attachers = [standin("attacher", suffix, rank, 4, tensor_specs(cpu, rank, 4), CYCLES, 0) for rank in range(4)]
        done: list[str] = []

        def all_done() -> bool:
            # the stand-ins print "attached" then, after every round, "done"
            return len(done) == 4

        import threading

        def read(attacher: subprocess.Popen[str]) -> None:
            expect(attacher, "attached")
            expect(attacher, "done")
            done.append("done")

        readers = [threading.Thread(target=read, args=(attacher,), daemon=True) for attacher in attachers]
        for reader in readers:
            reader.start()
        held = serve_kv_cache_status(managed, create, instance=suffix, until=all_done, timeout=30)
        for reader in readers:
            reader.join(5)
        assert len(held) == 4 and all(cache.kv_cache.shared for cache in held)
        assert [cache.host_cache for cache in held] == [cache.host_cache for cache in managed], (
            "the swap space kept throughout"
        )
        with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
            assert status.get(0) == KVCacheStatus.NORMAL
        for attacher in attachers:
            finish(attacher)
        for cache in held:
            cache.clear(10, clear_host=True)


def spawn_all(stack: ExitStack, ranks: int, target, args_of) -> tuple[list, list]:  # type: ignore[no-untyped-def]
    """``ranks`` spawned processes running ``target(*args_of(rank), far_end)``; their links and processes."""
    links, processes = [], []
    for rank in range(ranks):
        link, far = warm.Pipe()
        process = warm.Process(target=target, args=(*args_of(rank), far), daemon=True)
        process.start()
        stack.callback(process.kill)
        links.append(link)
        processes.append(process)
    return links, processes


def drive_rounds(  # type: ignore[type-arg]
    suffix: str, rounds: int, creators: list, runners: list, links: list, *, two_events: bool = False
) -> None:
    """Drive ``rounds`` clear/updates from our side over stand-in creators and our runners (``two_events``: each
    as a clear and, separately, a restore), then stop them all."""
    pids = {rank: runner.pid for rank, runner in enumerate(runners)}
    watched = {"creator_pid": creators[0].pid, "attacher_pids": pids}
    for _ in range(rounds):
        if two_events:
            assert drive_kv_cache_clear(suffix, timeout=30, **watched).ranks == len(runners)  # type: ignore[arg-type]
            with (
                FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status,
                FastDeploySignal.attach(CACHE_READY, suffix) as ready,
            ):
                assert status.get(0) == KVCacheStatus.CLEARED and set(ready.values()) == {0}, "cleared, between events"
            assert drive_kv_cache_restore(suffix, timeout=30, **watched).ranks == len(runners)  # type: ignore[arg-type]
        else:
            report = drive_kv_cache_update(suffix, timeout=30, **watched)  # type: ignore[arg-type]
            assert report.ranks == len(runners)
    stop_all(rounds, creators, runners, links)


def stop_all(rounds: int, creators: list, runners: list, links: list) -> None:  # type: ignore[type-arg]
    """Each runner says it followed ``rounds`` rounds, clears and ends; then the stand-in creators end."""
    for link in links:
        assert link.poll(60) and link.recv() == ("done", rounds)
        link.send("stop")
        assert link.poll(60) and link.recv()[0] == "cleared"
    for runner in runners:
        runner.join(30)
    for creator in creators:
        finish(creator)


def test_a_standin_metax_cache_manager_wakes_our_metax_runners_which_attach_through_its_raw_handles(metax) -> None:
    """FastDeploy's MetaX cache transfer manager, stood in: tensors in libmcruntime.so's device memory (faked),
    the raw 64-byte mcIpcGetMemHandle in set_data_ipc's records. Our MetaX runners, each on its own device, attach
    by FastDeploy's names through the vendor runtime's IPC, see the stand-in's mark, write theirs into its memory,
    and follow clear/update rounds driven from our side."""
    with fastdeploy_engine(2) as (suffix, _), ExitStack() as stack:
        creators = [standin("creator", suffix, rank, 2, device_specs(rank, 2)) for rank in range(2)]
        for creator in creators:
            stack.callback(creator.kill)
        links, runners = spawn_all(
            stack,
            2,
            fastdeploy_runner,
            lambda rank: (suffix, rank, 2, BLOCKS, METAX_CYCLES, rank),  # on device rank
        )
        for rank, link in enumerate(links):
            assert link.poll(120)
            said, _, place = link.recv()
            assert said == "attached" and f"metax_gpu:{rank}" in place, (said, place)
        for creator in creators:
            expect(creator, "created")
            expect(creator, "touched")  # our runner's byte, written into the stand-in's device memory
        drive_rounds(suffix, METAX_CYCLES, creators, runners, links)


def test_our_metax_cache_manager_wakes_a_standin_worker_which_opens_the_raw_handles(metax) -> None:
    """Our MetaX cache manager with FastDeploy's protocol: each rank's tensors on its own device, each record the
    raw 64-byte handle FastDeploy's set_data_ipc writes; a stand-in worker opens them with mcIpcOpenMemHandle and
    writes into our memory, and FastDeploy's engine hears the cache service is up."""
    with fastdeploy_engine(2) as (suffix, engine), ExitStack() as stack:
        links, _managers = spawn_all(stack, 2, fastdeploy_manager, lambda rank: (suffix, rank, 2, BLOCKS, rank))
        for rank, link in enumerate(links):
            assert link.poll(120)
            said, place = link.recv()
            assert said == "published" and f"metax_gpu:{rank}" in place, (said, place)
        for rank in range(2):
            _, handle = GPU_RECORD.fields.unpack(Path(f"/dev/shm/{qwen_layout(rank, 2, rank).names()[0]}").read_bytes())
            assert handle.startswith(b"FAKEIPC1"), "the raw handle (the fake runtime's magic), not its text"
        attachers = [standin("attacher", suffix, rank, 2, device_specs(rank, 2), 0, 0) for rank in range(2)]
        for attacher in attachers:
            stack.callback(attacher.kill)
            expect(attacher, "attached")
            expect(attacher, "done")
        for link in links:
            link.send("bytes")
            assert link.poll(30) and link.recv() == [0x5A], "the stand-in wrote into our device memory"
        said = {engine.stdout.readline().strip() for _ in range(2)}  # type: ignore[union-attr]
        assert said == {"cache_transfer_inited 2", "swap_space_ready 2"}, "what FastDeploy's engine waits for"
        for attacher in attachers:
            finish(attacher)  # closes its handles, resets its slot
        for link in links:
            link.send("clear")
            assert link.poll(60) and link.recv() == "cleared"


def test_a_rank_that_never_lets_go_is_named(cpu) -> None:
    with fastdeploy_engine(2) as (suffix, _):
        managed = [
            manage_kv_cache(
                cpu,
                kv_request(
                    qwen_layout(rank, 2),
                    BLOCKS,
                    num_cpu_blocks=4,
                    instance=suffix,
                    protocol="fastdeploy",
                    rule="2026-01",
                ),
            )
            for rank in range(2)
        ]
        with FastDeploySignal.attach(CACHE_READY, suffix) as ready:
            ready.set(0, 0)  # rank 0 let go; rank 1's attacher never does
            with pytest.raises(SignalWaitError) as caught:
                drive_kv_cache_update(suffix, timeout=0.5)
            assert caught.value.rank == 1 and caught.value.cause == "timeout"
            assert "rank 1 letting go of its KV cache" in str(caught.value)
            ready.set(1, 0)
            assert f"kv_cache_status.{suffix} was left at -30000 (fd-platforms' failure word" in str(caught.value)
        with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
            assert status.get(0) == -30000, "not NORMAL: rank 0 let go, so its creator may have freed its cache"
        for cache in managed:
            cache.clear(1)


def test_a_handle_that_does_not_fit_fastdeploys_record_is_refused(cpu, monkeypatch) -> None:
    from fd_platforms.fastdeploy import handles as fastdeploy_handles

    with pytest.raises(CacheSharingError, match="is 65 bytes, but FastDeploy's record holds a 64-byte handle"):
        fastdeploy_handles.encode_handle("key_caches_0_rank0.device0", "x" * 65, "cpu")


def test_a_bad_suffix_or_protocol_is_refused_before_any_hook(cpu) -> None:
    with pytest.raises(ConfigError, match="suffix") as caught:
        initialize_kv_cache(
            cpu, kv_request(qwen_layout(), BLOCKS, instance="../x", protocol="fastdeploy", **FASTDEPLOY_ATTACH)
        )
    assert "engine_worker_queue_port" in str(caught.value)
    with pytest.raises(ConfigError, match="protocol"):
        initialize_kv_cache(
            cpu, kv_request(qwen_layout(), BLOCKS, instance="9923", protocol="FastDeploy", **FASTDEPLOY_ATTACH)
        )


def test_the_agreed_block_count_reaches_a_standin_engine_in_its_format(cpu) -> None:
    with fastdeploy_engine(2) as (suffix, engine):
        with pytest.raises(ConfigError, match="int32") as caught:
            hand_off_block_count(suffix, 2**31)
        assert caught.value.field == "num_blocks"
        hand_off_block_count(suffix, 14448, platform=cpu, ranks=2)
        expect(engine, "profile_block_num 14448 words [14448]")  # what its engine polls before the cache service


def test_the_block_count_goes_to_the_engines_own_suffix_not_the_cache_signals(cpu) -> None:
    """FastDeploy names get_profile_block_num with engine_worker_queue_port[0] (its workers' engine_pid) and the cache
    signals with the data-parallel rank's port; with data parallelism they differ."""
    engine_pid = f"e{secrets.token_hex(4)}"
    with fastdeploy_engine(2, engine_pid) as (suffix, engine):
        with pytest.raises(CacheSignalError, match=rf"get_profile_block_num\.{suffix}' does not exist"):
            hand_off_block_count(suffix, 14448)
        word = hand_off_block_count(suffix, 14448, block_count_suffix=engine_pid, platform=cpu, ranks=2)
        assert word == f"get_profile_block_num.{engine_pid}"
        expect(engine, "profile_block_num 14448 words [14448]")


def test_on_iluvatar_the_count_fills_every_ranks_word_of_the_engines_array(cpu) -> None:
    """FastDeploy's Iluvatar engine makes one word per local rank; its workers end with the agreed minimum in each."""
    iluvatar = Platform(
        cpu.candidate, cpu.manager, PlatformIdentity("iluvatar", "iluvatar_gpu", "CUDA_VISIBLE_DEVICES")
    )
    engine_pid = f"e{secrets.token_hex(4)}"
    with fastdeploy_engine(4, engine_pid, "iluvatar") as (suffix, engine):
        with pytest.raises(CacheSignalError, match="holds 4 words, but FastDeploy's engine makes 1 for platform cpu"):
            hand_off_block_count(suffix, 300, block_count_suffix=engine_pid, platform=cpu, ranks=4)
        hand_off_block_count(suffix, 300, block_count_suffix=engine_pid, platform=iluvatar, ranks=4)
        expect(engine, "profile_block_num 300 words [300, 300, 300, 300]")


def run_entries() -> set[str]:
    """Entries of ``fd-platforms run --protocol fastdeploy`` at tp 2: its ranks' records and the signals
    under a run's suffix (``fdp<pid>-<hex>``; other suites' tests use other suffixes)."""
    ours = record_names(2)
    return {
        name
        for name in os.listdir("/dev/shm")
        if name in ours or (name.startswith(FD_SIGNAL_NAMES) and re.search(r"\.fdp\d+-[0-9a-f]+$", name))
    }


def test_run_with_fastdeploys_protocol_attaches_verifies_and_leaves_nothing() -> None:
    before = run_entries()
    done = subprocess.run(
        [
            SCRIPT,
            "run",
            "--model",
            QWEN,
            "--tp",
            "2",
            "--device-memory",
            "256MiB",
            "--role",
            "decode",
            "--protocol",
            "fastdeploy",
            "--cycles",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["protocol"] == "fastdeploy" and report["signal"].startswith("cache_ready_signal.fdp")
    assert all(rank["verified"] and rank["attached_tensors"] == 96 for rank in report["ranks"])
    assert [cycle["verified"] for cycle in report["cycles"]] == [True, True]
    engine_pid = f"fdb{os.getpid()}-{secrets.token_hex(3)}"
    table = subprocess.run(
        [
            SCRIPT,
            "run",
            "--model",
            QWEN,
            "--tp",
            "2",
            "--device-memory",
            "256MiB",
            "--role",
            "decode",
            "--protocol",
            "fastdeploy",
            "--block-count-suffix",
            engine_pid,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env=clean_env(),
    )
    assert table.returncode == 0, table.stderr
    assert "rule 2026-01, protocol fastdeploy:" in table.stdout.splitlines()[0]
    blocks = report["ranks"][0]["num_blocks"]
    assert (
        f"rank 0: handed the agreed {blocks} blocks to the engine (get_profile_block_num.{engine_pid})" in table.stderr
    )
    assert run_entries() - before == set(), "every signal and every per-tensor record removed"
    assert not os.path.exists(f"/dev/shm/get_profile_block_num.{engine_pid}")


def test_a_deploy_files_protocol_is_checked_by_name(tmp_path: Path) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text(f'[model]\npath = "{ROOT / QWEN}"\n[scheduler]\nprotocol = "grpc"\n')
    done = main_in_process("plan", "--config", str(config))
    assert done.returncode == 2
    assert "scheduler.protocol='grpc' is not valid; allowed: one of fd-platforms, fastdeploy" in done.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ("--block-count-suffix", "9924"),
            "--block-count-suffix='9924' is not valid; allowed: only with --protocol fastdeploy",
        ),
        (("--protocol", "fastdeploy", "--block-count-suffix", "../x"), "--block-count-suffix='../x' is not valid"),
    ],
)
def test_runs_block_count_suffix_is_checked_before_anything_starts(args: tuple[str, ...], expected: str) -> None:
    done = main_in_process("run", "--model", QWEN, "--device-memory", "256MiB", *args)
    assert done.returncode == 2 and expected in done.stderr, done.stderr


# -- clear like FastDeploy: a creator waits for an attacher only where one is configured, never for itself --


@pytest.mark.parametrize("role", ["mixed", "prefill", "decode"])
def test_run_with_fastdeploys_protocol_clears_and_creates_again_in_every_role(role: str) -> None:
    """mixed: each worker creates and nobody attaches (its clear waited for its own slot until the timeout);
    prefill, decode: the cache manager creates and the workers attach."""
    before = run_entries()
    done = main_in_process(
        "run",
        "--model",
        QWEN,
        "--tp",
        "2",
        "--device-memory",
        "256MiB",
        "--role",
        role,
        "--protocol",
        "fastdeploy",
        "--cycles",
        "3",
        "--timeout",
        "60",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    attached = None if role == "mixed" else True  # tokens are checked across processes where one attaches
    assert [cycle["verified"] for cycle in report["cycles"]] == [attached] * 3
    assert all(cycle["clear_seconds"] < 5 for cycle in report["cycles"]), report["cycles"]
    assert run_entries() - before == set()


def test_a_creator_nobody_attaches_to_sleeps_and_wakes_20_times_at_once(cpu) -> None:
    """FastDeploy's sleep calls clear_cache and its wakeup initialize_kv_cache: with no host swap space no
    process attaches, so neither waits (gpu_model_runner.py): no wait is reported, and each round ends well inside the
    30 s any wait would be bound by (a time bound of a second failed on a loaded machine, a wait would take 30)."""
    with fastdeploy_engine(1) as (suffix, _):
        for _ in range(20):
            started = time.monotonic()
            cache = initialize_kv_cache(
                cpu,
                kv_request(
                    qwen_layout(0, 1),
                    BLOCKS,
                    instance=suffix,
                    protocol="fastdeploy",
                    profile=False,
                    num_cpu_blocks=0,
                    storage_backend=None,
                    splitwise_role="mixed",
                    timeout=30,
                ),
            )
            assert cache.created and cache.wait_seconds is None
            cache.clear()
            assert time.monotonic() - started < 10


@pytest.mark.parametrize("role", ["mixed", "prefill", "decode"])
def test_a_killed_run_leaves_no_process_and_the_next_run_starts(role: str) -> None:
    from run_helpers import started as started_run

    with started_run(
        "--model",
        QWEN,
        "--tp",
        "2",
        "--device-memory",
        "256MiB",
        "--role",
        role,
        "--protocol",
        "fastdeploy",
        "--cycles",
        "100000",
        "--timeout",
        "30",
    ) as run:
        suffix = run.read_until(r"engine instance (\S+): FastDeploy's signals").group(1)
        run.read_until(r"cycle 2: cleared")
        children = [pid for pid in run.group() if pid != run.process.pid]
        run.process.kill()
        run.process.wait()
        deadline = time.monotonic() + 5
        while [pid for pid in children if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in children if alive(pid)] == [], "the engine's children stop with it (within 5 s)"
    # A SIGKILLed engine cannot remove its signals; the next run's start of any test run on this machine may
    # sweep them first (CI beside a loop did, in 1 of 9 runs), so they are its five names or fewer here
    left = {name for name in os.listdir("/dev/shm") if name.endswith(f".{suffix}")}
    assert left <= {f"{name}{suffix}" for name in FD_SIGNAL_NAMES}, left
    done = main_in_process(
        "run",
        "--model",
        QWEN,
        "--tp",
        "2",
        "--device-memory",
        "256MiB",
        "--role",
        role,
        "--protocol",
        "fastdeploy",
        "--cycles",
        "1",
        "--timeout",
        "60",
    )
    assert done.returncode == 0, done.stderr
    assert {name for name in os.listdir("/dev/shm") if name.endswith(f".{suffix}")} == set(), "the next run swept them"


def test_a_clear_that_fails_is_reported_as_the_workers_own_error_once() -> None:
    """A process of ours holds rank 0's records (a second attacher), so rank 0's worker cannot free its cache:
    the run fails with that worker's CacheInUseError within its --timeout, not with the engine's "sent no
    'clear'" after the worker waited a second time on its way out."""
    from run_helpers import started as started_run

    from fd_platforms.engine.publication import PublishedTensor
    from fd_platforms.fastdeploy.handles import FastDeployHandles

    timeout = 10  # each phase's: the workers' Paddle import too, slower while the other xdist worker's imports
    names = qwen_layout(0, 2).names()
    with started_run(
        "--model",
        QWEN,
        "--tp",
        "2",
        "--device-memory",
        "256MiB",
        "--protocol",
        "fastdeploy",
        "--cycles",
        "100000",
        "--timeout",
        str(timeout),
    ) as run:
        suffix = run.read_until(r"engine instance (\S+): FastDeploy's signals").group(1)
        run.read_until(r"cycle 1: cleared")
        held = None
        while held is None:  # between a clear and the next creation the records are gone for a moment
            try:
                held = FastDeployHandles.open(
                    suffix, 0, [PublishedTensor(name, (1,), "uint8", "") for name in names], "cpu"
                )
            except CacheSharingError:
                time.sleep(0.01)
        try:
            stopped = time.monotonic()
            code, stderr = run.finish()
            elapsed = time.monotonic() - stopped
        finally:
            held.let_go()
    assert (
        code != 0
        and "rank 0: CacheInUseError: rank 0's KV cache is still attached by a process of fd-platforms" in stderr
    ), stderr
    assert "sent no 'clear'" not in stderr and elapsed < 2 * timeout, f"{elapsed:.1f} s"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_waits_beside_fastdeploy_have_no_limit_unless_the_engine_sets_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """FastDeploy's runner polls cache_ready_signal and its clear_cache the let-go with no limit; under its protocol
    our waits do the same, while the request's timeout or FD_CACHE_READY_TIMEOUT still bounds them."""
    from fd_platforms.engine.protocols import OURS
    from fd_platforms.fastdeploy import FASTDEPLOY

    monkeypatch.delenv("FD_CACHE_READY_TIMEOUT", raising=False)
    assert (FASTDEPLOY.wait_limit(None), OURS.wait_limit(None)) == (math.inf, 600.0)
    assert FASTDEPLOY.wait_limit(0.5) == 0.5
    monkeypatch.setenv("FD_CACHE_READY_TIMEOUT", "2")
    assert (FASTDEPLOY.wait_limit(None), OURS.wait_limit(None)) == (2.0, 2.0)


def test_a_bad_fd_cache_ready_timeout_beside_fastdeploy_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal's example of seconds is one even where the protocol's own default is no limit."""
    from fd_platforms.fastdeploy import FASTDEPLOY

    monkeypatch.setenv("FD_CACHE_READY_TIMEOUT", "soon")
    with pytest.raises(ConfigError) as caught:
        FASTDEPLOY.wait_limit(None)
    assert caught.value.field == "FD_CACHE_READY_TIMEOUT" and "FD_CACHE_READY_TIMEOUT=60, or to inf" in str(
        caught.value
    )
