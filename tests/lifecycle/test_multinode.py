"""One engine over several nodes: ``fd-platforms run --nnodes N --node-rank I --master HOST:PORT``.

Each "node" is its own ``fd-platforms run`` in its own session on 127.0.0.1 (its own engine,
cache-ready signal and children), with its own ``--device-memory``; they agree through Paddle's
collective runtime (gloo). Faults end in a typed error naming the node and what was waited for,
within ``--timeout``, and nothing left in ``/dev/shm``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import shm_entries
from fd_platforms.contract.errors import ConfigError
from fd_platforms.engine import Cluster, NodeSpec, free_master
from fd_platforms.engine.nodes import parse_master
from run_helpers import ROOT, Run, main_in_process, run_cli, started, without_sweep

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"

LLAMA = "examples/llama-3.1-8b"
SMALL = ("--model", LLAMA, "--tp", "2", "--device-memory", "64MiB")  # one rank per node, 28 blocks of 2 MiB


def left_by(*engine_pids: int) -> set[str]:
    """Our /dev/shm entries made by the runs whose engines had these pids (every name carries it):
    other tests or runs on this machine cannot change the answer."""
    return {name for name in shm_entries() if any(f".{pid}-" in name for pid in engine_pids)}


def engine_pid(stderr: str) -> int:
    """The engine's pid, from its cache-ready signal's name in its progress lines."""
    found = re.search(r"engine instance fd_cache_ready\.(\d+)-\S+ \(its cache-ready signal\)", stderr)
    assert found, stderr
    return int(found.group(1))


def node_args(master: str, node: int, nnodes: int, *extra: str) -> tuple[str, ...]:
    return ("--nnodes", str(nnodes), "--node-rank", str(node), "--master", master, *extra)


@contextmanager
def nodes(*commands: tuple[str, ...]) -> Iterator[list[Run]]:
    """Every command as its own ``fd-platforms run`` at once, each in a session of its own."""
    with ExitStack() as stack:
        yield [stack.enter_context(started(*command)) for command in commands]


def finish_all(runs: list[Run]) -> list[tuple[int, str]]:
    return [run.finish() for run in runs]


def own_plan(memory: str, *args: str) -> int:
    """The blocks ``fd-platforms plan`` gives one rank with ``memory`` (``args``: the model and tp)."""
    done = main_in_process("plan", *args, "--device-memory", memory, "--json", FD_PLATFORM="cpu")
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["num_blocks"])


def test_two_nodes_agree_on_the_smaller_nodes_plan_and_node_0_reports_every_rank() -> None:
    """Two ranks per node, each node with its own cache manager (role decode) that every rank attaches to."""
    master, model = free_master(), ("--model", LLAMA, "--tp", "4")
    with nodes(
        (*model, "--device-memory", "512MiB", "--role", "decode", "--json", *node_args(master, 0, 2)),
        (*model, "--device-memory", "384MiB", "--role", "decode", "--json", *node_args(master, 1, 2)),
    ) as runs:
        first, second = finished_reports(runs)
        pids = [run.process.pid for run in runs]
    expected = own_plan("384MiB", *model)
    assert expected < own_plan("512MiB", *model), "the nodes' own plans differ"
    for report in (first, second):
        assert {rank["num_blocks"] for rank in report["ranks"]} == {expected}
        bound = report["nodes"]
        assert (bound["bound_by_node"], bound["bound_by_rank"], bound["bound_by_global_rank"]) == (1, 0, 2)
        assert bound["bound_by_blocks"] == expected and bound["agree_seconds"] > 0
    assert [(r["node"], r["rank"], r["global_rank"]) for r in first["ranks"]] == [(0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)]
    assert [r["planned_blocks"] for r in first["ranks"]] == [own_plan("512MiB", *model)] * 2 + [expected] * 2
    assert first["nodes"]["all_ranks"] and not second["nodes"]["all_ranks"]
    assert [(r["node"], r["global_rank"]) for r in second["ranks"]] == [(1, 2), (1, 3)]
    assert all(r["join_seconds"] > 0 for r in first["ranks"])
    assert {(r["allocated_by"], r["attached_tensors"], r["verified"]) for r in first["ranks"]} == {("cache manager", 64, True)}
    assert first["manager_pid"] != second["manager_pid"], "each node has its own cache manager"
    assert left_by(*pids) == set()


def finished_reports(runs: list[Run]) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        stdout, stderr = run.process.communicate(timeout=120)
        assert run.process.returncode == 0, stderr
        out.append(json.loads(stdout))
    return out


def test_the_guides_two_machine_commands_agree_on_machine_1s_plan() -> None:
    """docs/multinode.md's ```bash block (the only one anywhere in the docs), with 127.0.0.1 and a free port."""
    (block,) = re.findall(r"^```bash\n(.*?)^```", (ROOT / "docs" / "multinode.md").read_text(), re.S | re.M)
    master = free_master()
    commands = [line.replace("10.0.0.1:29500", master).split() for line in block.splitlines() if line.strip()]
    assert len(commands) == 2 and all(words[:2] == ["fd-platforms", "run"] for words in commands), commands
    with nodes(*[(*words[2:], "--json") for words in commands]) as runs:
        reports = finished_reports(runs)
    memory = commands[1][commands[1].index("--device-memory") + 1]
    expected = own_plan(memory, "--model", LLAMA, "--tp", "2")
    assert [rank["num_blocks"] for report in reports for rank in report["ranks"]] == [expected] * 3
    assert f"Both report {expected} blocks per rank, machine 1's plan" in (ROOT / "docs" / "multinode.md").read_text()
    assert left_by(*[run.process.pid for run in runs]) == set()


