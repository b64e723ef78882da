"""Our creators and attachers beside FastDeploy's, which hold no mark or lock of ours.

The marks are ``fd_platforms.fastdeploy.marks``. FastDeploy's worker and transfer manager attach through one
``cache_ready_signal`` slot and hold nothing; its cache messager publishes records and holds nothing either. The
stand-ins (``tests/support/fastdeploy_standins.py``) import nothing of ours. Each case ends with FastDeploy's memory
and records intact, or with a typed error naming whom our creator waits for.
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kv_requests import kv_request
from warm_processes import warm

from fd_platforms.contract.errors import CacheInUseError, CacheSharingError
from fd_platforms.engine.publication import PublishedTensor
from fd_platforms.fastdeploy.handles import FastDeployHandles, read_handle
from fd_platforms.fastdeploy.marks import attacher_prefix, look
from fd_platforms.fastdeploy.signals import (
    CACHE_READY,
    CACHE_TRANSFER_INITED,
    KV_CACHE_STATUS,
    FastDeploySignal,
)
from fd_platforms.rules.decision import DecisionInputs
from fd_platforms.rules.roles import cache_roles

STANDINS = Path(__file__).resolve().parents[1] / "support" / "fastdeploy_standins.py"
NBYTES = 32


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Record names of this test alone (FastDeploy's carry no instance; these carry a random rank)."""
    rank = secrets.randbelow(10**6) + 1000
    made = [f"key_caches_0_rank{rank}.device0", f"value_caches_0_rank{rank}.device0"]
    yield made
    for path in [*(f"/dev/shm/{name}" for name in made), *glob.glob(f"/dev/shm/{made[0]}.fdp-creator.*")]:
        if os.path.exists(path):
            os.unlink(path)


@pytest.fixture
def suffix() -> Iterator[str]:
    made = f"t{secrets.token_hex(4)}"
    yield made
    assert not glob.glob(f"/dev/shm/{attacher_prefix(made, 0)}*"), "every attacher's mark is removed or reclaimed"


@pytest.fixture
def memfds(names: list[str]) -> Iterator[list[PublishedTensor]]:
    """What our creator publishes: a memfd per tensor, named as the cpu platform names its handles."""
    fds = [os.memfd_create(name) for name in names]
    for fd in fds:
        os.ftruncate(fd, NBYTES)
    yield [
        PublishedTensor(name, (4, 8), "uint8", f"memfd:{os.getpid()}:{fd}")
        for name, fd in zip(names, fds, strict=False)
    ]
    for fd in fds:
        os.close(fd)


def expected(names: list[str]) -> list[PublishedTensor]:
    return [PublishedTensor(name, (4, 8), "uint8", "") for name in names]


