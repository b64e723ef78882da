"""The lifecycle's parts in-process: rank layouts and devices, the memory each rank plans on,
throttled allocation progress, how failures are reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from fd_platforms.contract.errors import ConfigError, RunError
from fd_platforms.contract.types import DeviceMemory
from fd_platforms.ipc.process_watch import describe_exit
from fd_platforms.lifecycle import progress as progress_module
from fd_platforms.lifecycle.children import START_METHOD_ENV, start_method
from fd_platforms.lifecycle.progress import Progress
from fd_platforms.lifecycle.spec import RunSpec
from fd_platforms.lifecycle.worker import rank_memory
from fd_platforms.rules.config import CacheConfig, DeployConfig, ParallelConfig, SchedulerConfig, load_model_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GIB = 2**30


def spec(device_type: str, ranks: int = 2, device_memory: int | None = None) -> RunSpec:
    model = load_model_config(EXAMPLES / "qwen3-30b-a3b")
    deploy = DeployConfig(EXAMPLES / "qwen3-30b-a3b", model, CacheConfig(), SchedulerConfig(), ParallelConfig(ranks))
    return RunSpec(deploy, "test", device_type, ranks, timeout=5.0, device_memory=device_memory)


class LiveMemory:
    """A platform stand-in whose devices report 10 GiB total, 8 GiB free, 1 GiB held."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def device_memory(self, device_id: int) -> DeviceMemory:
        self.asked.append(device_id)
        return DeviceMemory(10 * GIB, 8 * GIB, GIB, "stand-in")


def test_each_rank_has_its_own_device_except_on_cpu() -> None:
    gpu, cpu = spec("iluvatar_gpu"), spec("cpu")
    assert [gpu.local_device(rank) for rank in (0, 1)] == [0, 1]
    assert [cpu.local_device(rank) for rank in (0, 1)] == [0, 0]
    assert gpu.layout(1).names()[0] == "key_caches_0_rank1.device1"
    assert cpu.layout(1).names()[0] == "key_caches_0_rank1.device0"


def test_cpu_ranks_split_the_live_host_memory_evenly() -> None:
    platform = LiveMemory()
    memory = rank_memory(spec("cpu", ranks=4), platform, 3)  # type: ignore[arg-type]
    assert (memory.total_bytes, memory.free_bytes, memory.process_bytes) == (10 * GIB // 4, 2 * GIB, GIB)
    assert memory.source == "stand-in, split evenly across 4 ranks sharing host memory"
    assert platform.asked == [0]


def test_device_ranks_plan_on_their_own_device_and_device_memory_wins() -> None:
    platform = LiveMemory()
    assert rank_memory(spec("iluvatar_gpu"), platform, 1).total_bytes == 10 * GIB  # type: ignore[arg-type]
    assert platform.asked == [1]
    given = rank_memory(spec("cpu", device_memory=GIB), platform, 1)  # type: ignore[arg-type]
    assert given == DeviceMemory(GIB, None, None, "--device-memory") and platform.asked == [1]


def test_allocation_progress_is_throttled_to_one_line_a_second(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = iter([100.0, 100.4, 101.1, 101.5, 102.2, 103.0])
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    report = Progress(quiet=False, prefix="rank 0: ").allocation("allocating 4.00 GiB")
    assert report is not None
    for done in (1, 2, 3, 3, 4):
        report(done * GIB, 4 * GIB)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "fd-platforms: rank 0: allocating 4.00 GiB: 2.00 GiB of 4.00 GiB (50%)",
        "fd-platforms: rank 0: allocating 4.00 GiB: 3.00 GiB of 4.00 GiB (75%)",
    ]  # 100.4 is too soon after the start, 101.5 too soon after 101.1; a finished allocation is not reported


def test_quiet_progress_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    quiet = Progress(quiet=True)
    quiet("planned")
    assert quiet.allocation("allocating") is None
    assert capsys.readouterr().err == ""


def test_kv_cache_allocation_reports_progress_per_tensor() -> None:
    pytest.importorskip("paddle")
    from fd_platforms.engine.kv_cache import allocate_kv_cache

    layout = spec("cpu").layout(0)
    calls: list[tuple[int, int]] = []
    cache = allocate_kv_cache(layout, 2, "cpu", progress=lambda done, total: calls.append((done, total)))
    total = 2 * layout.bytes_per_block
    assert len(calls) == len(layout.tensors)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls) and calls[-1] == (total, total)
    assert {expected for _, expected in calls} == {total} == {cache.nbytes}
    cache.clear()


