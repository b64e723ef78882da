"""``fd-platforms check`` on an accelerator host without Paddle (``/dev/nvidia0``, no wheel): a column
passes where it needs no paddle, or its tests that need paddle skip with the platform's install hint."""

from __future__ import annotations

import importlib
import json
import subprocess

import pytest
from accelerator_host import host_command, skip_without_namespaces
from run_helpers import ROOT, SCRIPT, clean_env

from fd_platforms.conformance import CHECKS
from fd_platforms.conformance.fixtures import PADDLE_HINT
from fd_platforms.loading.discovery import discover

pytestmark = pytest.mark.slow  # a pytest process per platform, in a private mount namespace

NO_PADDLE = "needs paddle, which cannot be imported here (ModuleNotFoundError: No module named 'paddle'). Fix: "
PADDLE_VIEWS = 3  # host_alloc's zero-copy paddle view, one test per size
ALLOCATIONS = 2  # shapes: the shaped layout allocated, bf16 and block-wise fp8


def install_hint(name: str) -> str:
    """What the platform's plugin tells a user to install (the cpu platform states none)."""
    if name == "cpu":
        return PADDLE_HINT
    module = {"cuda": "fd_platforms_cuda", "nimbus": "fd_platforms_nimbus"}[name]
    return importlib.import_module(module).PLATFORM.install_hint


@pytest.mark.parametrize("name", ["cuda", "nimbus", "cpu"])
def test_check_on_a_host_with_an_nvidia_node_and_no_paddle_skips_what_needs_paddle(name: str) -> None:
    skip_without_namespaces()
    if name not in discover():
        pytest.skip(f"platform {name!r} is not installed (pip install ./examples/plugin-template)")
    command, env = host_command([SCRIPT, "check", name, "--json"], paddle=False, nodes=("nvidia0",))
    done = subprocess.run(command, capture_output=True, text=True, env=clean_env(**env), cwd=ROOT, timeout=300)
    assert "Traceback" not in done.stdout + done.stderr
    checks = json.loads(done.stdout)["platforms"][0]["checks"]
    hint = NO_PADDLE + install_hint(name)
    shapes, host_alloc = checks["shapes"], checks["host_alloc"]
    assert (shapes["failed"], shapes["skipped"], shapes["skip_reasons"]) == (0, ALLOCATIONS, [hint]), shapes
    assert host_alloc["skipped"] == PADDLE_VIEWS and host_alloc["skip_reasons"] == [hint], host_alloc
    assert list(checks) == list(CHECKS)
    failed = {check: result["failures"] for check, result in checks.items() if result["failed"]}
    assert not failed, failed
    reasons = [reason for result in checks.values() for reason in result["skip_reasons"]]
    needs_paddle = {reason for reason in reasons if "needs paddle" in reason}
    assert needs_paddle <= {hint}, "a test that needs paddle skips naming the platform's install hint"
    assert done.returncode == 0, done.stdout + done.stderr
