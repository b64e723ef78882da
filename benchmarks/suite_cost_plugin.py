"""pytest plugin of ``benchmarks/suite_cost.py``: the CPU-seconds and wall seconds of each test file.

Loaded with ``-p benchmarks.suite_cost_plugin`` (pytest run from the repository root) in pytest's own process
and, through xdist, in each worker. In a process that runs tests, each test's whole protocol (setup, call,
teardown: the fixtures it sets up or tears down count, a module's or the session's too) is measured as
``getrusage(RUSAGE_SELF)`` + ``getrusage(RUSAGE_CHILDREN)``, user + sys, after minus before: the process's own
CPU (every thread) and that of every child it started and waited for meanwhile, the children's own waited-for
children included. The difference goes to the test's file (its node id up to ``::``). At the end of the session
the process writes its totals, as JSON, to a file of its own in the folder ``FD_SUITE_COST_DIR`` names; without
that variable the plugin records nothing.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator
from pathlib import Path

import pytest

ENV = "FD_SUITE_COST_DIR"

# file -> [cpu seconds, wall seconds, tests]
_files: dict[str, list[float]] = {}


def cpu_seconds() -> float:
    """User + sys seconds of this process and of every child of it that has been waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    cpu, wall = cpu_seconds(), time.perf_counter()
    try:
        return (yield)
    finally:
        totals = _files.setdefault(item.nodeid.split("::", 1)[0], [0.0, 0.0, 0])
        totals[0] += cpu_seconds() - cpu
        totals[1] += time.perf_counter() - wall
        totals[2] += 1


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    folder = os.environ.get(ENV)
    if not folder or not _files:
        return
    worker = str(getattr(session.config, "workerinput", {}).get("workerid", "main"))  # xdist's gw0, gw1, ...
    record = {
        "worker": worker,
        "pid": os.getpid(),
        "process_cpu_s": cpu_seconds(),
        "files": {name: {"cpu_s": cpu, "wall_s": wall, "tests": int(n)} for name, (cpu, wall, n) in _files.items()},
    }
    target = Path(folder) / f"{worker}-{os.getpid()}.json"
    scratch = target.with_suffix(".part")
    scratch.write_text(json.dumps(record))
    scratch.rename(target)  # whole or not at all
