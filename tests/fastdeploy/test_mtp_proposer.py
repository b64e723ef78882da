"""The MTP proposer's own call: its draft layers created or attached on a call separate from the runner's,
in the same plan, with the rank's one cache-ready slot set once both parts are published.

FastDeploy: the proposer allocates its draft layers itself (``fastdeploy/spec_decode/mtp.py``
``MTPProposer.initialize_kv_cache``), the runner its main layers (``fastdeploy/worker/gpu_model_runner.py``
``initialize_kv_cache``, which sets ``cache_ready_signal``), and its cache transfer manager makes or attaches
both in one loop before or after that one word per rank (``cache_manager/cache_transfer_manager.py``
``_init_gpu_cache``, ``num_extra_layers``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from dataclasses import replace

import engine_processes
import pytest
from conftest import SHM_DIR
from engine_processes import mtp_layout, spawned_manager
from kv_requests import kv_request
from warm_processes import warm

from fd_platforms.contract.errors import CacheNotReadyError, ConfigError, SignalWaitError
from fd_platforms.contract.types import CacheRoleShape, DeviceMemory
from fd_platforms.engine import initialize_kv_cache, manage_kv_cache
from fd_platforms.ipc.cache_signal import CacheReadySignal
from fd_platforms.rules.config import CacheConfig
from fd_platforms.rules.planner import plan_blocks

paddle = pytest.importorskip("paddle")
DECODE = {"profile": False, "num_cpu_blocks": 0, "storage_backend": None, "splitwise_role": "decode"}
MIXED = {**DECODE, "splitwise_role": "mixed"}
BLOCKS = 4


@pytest.fixture
def signal_owner(signal_name: str) -> Iterator[CacheReadySignal]:
    """The engine's cache-ready signal for one rank."""
    with CacheReadySignal.create(1, signal_name) as owner:
        yield owner


def manifest(signal: CacheReadySignal, part: str = "") -> str:
    return f"fd_kv_cache.{signal.name.removeprefix('fd_cache_ready.')}.rank0{part}"


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_the_proposers_later_call_creates_the_draft_and_only_then_is_the_rank_ready(cpu, signal_owner) -> None:
    whole = mtp_layout(ratio=2.0)
    plan = plan_blocks(whole, DeviceMemory(2**30, None, None, "test"), CacheConfig(num_gpu_block_expand_ratio=2.0))
    runner = initialize_kv_cache(cpu, kv_request(whole.main(), plan.num_blocks, instance=signal_owner.name, **MIXED))
    try:
        assert runner.created and runner.part == "main" and runner.names == whole.main().names()
        assert signal_owner.slots() == (0,), "the rank is not ready while its draft layers are missing"
        proposer = initialize_kv_cache(
            cpu, kv_request(whole.draft(), plan.num_blocks, instance=signal_owner.name, **MIXED)
        )
        assert proposer.created and proposer.names == ("key_caches_4_rank0.device0", "value_caches_4_rank0.device0")
        assert {next(iter(t.shape)) for t in proposer.tensors} == {plan.num_draft_blocks} == {2 * plan.num_blocks}
        assert signal_owner.slots() == (1,)
        assert (SHM_DIR / manifest(signal_owner)).exists() and (SHM_DIR / manifest(signal_owner, ".draft")).exists()
        proposer.clear()
        assert signal_owner.slots() == (0,) and not (SHM_DIR / manifest(signal_owner, ".draft")).exists()
    finally:
        runner.clear()
    assert not (SHM_DIR / manifest(signal_owner)).exists()


def test_the_proposer_may_call_first_as_fastdeploys_runner_has_it(cpu, signal_owner) -> None:
    """FastDeploy's ``update_share_input_block_num`` (gpu_model_runner.py) calls the proposer before the runner."""
    whole = mtp_layout()
    proposer = initialize_kv_cache(cpu, kv_request(whole.draft(), BLOCKS, instance=signal_owner.name, **MIXED))
    try:
        assert signal_owner.slots() == (0,)
        runner = initialize_kv_cache(cpu, kv_request(whole.main(), BLOCKS, instance=signal_owner.name, **MIXED))
        assert signal_owner.slots() == (1,)
        runner.clear()
        assert signal_owner.slots() == (0,)
        runner = initialize_kv_cache(cpu, kv_request(whole.main(), BLOCKS, instance=signal_owner.name, **MIXED))
        assert signal_owner.slots() == (1,), "re-created: the draft layers are still published"
        runner.clear()
    finally:
        proposer.clear()
    runner = initialize_kv_cache(cpu, kv_request(whole.main(), BLOCKS, instance=signal_owner.name, **MIXED))
    assert signal_owner.slots() == (0,), "both cleared: the re-created main part alone is not the rank"
    runner.clear()


