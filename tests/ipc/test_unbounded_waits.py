"""Waits with no time limit (``timeout=math.inf``), as FastDeploy's own have none, saying what they wait for
every few seconds; and every engine call that takes ``creator_pid`` works without it, under both protocols
(FastDeploy's worker cannot name its cache transfer manager's pid: its engine starts it through a shell).

In-process, on cpu: the other side is a thread, which sets the word after a few seconds; the progress period
is shortened for the test (``fd_platforms.ipc.waiting.PROGRESS_SECONDS``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from engine_processes import qwen_layout
from kv_requests import kv_request
from run_helpers import QWEN, main_in_process

from fd_platforms.engine import initialize_kv_cache, manage_kv_cache
from fd_platforms.engine.protocols import protocol_named
from fd_platforms.ipc import waiting
from fd_platforms.loading.platform import Platform

pytestmark = pytest.mark.slow  # each waits a few seconds on purpose
paddle = pytest.importorskip("paddle")  # imported now: each wait below starts at once, not after the import

BLOCKS = 4
SWAP = {"profile": False, "num_cpu_blocks": 4, "storage_backend": None, "splitwise_role": "mixed"}
# With swap space in the mixed role the rule's versions disagree, and beside FastDeploy the rule is pinned
# (fd_platforms.fastdeploy.rule): 2026-01, the manager creates and the worker attaches.
OLD_RULE = "2026-01"
DELAY = 2.0  # seconds before the other side acts
PERIOD = 0.4  # seconds between two progress lines in these tests
PROTOCOLS = ("fd-platforms", "fastdeploy")


@pytest.fixture(params=PROTOCOLS)
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(protocol, signal name): the signals an engine of that protocol creates for 1 rank."""
    protocol = request.param
    if protocol == "fastdeploy":
        request.getfixturevalue("fastdeploy_record_names")  # its records are named as FastDeploy's: taken in turns
    name, held = protocol_named(protocol).create_signals(1, device_type="cpu", block_count_suffix=None)
    with held:
        yield protocol, name


