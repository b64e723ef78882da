"""``fd-platforms run`` when things go wrong: the cache manager killed, Ctrl-C, SIGTERM, no memory,
bad ranks. Each ends with one error (one line, or one line per process under a heading) or one
``interrupted`` line, the documented exit code, no process left and nothing in ``/dev/shm``."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from run_helpers import QWEN, clean_env, host_sharing_plugin, run_cli, started, without_sweep

from fd_platforms.ipc.process_watch import pid_running

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"

MANAGER_PATH = ("--model", QWEN, "--tp", "2", "--device-memory", "256MiB", "--role", "decode")
START_METHODS = pytest.mark.parametrize("method", ["spawn", "forkserver"])  # FD_PLATFORMS_START_METHOD


def method_env(method: str) -> dict[str, str]:
    return clean_env(FD_PLATFORMS_START_METHOD=method)


def signal_name(stderr: str) -> str:
    found = re.search(r"engine instance (fd_cache_ready\.\S+) \(its cache-ready signal\)", stderr)
    assert found, stderr
    return found.group(1)


def all_gone(pids: list[int], within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while any(pid_running(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_cache_manager_killed_fails_every_worker_quickly_and_cleans_up() -> None:
    with started(*MANAGER_PATH) as run:
        workers = [int(pid) for pid in run.read_until(r"started 2 worker\(s\) \(pid (\d+), (\d+)\)").groups()]
        manager = int(run.read_until(r"starting the cache manager \(pid (\d+)\)").group(1))
        killed_at = time.monotonic()
        os.kill(manager, signal.SIGKILL)
        code, stderr = run.finish()
        elapsed = time.monotonic() - killed_at
    assert code == 1, stderr
    # the workers' wait would end by its 600 s timeout; the manager's death ends it (0.25 s checks, 2 s grace)
    assert elapsed < 60, f"the run took {elapsed:.1f} s to fail after the cache manager was killed"
    heading, *lines = stderr[stderr.index("fd-platforms: error: ") :].splitlines()
    assert heading == "fd-platforms: error: 3 processes failed:" and "Traceback" not in stderr, stderr
    assert len(lines) == 3 and all(line.startswith("  ") for line in lines), "one line per process, under the heading"
    assert lines[0] == f"  cache manager: pid {manager} was killed by SIGKILL before sending its 'ready'"
    for rank, line in zip((0, 1), sorted(lines[1:]), strict=False):
        assert re.match(
            rf"  rank {rank}: CacheNotReadyError: .*rank {rank} was not set after [0-9.]+ s: "
            rf"the process expected to set it \(pid {manager}\) exited without setting it",
            line,
        ), line
    assert not Path("/dev/shm", signal_name(stderr)).exists()
    assert all_gone([*workers, manager])


@START_METHODS
def test_ctrl_c_while_waiting_stops_every_process(method: str) -> None:
    with started(*MANAGER_PATH, env=method_env(method)) as run:
        run.read_until(r"rank \d: waiting for the cache manager")
        processes = run.group()
        os.killpg(run.process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        said = len(run.lines)
        run.read_until(r"Ctrl-C: stopping every process of the run")
        os.killpg(run.process.pid, signal.SIGINT)  # a second Ctrl-C does not cut the clean-up short
        code, stderr = run.finish()
    assert code == 130, stderr
    assert run.lines[said:][-1].startswith("fd-platforms: Ctrl-C: stopping"), "said first, before anything stops"
    assert stderr.splitlines()[-1] == "fd-platforms: interrupted"
    assert "Traceback" not in stderr and "error" not in stderr
    assert len(processes) >= 4, "the engine, two workers and the cache manager"
    assert all_gone(processes)
    assert not Path("/dev/shm", signal_name(stderr)).exists()


@START_METHODS
def test_ctrl_c_while_workers_start_prints_no_traceback(method: str) -> None:
    with started(*MANAGER_PATH, env=method_env(method)) as run:
        run.read_until(r"started 2 worker\(s\)")
        processes = run.group()
        os.killpg(run.process.pid, signal.SIGINT)
        code, stderr = run.finish()
    assert code == 130, stderr
    assert stderr.splitlines()[-1] == "fd-platforms: interrupted" and "Traceback" not in stderr
    assert all_gone(processes)
    assert not Path("/dev/shm", signal_name(stderr)).exists()


@START_METHODS
def test_sigterm_to_the_engine_stops_every_process(method: str) -> None:
    with started(*MANAGER_PATH, env=method_env(method)) as run:
        run.read_until(r"rank \d: waiting for the cache manager")
        processes = run.group()
        run.process.terminate()
        code, stderr = run.finish()
    assert code == 143, stderr
    assert stderr.splitlines()[-1] == "fd-platforms: terminated" and "Traceback" not in stderr
    assert all_gone(processes)
    assert not Path("/dev/shm", signal_name(stderr)).exists()


@START_METHODS
def test_the_engine_killed_alone_takes_every_process_of_the_run_with_it(method: str) -> None:
    """SIGKILL to the engine only (no group signal, no clean-up of its): each child's parent-death signal ends it,
    a fork server's child one step later (the server ends with the engine's end of its pipe, then its children)."""
    with started(*MANAGER_PATH, env=method_env(method)) as run:
        left = run.read_until(r"engine instance (fd_cache_ready\.\S+) \(its cache-ready signal\)").group(1)
        run.read_until(r"rank \d: waiting for the cache manager")
        processes = run.group()
        os.kill(run.process.pid, signal.SIGKILL)
        run.finish()
    assert len(processes) >= (5 if method == "forkserver" else 4), "the engine, 2 workers, the manager (the server)"
    assert all_gone(processes, within=15.0), [pid for pid in processes if pid_running(pid)]
    Path("/dev/shm", left).unlink()  # the killed engine's signal (a next run reclaims it: the test above)


def test_an_unknown_start_method_is_refused_naming_the_variable_before_any_process_starts() -> None:
    done = run_cli("--model", QWEN, "--device-memory", "256MiB", env=method_env("fork"))
    assert done.returncode == 2, done.stderr
    assert without_sweep(done.stderr) == [
        (
            "fd-platforms: error: FD_PLATFORMS_START_METHOD='fork' is not valid; allowed: spawn or forkserver. Fix: "
            "unset FD_PLATFORMS_START_METHOD (spawn), or set it to forkserver to fork every child from one process "
            "that imported Paddle"
        )
    ]


def test_not_enough_memory_is_the_planners_error_with_exit_2() -> None:
    done = run_cli("--model", QWEN, "--device-memory", "1MiB", "--json")
    assert done.returncode == 2, done.stderr
    [line] = without_sweep(done.stderr)
    assert line.startswith("fd-platforms: error: rank 0: InsufficientMemoryError: KV cache budget")
    assert "holds no block" in line and "Fix: the memory itself (1.00 MiB from --device-memory)" in line
    assert done.stdout == ""


def test_two_ranks_failing_alike_are_reported_once() -> None:
    done = run_cli("--model", QWEN, "--tp", "2", "--device-memory", "1MiB", "--json")
    assert done.returncode == 2, done.stderr
    [line] = without_sweep(done.stderr)
    assert line.startswith("fd-platforms: error: rank 0, rank 1: InsufficientMemoryError: ")
    assert line.count("InsufficientMemoryError") == 1


def test_bad_ranks_are_configuration_errors() -> None:
    for ranks, allowed in (("0", "1 to tensor_parallel_size=2"), ("3", "1 to tensor_parallel_size=2")):
        done = run_cli("--model", QWEN, "--tp", "2", "--ranks", ranks, "--device-memory", "1GiB")
        assert done.returncode == 2, done.stderr
        [line] = without_sweep(done.stderr)
        assert line.startswith(f"fd-platforms: error: --ranks={int(ranks)} is not valid; allowed: {allowed}")


def test_bad_timeout_is_a_configuration_error() -> None:
    done = run_cli("--model", QWEN, "--device-memory", "1GiB", "--timeout", "0")
    assert done.returncode == 2
    assert "timeout=0.0 is not valid" in done.stderr and "Traceback" not in done.stderr


def test_a_signal_left_by_an_engine_killed_with_sigkill_is_reclaimed_by_the_next_run() -> None:
    with started(*MANAGER_PATH) as run:
        left = run.read_until(r"engine instance (fd_cache_ready\.\S+) \(its cache-ready signal\)").group(1)
        run.read_until(r"rank \d: waiting for the cache manager")
        processes = run.group()
        os.killpg(run.process.pid, signal.SIGKILL)  # no cleanup runs anywhere
        run.finish()
    assert all_gone(processes)
    assert Path("/dev/shm", left).exists(), "SIGKILL skips the engine's cleanup"
    done = run_cli("--model", QWEN, "--device-memory", "256MiB")
    assert done.returncode == 0, done.stderr
    assert f"reclaiming cache-ready signal {left!r} left behind by pid" in done.stderr
    assert not Path("/dev/shm", left).exists()


def test_a_cpu_run_larger_than_the_hosts_available_memory_is_refused_before_allocating() -> None:
    twice_the_host = 2 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    done = run_cli("--model", QWEN, "--tp", "1", "--device-memory", f"{twice_the_host}B", "--role", "decode")
    assert done.returncode == 2, done.stderr
    [line] = without_sweep(done.stderr)[-1:]
    assert line.startswith("fd-platforms: error: --device-memory=") and "a KV cache that leaves the host" in line
    assert "more than half of the" in line and "available. Fix: give --device-memory SIZE per rank" in line
    assert "publishing" not in done.stderr, "the cache manager, started beside the workers, allocated nothing"


FLAKY_SHARE = host_sharing_plugin(
    "flakyshare",
    export="""
if ".value_caches_3_" in name:
    raise DeviceAllocError(f"could not allocate KV cache tensor {name}: the device is full. Fix: plan fewer blocks")
return export_host_tensor(name, shape, dtype)
""",
)


def test_a_cache_manager_that_cannot_allocate_fails_the_waiting_worker_with_its_error(make_plugin) -> None:
    site = make_plugin("flakyshare", source=FLAKY_SHARE)
    done = run_cli(
        "--model",
        QWEN,
        "--tp",
        "1",
        "--device-memory",
        "64MiB",
        "--role",
        "decode",
        "--json",
        env=clean_env(FD_PLATFORM="flakyshare", PYTHONPATH=str(site)),
    )
    assert done.returncode == 1, done.stderr
    heading, manager, rank = without_sweep(done.stderr)
    assert heading == "fd-platforms: error: 2 processes failed:"
    assert manager.startswith("  cache manager: DeviceAllocError: could not allocate KV cache tensor fd_kv.")
    assert ".value_caches_3_rank0.device0: the device is full" in manager
    assert rank.startswith("  rank 0: CacheNotReadyError: ") and "exited without setting it" in rank
    assert done.stdout == ""