def test_a_managers_draft_must_be_the_draft_of_its_layout(cpu, signal_owner) -> None:
    whole = mtp_layout()
    with pytest.raises(ConfigError, match="draft='the main part of rank 0: layers 0-3, ratio 2' is not valid") as info:
        manage_kv_cache(
            cpu, kv_request(whole.main(), BLOCKS, num_cpu_blocks=0, instance=signal_owner.name, draft=whole.main())
        )
    assert "Fix: pass whole.main() as the layout and whole.draft() as draft" in str(info.value)
    assert signal_owner.slots() == (0,) and not (SHM_DIR / manifest(signal_owner)).exists()


def test_a_managers_layout_that_is_a_draft_part_is_refused_naming_the_fix(cpu, signal_owner) -> None:
    whole = mtp_layout()
    with pytest.raises(ConfigError) as info:
        manage_kv_cache(cpu, kv_request(whole.draft(), BLOCKS, num_cpu_blocks=0, instance=signal_owner.name))
    assert info.value.field == "layout" and str(info.value).startswith(
        "layout='the draft part of rank 0: layers 4-4, ratio 2' is not valid; allowed: the rank's whole layout, or "
        "with MTP its main part (whole.main()). Fix: pass whole.main() as layout and whole.draft() as draft="
    ), info.value
    assert signal_owner.slots() == (0,) and not (SHM_DIR / manifest(signal_owner)).exists()
    assert not (SHM_DIR / manifest(signal_owner, ".draft")).exists()


@pytest.mark.slow
def test_a_manager_publishes_main_and_draft_and_the_runner_and_proposer_attach(cpu, signal_owner) -> None:
    whole = mtp_layout()
    with spawned_manager(engine_processes.manage_with_draft, signal_owner.name, BLOCKS) as (manager, pid):
        runner = initialize_kv_cache(
            cpu, kv_request(whole.main(), BLOCKS, instance=signal_owner.name, creator_pid=pid, timeout=30, **DECODE)
        )
        proposer = initialize_kv_cache(
            cpu, kv_request(whole.draft(), BLOCKS, instance=signal_owner.name, creator_pid=pid, timeout=30, **DECODE)
        )
        assert not runner.created and not proposer.created
        assert runner.names == whole.main().names() and proposer.names == whole.draft().names()
        assert runner.tensors[0][0, 0, 0, 0].item() == 5.0 and proposer.tensors[0][0, 0, 0, 0].item() == 6.0
        assert next(iter(proposer.tensors[0].shape)) == 2 * BLOCKS
        proposer.tensors[-1][-1, -1, -1, -1] = 7.0
        manager.send(("read", None))
        assert manager.recv() == 7.0, "the proposer's write is seen by the manager"
        runner.clear()
        manager.send(("clear", 0.3))
        kind, message, _ = manager.recv()
        assert kind == "CacheInUseError" and "still held by its attaching process" in message, "the draft is held"
        assert proposer.tensors[0][0, 0, 0, 0].item() == 6.0, "nothing of the draft was freed"
        proposer.clear()
        manager.send(("clear", 5.0))
        assert manager.recv() == ("cleared", None, None)
        assert signal_owner.slots() == (0,)
        assert not (SHM_DIR / manifest(signal_owner, ".draft")).exists()


SWAP_2026_04 = {**MIXED, "num_cpu_blocks": 2, "rule": "2026-04"}  # the worker creates, the manager attaches


@pytest.mark.slow
def test_a_managers_timeout_says_the_worker_published_its_main_part_but_not_the_draft(cpu, signal_owner) -> None:
    whole = mtp_layout()
    runner = initialize_kv_cache(cpu, kv_request(whole.main(), BLOCKS, instance=signal_owner.name, **SWAP_2026_04))
    try:
        with pytest.raises(CacheNotReadyError) as info:
            manage_kv_cache(
                cpu,
                kv_request(
                    whole.main(),
                    BLOCKS,
                    num_cpu_blocks=2,
                    instance=signal_owner.name,
                    rule="2026-04",
                    draft=whole.draft(),
                    timeout=0.3,
                ),
            )
    finally:
        runner.clear(timeout=5)
    said = str(info.value)
    assert info.value.cause == "timeout" and said.endswith(
        f"Rank 0's creator published its main part (/dev/shm/{manifest(signal_owner)}) but not its draft part (no "
        f"/dev/shm/{manifest(signal_owner, '.draft')}), and sets the rank's slot only once both are. Fix: have the "
        "creating worker's MTP proposer create the draft layers too (initialize_kv_cache with whole.draft() and the "
        "same num_blocks), or, without MTP, pass the manager no draft="
    ), said