@pytest.fixture
def progress_lines(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> Callable[[int], list[str]]:
    """The waits' progress lines at ``level``, a line every :data:`PERIOD` seconds."""
    monkeypatch.setattr(waiting, "PROGRESS_SECONDS", PERIOD)
    caplog.set_level(logging.INFO, logger="fd_platforms")

    def lines(level: int) -> list[str]:
        return [
            record.getMessage()
            for record in caplog.records
            if record.name == waiting.logger.name and record.levelno == level
        ]

    return lines


def named(protocol: str, name: str) -> dict[str, str]:
    """The engine calls' engine instance under ``protocol`` (ours: its signal's name; FastDeploy's: its suffix)."""
    return {"instance": name}


def later(seconds: float, action: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """``action()`` in a thread after ``seconds``; the thread and a list that gets its result."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: (time.sleep(seconds), result.append(action())), daemon=True)
    thread.start()
    return thread, result


def test_an_unbounded_attach_without_creator_pid_is_woken_after_seconds_saying_what_it_waits_for(
    cpu: Platform, engine: tuple[str, str], progress_lines: Callable[[int], list[str]]
) -> None:
    protocol, name = engine
    names = named(protocol, name)
    layout = qwen_layout()
    thread, managed = later(
        DELAY,
        lambda: manage_kv_cache(
            cpu, kv_request(layout, BLOCKS, num_cpu_blocks=4, **names, protocol=protocol, rule=OLD_RULE)
        ),
    )
    cache = initialize_kv_cache(
        cpu, kv_request(layout, BLOCKS, **names, protocol=protocol, timeout=math.inf, rule=OLD_RULE, **SWAP)
    )
    thread.join(30)
    try:
        assert not cache.created and cache.wait_seconds >= DELAY - 0.1
        lines = progress_lines(logging.WARNING)
        assert len(lines) >= 3, lines
        word = (
            f"'{name}' slot 0 is 0"
            if protocol == "fd-platforms"
            else f"'cache_ready_signal.{name}' word 0 is 0, waiting for 1"
        )
        for line in lines:
            assert line.startswith("rank 0 waiting for its KV cache: ") and word in line, line
            assert "exit goes unnoticed" in line and line.endswith("s, no time limit"), line
        seconds = [float(line.rsplit("; waited ", 1)[1].split(" s,")[0]) for line in lines]
        assert seconds == sorted(seconds) and seconds[-1] < DELAY + PERIOD, seconds
    finally:
        cache.clear()
        for held in managed:
            held.clear(5)  # type: ignore[attr-defined]


def test_a_bounded_wait_says_the_same_at_info(
    cpu: Platform, engine: tuple[str, str], progress_lines: Callable[[int], list[str]]
) -> None:
    protocol, name = engine
    names = named(protocol, name)
    layout = qwen_layout()
    thread, managed = later(
        1.0,
        lambda: manage_kv_cache(
            cpu, kv_request(layout, BLOCKS, num_cpu_blocks=4, **names, protocol=protocol, rule=OLD_RULE)
        ),
    )
    cache = initialize_kv_cache(
        cpu, kv_request(layout, BLOCKS, **names, protocol=protocol, timeout=30, rule=OLD_RULE, **SWAP)
    )
    thread.join(30)
    try:
        assert progress_lines(logging.WARNING) == []
        lines = progress_lines(logging.INFO)
        assert lines and all(line.endswith("s, limit 30 s") for line in lines), lines
    finally:
        cache.clear()
        for held in managed:
            held.clear(5)  # type: ignore[attr-defined]


def test_an_unbounded_clear_waits_for_the_attacher_saying_so(
    cpu: Platform, engine: tuple[str, str], progress_lines: Callable[[int], list[str]]
) -> None:
    protocol, name = engine
    names = named(protocol, name)
    layout = qwen_layout()
    managed = manage_kv_cache(
        cpu, kv_request(layout, BLOCKS, num_cpu_blocks=4, **names, protocol=protocol, rule=OLD_RULE)
    )
    cache = initialize_kv_cache(
        cpu, kv_request(layout, BLOCKS, **names, protocol=protocol, timeout=30, rule=OLD_RULE, **SWAP)
    )
    thread, _ = later(DELAY, cache.clear)  # the attacher lets go after a few seconds
    started = time.monotonic()
    managed.clear(timeout=math.inf)
    thread.join(30)
    assert time.monotonic() - started >= DELAY - 0.1
    lines = progress_lines(logging.WARNING)
    assert len(lines) >= 3, lines
    assert all(line.startswith("rank 0's creator waiting for its attacher") for line in lines), lines


def test_the_cache_manager_holds_a_workers_cache_without_creator_pid(cpu: Platform, engine: tuple[str, str]) -> None:
    """Rule 2026-04 with swap space: the worker creates, the manager waits for it and attaches; no pid named."""
    protocol, name = engine
    names = named(protocol, name)
    layout = qwen_layout()
    thread, created = later(
        DELAY / 2,
        lambda: initialize_kv_cache(
            cpu, kv_request(layout, BLOCKS, **names, protocol=protocol, rule="2026-04", **SWAP)
        ),
    )
    manager = manage_kv_cache(
        cpu, kv_request(layout, BLOCKS, num_cpu_blocks=4, **names, timeout=30, protocol=protocol, rule="2026-04")
    )
    thread.join(30)
    [cache] = created
    try:
        assert manager.kv_cache.wait_seconds >= DELAY / 2 - 0.1
        assert cache.created and not manager.kv_cache.created  # type: ignore[attr-defined]
        cache.tensors[0][0, 0, 0, 0] = 2.5  # type: ignore[attr-defined]
        assert manager.kv_cache.tensors[0][0, 0, 0, 0].item() == 2.5
    finally:
        manager.clear(5)  # lets go first: the worker's clear waits for it
        cache.clear(5)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("args", "env", "given"),
    [
        (("--timeout", "inf"), {}, "--timeout=inf"),
        ((), {"FD_CACHE_READY_TIMEOUT": "inf"}, "FD_CACHE_READY_TIMEOUT='inf'"),
    ],
)
def test_run_bounds_each_phase_so_it_refuses_no_limit(args: tuple[str, ...], env: dict[str, str], given: str) -> None:
    done = main_in_process("run", "--model", QWEN, "--device-memory", "256MiB", *args, **env)
    assert done.returncode == 2, done.stderr
    assert f"{given} is not valid; allowed: a finite number of seconds > 0" in done.stderr
    assert "Fix: run bounds each of its phases by this limit: pass --timeout SECONDS" in done.stderr


@pytest.mark.parametrize(
    ("args", "env", "given"),
    [
        (("--timeout", "-1"), {}, "--timeout=-1.0"),
        ((), {"FD_CACHE_READY_TIMEOUT": "-1"}, "FD_CACHE_READY_TIMEOUT='-1'"),
    ],
)
def test_runs_refusal_of_a_bad_timeout_never_offers_no_limit_which_run_refuses(
    args: tuple[str, ...], env: dict[str, str], given: str
) -> None:
    done = main_in_process("run", "--model", QWEN, "--device-memory", "256MiB", *args, **env)
    assert done.returncode == 2, done.stderr
    assert f"{given} is not valid; allowed: a finite number of seconds > 0 and at most 604800 (7 days). " in done.stderr
    assert "Fix: run bounds each of its phases by this limit: pass --timeout SECONDS, e.g. --timeout 600" in done.stderr
    assert "no limit" not in done.stderr and "inf" not in done.stderr, done.stderr
