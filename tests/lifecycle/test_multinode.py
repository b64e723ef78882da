"""One engine over several nodes: ``fd-platforms run --nnodes N --node-rank I --master HOST:PORT``.

Each "node" is its own ``fd-platforms run`` in its own session on 127.0.0.1 (its own engine,
cache-ready signal, cache manager and ``python -m paddle.distributed.launch``, which starts its
workers), with its own ``--device-memory``; they agree over the launcher's process group (gloo).
Faults end in a typed error naming the node or rank and what was waited for, within ``--timeout``,
with nothing left running or in ``/dev/shm``. A launcher's start costs seconds: the runs here are
the few the failure table of docs/multinode.md needs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import shm_entries
from run_helpers import ROOT, Run, clean_env, free_port, main_in_process, run_cli, started, without_sweep

from fd_platforms.cli.run_command import MAX_CYCLES
from fd_platforms.lifecycle.launcher import launcher_command
from fd_platforms.lifecycle.spec import NodeFlags, RunSpec
from fd_platforms.rules.config import CacheConfig, DeployConfig, ParallelConfig, SchedulerConfig, load_model_config

launches = pytest.mark.slow  # a launcher and its workers per node: left out of -m "not slow"

LLAMA = "examples/llama-3.1-8b"
SMALL = ("--model", LLAMA, "--tp", "2", "--device-memory", "64MiB")  # one rank per node, 28 blocks of 2 MiB


def left_by(*engine_pids: int) -> set[str]:
    """Our /dev/shm entries made by the runs whose engines had these pids (every name carries it):
    other tests or runs on this machine cannot change the answer."""
    return {name for name in shm_entries() if any(f".{pid}-" in name for pid in engine_pids)}


def engine_pid(stderr: str) -> int:
    """The engine's pid, from its cache-ready signal's name in its first progress line."""
    found = re.search(r"engine instance fd_cache_ready\.(\d+)-\S+ \(its cache-ready signal\)", stderr)
    assert found, stderr
    return int(found.group(1))


def worker_pids(stderr: str) -> list[int]:
    """The pids of the workers the launcher started, from the engine's progress line."""
    found = re.search(r"the launcher started \d+ worker\(s\) \(pid ([\d, ]+)\)", stderr)
    assert found, stderr
    return [int(pid) for pid in found.group(1).split(", ")]


def running(pids: list[int], within: float = 10.0) -> list[int]:
    """Those of ``pids`` still running after ``within`` seconds at most (a process in its last moment of exit, its
    parent gone, is given that time to end)."""
    deadline = time.monotonic() + within
    while True:
        alive = []
        for pid in pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            if stat[stat.rfind(")") + 2] not in "ZX":
                alive.append(pid)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def node_args(master: str, node: int, nnodes: int, *extra: str) -> tuple[str, ...]:
    return ("--nnodes", str(nnodes), "--node-rank", str(node), "--master", master, *extra)


@contextmanager
def nodes(*commands: tuple[str, ...]) -> Iterator[list[Run]]:
    """Every command as its own ``fd-platforms run`` at once, each in a session of its own."""
    with ExitStack() as stack:
        yield [stack.enter_context(started(*command)) for command in commands]


def finished_reports(runs: list[Run]) -> list[dict[str, Any]]:
    """Each run's JSON report; each must have exited 0 leaving no process of its session running."""
    out = []
    for run in runs:
        stdout, stderr = run.process.communicate(timeout=120)
        assert run.process.returncode == 0, stderr
        assert running(run.group()) == [], "the launcher ends with the engine"
        assert "No ccache found" not in stderr, "the workers import Paddle quietly, as spawned ones do"
        out.append(json.loads(stdout))
    return out


def own_plan(memory: str, *args: str) -> int:
    """The blocks ``fd-platforms plan`` gives one rank with ``memory`` (``args``: the model and tp)."""
    done = main_in_process("plan", *args, "--device-memory", memory, "--json", FD_PLATFORM="cpu")
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["num_blocks"])


