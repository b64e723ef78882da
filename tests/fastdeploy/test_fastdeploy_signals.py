"""FastDeploy's signal arrays as our processes read and write them (``fd_platforms.fastdeploy.signals``): their names,
waits on their words, and what a reader refuses in them (a word outside FastDeploy's values, an array FastDeploy did
not make for the engine's tp, a file other users may write, one replaced under a wait)."""

from __future__ import annotations

import logging
import mmap
import os
import re
import secrets
import struct
import subprocess
import sys
import threading
import time

import pytest
from engine_processes import qwen_layout
from kv_requests import kv_request

from fd_platforms.contract.errors import CacheNotReadyError, CacheSignalError, ConfigError, SignalWaitError
from fd_platforms.engine import initialize_kv_cache, manage_kv_cache
from fd_platforms.fastdeploy.cache_status import drive_kv_cache_update
from fd_platforms.fastdeploy.signals import (
    CACHE_READY,
    CACHE_TRANSFER_INITED,
    KV_CACHE_STATUS,
    FastDeploySignal,
    FastDeploySuffix,
    KVCacheStatus,
    check_suffix,
    segment_name,
)


@pytest.fixture
def suffix() -> str:
    return f"t{secrets.token_hex(4)}"


def plain_store(name: str, index: int, value: int) -> None:
    """What a FastDeploy process does: a store through its own mapping, no wake."""
    with open(f"/dev/shm/{name}", "r+b") as file, mmap.mmap(file.fileno(), 0) as view:
        view[index * 4 : index * 4 + 4] = struct.pack("=i", value)


def test_the_names_are_fastdeploys() -> None:
    assert segment_name(CACHE_READY, "9923") == "cache_ready_signal.9923"
    assert check_suffix(9923) == "9923"
    assert [status.value for status in KVCacheStatus] == [0, 1, -1, -2]


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "x" * 65, None, 1.5, True])
def test_a_bad_suffix_names_the_field_and_the_fix(bad: object) -> None:
    with pytest.raises(ConfigError) as caught:
        check_suffix(bad)
    assert caught.value.field == "suffix" and "engine_worker_queue_port" in str(caught.value)
    with pytest.raises(ConfigError, match="suffix"):
        FastDeploySignal.attach(CACHE_READY, bad)  # type: ignore[arg-type]


def test_a_segment_is_a_bare_int32_array_that_numpy_style_readers_share(suffix: str) -> None:
    with FastDeploySignal.create(CACHE_READY, suffix, 4) as owner:
        assert os.path.getsize(f"/dev/shm/{owner.name}") == 16, "no header: FastDeploy maps it as int32[tp]"
        plain_store(owner.name, 2, 1)
        with FastDeploySignal.attach(CACHE_READY, suffix) as attached:
            assert attached.length == 4 and attached.values() == (0, 0, 1, 0)
            attached.set(3, -2)
        assert owner.values() == (0, 0, 1, -2)
    assert not os.path.exists(f"/dev/shm/{CACHE_READY}.{suffix}"), "the creator removes what it created"


def test_a_foreign_store_ends_a_wait(suffix: str) -> None:
    with FastDeploySignal.create(KV_CACHE_STATUS, suffix, 1) as status:
        storing = threading.Event()

        def store() -> None:
            storing.set()  # before the store: a wait that returns has seen it only if this is set
            plain_store(status.name, 0, int(KVCacheStatus.CLEARED))

        storer = threading.Timer(0.05, store)
        storer.start()
        waited = status.wait_for(0, KVCacheStatus.CLEARED, 10)
        assert storing.is_set(), "the wait ended before the foreign store"  # not a timing bound: load-proof
        storer.join()
        assert waited < 10


def test_a_wait_that_times_out_names_the_signal_word_and_step(suffix: str) -> None:
    with FastDeploySignal.create(CACHE_READY, suffix, 2) as ready, pytest.raises(SignalWaitError) as caught:
        ready.wait_for(1, 1, 0.05, what="rank 1 waiting for its KV cache")
    error = caught.value
    assert isinstance(error, CacheNotReadyError), "callers that catch CacheNotReadyError catch it too"
    assert (error.rank, error.value, error.seen, error.cause) == (1, 1, 0, "timeout")
    assert str(error).startswith(f"rank 1 waiting for its KV cache: FastDeploy signal 'cache_ready_signal.{suffix}'")