def test_three_nodes_agree_and_the_table_names_the_binding_rank(tmp_path: Path) -> None:
    config = json.loads((ROOT / LLAMA / "config.json").read_text())
    config.update(num_attention_heads=48, num_key_value_heads=12, hidden_size=6144, _name_or_path="three-way")
    (tmp_path / "config.json").write_text(json.dumps(config))
    master, model = free_master(), ("--model", str(tmp_path), "--tp", "3")
    memories = ("512MiB", "256MiB", "384MiB")
    with nodes(*[(*model, "--device-memory", memory, *node_args(master, node, 3)) for node, memory in enumerate(memories)]) as runs:
        finished = [run.process.communicate(timeout=120) for run in runs]
    for run, (_, stderr) in zip(runs, finished):
        assert run.process.returncode == 0, stderr
    expected = own_plan("256MiB", *model)
    master_table = finished[0][0]
    assert f"every rank uses the {expected} blocks of node 1 rank 0 (global rank 1)" in master_table
    rows = [line.split() for line in master_table.splitlines()[3:]]
    assert [row[:2] for row in rows] == [["0", "0"], ["1", "1"], ["2", "2"]], master_table
    assert "node 0 shows every node's ranks" in finished[2][0]
    for out, _ in finished:  # every node counts the engine's ranks the same way
        assert out.startswith("platform cpu, model three-way, 3 rank(s) on 3 nodes, 1 on this node, role mixed"), out
    assert left_by(*[run.process.pid for run in runs]) == set()


def test_a_node_that_never_joins_is_named_within_the_timeout() -> None:
    master = free_master()
    sent = time.monotonic()
    done = run_cli(*SMALL, "--timeout", "3", *node_args(master, 0, 2))
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - sent < 20
    (line,) = without_sweep(done.stderr)[-1:]
    assert re.search(rf"rank 0: NodeError: node 0 rank 0 \(global rank 0\): waited 3 s at the master {master} "
                     r"for every node to join; missing: node 1 \(0 of 1 ranks\)\. Fix: .*--timeout", line), line  # fmt: skip
    assert left_by(engine_pid(done.stderr)) == set()


