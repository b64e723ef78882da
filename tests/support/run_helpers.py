"""Running ``fd-platforms run`` as the real console script, and reading what it left behind."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from fd_platforms.lifecycle.children import START_METHOD_ENV

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(Path(sysconfig.get_path("scripts")) / "fd-platforms")
MIB = 2**20
QWEN = "examples/qwen3-30b-a3b"
TENSORS_PER_RANK = 2 * 48  # qwen3-30b-a3b: key and value for each of 48 layers


def qwen_bytes_per_block(tp: int) -> int:
    """One qwen3-30b-a3b block per rank: bf16, key + value, block 64, head_dim 128, 4 KV heads, 48 layers."""
    return 2 * 2 * 64 * 128 * max(1, 4 // tp) * 48


UNSET = ("FD_PLATFORM", "FD_CACHE_READY_TIMEOUT", "CUSTOM_DEVICE_ROOT", "FLAGS_selected_", "FAKE_")
"""Prefixes of the outer environment's variables a command under test never sees: selection, timeouts, fake devices."""
KEPT = (START_METHOD_ENV,)
"""What the tests' commands see of those after all: how ``run`` starts its children (``forkserver``, set by conftest:
each run imports Paddle once, not once per child; a test of the default passes ``FD_PLATFORMS_START_METHOD=spawn``)."""


def clean_env(**env: str) -> dict[str, str]:
    """The outer environment without selection, timeout or fake-device settings, plus ``env``."""
    return {**{k: v for k, v in os.environ.items() if k in KEPT or not k.startswith(UNSET)}, **env}


def console_script(*argv: str, cwd: Path | str = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    """``fd-platforms *argv`` run as the installed console script, in ``clean_env(**env)``: for a test of
    what only a process shows (see :func:`main_in_process`), or of ``run``, which starts processes."""
    return subprocess.run([SCRIPT, *argv], capture_output=True, text=True, env=clean_env(**env), cwd=cwd, timeout=300)


def main_in_process(*argv: str, cwd: Path | str = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    """``fd-platforms *argv`` run by ``fd_platforms.cli.main`` in this process, reported as
    ``subprocess.run`` of the console script with ``clean_env(**env)`` would report it: exit code
    (argparse's ``SystemExit`` included), stdout and stderr as text with universal newlines.

    Descriptors 1 and 2 point at files of their own during the call and ``sys.stdout``/``sys.stderr``
    are text streams on them, as in the console script: :func:`fd_platforms.cli.output.take_stdout`
    takes descriptor 1 for the command's output as it does there, and whatever the screening child
    or native code writes to descriptor 2 is in ``stderr``. Afterwards the descriptors, streams,
    environment, the timeout flags it named, working directory, logging's root logger (``main`` configures it with
    ``basicConfig``), ``sys.unraisablehook`` (``main`` chains its own) and the stdout that
    ``take_stdout`` kept are as they were, so calls do not see each other's.

    Only for commands that start no process of their own beyond the screening child and end normally:
    a plugin call past its bound ends the process (:mod:`fd_platforms.loading.watchdog`),
    a plugin may ``os._exit`` or close a descriptor; a test of those, of signals, of start-up imports,
    or of a ``run`` that starts its workers runs :func:`console_script`."""
    from fd_platforms.cli import main, output
    from fd_platforms.ipc import timeouts

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_flags = dict(timeouts._flags)
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved_hook, saved_streams = sys.unraisablehook, (sys.stdout, sys.stderr)
    for stream in saved_streams:
        stream.flush()
    saved_fds = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        streams = (
            open(1, "w", encoding="utf-8", closefd=False),  # noqa: SIM115 - closed below
            open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False),  # noqa: SIM115 - closed below
        )
        try:
            for name in [name for name in os.environ if name.startswith(UNSET)]:
                del os.environ[name]
            os.environ.update(env)
            os.chdir(cwd)
            root.handlers.clear()
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout, sys.stderr = streams
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse: usage errors, --version, --help
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        finally:
            kept = output._output
            if kept is not None:
                output._output = output._guard = None
                fd = kept.fileno()
                with suppress(OSError):
                    kept.close()
                os.close(fd)
            for stream in streams:
                stream.close()
            sys.stdout, sys.stderr = saved_streams
            for fd, saved in enumerate(saved_fds, start=1):
                os.dup2(saved, fd)
                os.close(saved)
            root.handlers[:] = saved_handlers
            root.setLevel(saved_level)
            sys.unraisablehook = saved_hook
            os.chdir(saved_cwd)
            for name in set(os.environ) - set(saved_env):
                del os.environ[name]
            os.environ.update(saved_env)
            timeouts._flags.clear()
            timeouts._flags.update(saved_flags)
        out.seek(0)
        err.seek(0)
        stdout, stderr = (file.read().decode().replace("\r\n", "\n").replace("\r", "\n") for file in (out, err))
    return subprocess.CompletedProcess(["fd-platforms", *argv], code, stdout, stderr)


def main_on_cpu(*argv: str, cwd: Path | str = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    """:func:`main_in_process` with the cpu platform named (``FD_PLATFORM=cpu``), for a test of something other
    than selection: the same answer on a host with an accelerator, and no screening child."""
    return main_in_process(*argv, cwd=cwd, FD_PLATFORM="cpu", **env)


SWEEP_LINES = (
    ": WARNING: left ",
    ": WARNING: reclaiming cache-ready signal ",
    ": WARNING: removed ",  # dead FastDeploy attacher marks, one line
)


def without_sweep(stderr: str) -> list[str]:
    """stderr's lines without the start-up sweep's warnings (which name whatever else is in /dev/shm)."""
    return [line for line in stderr.splitlines() if not any(mark in line for mark in SWEEP_LINES)]


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (another process may still take it before it is used)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, "run", *args], capture_output=True, text=True, env=env or clean_env(), cwd=ROOT, timeout=120
    )