@pytest.mark.slow
def test_fastdeploys_manager_attaches_main_and_draft_once_the_worker_published_both(cpu, fastdeploy_suffix) -> None:
    """Rule 2026-04 with swap space: the worker's runner and proposer create, the transfer manager attaches to
    every layer once the one ``cache_ready_signal`` word is set (``cache_transfer_manager.py``
    ``_init_gpu_cache`` loops over ``num_layers + num_extra_layers``): the word waits for the draft too."""
    whole = mtp_layout()
    swap = {**MIXED, "num_cpu_blocks": 2}
    ours, theirs = warm.Pipe()
    manager = warm.Process(target=engine_processes.hold_with_draft, args=(fastdeploy_suffix, BLOCKS, theirs))
    manager.start()
    caches = []
    try:
        for part in (whole.main(), whole.draft()):
            assert not ours.poll(0.2), "the manager attached before the rank's draft layers were published"
            caches.append(
                initialize_kv_cache(
                    cpu,
                    kv_request(part, BLOCKS, instance=fastdeploy_suffix, protocol="fastdeploy", rule="2026-04", **swap),
                )
            )
        caches[1].tensors[0][0, 0, 0, 0] = 6.0
        assert ours.poll(60), "the manager never attached"
        kind, first_draft, host_names = ours.recv()
        assert kind == "ready" and first_draft == 6.0
        assert list(host_names) == [name.split(".device")[0] for name in whole.names()]  # main and draft layers
        assert (SHM_DIR / "key_caches_4_rank0.device0").exists()
        ours.send(("clear", 5.0))
        assert ours.recv() == ("cleared",)
        for cache in reversed(caches):
            cache.clear(timeout=5)
        assert not (SHM_DIR / "key_caches_4_rank0.device0").exists()
    finally:
        for cache in caches:
            cache.clear(timeout=5)
        with suppress(OSError):  # a manager that failed has closed its end
            ours.send(("stop", None))
        manager.join(30)
        if manager.is_alive():
            manager.kill()
            manager.join(10)


def test_a_managers_draft_takes_the_engines_tensor_specs_as_its_main_part_does(cpu, signal_owner) -> None:
    """The attention backend states one layer's shapes; a draft layer's block is a main layer's, so the draft part
    holds them too (MetaX's flash backend: tokens before heads), with its own expanded blocks."""
    whole = mtp_layout(ratio=2.0)
    key = whole.roles[0]
    heads, block, head_dim = key.block_shape
    tokens_first = tuple(
        CacheRoleShape(role.role, (BLOCKS, block, heads, head_dim), role.dtype) for role in whole.roles
    )
    managed = manage_kv_cache(
        cpu,
        kv_request(
            whole.main(),
            BLOCKS,
            num_cpu_blocks=0,
            instance=signal_owner.name,
            tensor_specs=tokens_first,
            draft=whole.draft(),
        ),
    )
    try:
        assert managed.draft is not None
        assert list(managed.kv_cache.tensors[0].shape) == [BLOCKS, block, heads, head_dim]
        assert list(managed.draft.tensors[0].shape) == [int(BLOCKS * 2.0), block, heads, head_dim]
    finally:
        managed.clear(timeout=5)


@pytest.mark.slow
def test_a_fastdeploy_managers_timeout_says_the_worker_published_its_draft_but_not_the_main_part(
    cpu, fastdeploy_suffix
) -> None:
    """The proposer first, as FastDeploy's runner calls it, and no runner after: the records of layer 4 are there,
    those of layer 0 not; the manager's wait on the one cache_ready_signal word says so. Device 11 names records
    of no other test (FastDeploy's names are the machine's)."""
    whole = replace(mtp_layout(), device_id=11)
    proposer = initialize_kv_cache(
        cpu, kv_request(whole.draft(), BLOCKS, instance=fastdeploy_suffix, protocol="fastdeploy", **SWAP_2026_04)
    )
    try:
        with pytest.raises(SignalWaitError) as info:
            manage_kv_cache(
                cpu,
                kv_request(
                    whole.main(),
                    BLOCKS,
                    num_cpu_blocks=2,
                    instance=fastdeploy_suffix,
                    protocol="fastdeploy",
                    rule="2026-04",
                    draft=whole.draft(),
                    timeout=0.3,
                ),
            )
    finally:
        proposer.clear(timeout=5)
    said = str(info.value)
    assert (
        "Rank 0's creator published its draft part (/dev/shm/key_caches_4_rank0.device11) but not its main part (no "
        "/dev/shm/key_caches_0_rank0.device11), and sets the rank's slot only once both are. Fix: have the creating "
        "worker's runner create the main layers too (initialize_kv_cache with whole.main() and the same num_blocks). "
    ) in said, said