def test_a_master_that_does_not_answer_is_named_within_the_timeout() -> None:
    master = free_master()
    done = run_cli(*SMALL, "--timeout", "2", *node_args(master, 1, 2))
    assert done.returncode == 1, done.stderr
    assert f"node 1 rank 0 (global rank 1): the master {master} did not answer within 2 s" in done.stderr
    assert "raise --timeout (seconds)" in done.stderr


TWO = ("--model", LLAMA, "--tp", "2")


@pytest.mark.parametrize(
    ("field", "first", "second"),
    [
        ("--nnodes", ("--model", LLAMA, "--tp", "4", "--ranks", "1"), ("--model", LLAMA, "--tp", "4", "--ranks", "1")),
        ("--model", TWO, ("--model", "examples/qwen3-30b-a3b", "--tp", "2")),
        ("--role", (*TWO, "--role", "prefill"), (*TWO, "--role", "decode")),
        ("--swap-space", (*TWO, "--swap-space", "16MiB"), TWO),
        ("--cycles", (*TWO, "--cycles", "2"), TWO),
        ("--storage-backend", (*TWO, "--storage-backend", "file"), (*TWO, "--storage-backend", "mooncake")),
    ],
)
def test_nodes_started_differently_are_refused_naming_both_values(field: str, first: tuple[str, ...], second: tuple[str, ...]) -> None:
    master = free_master()
    other_nnodes = 4 if field == "--nnodes" else 2
    with nodes(
        (*first, "--device-memory", "64MiB", "--timeout", "20", *node_args(master, 0, 2)),
        (*second, "--device-memory", "64MiB", "--timeout", "20", *node_args(master, 1, other_nnodes)),
    ) as runs:
        (code0, err0), (code1, err1) = finish_all(runs)
    assert (code0, code1) == (2, 2), err0 + err1
    assert left_by(*[run.process.pid for run in runs]) == set()
    ours, theirs = {"--nnodes": ("2", "4"), "--role": ("'prefill'", "'decode'"), "--swap-space": ("16777216", "0"),
                    "--cycles": ("2", "0"), "--storage-backend": ("'file'", "'mooncake'")}.get(field, ("", ""))  # fmt: skip
    if field == "--model":
        ours, theirs = _names(err0, err1)
    assert f"{field}={ours} is not valid; allowed: the same on every node; node 1 was started with {field}={theirs}" in err0
    assert f"{field}={theirs} is not valid; allowed: the same on every node; node 0 was started with {field}={ours}" in err1


def _names(err0: str, err1: str) -> tuple[str, str]:
    found = re.search(r"--model=('[^']+') is not valid", err0)
    other = re.search(r"--model=('[^']+') is not valid", err1)
    assert found and other and found.group(1) != other.group(1), err0 + err1
    return found.group(1), other.group(1)


def test_a_second_node_with_a_taken_node_rank_is_refused_while_the_others_run() -> None:
    master = free_master()
    with nodes((*CYCLING, *node_args(master, 0, 2)), (*CYCLING, *node_args(master, 1, 2))) as (first, second):
        second.read_until(r"cycle 1: cleared")  # node 1 has claimed its rank long before
        with started(*SMALL, "--timeout", "20", *node_args(master, 1, 2)) as extra:
            code, refused = extra.finish()
        time.sleep(1.0)  # the two still cycle in step (a barrier per cycle): neither has failed
        alive = [run.process.poll() is None for run in (first, second)]
        for run in (first, second):
            run.process.send_signal(signal.SIGTERM)
        finish_all([first, second])
        pids = [run.process.pid for run in (first, second, extra)]
    assert code == 2, refused
    assert "--node-rank=1 is not valid; allowed: a node rank no other node of this engine uses" in refused
    assert alive == [True, True]
    assert left_by(*pids) == set()