def run_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The report of a successful ``run --json``."""
    done = run_cli(*args, "--json", env=env)
    assert done.returncode == 0, f"rc={done.returncode}\nstderr:\n{done.stderr}"
    progress = [line for line in done.stderr.splitlines() if ": WARNING: " not in line]
    assert not progress, f"--json prints no progress: {progress}"
    report = json.loads(done.stdout)
    assert not Path("/dev/shm", report["signal"]).exists(), "the run left its cache-ready signal behind"
    return report


def expected_decision(role: str, backend: str, swap: bool = False, profile: bool = False) -> tuple[bool, str]:
    """(create, deciding term) as the issue states the rule: the first term that holds decides."""
    if profile:
        return True, "profile"
    if swap:
        return False, "num_cpu_blocks"
    if backend != "none":
        return False, "storage_backend"
    if role != "mixed":
        return False, "splitwise_role"
    return True, "none"


def check_rank(rank: dict[str, Any], bytes_per_block: int, create: bool, term: str) -> None:
    """One rank's row: the decision, who allocated, the bytes, and a wait only for non-creators."""
    assert (rank["create"], rank["deciding_term"]) == (create, term), rank
    assert rank["allocated_by"] == ("worker" if create else "cache manager")
    assert rank["num_blocks"] > 0 and rank["device_bytes"] == rank["num_blocks"] * bytes_per_block
    assert rank["host_bytes"] == (0 if create else rank["num_cpu_blocks"] * bytes_per_block)
    assert rank["num_cpu_blocks"] == (0 if create else rank["planned_cpu_blocks"])
    assert rank["decided_by"] == ("rule: no cache manager needed" if term == "none" else term)
    assert (rank["pinned"] is None) if rank["host_bytes"] == 0 else isinstance(rank["pinned"], bool)
    assert rank["plan_seconds"] >= 0 and rank["allocate_seconds"] >= 0
    if create:
        assert rank["wait_seconds"] is None and rank["attach_seconds"] is None
        assert (rank["attached_tensors"], rank["verified"]) == (0, None)
    else:
        assert rank["wait_seconds"] >= 0 and rank["attach_seconds"] >= 0
        assert rank["attached_tensors"] == TENSORS_PER_RANK  # every tensor of the layout, opened zero-copy
        assert rank["verified"] is True, "the worker read the manager's tokens and the manager read the worker's"


class Run:
    """``fd-platforms run`` in its own process group, its stderr read line by line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []

    def read_until(self, pattern: str, within: float = 120) -> re.Match[str]:
        """Read stderr until a line matches ``pattern``: an AssertionError naming it where the process ends, or goes on
        printing other lines for ``within`` seconds (a run of many cycles would otherwise be read to its end)."""
        assert self.process.stderr is not None
        deadline = time.monotonic() + within
        for line in self.process.stderr:
            self.lines.append(line)
            found = re.search(pattern, line)
            if found:
                return found
            if time.monotonic() > deadline:
                self.process.kill()
                raise AssertionError(f"no line matched {pattern!r} in {within:g} s; stderr:\n{''.join(self.lines)}")
        raise AssertionError(f"no line matched {pattern!r}; stderr:\n{''.join(self.lines)}")

    def finish(self) -> tuple[int, str]:
        """Exit code and the whole stderr, waiting at most 60 s."""
        _, rest = self.process.communicate(timeout=60)
        return self.process.returncode, "".join(self.lines) + rest

    def group(self) -> list[int]:
        """Live processes of the run's process group (the engine and its children)."""
        pids = []
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            if entry.name.isdigit() and int(fields[2]) == self.process.pid and fields[0] not in "ZX":
                pids.append(int(entry.name))
        return pids


@contextmanager
def started(*args: str, env: dict[str, str] | None = None) -> Iterator[Run]:
    """``fd-platforms run *args`` in a session of its own; killed with its children if still running at the end."""
    process = subprocess.Popen(
        [SCRIPT, "run", *args],
        cwd=ROOT,
        env=env or clean_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        yield Run(process)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate(timeout=30)


HOST_SHARING_PLUGIN = """
import errno
from fd_platforms import hookimpl
from fd_platforms.contract.errors import DeviceAllocError
from fd_platforms.contract.types import Detection, PlatformIdentity, SharedTensor
from fd_platforms.kit.host_memory import system_memory
from fd_platforms.kit.host_sharing import export_host_tensor, open_host_tensor

@hookimpl
def platform_identity():
    return PlatformIdentity({name!r}, "cpu", None)

@hookimpl
def detect_platform():
    return Detection(True, "host memory, like cpu", 1)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"

@hookimpl
def device_memory(device_id):
    return system_memory()

@hookimpl
def cache_sharing():
    return "memfds, like cpu"

@hookimpl
def export_cache_tensor(name, shape, dtype):
{export}

@hookimpl
def open_cache_tensor(name, handle, shape, dtype):
{open}
{extra}"""


def host_sharing_plugin(
    name: str,
    export: str = "return export_host_tensor(name, shape, dtype)",
    open: str = "return open_host_tensor(name, handle, shape, dtype)",
    extra: str = "",
) -> str:
    """The source of platform ``name``, whose cache lives in host memory like cpu's, with the bodies
    of its export and open hooks given (to make one of them misbehave) and ``extra`` source after them."""
    indent = lambda body: "\n".join(f"    {line}" for line in body.strip("\n").splitlines())  # noqa: E731
    return HOST_SHARING_PLUGIN.format(name=name, export=indent(export), open=indent(open), extra=extra)
