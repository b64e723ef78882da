"""A process the tests start warm (``tests/support/warm_processes.py``) matches a spawned one in what they rely on."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import warm_processes
from warm_processes import WarmProcess, warm, what_a_child_sees

pytestmark = pytest.mark.slow  # a spawned child imports Paddle


def report_of(process_class: Any, probe: str) -> dict[str, Any]:
    ours, theirs = multiprocessing.Pipe()
    child = process_class(target=what_a_child_sees, args=(probe, theirs))
    child.start()
    theirs.close()
    assert ours.poll(120), "the child sent no report"
    report: dict[str, Any] = ours.recv()
    child.join(30)
    assert child.exitcode == 0
    return report


@pytest.fixture
def shm_probe() -> Iterator[str]:
    """A file in this test process's ``/dev/shm`` that a child must see."""
    name = f"fd-test-warm-{secrets.token_hex(4)}"
    path = Path("/dev/shm") / name
    path.write_bytes(b"")
    yield name
    path.unlink()


@pytest.fixture
def reports(shm_probe: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """What a warm child and a spawned child saw, started alike after the test changed its environment."""
    monkeypatch.setenv("FD_WARM_TEST", secrets.token_hex(4))  # read after Paddle's import: the child must see it
    assert isinstance(warm.Process(target=os.getpid), WarmProcess), "an environment differing in FD_* starts warm"
    return {
        "warm": report_of(warm.Process, shm_probe),
        "spawned": report_of(multiprocessing.get_context("spawn").Process, shm_probe),
    }


def test_a_warm_child_preloaded_paddle_and_sees_what_a_spawned_one_sees(reports: dict[str, dict[str, Any]]) -> None:
    warm_one, spawned = reports["warm"], reports["spawned"]
    assert warm_one["paddle preloaded"] and not spawned["paddle preloaded"]
    assert warm_one["paddle works"] and spawned["paddle works"]
    for key in (
        "handlers",
        "kernel signal masks",
        "environment",
        "cwd",
        "sys.path",
        "/dev/shm",
        "mount namespace",
        "stdout, stderr",
    ):
        assert warm_one[key] == spawned[key], key
    assert warm_one["environment"]["FD_WARM_TEST"] == os.environ["FD_WARM_TEST"], "the environment of start()"
    assert warm_one["/dev/shm"][1], "the warm child sees this test process's /dev/shm"
    assert os.readlink("/proc/self/ns/mnt") == warm_one["mount namespace"]
    assert warm_one["stdout, stderr"] == [(os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in (1, 2)]
    assert len({warm_one["pid"], spawned["pid"], os.getpid()}) == 3
    assert warm_one["python threads"] == spawned["python threads"] == 1
    # the only thread a spawned child has beyond its main one is OpenBLAS's (numpy's) server thread, which
    # OpenBLAS's fork handler leaves out of a forked child and starts again at its first threaded call
    assert warm_one["threads"] == 1 and spawned["threads"] <= 2


def test_a_child_whose_environment_paddle_reads_differs_is_spawned(monkeypatch: pytest.MonkeyPatch) -> None:
    warm.Process(target=os.getpid)  # the server runs, with this environment
    monkeypatch.setenv("FLAGS_fd_warm_test", "1")  # a FLAGS_* variable Paddle reads at import
    assert not isinstance(warm.Process(target=os.getpid), WarmProcess)
    monkeypatch.delenv("FLAGS_fd_warm_test")
    assert isinstance(warm.Process(target=os.getpid), WarmProcess)


def test_stopping_the_server_reaps_it() -> None:
    warm.Process(target=os.getpid)
    server = multiprocessing.forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    assert server is not None and Path(f"/proc/{server}").exists()
    warm_processes.stop_server()
    assert not warm_processes.server_running()
    assert not Path(f"/proc/{server}").exists(), "reaped: no zombie left"