def test_a_master_port_in_use_is_refused_before_paddle_could_abort() -> None:
    master = free_master()
    port = int(master.rsplit(":", 1)[1])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        done = run_cli(*SMALL, "--timeout", "10", *node_args(master, 0, 2))
    assert done.returncode == 1, done.stderr
    assert f"cannot listen on port {port + 1} for --master {master}" in done.stderr
    assert "Traceback" not in done.stderr and "Aborted" not in done.stderr


CYCLING = (*SMALL, "--timeout", "30", "--cycles", "100000")


@dataclass(frozen=True)
class Hurt:
    """Node 0's exit code and stderr, the seconds it took to exit after node 1 was hurt, node 1's
    exit code, and both engines' pids."""

    code: int
    stderr: str
    took: float
    other_code: int
    pids: tuple[int, int]


def hurt_node_1(args: tuple[str, ...], how: signal.Signals) -> Hurt:
    """Two nodes clearing and re-creating their caches; in node 1's third cycle, ``how`` goes to its
    engine (SIGTERM) or its whole process group; a stopped node 1 is killed once node 0 has exited."""
    master = free_master()
    with nodes((*args, *node_args(master, 0, 2)), (*args, *node_args(master, 1, 2))) as (first, second):
        second.read_until(r"cycle 3: cleared")
        if how == signal.SIGTERM:
            second.process.send_signal(how)
        else:
            os.killpg(second.process.pid, how)
        hurt = time.monotonic()
        code, stderr = first.finish()
        took = time.monotonic() - hurt
        if how == signal.SIGSTOP:
            os.killpg(second.process.pid, signal.SIGKILL)
        other_code, _ = second.finish()
    return Hurt(code, stderr, took, other_code, (first.process.pid, second.process.pid))


def test_a_node_killed_mid_run_fails_the_other_within_seconds_and_its_leftovers_are_reclaimed() -> None:
    hurt = hurt_node_1(CYCLING, signal.SIGKILL)
    assert hurt.code == 1 and hurt.took < 10, hurt
    assert "NodeError: node 0 rank 0 (global rank 0): " in hurt.stderr
    assert "node 1 rank 0 (global rank 1) is gone" in hurt.stderr
    assert "Traceback" not in hurt.stderr, "no Python or Paddle C++ traceback reaches the user"
    first, second = hurt.pids
    assert left_by(first) == set()
    # SIGKILL skips the killed node's clean-up; what it left is not asserted here, since the start-up
    # sweep of any run beside this suite (another test run on the machine) may already have removed it
    run_cli(*SMALL)  # the next run on that node sweeps what it left
    assert left_by(second) == set()


def test_a_node_stopped_with_sigterm_cleans_up_and_the_other_fails_within_seconds() -> None:
    hurt = hurt_node_1(CYCLING, signal.SIGTERM)
    assert hurt.other_code == 143
    assert hurt.code == 1 and hurt.took < 10, hurt
    assert "node 1 rank 0 (global rank 1) is gone" in hurt.stderr
    assert "Traceback" not in hurt.stderr, "no Python or Paddle C++ traceback reaches the user"
    assert left_by(*hurt.pids) == set()