@pytest.mark.slow
def test_a_wait_ends_when_the_watched_process_exits(suffix: str) -> None:
    with FastDeploySignal.create(CACHE_READY, suffix, 1) as ready:
        writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
        started = time.monotonic()
        with pytest.raises(SignalWaitError) as caught:
            ready.wait_for(0, 1, 30, watch_pid=writer.pid)
        writer.wait()
    assert caught.value.cause == "watched_exited" and f"pid {writer.pid}" in str(caught.value)
    assert time.monotonic() - started < 10


def test_a_slot_outside_0_and_1_is_logged_and_never_taken_for_set(
    suffix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with FastDeploySignal.create(CACHE_READY, suffix, 2) as ready:
        ready.set(1, 7)
        with caplog.at_level(logging.WARNING), pytest.raises(SignalWaitError) as caught:
            ready.wait_for(1, 1, 0.1)
        assert caught.value.seen == 7
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert (
        len(warned) == 1
        and f"'cache_ready_signal.{suffix}' (/dev/shm/cache_ready_signal.{suffix}) word 1 "
        "holds 7, not one of FastDeploy's values 0, 1"
        in warned[0]
    ), warned


class FakeClock:
    """``time.monotonic`` that moves by a futex look's whole step (recorded as ``steps``), and by 1 µs
    with every reading (as time passes while Python runs)."""

    def __init__(self) -> None:
        self.now, self.steps = 1000.0, []

    def monotonic(self) -> float:
        self.now += 1e-6
        return self.now

    def syscall(self, *args: object) -> int:
        span = args[4]._obj  # type: ignore[attr-defined]  # the timespec passed by reference
        step = span.tv_sec + span.tv_nsec / 1e9
        self.steps.append(round(step, 6))
        self.now += step
        return -1  # with _timed_out patched: the whole step passed, the word unchanged


def test_a_long_wait_looks_for_a_foreign_store_at_the_cap_not_fast_again_every_slice(
    suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait sleeps in slices (to look at the watched process and the clock every CHECK_SECONDS); the
    looks for a foreign store start fast and slow to FOREIGN_POLL_SECONDS once, for the whole wait (they
    started fast again with every slice: about 20 looks in each 0.25 s instead of 17)."""
    from fd_platforms.ipc import futex

    clock = FakeClock()
    monkeypatch.setattr(time, "monotonic", clock.monotonic)
    monkeypatch.setattr(futex, "_SYSCALL", (clock.syscall, 202))
    monkeypatch.setattr(futex, "_timed_out", lambda result: True)
    with FastDeploySignal.create(CACHE_READY, suffix, 1) as signal, pytest.raises(SignalWaitError):
        signal.wait_for(0, 1, 1.0)
    short = [round(step, 3) for step in clock.steps if step < futex.FOREIGN_POLL_SECONDS]
    assert short[0] == 0.001, "the first look comes fast"
    ramp = [step for step in short if step <= 0.008]
    assert len(short) <= 5 + 4, f"one ramp (1 to 8 ms), then 15 ms looks, but one cut by each slice's end: {short}"
    assert len(clock.steps) <= 1.0 / futex.FOREIGN_POLL_SECONDS + len(ramp) + 4, len(clock.steps)
    clock.steps.clear()  # a caller sleeping in slices of its own (serve_kv_cache_status) passes when it began
    with FastDeploySignal.create(CACHE_READY, f"{suffix}b", 1) as signal:
        signal.sleep_while(0, 0, 0.1, since=time.monotonic() - 1.0)
    assert [round(step, 3) for step in clock.steps[:-1]] == [0.015] * 6, clock.steps


def test_an_existing_name_is_refused_and_left_alone(suffix: str) -> None:
    path = f"/dev/shm/{CACHE_READY}.{suffix}"
    with open(path, "wb") as file:
        file.write(b"\0" * 8)
    try:
        with pytest.raises(CacheSignalError, match=f"remove {path} if no engine with suffix {suffix} is running"):
            FastDeploySignal.create(CACHE_READY, suffix, 2)
        assert os.path.getsize(path) == 8, "FastDeploy's processes hold no lock: nothing proves it dead"
    finally:
        os.unlink(path)


def test_attach_refuses_a_missing_or_odd_segment(suffix: str) -> None:
    with pytest.raises(CacheSignalError, match=r"does not exist.*engine_worker_queue_port"):
        FastDeploySignal.attach(CACHE_READY, suffix)
    path = f"/dev/shm/{CACHE_READY}.{suffix}"
    with open(path, "wb") as file:
        file.write(b"\0" * 6)
    try:
        with pytest.raises(CacheSignalError, match="holds 6 bytes, not an int32 array"):
            FastDeploySignal.attach(CACHE_READY, suffix)
    finally:
        os.unlink(path)
    os.mkfifo(path)
    try:
        with pytest.raises(CacheSignalError, match="is a FIFO"):
            FastDeploySignal.attach(CACHE_READY, suffix)
    finally:
        os.unlink(path)


def test_a_truncation_under_a_waiter_is_a_typed_error_not_sigbus(suffix: str) -> None:
    with FastDeploySignal.create(CACHE_READY, suffix, 4) as ready:
        attached = FastDeploySignal.attach(CACHE_READY, suffix)
        os.truncate(f"/dev/shm/{ready.name}", 0)
        with pytest.raises(CacheSignalError, match="was truncated to 0 bytes while in use"):
            attached.wait_for(3, 1, 5)
        attached.close()


def test_an_index_out_of_range_is_refused(suffix: str) -> None:
    with (
        FastDeploySignal.create(CACHE_READY, suffix, 2) as ready,
        pytest.raises(ConfigError, match="an index from 0 to 1"),
    ):
        ready.set(2, 1)


# -- shape and identity: an array FastDeploy did not make for this tp, a file others may write, one replaced --


@pytest.mark.parametrize("size", [12, 16, 4096], ids=["3-words", "int64-of-tp-2", "4096-bytes"])
@pytest.mark.parametrize("reader", ["attach", "drive"])
def test_a_cache_ready_signal_not_fastdeploys_int32_array_for_the_tp_is_refused_naming_its_size(
    suffix: str, size: int, reader: str
) -> None:
    """The engine's tp is known wherever FastDeploy's config is: every attach under its suffix checks the array."""
    with (
        FastDeploySignal.create(CACHE_READY, suffix, size // 4),
        FastDeploySignal.create(KV_CACHE_STATUS, suffix, 1),
        pytest.raises(CacheSignalError) as caught,
    ):
        if reader == "attach":
            FastDeploySignal.attach(CACHE_READY, FastDeploySuffix.of(suffix, tp=2))
        else:
            drive_kv_cache_update(suffix, tp=2, timeout=0.5)
    expected = (
        f"FastDeploy signal 'cache_ready_signal.{suffix}' (/dev/shm/cache_ready_signal.{suffix}) holds {size} "
        "bytes, but FastDeploy makes it an int32 array of 2 words (8 bytes for tp 2, one word per local rank"
    )
    assert expected in str(caught.value)


def test_a_signal_other_users_may_write_is_refused(suffix: str) -> None:
    """Another user's write to rank 0's slot made root's creator free its cache: a signal group- or
    world-writable is refused as records are."""
    with FastDeploySignal.create(CACHE_READY, suffix, 2):
        os.chmod(f"/dev/shm/{CACHE_READY}.{suffix}", 0o666)
        with pytest.raises(CacheSignalError, match=r"mode 0666: users other than its owner may write its words"):
            FastDeploySignal.attach(CACHE_READY, suffix)


@pytest.mark.usefixtures("fastdeploy_record_names")
def test_engine_calls_given_tp_refuse_a_ready_signal_of_another_length_before_any_tensor(cpu, suffix: str) -> None:
    """manage_kv_cache and initialize_kv_cache take the engine's tp and check the array before any tensor."""
    with FastDeploySignal.create(CACHE_READY, suffix, 3), FastDeploySignal.create(CACHE_TRANSFER_INITED, suffix, 2):
        with pytest.raises(CacheSignalError, match=r"holds 12 bytes.*of 2 words \(8 bytes for tp 2"):
            initialize_kv_cache(
                cpu,
                kv_request(
                    qwen_layout(0, 2),
                    4,
                    profile=False,
                    num_cpu_blocks=0,
                    storage_backend=None,
                    splitwise_role="mixed",
                    protocol="fastdeploy",
                    instance=suffix,
                    tp=2,
                ),
            )
        with pytest.raises(CacheSignalError, match=r"holds 12 bytes.*for tp 2"):
            manage_kv_cache(
                cpu, kv_request(qwen_layout(0, 2), 4, num_cpu_blocks=0, protocol="fastdeploy", instance=suffix, tp=2)
            )
        with pytest.raises(ConfigError, match=re.escape("layout.rank=2 is not valid; allowed: a local rank of tp 2")):
            manage_kv_cache(
                cpu, kv_request(qwen_layout(2, 4), 4, num_cpu_blocks=0, protocol="fastdeploy", instance=suffix, tp=2)
            )
    assert not os.path.exists("/dev/shm/key_caches_0_rank0.device0"), "nothing published"


def test_an_int64_kv_cache_status_is_refused_whatever_the_tp(suffix: str) -> None:
    with FastDeploySignal.create(KV_CACHE_STATUS, suffix, 2), pytest.raises(CacheSignalError) as caught:
        FastDeploySignal.attach(KV_CACHE_STATUS, suffix)
    assert "holds 8 bytes, but FastDeploy makes it an int32 array of 1 word (4 bytes)" in str(caught.value)


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_signal_replaced_while_waited_on_is_reported_at_once_with_its_current_value(suffix: str) -> None:
    with FastDeploySignal.create(CACHE_READY, suffix, 2) as old:
        caught: list[BaseException] = []

        def wait() -> None:
            try:
                old.wait_for(0, 1, 5, what="rank 0 waiting for its KV cache")
            except BaseException as error:  # noqa: BLE001 - handed to the test
                caught.append(error)

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.1)
        with FastDeploySignal.create(CACHE_READY, f"{suffix}-new", 2, initial=1) as new:
            os.rename(f"/dev/shm/{new.name}", f"/dev/shm/{old.name}")  # removed and created again, no gap
        started = time.monotonic()
        waiter.join(10)
        elapsed = time.monotonic() - started
        os.unlink(f"/dev/shm/{old.name}")  # the new file (the old one's close leaves another inode alone)
    assert elapsed < 1.5, f"noticed after {elapsed:.1f} s"
    assert len(caught) == 1 and isinstance(caught[0], CacheSignalError), caught
    expected = (
        f"rank 0 waiting for its KV cache: FastDeploy signal 'cache_ready_signal.{suffix}' "
        f"(/dev/shm/cache_ready_signal.{suffix}) was replaced by another file (its word 0 is now 1)"
    )
    assert expected in str(caught[0])


def test_our_failure_words_in_kv_cache_status_are_known_words_and_a_stray_one_is_still_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A creator's or driver's failure word (ipc.fault_words) is not logged as a stray value by every reader."""
    import logging

    from fd_platforms.fastdeploy.fault_words import FaultKind, KVCacheFault
    from fd_platforms.fastdeploy.signals import KV_CACHE_STATUS, FastDeploySignal

    with (
        FastDeploySignal.create(KV_CACHE_STATUS, f"t{secrets.token_hex(4)}", 1) as status,
        caplog.at_level(logging.WARNING),
    ):
        for word in (FaultKind.DRIVE_FAILED, KVCacheFault(FaultKind.NOT_CLEARED, 3).word, FaultKind.NOT_CREATED - 1023):
            assert status.allows(0, word), word
        assert not caplog.records
        assert not status.allows(0, -29999) and "not one of FastDeploy's values" in caplog.text