def our_attacher(suffix: str, names: list[str], attachers: int) -> subprocess.Popen:
    """An attacher of ours in another process; it lets go when its stdin closes."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys; from fd_platforms.fastdeploy.handles import FastDeployHandles\n"
                "from fd_platforms.engine.publication import PublishedTensor\n"
                f"h = FastDeployHandles.open({suffix!r}, 0, "
                f"[PublishedTensor(n, (4, 8), 'uint8', '') for n in {names!r}], "
                f"'cpu', attachers={attachers})\n"
                "print('attached', flush=True); sys.stdin.read(); h.let_go()"
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "attached"  # type: ignore[union-attr]
    return child


def fastdeploys(role: str, suffix: str, names: list[str], *extra: str) -> subprocess.Popen:
    """A stand-in of FastDeploy's process ``role`` for rank 0 of tp 1 (it imports nothing of ours)."""
    specs = json.dumps([[name, NBYTES] for name in names])
    return subprocess.Popen(
        [sys.executable, str(STANDINS), role, suffix, "0", "1", specs, *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen) -> None:
    process.stdin.close()  # type: ignore[union-attr]
    assert process.wait(10) == 0


@pytest.mark.slow
def test_a_dead_attacher_of_ours_beside_one_that_may_be_fastdeploys_is_waited_for_never_freed_under(
    names: list[str], suffix: str, memfds: list[PublishedTensor]
) -> None:
    """P/D decode with swap space: our runner and FastDeploy's transfer manager attach one rank through one slot.
    Our runner SIGKILLed: its dead mark says nothing about FastDeploy's attacher, so the creator frees nothing and
    names whom it waits for; FastDeploy's let-go then lets it free."""
    per_rank = len(cache_roles(DecisionInputs(False, 64, None, "decode")).attachers)
    assert per_rank == 2
    with FastDeploySignal.create(CACHE_READY, suffix, 1) as ready, FastDeploySignal.create(KV_CACHE_STATUS, suffix, 1):
        held = FastDeployHandles.create(suffix, 0, memfds, "cpu", attachers=per_rank)
        ready.set(0, 1)
        ours = our_attacher(suffix, names, per_rank)
        theirs = fastdeploys("attacher", suffix, names, "0", "-1")
        assert [theirs.stdout.readline().strip() for _ in range(2)] == ["attached", "done"]  # type: ignore[union-attr]
        ours.kill()
        ours.wait()
        with pytest.raises(CacheInUseError) as caught:
            held.retract(0.6)
        message = str(caught.value)
        assert f"(pid {ours.pid}) are gone without letting go" in message
        assert "attaches 2 processes to each rank" in message and "FastDeploy's own" in message
        assert ready.get(0) == 1 and all(os.path.exists(f"/dev/shm/{name}") for name in names), "nothing freed"
        assert os.pread(int(memfds[0].handle.split(":")[2]), 2, 0)[1] == 0x5A, "FastDeploy's attacher maps it"
        finish(theirs)  # FastDeploy's let-go resets the slot
        held.retract(5)
    assert not any(os.path.exists(f"/dev/shm/{name}") for name in names)


@pytest.mark.slow
def test_a_living_attacher_whose_mark_was_removed_still_holds_the_slot_beside_a_dead_one(
    names: list[str], suffix: str, memfds: list[PublishedTensor]
) -> None:
    """The kernel's lock on the first record says an attacher of ours lives even where its mark is gone: the slot
    is not reset under it for a dead one, and the error names its holder."""
    with FastDeploySignal.create(CACHE_READY, suffix, 1) as ready:
        held = FastDeployHandles.create(suffix, 0, memfds, "cpu", attachers=1)
        ready.set(0, 1)
        living = our_attacher(suffix, names, 1)
        dead = our_attacher(suffix, names, 1)
        (living_mark,) = glob.glob(f"/dev/shm/{attacher_prefix(suffix, 0)}{living.pid}-*")
        os.unlink(living_mark)
        dead.kill()
        dead.wait()
        with pytest.raises(CacheInUseError, match=f"still attached by a process of fd-platforms \\(pid {living.pid},"):
            held.retract(0.5)
        assert ready.get(0) == 1, "the slot is not reset under the living attacher"
        finish(living)
        held.retract(5)


def test_a_held_mark_is_reported_by_the_holder_proc_locks_shows_not_the_pid_in_its_name(suffix: str) -> None:
    name = f"{attacher_prefix(suffix, 0)}999999-abcdef"
    ready = FastDeploySignal.create(CACHE_READY, suffix, 1)  # its slot lives: no creator's sweep takes the mark
    fd = os.open(f"/dev/shm/{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(
            fd, (999999).to_bytes(8, sys.byteorder) + (0).to_bytes(8, sys.byteorder) + (1).to_bytes(8, sys.byteorder)
        )
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                (
                    "import fcntl, os, sys\n"
                    f"f = open('/dev/shm/{name}'); fcntl.flock(f, fcntl.LOCK_SH); print('held', "
                    "flush=True); sys.stdin.read()"
                ),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout.readline().strip() == "held"  # type: ignore[union-attr]
        assert look(suffix, 0).living == (f"pid {holder.pid}",)
        finish(holder)
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm/{name}")
        ready.close()


@pytest.mark.slow
def test_a_creator_never_writes_over_records_fastdeploy_published_while_its_slot_is_set(
    names: list[str], suffix: str, memfds: list[PublishedTensor]
) -> None:
    """P/D decode with swap: FastDeploy's cache messager published the rank (records, slot set); our creator
    refuses, naming the slot and the records, and FastDeploy's worker opening them still gets the messager's."""
    signals = [FastDeploySignal.create(name, suffix, 1) for name in (CACHE_READY, CACHE_TRANSFER_INITED)]
    signals.append(FastDeploySignal.create(KV_CACHE_STATUS, suffix, 1))
    try:
        theirs = fastdeploys("creator", suffix, names)
        assert theirs.stdout.readline().strip() == "created"  # type: ignore[union-attr]
        before = [Path(f"/dev/shm/{name}").read_bytes() for name in names]
        with pytest.raises(CacheSharingError) as caught:
            FastDeployHandles.create(suffix, 0, memfds, "cpu", attachers=2)
        message = str(caught.value)
        assert f"/dev/shm/{names[0]} and 1 more" in message and f"cache_ready_signal.{suffix} is set" in message
        assert [Path(f"/dev/shm/{name}").read_bytes() for name in names] == before, "FastDeploy's records intact"
        assert read_handle(names[0], "cpu").startswith(f"memfd:{theirs.pid}:")
        finish(theirs)
    finally:
        for signal in signals:
            signal.close()


@pytest.mark.slow
def test_stale_records_of_a_dead_creator_of_ours_are_still_reclaimed_with_the_slot_set(
    names: list[str], suffix: str, memfds: list[PublishedTensor]
) -> None:
    with FastDeploySignal.create(CACHE_READY, suffix, 1):
        creator = subprocess.Popen(
            [
                sys.executable,
                "-c",
                (
                    "import sys; from fd_platforms.fastdeploy.handles import FastDeployHandles\n"
                    "from fd_platforms.engine.publication import PublishedTensor\n"
                    "from fd_platforms.fastdeploy.signals import CACHE_READY, FastDeploySignal\n"
                    f"h = FastDeployHandles.create({suffix!r}, 0, [PublishedTensor(n, (4, 8), 'uint8', 'memfd:1:3') "
                    f"for n in {names!r}], 'cpu', attachers=1)\n"
                    f"FastDeploySignal.attach(CACHE_READY, {suffix!r}).set(0, 1)\n"
                    "print('published', flush=True); sys.stdin.read()"
                ),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert creator.stdout.readline().strip() == "published"  # type: ignore[union-attr]
        creator.kill()  # SIGKILL: its records, its creator mark and the slot stay
        creator.wait()
        held = FastDeployHandles.create(suffix, 0, memfds, "cpu", attachers=0)
        assert read_handle(names[0], "cpu") == memfds[0].handle
        held.retract(0)


@pytest.mark.slow
def test_a_failed_attach_never_writes_the_slot_another_attacher_holds(
    names: list[str], suffix: str, memfds: list[PublishedTensor]
) -> None:
    """A wrong attacher (one record it expects is not published) beside a good one: its failure leaves the slot as
    the good one holds it, so a clear still waits for the good one."""
    with FastDeploySignal.create(CACHE_READY, suffix, 1) as ready, FastDeploySignal.create(KV_CACHE_STATUS, suffix, 1):
        held = FastDeployHandles.create(suffix, 0, memfds, "cpu", attachers=1)
        ready.set(0, 1)
        theirs = fastdeploys("attacher", suffix, names, "0", "-1")
        assert [theirs.stdout.readline().strip() for _ in range(2)] == ["attached", "done"]  # type: ignore[union-attr]
        wrong = expected([*names, f"{names[0]}.missing"])
        with pytest.raises(CacheSharingError, match="is not published"):
            FastDeployHandles.open(suffix, 0, wrong, "cpu")
        assert ready.get(0) == 1, "the failed attach wrote nothing into the shared slot"
        with pytest.raises(CacheInUseError, match="No attacher of fd-platforms is attached"):
            held.retract(0.4)
        assert all(os.path.exists(f"/dev/shm/{name}") for name in names)
        finish(theirs)
        held.retract(5)


@pytest.mark.slow
@pytest.mark.usefixtures("fastdeploy_record_names")
def test_decode_with_swap_our_manager_never_frees_under_fastdeploys_transfer_manager_when_our_runner_dies(
    suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the engine calls: our manager creates (decode with swap space), our
    runner (another process) and FastDeploy's transfer manager attach; our runner SIGKILLed. The manager's clear
    frees nothing while FastDeploy's attacher maps the cache, naming whom it waits for; it frees once that lets go."""

    from engine_processes import decode_runner, first_bytes, qwen_layout

    from fd_platforms.engine import manage_kv_cache
    from fd_platforms.fastdeploy.signals import SWAP_SPACE_READY
    from fd_platforms.loading.selection import select_platform

    monkeypatch.setenv("FD_PLATFORM", "cpu")
    platform = select_platform({"FD_PLATFORM": "cpu"}).platform
    made = [
        FastDeploySignal.create(name, suffix, 1)
        for name in (CACHE_READY, SWAP_SPACE_READY, CACHE_TRANSFER_INITED, KV_CACHE_STATUS)
    ]
    try:
        managed = manage_kv_cache(
            platform,
            kv_request(
                qwen_layout(),
                4,
                num_cpu_blocks=4,
                splitwise_role="decode",
                protocol="fastdeploy",
                instance=suffix,
                tp=1,
            ),
        )
        assert managed.created and made[0].get(0) == 1
        names = managed.kv_cache.names
        ours, theirs_end = warm.Pipe()
        runner = warm.Process(target=decode_runner, args=(suffix, theirs_end), daemon=True)
        runner.start()
        theirs_end.close()  # the runner's end is the runner's: its death ends our wait
        assert ours.poll(60) and ours.recv() == ("attached", False)
        theirs = fastdeploys("attacher", suffix, names, "0", "-1")
        assert [theirs.stdout.readline().strip() for _ in range(2)] == ["attached", "done"]  # type: ignore[union-attr]
        runner.kill()
        runner.join()
        with pytest.raises(CacheInUseError) as caught:
            managed.clear(0.6)
        assert f"(pid {runner.pid}) are gone without letting go" in str(caught.value)
        assert "the other may be FastDeploy's own" in str(caught.value)
        assert made[0].get(0) == 1 and all(os.path.exists(f"/dev/shm/{name}") for name in names), "nothing freed"
        assert first_bytes(managed.kv_cache, 1) == {0x5A}, "FastDeploy's attacher wrote into every tensor"
        finish(theirs)
        managed.clear(5)
        assert not any(os.path.exists(f"/dev/shm/{name}") for name in names)
    finally:
        for signal in made:
            signal.close()


@pytest.mark.slow
def test_a_drive_notices_a_dead_attacher_of_ours_that_held_the_rank_and_the_round_completes(
    names: list[str], suffix: str
) -> None:
    """An attacher of ours holding every rank SIGKILLed beside FastDeploy's creator (its transfer manager with
    --create_cache_tensor), which looks at no mark: the drive looks at the dead mark as a creator's clear of ours
    does, resets the slot for the dead attacher, and FastDeploy's creator frees and creates again (every later drive
    timed out while only our creator's clear looked)."""
    from fd_platforms.fastdeploy.cache_status import drive_kv_cache_clear, drive_kv_cache_restore

    signals = [FastDeploySignal.create(name, suffix, 1) for name in (CACHE_READY, CACHE_TRANSFER_INITED)]
    signals.append(FastDeploySignal.create(KV_CACHE_STATUS, suffix, 1))
    try:
        theirs = fastdeploys("creator", suffix, names)
        assert theirs.stdout.readline().strip() == "created"  # type: ignore[union-attr]
        ours = our_attacher(suffix, names, 1)
        ours.kill()
        ours.wait()
        cleared = drive_kv_cache_clear(suffix, timeout=10, tp=1)
        assert cleared.ranks == 1 and signals[0].get(0) == 0
        assert not glob.glob(f"/dev/shm/{attacher_prefix(suffix, 0)}*"), "the dead mark went with the reset"
        drive_kv_cache_restore(suffix, timeout=10, tp=1)
        assert signals[0].get(0) == 1 and signals[2].get(0) == 0
        finish(theirs)
    finally:
        for signal in signals:
            signal.close()


@pytest.mark.slow
@pytest.mark.usefixtures("fastdeploy_record_names")
def test_serve_notices_a_dead_attacher_of_ours_when_fastdeploys_worker_drives(
    suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FastDeploy's worker drives (it writes CLEARING, and looks at no mark); our runner, the rank's only attacher,
    was SIGKILLed: serve_kv_cache_status clears as if it had let go, answers CLEARED, and creates again on UPDATING."""
    import threading

    from engine_processes import qwen_layout

    from fd_platforms.engine import manage_kv_cache
    from fd_platforms.fastdeploy.cache_server import serve_kv_cache_status
    from fd_platforms.fastdeploy.signals import SWAP_SPACE_READY, KVCacheStatus
    from fd_platforms.loading.selection import select_platform

    monkeypatch.setenv("FD_PLATFORM", "cpu")
    platform = select_platform({"FD_PLATFORM": "cpu"}).platform
    made = [
        FastDeploySignal.create(name, suffix, 1)
        for name in (CACHE_READY, SWAP_SPACE_READY, CACHE_TRANSFER_INITED, KV_CACHE_STATUS)
    ]
    ready, status = made[0], made[3]

    def manage(rank: int = 0) -> object:
        return manage_kv_cache(
            platform,
            kv_request(
                qwen_layout(), 4, num_cpu_blocks=4, protocol="fastdeploy", instance=suffix, rule="2026-01", tp=1
            ),
        )

    stop, held = threading.Event(), []
    try:
        managed = manage()
        ours = our_attacher(suffix, list(managed.kv_cache.names), 1)
        ours.kill()
        ours.wait()
        server = threading.Thread(
            target=lambda: held.extend(
                serve_kv_cache_status([managed], manage, instance=suffix, until=stop.is_set, timeout=10, tp=1)
            )
        )
        server.start()
        status.set(0, KVCacheStatus.CLEARING)  # FastDeploy's worker: it looks at no mark of ours
        deadline = time.monotonic() + 10
        while status.get(0) != KVCacheStatus.CLEARED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status.get(0) == KVCacheStatus.CLEARED and ready.get(0) == 0
        status.set(0, KVCacheStatus.UPDATING)
        while status.get(0) != KVCacheStatus.NORMAL and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        assert status.get(0) == KVCacheStatus.NORMAL and ready.get(0) == 1
    finally:
        stop.set()
        server.join(15)
        ready.set(0, 0)  # no runner attached again: nothing else would reset the slot the creation set
        for cache in held:
            cache.clear(5)
        for signal in made:
            signal.close()
    assert not glob.glob("/dev/shm/key_caches_0_rank0.device0*"), "the re-created cache is cleared"


def test_a_dead_attachers_mark_goes_once_its_slot_is_gone_and_stays_while_it_stands_for_the_slot(
    names: list[str], suffix: str, memfds: list[PublishedTensor]
) -> None:
    """Marks are named by their slot (the suffix and rank), so a run's next suffix never meets its last run's: a
    dead mark whose cache_ready_signal is gone is removed by the next creator (or run), one whose slot lives stays."""
    import struct

    gone, living_slot = f"t{secrets.token_hex(4)}", suffix
    marks = [f"/dev/shm/{attacher_prefix(slot, 0)}999999-abcdef" for slot in (gone, living_slot)]
    with FastDeploySignal.create(CACHE_READY, living_slot, 1):
        for mark in marks:
            with open(mark, "wb") as file:
                file.write(struct.pack("=qqq", 999999, 0, 1))
            os.chmod(mark, 0o600)
        held = FastDeployHandles.create(f"t{secrets.token_hex(4)}", 0, memfds, "cpu", attachers=0)
        assert not os.path.exists(marks[0]), "its slot is gone: nothing it could stand for"
        assert os.path.exists(marks[1]), "its slot lives: it stands for its attacher until that slot's creator clears"
        held.retract(0)
        os.unlink(marks[1])