def test_a_node_that_stops_answering_fails_the_other_within_its_timeout() -> None:
    """A hung machine (SIGSTOP: its sockets stay open, nothing answers) is found by the bound, not by gloo."""
    hurt = hurt_node_1((*SMALL, "--timeout", "4", "--cycles", "100000"), signal.SIGSTOP)
    assert hurt.code == 1 and hurt.took < 4 + 6, hurt
    assert re.search(r"node 0 rank 0 \(global rank 0\): cycle \d+ did not complete within 4 s: another node is not "
                     r"answering\. Fix: .*raise --timeout", hurt.stderr), hurt.stderr  # fmt: skip
    assert "Traceback" not in hurt.stderr, "no Python or Paddle C++ traceback reaches the user"
    first, second = hurt.pids
    assert left_by(first) == set()
    run_cli(*SMALL)  # sweeps what the killed node left
    assert left_by(second) == set()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--nnodes", "2"), "--node-rank is not given; allowed: required with --nnodes 2"),
        (("--nnodes", "2", "--node-rank", "0"), "--master is not given; allowed: required with --nnodes 2"),
        (("--master", "127.0.0.1:29500"), "--master='127.0.0.1:29500' is not valid; allowed: only with --nnodes 2 or more"),
        (("--nnodes", "2", "--node-rank", "2", "--master", "h:1"), "--node-rank=2 is not valid; allowed: 0 to 1"),
        (("--nnodes", "0"), "--nnodes=0 is not valid; allowed: 1 to 4096"),
        (("--nnodes", "3", "--node-rank", "0", "--master", "h:1"), "allowed: a number of nodes that divides --tp 2"),
        (("--nnodes", "2", "--node-rank", "0", "--master", "h"), "--master='h' is not valid; allowed: HOST:PORT"),
        (("--nnodes", "2", "--node-rank", "0", "--master", "h:65535"), "--master='h:65535' is not valid"),
        (("--nnodes", "2", "--node-rank", "0", "--master", "[::1]:5"), "--master='[::1]:5' is not valid"),
        (("--nnodes", "2", "--node-rank", "0", "--master", "h:1", "--ranks", "2"), "--ranks=2 is not valid; allowed: 1 to tensor_parallel_size=2 / --nnodes 2 = 1"),
        (("--nnodes", "2", "--node-rank", "1", "--master", "nosuchhost.invalid:29500"),
         "--master='nosuchhost.invalid:29500' is not valid; allowed: a host this machine resolves to an IPv4 address"),
    ],
)
def test_bad_node_flags_are_one_line_naming_the_flag(args: tuple[str, ...], message: str) -> None:
    done = run_cli(*SMALL, *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_global_ranks_number_each_nodes_ranks_in_turn() -> None:
    spec = NodeSpec(nnodes=3, node_rank=2, master="10.0.0.1:29500", local_ranks=8)
    assert (spec.world_size, spec.global_rank(0), spec.global_rank(7)) == (24, 16, 23)
    assert spec.locate(9) == (1, 1) and spec.describe(17) == "node 2 rank 1 (global rank 17)"
    assert (spec.host, spec.port) == ("10.0.0.1", 29500)
    assert parse_master("node-0.cluster.local:1") == ("node-0.cluster.local", 1)
    host, port = parse_master(free_master())
    for free in (port, port + 1):
        with socket.socket() as probe:
            probe.bind((host, free))
    for bad in ("10.0.0.1", ":29500", "10.0.0.1:", "a b:1", "h:0", "h:65535", "h:²", "h:+1", 29500, None):
        with pytest.raises(ConfigError, match="HOST:PORT"):
            parse_master(bad)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"nodes": "node 0"}, "nodes"),
        ({"local_rank": 1}, "local_rank"),
        ({"local_rank": True}, "local_rank"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"facts": {"model": object()}}, "facts"),
        ({"facts": {1: "x"}}, "facts"),
        ({"facts": ["model"]}, "facts"),
        ({"device_type": ""}, "device_type"),
        ({"device_id": -1}, "device_id"),
        ({"nodes": NodeSpec(nnodes=2, node_rank=1, master="nosuchhost.invalid:1", local_ranks=1)}, "nodes.master"),
    ],
)
def test_cluster_join_blames_the_callers_argument_before_any_connection(change: dict[str, Any], field: str) -> None:
    arguments: dict[str, Any] = {
        "nodes": NodeSpec(nnodes=2, node_rank=0, master="127.0.0.1:1", local_ranks=1),
        "local_rank": 0, "facts": {"model": "m"}, "timeout": 5,
    }  # fmt: skip
    arguments.update(change)
    nodes, local_rank = arguments.pop("nodes"), arguments.pop("local_rank")
    with pytest.raises(ConfigError, match=rf"^{field}=.* is not valid; allowed: .* Fix: "):
        Cluster.join(nodes, local_rank, **arguments)
