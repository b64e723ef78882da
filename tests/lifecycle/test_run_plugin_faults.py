"""A plugin whose cache sharing misbehaves in ``fd-platforms run``: an ``open_cache_tensor`` that returns a copy
fails the run and the conformance kit naming it; an export that fails on rank 1 fails the run with that cause at
once, not after a wait for attachers that will never come."""

from __future__ import annotations

import json
import time

import pytest
from run_helpers import QWEN, console_script, host_sharing_plugin, main_in_process

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"


COPIER = host_sharing_plugin(
    "copier",
    open="""
opened = open_host_tensor(name, handle, shape, dtype)
copy = opened.tensor.clone()
opened.close()
return SharedTensor(name, copy, handle, opened.nbytes, False, lambda: None)
""",
)


def test_a_plugin_that_opens_copies_fails_run_and_check_naming_it(make_plugin) -> None:
    site = make_plugin("copier", source=COPIER)
    done = console_script(
        "run",
        "--platform",
        "copier",
        "--model",
        QWEN,
        "--tp",
        "2",
        "--device-memory",
        "256MiB",
        "--role",
        "decode",
        PYTHONPATH=str(site),
    )
    assert done.returncode != 0, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("fd-platforms: error: platform plugin 'copier' (distribution fd-test-copier): rank(s) 0, 1")
    assert "open_cache_tensor returned a copy" in last
    checked = main_in_process("check", "copier", "--json", PYTHONPATH=str(site))
    assert checked.returncode != 0
    [result] = json.loads(checked.stdout)["platforms"]
    assert result["checks"]["sharing"]["status"] == "fail", result


FAILS_ON_RANK_1 = host_sharing_plugin(
    "nofds",
    export="""
if "_rank1." in name:
    raise OSError(errno.EMFILE, "Too many open files")
return export_host_tensor(name, shape, dtype)
""",
)


def test_a_manager_failing_on_rank_1_reports_that_cause_within_the_timeout(make_plugin) -> None:
    site = make_plugin("nofds", source=FAILS_ON_RANK_1)
    started_at = time.monotonic()
    done = console_script(
        "run",
        "--model",
        QWEN,
        "--tp",
        "2",
        "--device-memory",
        "256MiB",
        "--role",
        "decode",
        "--timeout",
        "60",
        FD_PLATFORM="nofds",
        PYTHONPATH=str(site),
    )
    elapsed = time.monotonic() - started_at
    assert done.returncode != 0, done.stderr
    assert "Too many open files" in done.stderr and "CacheInUseError" not in done.stderr, done.stderr
    assert elapsed < 30, f"{elapsed:.1f} s: the manager waited for an attacher instead of failing"