@launches
def test_the_guides_two_machine_commands_agree_on_machine_1s_plan_and_node_0_reports_every_rank() -> None:
    """docs/multinode.md's ```bash block (the only one anywhere in the docs), with 127.0.0.1 and a free port: each
    launcher starts two workers, and each node's cache manager (role decode) publishes the cache they attach to."""
    guide = (ROOT / "docs" / "multinode.md").read_text()
    (block,) = re.findall(r"^```bash\n(.*?)^```", guide, re.DOTALL | re.MULTILINE)
    master = f"127.0.0.1:{free_port()}"
    commands = [line.replace("10.0.0.1:29500", master).split() for line in block.splitlines() if line.strip()]
    assert len(commands) == 2 and all(words[:2] == ["fd-platforms", "run"] for words in commands), commands
    with nodes(*[(*words[2:], "--json") for words in commands]) as runs:
        first, second = finished_reports(runs)
    model = ("--model", LLAMA, "--tp", "4")
    assert all(" ".join(model) in " ".join(words) for words in commands)
    (big, small) = (words[words.index("--device-memory") + 1] for words in commands)
    expected, bigger = own_plan(small, *model), own_plan(big, *model)
    assert expected < bigger, "the nodes' own plans differ"
    assert f"Both report {expected} blocks per rank, machine 1's plan" in guide
    for report in (first, second):
        assert {rank["num_blocks"] for rank in report["ranks"]} == {expected}
        bound = report["nodes"]
        assert (bound["bound_by_node"], bound["bound_by_rank"], bound["bound_by_global_rank"]) == (1, 0, 2)
        assert bound["bound_by_blocks"] == expected and bound["agree_seconds"] > 0
    placed = [(r["node"], r["rank"], r["global_rank"], r["planned_blocks"]) for r in first["ranks"]]
    assert placed == [(0, 0, 0, bigger), (0, 1, 1, bigger), (1, 0, 2, expected), (1, 1, 3, expected)]
    assert first["nodes"]["all_ranks"] and not second["nodes"]["all_ranks"]
    assert [(r["node"], r["global_rank"]) for r in second["ranks"]] == [(1, 2), (1, 3)]
    assert all(r["join_seconds"] > 0 for r in first["ranks"])
    attached = {(r["allocated_by"], r["attached_tensors"], r["verified"]) for r in first["ranks"]}
    assert attached == {("cache manager", 64, True)}
    assert first["manager_pid"] != second["manager_pid"], "each node has its own cache manager"
    assert left_by(*[run.process.pid for run in runs]) == set()


@launches
def test_a_node_that_never_comes_is_named_by_the_launchers_wait_within_the_timeout() -> None:
    master = f"127.0.0.1:{free_port()}"
    sent = time.monotonic()
    with started(*SMALL, "--timeout", "3", *node_args(master, 0, 2)) as run:
        code, stderr = run.finish()
        assert running(run.group()) == [], "the launcher is stopped with the engine"
    assert code == 1, stderr
    assert time.monotonic() - sent < 20
    (line,) = without_sweep(stderr)[-1:]
    assert re.fullmatch(
        r"fd-platforms: error: node 0 of 2: python -m paddle\.distributed\.launch \(pid \d+\) started 0 of this node's "
        rf"1 worker\(s\) within 3 s; it starts them once all 2 nodes have come to --master {master} \(its last line: "
        r"'[^']+'\)\. Fix: start each node with --nnodes 2, its own --node-rank and --master \S+; raise --timeout .*",
        line,
    ), line
    assert left_by(engine_pid(stderr)) == set()


@launches
def test_nodes_started_with_another_model_are_refused_naming_both_values() -> None:
    master = f"127.0.0.1:{free_port()}"
    with nodes(
        (*SMALL, "--timeout", "30", *node_args(master, 0, 2)),
        ("--model", "examples/qwen3-30b-a3b", *SMALL[2:], "--timeout", "30", *node_args(master, 1, 2)),
    ) as runs:
        (code0, err0), (code1, err1) = [run.finish() for run in runs]
    assert (code0, code1) == (2, 2), err0 + err1
    assert (
        "ConfigError: --model='llama-3.1-8b' is not valid; allowed: the same on every node; node 1 (127.0.0.1) rank 0 "
        "(global rank 1) was started with --model='qwen3-30b-a3b'"
    ) in err0
    assert "node 0 (127.0.0.1) rank 0 (global rank 0) was started with --model='llama-3.1-8b'" in err1
    assert left_by(*[run.process.pid for run in runs]) == set()


