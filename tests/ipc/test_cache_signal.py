"""The cache-ready signal and its wait, across real processes started with spawn."""

from __future__ import annotations

import logging
import math
import os
import signal as signals
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import signal_processes
from conftest import SHM_DIR, shm_entries
from warm_processes import warm

from fd_platforms.contract.errors import CacheNotReadyError, CacheSignalError, ConfigError
from fd_platforms.ipc import futex, shm, timeouts
from fd_platforms.ipc.cache_signal import (
    SIGNAL_PREFIX,
    CacheReadySignal,
    new_signal_name,
    reclaim_stale_signals,
    resolve_timeout,
)
from fd_platforms.ipc.process_watch import ProcessWatch, pid_running

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="POSIX shared memory in /dev/shm is needed")
REPO = Path(__file__).resolve().parents[2]


def run_python(code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in an unrelated interpreter (its own resource tracker, no multiprocessing parent)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


# -- the segment ------------------------------------------------------------------------------


def test_layout_is_the_documented_int32_words(signal_name: str) -> None:
    with CacheReadySignal.create(3, signal_name) as owner:
        owner.set(1)
        words = struct.unpack("11i", (SHM_DIR / signal_name).read_bytes())  # a reader knowing only the layout
    assert list(words[:8]) == [0x46444352, 2, 3, os.getpid(), 0, 0, 0, 0]
    assert list(words[8:11]) == [0, 1, 0]


def test_segment_is_private_to_the_user(signal_name: str) -> None:
    with CacheReadySignal.create(1, signal_name):
        assert (SHM_DIR / signal_name).stat().st_mode & 0o777 == 0o600


def test_set_clear_and_slots_seen_by_an_attacher(signal_name: str) -> None:
    with CacheReadySignal.create(4, signal_name) as owner, CacheReadySignal.attach(signal_name) as worker:
        assert worker.num_ranks == 4 and not worker.owner
        owner.set(0)
        worker.set(3)
        assert owner.slots() == worker.slots() == (1, 0, 0, 1)
        owner.clear(0)
        assert not worker.is_set(0) and worker.is_set(3)


def test_owner_close_unlinks_and_attacher_close_does_not(signal_name: str) -> None:
    owner = CacheReadySignal.create(1, signal_name)
    CacheReadySignal.attach(signal_name).close()
    assert (SHM_DIR / signal_name).exists()
    owner.close()
    owner.close()  # idempotent
    assert not (SHM_DIR / signal_name).exists()
    with pytest.raises(CacheSignalError, match="is closed"):
        owner.is_set(0)


def test_unrelated_attacher_exiting_leaves_the_segment(signal_name: str) -> None:
    """Python's resource_tracker would unlink a segment an unrelated process attached; ours must not."""
    with CacheReadySignal.create(2, signal_name) as owner:
        done = run_python(
            f"""
            from fd_platforms.ipc.cache_signal import CacheReadySignal
            signal = CacheReadySignal.attach({signal_name!r})
            signal.set(1)
            """
        )
        assert done.returncode == 0, done.stderr
        assert "leaked" not in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert (SHM_DIR / signal_name).exists()
        assert owner.slots() == (0, 1)


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_spawned_attacher_exiting_leaves_the_segment(signal_name: str) -> None:
    with CacheReadySignal.create(2, signal_name) as owner:
        child = warm.Process(target=signal_processes.set_ranks, args=(signal_name, [0, 1], 0.0))
        child.start()
        child.join(30)
        assert child.exitcode == 0
        assert (SHM_DIR / signal_name).exists()
        assert owner.slots() == (1, 1)


def test_owner_exit_unlinks_but_a_forked_child_exit_does_not(signal_name: str) -> None:
    done = run_python(
        f"""
        import os, sys
        from fd_platforms.ipc.cache_signal import CacheReadySignal
        signal = CacheReadySignal.create(1, {signal_name!r})
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # runs the exit hooks it inherited from the owner
        os.waitpid(pid, 0)
        print(os.path.exists("/dev/shm/{signal_name}"))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert not (SHM_DIR / signal_name).exists()


def test_stale_segment_of_a_killed_owner_is_reclaimed(signal_name: str, caplog) -> None:
    engine = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, time
            from fd_platforms.ipc.cache_signal import CacheReadySignal
            signal = CacheReadySignal.create(2, {signal_name!r})
            signal.set(1)
            print("created", flush=True)
            time.sleep(120)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert engine.stdout is not None and engine.stdout.readline().strip() == "created"
        with pytest.raises(
            CacheSignalError, match=rf"in use by a running engine: .*\(pid {engine.pid} in its PID namespace\)"
        ):
            CacheReadySignal.create(2, signal_name)
    finally:
        engine.kill()
        engine.wait()
    assert (SHM_DIR / signal_name).exists(), "SIGKILL skips exit hooks: the segment is left behind"
    with (
        caplog.at_level(logging.WARNING, logger="fd_platforms"),
        CacheReadySignal.create(3, signal_name) as reclaimed,
    ):
        assert reclaimed.slots() == (0, 0, 0)
    assert f"left behind by pid {engine.pid}" in caplog.text


def test_the_sweep_reclaims_only_signals_whose_owner_is_gone(tmp_path, caplog, monkeypatch) -> None:
    killed = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time\n"
                "from fd_platforms.ipc.cache_signal import CacheReadySignal\n"
                "signal = CacheReadySignal.create(1)\n"
                "print(signal.name, flush=True)\n"
                "time.sleep(120)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert killed.stdout is not None
        stale = killed.stdout.readline().strip()
    finally:
        killed.kill()
        killed.wait()
    foreign = SHM_DIR / f"{SIGNAL_PREFIX}test-foreign-{os.getpid()}"
    foreign.write_bytes(bytes(64))
    try:
        with CacheReadySignal.create(1) as alive, caplog.at_level(logging.WARNING, logger="fd_platforms"):
            assert (SHM_DIR / stale).exists()
            reclaimed = reclaim_stale_signals()
            assert not (SHM_DIR / stale).exists()
            assert alive.name not in reclaimed and (SHM_DIR / alive.name).exists()
            assert foreign.name not in reclaimed and foreign.exists()
        if stale in reclaimed:  # else the start-up sweep of a run beside this suite reclaimed it first
            assert f"left behind by pid {killed.pid}" in caplog.text
    finally:
        foreign.unlink()
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path / "no-such-dir"))
    assert reclaim_stale_signals() == []


def test_foreign_segment_is_neither_attached_nor_reclaimed(signal_name: str) -> None:
    foreign = SHM_DIR / signal_name
    foreign.write_bytes(bytes(64))
    try:
        with pytest.raises(CacheSignalError, match="not a usable fd-platforms cache-ready signal"):
            CacheReadySignal.attach(signal_name)
        with pytest.raises(CacheSignalError, match=f"remove /dev/shm/{signal_name}"):
            CacheReadySignal.create(1, signal_name)
        assert foreign.read_bytes() == bytes(64)
    finally:
        foreign.unlink()


def test_a_signal_of_the_previous_layout_is_left_alone(signal_name: str) -> None:
    """Layout 1 judged liveness by a pid; nothing proves such a segment unused, so it is never removed."""
    old = SHM_DIR / signal_name
    old.write_bytes(struct.pack("10i", 0x46444352, 1, 2, 999_999, -1, 0, 0, 0, 0, 0))
    try:
        assert signal_name not in reclaim_stale_signals()
        with pytest.raises(CacheSignalError, match="not a usable fd-platforms cache-ready signal \\(layout 2\\)"):
            CacheReadySignal.attach(signal_name)
        assert old.exists()
    finally:
        old.unlink()


def test_attach_checks_the_size_before_mapping(signal_name: str) -> None:
    """A header claiming more ranks than the file holds is refused, never mapped (no SIGBUS)."""
    short = SHM_DIR / signal_name
    short.write_bytes(struct.pack("10i", 0x46444352, 2, 1000, 1, 0, 0, 0, 0, 0, 0))
    short.chmod(0o600)
    try:
        with pytest.raises(CacheSignalError, match="not a complete fd-platforms signal of layout 2"):
            CacheReadySignal.attach(signal_name)
    finally:
        short.unlink()


def test_attaching_a_missing_signal_says_who_creates_it(signal_name: str) -> None:
    with pytest.raises(CacheSignalError, match=r"does not exist.*engine process creates it"):
        CacheReadySignal.attach(signal_name)


def test_generated_names_are_unique_per_engine() -> None:
    names = {new_signal_name() for _ in range(50)}
    assert len(names) == 50 and all(name.startswith(f"fd_cache_ready.{os.getpid()}-") for name in names)
    assert new_signal_name("engine-8188") == "fd_cache_ready.engine-8188"


@pytest.mark.parametrize("name", ["", "../etc", "a/b", "has space", "-leading", "x" * 202, 7])
def test_bad_names_are_config_errors(name: object) -> None:
    with pytest.raises(ConfigError, match="signal_name="):
        CacheReadySignal.create(1, name)  # type: ignore[arg-type]


@pytest.mark.parametrize("num_ranks", [0, -1, 1025, True, 2.0])
def test_bad_rank_counts_are_config_errors(num_ranks: object, signal_name: str) -> None:
    with pytest.raises(ConfigError, match=r"num_ranks=.*allowed: an integer from 1 to 1024"):
        CacheReadySignal.create(num_ranks, signal_name)  # type: ignore[arg-type]


@pytest.mark.parametrize("rank", [-1, 2, True, "0"])
def test_bad_ranks_are_config_errors(rank: object, signal_name: str) -> None:
    with CacheReadySignal.create(2, signal_name) as owner:
        for operation in (owner.set, owner.clear, owner.is_set, owner.wait):
            with pytest.raises(ConfigError, match=r"rank=.*a local rank from 0 to 1"):
                operation(rank)  # type: ignore[arg-type]


# -- waiting ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_n_ranks_set_by_a_manager_process_are_waited_on_by_n_workers(signal_name: str) -> None:
    ranks = 4
    with CacheReadySignal.create(ranks, signal_name):
        manager = warm.Process(target=signal_processes.set_ranks, args=(signal_name, list(range(ranks)), 0.2))
        manager.start()
        receivers, workers = [], []
        for rank in range(ranks):
            receiver, sender = warm.Pipe(duplex=False)
            worker = warm.Process(
                target=signal_processes.wait_and_report, args=(signal_name, rank, 30.0, manager.pid, sender)
            )
            worker.start()
            receivers.append(receiver)
            workers.append(worker)
        outcomes = [receiver.recv() for receiver in receivers]
        for process in (*workers, manager):
            process.join(30)
            assert process.exitcode == 0
    assert outcomes == [(rank, "ready", outcome[2]) for rank, outcome in enumerate(outcomes)]


@pytest.mark.slow
def test_two_engine_instances_never_cross() -> None:
    engines, names = [], []
    for _ in range(2):
        receiver, sender = warm.Pipe()
        engine = warm.Process(target=signal_processes.create_and_report, args=(2, sender))
        engine.start()
        engines.append((engine, receiver))
        names.append(receiver.recv())
    try:
        assert names[0] != names[1]
        first, second = (CacheReadySignal.attach(name) for name in names)
        with first, second:
            assert first.slots() == second.slots() == (1, 0)
            first.set(1)
            assert second.slots() == (1, 0)
            with pytest.raises(CacheNotReadyError, match=names[1]):
                second.wait(1, timeout=0.3)
            assert first.wait(1, timeout=1) < 0.1
    finally:
        for engine, receiver in engines:
            receiver.send("stop")
            engine.join(30)
    assert all(engine.exitcode == 0 for engine, _ in engines)
    assert not set(names) & shm_entries()


@pytest.mark.slow
def test_timeout_names_signal_rank_elapsed_and_every_slot(signal_name: str) -> None:
    with CacheReadySignal.create(3, signal_name) as owner:
        owner.set(2)
        start = time.monotonic()
        with pytest.raises(CacheNotReadyError) as raised:
            owner.wait(1, timeout=0.4)
        assert 0.4 <= time.monotonic() - start < 5, "ended by its 0.4 s timeout (a busy machine may add seconds)"
    error = raised.value
    assert (error.signal_name, error.rank, error.cause, error.slots) == (signal_name, 1, "timeout", (0, 0, 1))
    assert 0.4 <= error.elapsed < 5
    message = str(error)
    for part in (
        signal_name,
        "rank 1 was not set after 0.4 s",
        "limit is 0.4 s",
        "rank 0 clear, rank 1 clear, rank 2 set",
        "raise the timeout argument (seconds)",
    ):
        assert part in message


def test_timeout_comes_from_the_environment_when_not_given(signal_name: str, monkeypatch) -> None:
    monkeypatch.setenv("FD_CACHE_READY_TIMEOUT", "0.1")
    with (
        CacheReadySignal.create(1, signal_name) as owner,
        pytest.raises(CacheNotReadyError, match=r"limit is 0.1 s.*raise FD_CACHE_READY_TIMEOUT \(seconds\)"),
    ):
        owner.wait(0)


@pytest.mark.slow
def test_a_limit_a_command_flag_set_names_that_flag(signal_name: str, monkeypatch) -> None:
    """``run --timeout`` sets the limit: its messages say to raise --timeout, not a variable it overrides."""
    monkeypatch.setattr(timeouts, "_flags", {})
    monkeypatch.setenv("FD_CACHE_READY_TIMEOUT", "600")
    timeouts.set_by_flag("FD_CACHE_READY_TIMEOUT", "--timeout", 0.2)
    assert resolve_timeout(None) == 0.2, "exported: the processes the command starts follow the flag too"
    with CacheReadySignal.create(1, signal_name) as owner:
        for timeout in (None, 0.2):
            with pytest.raises(CacheNotReadyError) as raised:
                owner.wait(0, timeout=timeout)
            assert "raise --timeout (seconds)" in str(raised.value) and "FD_CACHE_READY_TIMEOUT" not in str(
                raised.value
            )


@pytest.mark.parametrize("raw", ["soon", "0", "-5", "nan", "1e9", "604801", "-inf", "Infinity", "INF", "1e999", "none"])
def test_bad_timeout_variable_is_a_config_error(raw: str) -> None:
    with pytest.raises(
        ConfigError,
        match=rf"FD_CACHE_READY_TIMEOUT='{raw}'.*seconds > 0 and at most 604800 \(7 days\), "
        "or inf for no limit.*FD_CACHE_READY_TIMEOUT=600, or to inf for no limit",
    ):
        resolve_timeout(None, {"FD_CACHE_READY_TIMEOUT": raw})


@pytest.mark.parametrize(
    "timeout", [0, -1.0, float("-inf"), float("nan"), "10", "inf", True, 3e6, pytest.param(10**5000, id="5000-digits")]
)
def test_bad_timeout_argument_is_a_config_error(timeout: object) -> None:
    with pytest.raises(ConfigError, match=r"timeout=.*seconds > 0 .*or inf for no limit.*or math.inf for no limit"):
        resolve_timeout(timeout)  # type: ignore[arg-type]


def test_no_limit_is_spelled_inf_as_FastDeploys_own_waits_have_none() -> None:
    assert resolve_timeout(math.inf) == resolve_timeout(float("inf")) == math.inf
    assert resolve_timeout(None, {"FD_CACHE_READY_TIMEOUT": "inf"}) == math.inf
    assert resolve_timeout(None, {"FD_CACHE_READY_TIMEOUT": " inf "}) == math.inf
    assert resolve_timeout(5, {"FD_CACHE_READY_TIMEOUT": "inf"}) == 5.0, "the argument wins"


def test_default_timeout_is_600_seconds() -> None:
    assert resolve_timeout(None, {}) == 600.0
    assert resolve_timeout(None, {"FD_CACHE_READY_TIMEOUT": " "}) == 600.0
    assert resolve_timeout(2) == 2.0
    assert resolve_timeout(604800) == resolve_timeout(None, {"FD_CACHE_READY_TIMEOUT": "604800"}) == 604800.0


@pytest.mark.slow
def test_creator_killed_with_sigkill_ends_the_wait_within_a_second(signal_name: str) -> None:
    with CacheReadySignal.create(2, signal_name) as owner:
        manager = warm.Process(target=signal_processes.sleep_forever)
        manager.start()
        killed_at: list[float] = []

        def kill() -> None:
            killed_at.append(time.monotonic())
            os.kill(manager.pid, signals.SIGKILL)

        threading.Timer(0.5, kill).start()
        with pytest.raises(CacheNotReadyError) as raised:
            owner.wait(1, timeout=60, creator_pid=manager.pid)
        noticed = time.monotonic() - killed_at[0]
        manager.join(10)
    assert noticed < 1.0, f"the dead creator was noticed after {noticed:.2f} s"
    error = raised.value
    assert error.cause == "creator_exited" and error.rank == 1
    assert f"pid {manager.pid}) exited without setting it" in str(error)


def test_creator_already_gone_fails_at_once(signal_name: str) -> None:
    gone = warm.Process(target=time.sleep, args=(0,))
    gone.start()
    gone.join(30)
    with CacheReadySignal.create(1, signal_name) as owner:
        start = time.monotonic()
        with pytest.raises(CacheNotReadyError, match="exited without setting it"):
            owner.wait(0, timeout=30, creator_pid=gone.pid)
        assert time.monotonic() - start < 10, "the creator's exit ended the wait, not the 30 s timeout"


def test_creator_that_sets_then_exits_is_success(signal_name: str) -> None:
    with CacheReadySignal.create(1, signal_name) as owner:
        manager = warm.Process(target=signal_processes.set_ranks, args=(signal_name, [0], 0.0))
        manager.start()
        manager.join(30)
        assert owner.wait(0, timeout=5, creator_pid=manager.pid) < 0.5


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_ctrl_c_interrupts_a_waiting_worker_at_once(signal_name: str) -> None:
    with CacheReadySignal.create(1, signal_name):
        worker = subprocess.Popen(
            [
                sys.executable,
                "-c",
                textwrap.dedent(f"""
                from fd_platforms.ipc.cache_signal import CacheReadySignal
                signal = CacheReadySignal.attach({signal_name!r})
                print("waiting", flush=True)
                signal.wait(0, timeout=120)
            """),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert worker.stdout is not None and worker.stdout.readline().strip() == "waiting"
        time.sleep(0.2)  # let it reach the futex
        sent = time.monotonic()
        worker.send_signal(signals.SIGINT)
        _, stderr = worker.communicate(timeout=10)
        stopped = time.monotonic() - sent
        assert (SHM_DIR / signal_name).exists(), "an interrupted attacher leaves the engine's signal alone"
    assert worker.returncode != 0 and "KeyboardInterrupt" in stderr
    assert stopped < 5, f"Ctrl-C took {stopped:.2f} s to stop the wait (its timeout is far longer)"


@pytest.mark.slow
def test_progress_is_logged_at_info_while_waiting(signal_name: str, caplog) -> None:
    with CacheReadySignal.create(3, signal_name) as owner:
        owner.set(2)
        with caplog.at_level(logging.INFO, logger="fd_platforms"), pytest.raises(CacheNotReadyError):
            owner.wait(0, timeout=0.5, progress_seconds=0.1)
    progress = [record for record in caplog.records if "waiting for its KV cache" in record.getMessage()]
    assert 3 <= len(progress) <= 5
    assert all(record.levelno == logging.INFO for record in progress), "a bounded wait says it at INFO"
    assert all(
        f"signal {signal_name!r} slot 0 is 0" in record.getMessage()
        and "slots set: [2] of 3" in record.getMessage()
        and record.getMessage().endswith("s, limit 0.5 s")
        for record in progress
    )


@pytest.mark.slow
def test_an_unbounded_wait_says_every_few_seconds_what_it_waits_for_at_warning(signal_name: str, caplog) -> None:
    with CacheReadySignal.create(2, signal_name) as owner:
        threading.Timer(1.5, owner.set, (1,)).start()
        with caplog.at_level(logging.INFO, logger="fd_platforms"):
            waited = owner.wait(1, timeout=math.inf, creator_pid=os.getpid(), progress_seconds=0.3)
    assert waited >= 1.4
    progress = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(progress) >= 4, progress
    for line in progress:
        assert line.startswith(
            f"rank 1 waiting for its KV cache: cache-ready signal {signal_name!r} slot 1 is 0, set "
            f"once the process creating the cache has it (pid {os.getpid()}, watched: its exit ends "
            "the wait); slots set: none of 2; waited "
        )
        assert line.endswith(" s, no time limit")


def test_wait_polls_where_futexes_are_unavailable(signal_name: str, monkeypatch) -> None:
    monkeypatch.setattr(futex, "AVAILABLE", False)
    with CacheReadySignal.create(1, signal_name) as owner:
        threading.Timer(0.1, owner.set, (0,)).start()
        assert 0.05 < owner.wait(0, timeout=5) < 1


@pytest.mark.slow
def test_futex_wake_reaches_a_waiter_in_another_process(signal_name: str) -> None:
    if not futex.AVAILABLE:
        pytest.skip("this machine has no futex syscall the core knows (not Linux x86_64/aarch64/riscv64)")
    with CacheReadySignal.create(1, signal_name) as owner:
        receiver, sender = warm.Pipe(duplex=False)
        worker = warm.Process(target=signal_processes.wait_and_report, args=(signal_name, 0, 30.0, None, sender))
        worker.start()
        time.sleep(1.0)  # the worker is asleep in the kernel by now
        owner.set(0)
        rank, outcome, waited = receiver.recv()
        worker.join(30)
    assert (rank, outcome) == (0, "ready") and waited < 29


# -- watching the creator ----------------------------------------------------------------------


def test_process_watch_sees_an_unreaped_child_as_exited() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    watch = ProcessWatch(child.pid)
    try:
        deadline = time.monotonic() + 10
        while not watch.exited() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watch.exited()
        assert not pid_running(child.pid), "a zombie is not running"
    finally:
        watch.close()
        child.wait()


def test_process_watch_without_pidfd_falls_back_to_the_pid(monkeypatch) -> None:
    monkeypatch.delattr(os, "pidfd_open")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    watch = ProcessWatch(child.pid)
    try:
        assert not watch.exited()
        child.kill()
        child.wait()
        assert watch.exited()
    finally:
        watch.close()


@pytest.mark.parametrize("pid", [0, -3, True, "12"])
def test_bad_creator_pid_is_a_config_error(pid: object) -> None:
    with pytest.raises(ConfigError, match="creator_pid="):
        ProcessWatch(pid)  # type: ignore[arg-type]


def test_a_watch_of_a_pid_beyond_the_kernels_limit_is_refused_naming_it_not_an_overflow() -> None:
    """``pidfd_open(2**70)`` raised OverflowError; every pid check bounds by the kernel's PID_MAX_LIMIT."""
    from fd_platforms.ipc.process_watch import PID_MAX_LIMIT, ProcessWatch

    with pytest.raises(
        ConfigError, match=r"creator_pid=.* is not valid; allowed: a process id from 1 to 4194304.*Fix: pass"
    ):
        ProcessWatch(2**70)
    assert PID_MAX_LIMIT == 2**22
