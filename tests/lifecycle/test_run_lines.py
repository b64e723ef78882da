"""What ``fd-platforms run`` says on stderr around its longest silences and at its end: a line when the
workers start importing Paddle and one when every worker has (before any plan's line), then, after the
report, one line naming what to try next; never with ``--json``, and never after an error."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess

import pytest
from run_helpers import QWEN, ROOT, SCRIPT, clean_env, console_script, run_cli, without_sweep

from fd_platforms.cli.run_command import next_steps

IMPORTED = re.compile(
    r"fd-platforms: 2 worker\(s\) imported Paddle (\d+\.\d{3}) s after they were started "
    r"\(import paddle itself: (\d+\.\d{3}) s in the slowest\)(; the fork server had imported it once)?"
)
HINT = (
    "fd-platforms: next: --cycles 2 clears and re-creates every rank's cache; fd-platforms plan --platform all "
    "--model examples/qwen3-30b-a3b --tp 2 --device-memory 256MiB --role decode compares every platform's plan; "
    "docs/lifecycle.md explains each line"
)


def index(lines: list[str], pattern: str) -> int:
    """The index of the first line matching ``pattern``."""
    found = [number for number, line in enumerate(lines) if re.search(pattern, line)]
    assert found, f"no line matches {pattern!r}:\n" + "\n".join(lines)
    return found[0]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_the_paddle_import_is_said_before_any_plan_and_the_last_line_is_the_next_step(method: str) -> None:
    done = run_cli(
        "--model", QWEN, "--tp", "2", "--device-memory", "256MiB", "--role", "decode",
        env=clean_env(FD_PLATFORMS_START_METHOD=method),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = without_sweep(done.stderr)
    started = index(lines, r"^fd-platforms: platform cpu: started 2 worker\(s\)")
    importing = lines.index("fd-platforms: importing Paddle in 2 worker(s)")
    imported = index(lines, IMPORTED.pattern)
    assert started < importing < imported < index(lines, r": planned \d+ blocks"), "\n".join(lines)
    since_start, itself, preloaded = IMPORTED.fullmatch(lines[imported]).groups()  # type: ignore[union-attr]
    if method == "spawn":  # each worker imported it
        assert 0 < float(itself) < float(since_start) and preloaded is None, lines[imported]
    else:  # the fork server had, before it forked them
        assert float(itself) < 0.5 and preloaded is not None, lines[imported]  # a look in sys.modules
    assert lines[-1] == HINT and "next:" not in "\n".join(lines[:-1])
    suggested = shlex.split(HINT.split("; ")[1].removesuffix(" compares every platform's plan"))
    assert console_script(*suggested[1:]).returncode == 0, "the suggested plan runs as it is printed"


@pytest.mark.slow
def test_json_has_no_progress_and_no_hint() -> None:
    done = run_cli("--model", QWEN, "--tp", "2", "--device-memory", "256MiB", "--role", "decode", "--json")
    assert done.returncode == 0, done.stderr
    assert without_sweep(done.stderr) == []


@pytest.mark.slow
def test_a_failed_run_ends_with_its_error_not_the_hint() -> None:
    done = run_cli("--model", QWEN, "--tp", "2", "--device-memory", "1MiB")
    assert done.returncode == 2, done.stderr
    lines = without_sweep(done.stderr)
    assert lines[-1].startswith("fd-platforms: error: rank 0, rank 1: InsufficientMemoryError: KV cache budget")
    assert IMPORTED.fullmatch(lines[-2]), "the workers imported Paddle, then failed to plan"
    assert "next:" not in done.stderr


@pytest.mark.slow
def test_a_report_that_cannot_be_written_ends_with_that_error_not_the_hint() -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    command = [SCRIPT, "run", "--model", QWEN, "--device-memory", "256MiB"]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            command, stdout=full, stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=ROOT, timeout=120
        )
    assert done.returncode == 1, done.stderr
    assert without_sweep(done.stderr)[-1].startswith("fd-platforms: error: cannot write the output to stdout: ")
    assert "next:" not in done.stderr


def hint(*argv: str) -> str:
    """The hint after a run with these flags, as ``run`` parses them."""
    from fd_platforms.cli import build_parser

    args = build_parser().parse_args(["run", *argv])
    assert isinstance(args, argparse.Namespace)
    return next_steps(args)


def test_the_hint_repeats_the_deployment_flags_given_and_drops_what_was_done() -> None:
    run_flags = ("--ranks", "1", "--timeout", "60", "--profile")  # run's own: not plan's, never repeated
    given = hint("--model", QWEN, "--tp", "2", "--device-memory", "256MiB", *run_flags, "--role", "decode")
    assert given == HINT.removeprefix("fd-platforms: ")
    assert hint("--config", "examples/deploy.toml", "--cycles", "3") == (
        "next: fd-platforms plan --platform all --config examples/deploy.toml --device-memory SIZE compares every "
        "platform's plan; docs/lifecycle.md explains each line"
    )
    deployment = ("--config", "examples/deploy.toml", "--model", "my models/qwen", "--mtp", "--tp", "4")
    everything = hint(*deployment, "--memory-utilization", "0.5", "--device-memory", "80 GiB", "--swap-space", "4")
    assert (
        "plan --platform all --config examples/deploy.toml --model 'my models/qwen' --mtp --tp 4 "
        "--memory-utilization 0.5 --device-memory '80 GiB' --swap-space 4 compares"
    ) in everything