@pytest.fixture
def runs_temp_folder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temp folder (``TMPDIR``) of the test's for the runs it starts, removed after it with what a killed run left
    there. Made in the machine's and not under ``tmp_path``, whose depth would put a launcher's socket
    (``fd-platforms-launch-*/engine``) past the 107 bytes an AF_UNIX path may have."""
    folder = Path(tempfile.mkdtemp(prefix="fd-test-runs-"))
    monkeypatch.setenv("TMPDIR", str(folder))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


CYCLING = (*SMALL, "--timeout", "12", "--cycles", str(MAX_CYCLES))


@launches
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_node_killed_or_stopped_mid_run_fails_the_other_within_its_timeout(
    how: signal.Signals, runs_temp_folder: Path
) -> None:
    """SIGKILL of node 1's process group (its engine and launcher; the launcher's workers are in sessions of their
    own and stop once their engine is gone), or SIGTERM to its engine, in its third cycle: node 0's rank names node
    1's rank once it has not come to a cycle within --timeout. Node 1 stopped by SIGTERM cleans up and exits 143;
    what a killed one left is swept by the next run on that node. No worker of either node is left running. A killed
    engine cannot remove its launcher's folder (``fd-platforms-launch-*``): the runs' temp folder is the test's."""
    master = f"127.0.0.1:{free_port()}"
    with nodes((*CYCLING, *node_args(master, 0, 2)), (*CYCLING, *node_args(master, 1, 2))) as (first, second):
        second.read_until(r"cycle 3: cleared")
        if how == signal.SIGKILL:
            os.killpg(second.process.pid, how)
        else:
            second.process.send_signal(how)
        hurt = time.monotonic()
        code, stderr = first.finish()
        took = time.monotonic() - hurt
        other_code, other_stderr = second.finish()
        pids = [run.process.pid for run in (first, second)]
    assert running(worker_pids(stderr) + worker_pids(other_stderr)) == []
    assert code == 1 and took < 12 + 10, (code, took, stderr)
    assert re.search(
        r"NodeError: node 0 \(127\.0\.0\.1\) rank 0 \(global rank 0\): node 1 \(127\.0\.0\.1\) rank 0 "
        r"\(global rank 1\) did not come to cycle \d+ within 12 s",
        stderr,
    ), stderr
    assert "Traceback" not in stderr, "no Python or Paddle C++ traceback reaches the user"
    assert left_by(pids[0]) == set()
    if how == signal.SIGTERM:
        assert other_code == 143
    else:
        run_cli(*SMALL)  # the next run on that node sweeps what the killed one left
    assert left_by(pids[1]) == set()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--nnodes", "2"), "--node-rank is not given; allowed: required with --nnodes 2"),
        (("--nnodes", "2", "--node-rank", "0"), "--master is not given; allowed: required with --nnodes 2"),
        (
            ("--master", "127.0.0.1:29500"),
            "--master='127.0.0.1:29500' is not valid; allowed: only with --nnodes 2 or more",
        ),
        (("--nnodes", "2", "--node-rank", "2", "--master", "h:1"), "--node-rank=2 is not valid; allowed: 0 to 1"),
        (("--nnodes", "0"), "--nnodes=0 is not valid; allowed: 1 to 4096"),
        (("--nnodes", "3", "--node-rank", "0", "--master", "h:1"), "allowed: a number of nodes that divides --tp 2"),
        (("--nnodes", "2", "--node-rank", "0", "--master", "h"), "--master='h' is not valid; allowed: HOST:PORT"),
        (("--nnodes", "2", "--node-rank", "0", "--master", "h:65535"), "--master='h:65535' is not valid"),
        (("--nnodes", "2", "--node-rank", "0", "--master", "[::1]:5"), "--master='[::1]:5' is not valid"),
        (
            ("--nnodes", "2", "--node-rank", "0", "--master", "h:1", "--ranks", "2"),
            "--ranks=2 is not valid; allowed: 1 to tensor_parallel_size=2 / --nnodes 2 = 1",
        ),
        (
            ("--nnodes", "2", "--node-rank", "1", "--master", "nosuchhost.invalid:29500"),
            "--master='nosuchhost.invalid:29500' is not valid; allowed: a host this machine resolves",
        ),
    ],
)
def test_bad_node_flags_are_one_line_naming_the_flag_before_anything_starts(
    args: tuple[str, ...], message: str
) -> None:
    done = main_in_process("run", *SMALL, *args, FD_PLATFORM="cpu")
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("device_type", "device_ids", "devices"), [("cpu", (), []), ("gpu", (4, 5), ["--devices", "4,5"])]
)
def test_each_node_starts_paddles_launcher_with_its_place_and_ranks_and_the_runs_worker_as_its_script(
    device_type: str, device_ids: tuple[int, ...], devices: list[str]
) -> None:
    """On an accelerator ``--devices`` names each rank's device by its visible label, as the run names its tensors."""
    model = load_model_config(ROOT / LLAMA)
    deploy = DeployConfig(ROOT / LLAMA, model, CacheConfig(), SchedulerConfig(), ParallelConfig(6))
    nodes = NodeFlags(nnodes=3, node_rank=1, master="10.0.0.1:29500")
    spec = RunSpec(deploy, "x", device_type, 2, timeout=5.0, nodes=nodes, device_ids=device_ids)
    assert launcher_command(spec, "/logs") == [
        sys.executable,
        "-m",
        "paddle.distributed.launch",
        "--nnodes",
        "3",
        "--rank",
        "1",
        "--master",
        "10.0.0.1:29500",
        "--nproc_per_node",
        "2",
        "--log_dir",
        "/logs",
        *devices,
        sys.executable,
        "-u",
        "-m",
        "fd_platforms.lifecycle.launched",
    ]


def test_the_runs_launched_worker_started_by_hand_is_one_line_naming_what_starts_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fd_platforms.lifecycle.launched"],
        check=False,
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        (
            "fd_platforms.lifecycle.launched: started outside fd-platforms run (FD_PLATFORMS_ENGINE and "
            "PADDLE_LOCAL_RANK are not set). Fix: run fd-platforms run --nnodes N --node-rank I --master HOST:PORT, "
            "which starts it through python -m paddle.distributed.launch"
        )
    ]
