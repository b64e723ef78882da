"""Agreeing inside the process group Paddle's launcher made: ``Cluster.current``.

The real ``python -m paddle.distributed.launch`` starts ``tests/support/launched_worker.py`` (a
FastDeploy-style worker) on this machine: one launcher with two processes, or two launchers as two
nodes on their own loopback addresses (``--ips 127.0.0.2,127.0.0.3`` with ``--host``/``POD_IP``
each: the launcher refuses 127.0.0.1 in a multi-node ``--ips``). Each rank gets its own device
memory; every rank must end with the smallest plan, and nothing may be left running.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from run_helpers import ROOT, clean_env, free_port

from fd_platforms.contract.errors import ConfigError, NodeError
from fd_platforms.engine import Cluster
from fd_platforms.fastdeploy.signals import PROFILE_BLOCK_NUM, FastDeploySignal

launcher = pytest.mark.slow  # the real launcher: left out of -m "not slow"

WORKER = Path(__file__).resolve().parents[1] / "support" / "launched_worker.py"
LAUNCH_SECONDS = 120  # a launcher and its workers, start to exit (about 8 s here)


def launch(
    tmp: Path,
    name: str,
    *worker_args: str,
    launcher: Sequence[str] = ("--nproc_per_node", "2"),
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """One ``paddle.distributed.launch`` of the worker, its results in ``tmp/out``."""
    (tmp / "out").mkdir(exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "paddle.distributed.launch",
        *launcher,
        "--log_dir",
        str(tmp / f"log-{name}"),
        str(WORKER),
        "--out",
        str(tmp / "out"),
        *worker_args,
    ]
    environ = {**clean_env(), "FD_PLATFORM": "cpu", **(env or {})}
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(*launchers: subprocess.Popen[str]) -> list[int]:
    """Each launcher's exit code (every wait bounded)."""
    for process in launchers:
        try:
            process.communicate(timeout=LAUNCH_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.communicate()
            pytest.fail(f"a launcher did not end within {LAUNCH_SECONDS} s")
    return [process.returncode for process in launchers]


def results(tmp: Path, world: int) -> list[dict]:
    return [json.loads((tmp / "out" / f"rank{rank}.json").read_text()) for rank in range(world)]


def still_running(tmp: Path) -> list[str]:
    """Processes whose command line names this test's folder (its launchers and workers)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(tmp) in command:
            found.append(f"{pid}: {command}")
    return found


def two_nodes(tmp: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Launcher arguments for nodes 0 and 1 on 127.0.0.2 and 127.0.0.3, on a free port."""
    port = str(free_port("127.0.0.2"))
    return tuple(
        ("--ips", "127.0.0.2,127.0.0.3", "--host", host, "--start_port", port, "--nproc_per_node", "1")
        for host in ("127.0.0.2", "127.0.0.3")
    )  # type: ignore[return-value]


@contextmanager
def engines(*suffixes: str) -> Iterator[list[FastDeploySignal]]:
    """Each node's stand-in FastDeploy engine: its ``get_profile_block_num`` word, 0 until handed the count."""
    with ExitStack() as stack:
        yield [stack.enter_context(FastDeploySignal.create(PROFILE_BLOCK_NUM, suffix, 1)) for suffix in suffixes]


@launcher
@pytest.mark.parametrize("init", ["fleet", "none"])
def test_two_processes_of_one_launcher_agree_on_the_smallest_plan_across_a_group_restart(tmp_path, init) -> None:
    suffix = f"t{secrets.token_hex(4)}"
    with engines(suffix) as (engine,):
        launcher = launch(
            tmp_path, "one", "--memory-mib", "96,64", "--init", init, "--restart", env={"FD_TEST_ENGINE_SUFFIX": suffix}
        )
        assert finish(launcher) == [0], launcher.stdout
        ranks = results(tmp_path, 2)
        assert engine.get(0) == 19  # local rank 0 handed the agreed count to the engine
    assert [rank["planned"] for rank in ranks] == [28, 19]
    for rank in ranks:
        assert rank["uses"] == [19, 19]  # before and after the group was replaced
        assert rank["bound_by"] == "node 0 (127.0.0.1) rank 1 (global rank 1)"
        assert rank["env_changed"] == []  # byte for byte: no PADDLE_*, FLAGS_* or other variable written
        assert rank["user_all_reduce"] == 1000  # the user's own MIN on the same group still works
        assert rank["old_group_unusable"] is True  # the replaced group really was gone
    assert still_running(tmp_path) == []


@launcher
def test_two_launchers_as_two_nodes_agree_and_each_node_hands_its_engine_the_count(tmp_path) -> None:
    node0, node1 = two_nodes(tmp_path)
    suffixes = [f"t{secrets.token_hex(4)}" for _ in range(2)]
    with engines(*suffixes) as words:
        launchers = [
            launch(
                tmp_path,
                f"node{node}",
                "--memory-mib",
                "64,96",
                launcher=args,
                env={"POD_IP": host, "FD_TEST_ENGINE_SUFFIX": suffix},
            )
            for node, (args, host, suffix) in enumerate(
                zip((node0, node1), ("127.0.0.2", "127.0.0.3"), suffixes, strict=True)
            )
        ]
        assert finish(*launchers) == [0, 0], [process.stdout for process in launchers]
        assert [word.get(0) for word in words] == [19, 19]
    ranks = results(tmp_path, 2)
    assert [(rank["node"], rank["local"], rank["planned"], rank["uses"]) for rank in ranks] == [
        (0, 0, 19, [19]),
        (1, 0, 28, [19]),
    ]
    assert ranks[1]["me"] == "node 1 (127.0.0.3) rank 0 (global rank 1)"
    assert all(rank["env_changed"] == [] and rank["user_all_reduce"] == 1000 for rank in ranks)
    assert still_running(tmp_path) == []


@launcher
def test_a_rank_that_never_comes_is_named_within_the_timeout_and_nothing_is_left(tmp_path) -> None:
    started = time.monotonic()
    launcher = launch(tmp_path, "absent", "--memory-mib", "96,64", "--absent", "1", "--timeout", "5")
    assert finish(launcher) != [0]
    error = json.loads((tmp_path / "out" / "rank0.json").read_text())["error"]
    assert error.startswith(
        "NodeError: node 0 (127.0.0.1) rank 0 (global rank 0): node 0 (127.0.0.1) rank 1 (global "
        "rank 1) did not come to comparing every node's facts within 5 s. Fix: check those ranks' output"
    )
    assert time.monotonic() - started < 60  # the launcher stopped the absent rank once rank 0 failed
    assert still_running(tmp_path) == []


def test_cluster_current_outside_any_group_names_the_launcher(monkeypatch) -> None:
    for name in ("PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID", "PADDLE_GLOBAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="PADDLE_TRAINERS_NUM is not given") as caught:
        Cluster.current(facts={"tp": 2}, timeout=5)
    assert "python -m paddle.distributed.launch" in str(caught.value)


@pytest.mark.slow
def test_a_rank_whose_groups_store_never_listens_is_a_node_error_within_its_timeout(monkeypatch) -> None:
    """Paddle's store client retries a refused connection holding the interpreter lock, past any bound of ours: a
    rank other than 0 waits for the store's host to listen first, bounded."""
    launched = {"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "2", "PADDLE_MASTER": f"127.0.0.1:{free_port()}"}
    for name, value in launched.items():
        monkeypatch.setenv(name, value)
    import paddle  # noqa: F401 - imported before the clock starts

    started = time.monotonic()
    said = r"^global rank 1: joining the launcher's process group did not complete within 1 s"
    with pytest.raises(NodeError, match=said):
        Cluster.current(facts={"tp": 2}, timeout=1)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("facts", "timeout", "field"),
    [
        ([("tp", 2)], 5, "facts"),
        ({"tp": object()}, 5, "facts"),
        ({"tp": 2}, 0, "timeout"),
        ({"tp": 2}, True, "timeout"),
    ],
)
def test_cluster_current_checks_its_arguments_before_touching_any_group(facts, timeout, field) -> None:
    with pytest.raises(ConfigError) as caught:
        Cluster.current(facts=facts, timeout=timeout)
    assert caught.value.field == field
