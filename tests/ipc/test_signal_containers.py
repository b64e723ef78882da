"""The cache-ready signal in a container's ``/dev/shm``: other PID namespaces, other users, odd
entries, and Python's resource tracker. Liveness is the lock the kernel holds, never a pid."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from pathlib import Path

import pytest
from conftest import SHM_DIR, held_by_a_living_process
from run_helpers import QWEN, ROOT, SCRIPT, clean_env, run_cli, without_sweep

from fd_platforms.contract.errors import CacheSignalError
from fd_platforms.ipc.cache_signal import SIGNAL_PREFIX, CacheReadySignal, reclaim_stale_signals

pytestmark = [  # multi-process: left out of -m "not slow"
    pytest.mark.slow,
    pytest.mark.skipif(not SHM_DIR.is_dir(), reason="POSIX shared memory in /dev/shm is needed"),
]

HOLD = textwrap.dedent(
    """
    import os, sys
    from fd_platforms.ipc.cache_signal import CacheReadySignal
    signal = CacheReadySignal.create(2)
    signal.set(1)
    print(signal.name, os.getpid(), flush=True)
    sys.stdin.read()  # hold the signal until the test closes stdin
    """
)


def unshare_refused() -> str | None:
    """Why ``unshare -p -f`` cannot run here, or None when it can."""
    if shutil.which("unshare") is None:
        return "the unshare tool (util-linux) is not installed"
    probe = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare -p -f --mount-proc is refused here: {probe.stderr.strip() or probe.returncode}"
    return None


needs_pid_namespace = pytest.mark.skipif(unshare_refused() is not None, reason=str(unshare_refused()))


@contextmanager
def held_in_new_pid_namespace() -> Iterator[tuple[str, int]]:
    """A process in its own PID namespace holding a fresh signal: yields (name, its pid in there).

    On exit the holder is killed with SIGKILL (no cleanup runs) and the kernel has dropped its lock.
    """
    process = subprocess.Popen(
        ["unshare", "-p", "-f", "--mount-proc", "--kill-child", sys.executable, "-c", HOLD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    name = ""
    try:
        assert process.stdout is not None
        name, pid = process.stdout.readline().split()
        yield name, int(pid)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # unshare and the holder in its namespace
        process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while name and held_by_a_living_process(name):  # the holder dies a moment after unshare
            assert time.monotonic() < deadline, "the holder outlived its PID namespace by 10 s"
            time.sleep(0.01)


@needs_pid_namespace
def test_a_signal_held_in_another_pid_namespace_is_never_reclaimed(caplog) -> None:
    with held_in_new_pid_namespace() as (name, pid):
        assert pid == 1, "the holder is init of its namespace: its pid means nothing here"
        with caplog.at_level(logging.WARNING, logger="fd_platforms"):
            assert name not in reclaim_stale_signals()
        assert (SHM_DIR / name).exists() and "reclaiming" not in caplog.text
        with pytest.raises(CacheSignalError, match="in use by a running engine: a living process holds it"):
            CacheReadySignal.create(2, name)
        with CacheReadySignal.attach(name) as attached:
            assert attached.slots() == (0, 1), "the holder's signal is intact"
    # SIGKILL ran no cleanup; the kernel dropped the holder's lock: now the signal is provably dead.
    reclaim_stale_signals()  # (a run beside this suite may have swept it first: either way it is gone)
    assert not (SHM_DIR / name).exists()


@needs_pid_namespace
def test_a_run_in_another_pid_namespace_keeps_its_signal_while_a_run_outside_sweeps() -> None:
    engine = subprocess.Popen(
        [
            "unshare",
            "-p",
            "-f",
            "--mount-proc",
            "--kill-child",
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
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=clean_env(),
    )
    try:
        assert engine.stderr is not None
        first = engine.stderr.readline()
        while without_sweep(first) == [] and first:  # a suite beside this one may leave odd entries to warn of
            first = engine.stderr.readline()
        assert "engine instance fd_cache_ready.1-" in first, first  # the engine is pid 1 in there
        name = first.rsplit(" ", 1)[1].strip()
        sweep = subprocess.run(
            [sys.executable, "-c", "from fd_platforms.ipc.cache_signal import reclaim_stale_signals as r; print(r())"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert sweep.returncode == 0, sweep.stderr
        assert name not in sweep.stdout and "reclaiming" not in sweep.stderr
        _, rest = engine.communicate(timeout=120)
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.communicate(timeout=30)
    assert engine.returncode == 0, first + rest
    assert not (SHM_DIR / name).exists()


@contextmanager
def odd_entries(tag: str) -> Iterator[dict[str, str]]:
    """Entries under the signal prefix that are not signals this user may touch: name -> what it is."""
    base = f"{SIGNAL_PREFIX}test-odd-{tag}-{os.getpid()}"
    made: dict[str, str] = {}
    try:
        os.mkfifo(SHM_DIR / f"{base}-fifo")
        made[f"{base}-fifo"] = "is a FIFO"
        (SHM_DIR / f"{base}-dir").mkdir()
        made[f"{base}-dir"] = "is a directory"
        (SHM_DIR / f"{base}-empty").touch()
        made[f"{base}-empty"] = "holds 0 bytes"
        os.symlink("/etc/hostname", SHM_DIR / f"{base}-link")
        made[f"{base}-link"] = "is a symlink"
        (SHM_DIR / f"{base}-foreign").write_bytes(b"not a signal, just 64 bytes of someone's data".ljust(64))
        made[f"{base}-foreign"] = "is not a complete fd-platforms cache-ready signal"
        if os.geteuid() == 0:  # only root can give a file to another user
            other = SHM_DIR / f"{base}-other-user"
            other.write_bytes(bytes(64))
            os.chown(other, 65534, 65534)
            other.chmod(0o600)
            made[other.name] = "belongs to uid 65534"
        yield made
    finally:
        for name in made:
            path = SHM_DIR / name
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            elif path.exists() or path.is_symlink():
                path.unlink()


def test_the_sweep_leaves_every_odd_entry_alone_with_one_warning(caplog) -> None:
    with odd_entries("sweep") as made:
        before = {name: os.lstat(SHM_DIR / name) for name in made}
        with caplog.at_level(logging.WARNING, logger="fd_platforms"):
            assert not set(reclaim_stale_signals()) & set(made)
        for name, info in before.items():
            after = os.lstat(SHM_DIR / name)
            assert (after.st_ino, after.st_mode, after.st_size) == (info.st_ino, info.st_mode, info.st_size), name
        # (a concurrent test run's stale signal may be reclaimed too, with its own line: not counted)
        warnings = [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING and "reclaiming" not in r.getMessage()
        ]
        assert len(warnings) == 1, warnings
        for name, what in made.items():
            assert f"/dev/shm/{name} {what}" in warnings[0]


def test_fd_platforms_run_succeeds_beside_odd_entries() -> None:
    with odd_entries("run") as made:
        done = run_cli("--model", QWEN, "--device-memory", "256MiB")
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        [warning] = [line for line in done.stderr.splitlines() if ": WARNING: left " in line]
        assert all(f"/dev/shm/{name} {what}" in warning for name, what in made.items()), warning
        assert all((SHM_DIR / name).exists() or (SHM_DIR / name).is_symlink() for name in made)


def test_segments_never_enter_the_resource_tracker(signal_name: str, monkeypatch) -> None:
    """Python < 3.13's tracker keeps a set per process tree; any register/unregister of ours can race."""
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(resource_tracker, "register", lambda name, kind: calls.append(("register", name)))
    monkeypatch.setattr(resource_tracker, "unregister", lambda name, kind: calls.append(("unregister", name)))
    with CacheReadySignal.create(2, signal_name) as owner:
        with CacheReadySignal.attach(signal_name) as attached:
            attached.set(0)
        assert owner.slots() == (1, 0)
    reclaim_stale_signals()
    assert calls == []


def test_an_attacher_exiting_under_sigkill_leaves_no_tracker_noise(signal_name: str) -> None:
    """The tracker's 'leaked shared_memory' warnings and KeyError tracebacks came from our names."""
    with CacheReadySignal.create(1, signal_name):
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                textwrap.dedent(f"""
                import os, signal
                from fd_platforms.ipc.cache_signal import CacheReadySignal
                attached = CacheReadySignal.attach({signal_name!r})
                attached.set(0)
                os.kill(os.getpid(), signal.SIGKILL)
            """),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert done.returncode == -9
        assert "resource_tracker" not in done.stderr and "Traceback" not in done.stderr
        assert (SHM_DIR / signal_name).exists()
    assert not Path(SHM_DIR / signal_name).exists()