def test_run_error_groups_alike_failures_and_keeps_the_exit_code() -> None:
    error = RunError(
        (
            ("rank 0", "InsufficientMemoryError: no block"),
            ("rank 1", "InsufficientMemoryError: no block"),
            ("cache manager", "pid 7 was killed by SIGKILL"),
        ),
        exit_code=2,
    )
    assert str(error) == (
        "3 processes failed:\n  rank 0, rank 1: InsufficientMemoryError: no block"
        "\n  cache manager: pid 7 was killed by SIGKILL"
    )
    assert error.exit_code == 2 and len(error.failures) == 3
    alike = RunError((("rank 0", "InsufficientMemoryError: no block"), ("rank 1", "InsufficientMemoryError: no block")))
    assert str(alike) == "rank 0, rank 1: InsufficientMemoryError: no block", "one failure stays one line"


@pytest.mark.parametrize(
    ("code", "said"),
    [(0, "exited with code 0"), (3, "exited with code 3"), (-9, "was killed by SIGKILL"), (None, "is still running")],
)
def test_describe_exit(code: int | None, said: str) -> None:
    assert describe_exit(code) == said


def _killed(conn: object) -> None:
    """A stand-in cache manager that dies without a word (as under SIGKILL)."""
    import os

    os._exit(9)


def _fails_after_a_while(conn: object) -> None:
    """A stand-in worker whose attach fails because its exporter died: a typed error with exit code 2."""
    import time

    time.sleep(0.3)
    conn.send(("error", ("CacheSharingError", "its exporter has exited or closed it", 2)))  # type: ignore[attr-defined]


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_child_outside_the_phase_that_died_is_named_first_as_the_cause() -> None:
    """The cache manager dies while the workers re-attach: the run says so first and exits 1, rather
    than reporting only the worker's consequent sharing error (exit 2) — a CI run beside a loop hit it."""
    from fd_platforms.lifecycle.children import Children

    with Children() as children:
        manager = children.start("cache manager", _killed)
        worker = children.start("rank 0", _fails_after_a_while)
        manager.process.join(30)
        with pytest.raises(RunError) as raised:
            children.collect([worker], "ready", 30)
    assert raised.value.exit_code == 1
    assert raised.value.failures == (
        ("cache manager", f"pid {manager.pid} exited with code 9 during this phase"),
        ("rank 0", "CacheSharingError: its exporter has exited or closed it"),
    )


def _cleans_up_on_sigterm(conn: object) -> None:
    """A stand-in worker between phases: it waits for its engine's word and handles SIGTERM (its clean-up) by
    exiting with STOPPED_EXIT, as a worker does (lifecycle/child.py)."""
    import signal
    import sys
    import time

    from fd_platforms.lifecycle.interrupts import STOPPED_EXIT

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(STOPPED_EXIT))
    conn.send(("ready", None))  # type: ignore[attr-defined]
    time.sleep(60)


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_stopped_child_is_continued_with_its_sigterm_so_it_ends_by_it_not_by_sigkill_seconds_later() -> None:
    """A child stopped from outside (SIGSTOP, a debugger, a frozen cgroup) holds a SIGTERM pending until continued:
    stopping the run sends SIGCONT after it, so the child runs its SIGTERM handler (its clean-up) at once."""
    import os
    import signal
    import time

    from fd_platforms.lifecycle.children import STOP_SECONDS, Children
    from fd_platforms.lifecycle.interrupts import STOPPED_EXIT

    with Children() as children:
        child = children.start("rank 0", _cleans_up_on_sigterm)
        children.collect([child], "ready", 30)  # its handler is in place
        os.kill(child.pid, signal.SIGSTOP)
        started = time.monotonic()
        children.stop(graceful=False)
        took = time.monotonic() - started
    assert child.process.exitcode == STOPPED_EXIT == 143, child.ended()
    assert took < STOP_SECONDS, f"{took:.1f} s"


@pytest.mark.parametrize(("value", "method"), [(None, "spawn"), ("", "spawn"), ("spawn", "spawn"), ("forkserver",) * 2])
def test_the_start_method_is_spawn_unless_forkserver_is_named(value: str | None, method: str) -> None:
    environ = {} if value is None else {START_METHOD_ENV: value}
    assert start_method(environ) == method


@pytest.mark.parametrize("value", ["fork", "Forkserver", " spawn"])
def test_any_other_start_method_is_a_config_error_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError) as raised:
        start_method({START_METHOD_ENV: value})
    assert (raised.value.field, raised.value.value, raised.value.allowed) == (
        START_METHOD_ENV,
        value,
        "spawn or forkserver",
    )
