"""``fd-platforms run`` on the fake Iluvatar device: Paddle's real custom-device path, one device per rank.

The fake runtime (``tools/fake-custom-device``) and the fake vendor host runtime (pinned host
memory through ``cudaHostAlloc``) are built once for the module.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from run_helpers import (
    MIB, QWEN, ROOT, check_rank, clean_env, expected_decision, qwen_bytes_per_block, run_cli, run_json,
)

TOOLS = ROOT / "tools" / "fake-custom-device"
FAKE_TOTAL = 1024 * MIB
ROLES = ("mixed", "prefill", "decode")
BACKENDS = ("none", "mooncake", "attention_store", "file")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, fake_device_root) -> dict[str, str]:
    """The environment selecting iluvatar on the fake device, with the fake host runtime loadable."""
    device = fake_device_root("iluvatar_gpu")
    host = tmp_path_factory.mktemp("fake-host")
    argv = ["bash", str(TOOLS / "build-host-runtime.sh"), str(host)]
    built = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable},
                           timeout=120)
    assert built.returncode == 0, f"{' '.join(argv)} failed:\n{built.stderr}"
    library_path = os.environ.get("LD_LIBRARY_PATH")
    return clean_env(
        FD_PLATFORM="iluvatar",
        CUSTOM_DEVICE_ROOT=str(device),
        FAKE_DEVICE_TOTAL_MEMORY=str(FAKE_TOTAL),
        FLAGS_allocator_strategy="auto_growth",
        LD_LIBRARY_PATH=f"{host}:{library_path}" if library_path else str(host),
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("role", ROLES)
def test_every_role_and_storage_backend(env: dict[str, str], role: str, backend: str) -> None:
    report = run_json("--model", QWEN, "--tp", "1", "--device-memory", "256MiB", "--role", role,
                      "--storage-backend", backend, env=env)
    per_block = qwen_bytes_per_block(1)
    create, term = expected_decision(role, backend)
    assert (report["platform"], report["num_ranks"], report["bytes_per_block"]) == ("iluvatar", 1, per_block)
    [rank] = report["ranks"]
    check_rank(rank, per_block, create, term)
    assert rank["device"] == "iluvatar_gpu:0"
    assert rank["num_blocks"] == 256 * MIB * 9 // 10 // per_block
    assert (report["manager_pid"] is None) == create


def test_each_rank_on_its_own_device_with_live_memory_and_pinned_swap(env: dict[str, str]) -> None:
    report = run_json("--model", QWEN, "--tp", "2", "--role", "prefill", "--swap-space", "32MiB", env=env)
    per_block = qwen_bytes_per_block(2)
    ranks = report["ranks"]
    assert [rank["device"] for rank in ranks] == ["iluvatar_gpu:0", "iluvatar_gpu:1"]
    for rank in ranks:
        check_rank(rank, per_block, *expected_decision("prefill", "none", swap=True))
        assert rank["planned_blocks"] == FAKE_TOTAL * 9 // 10 // per_block  # the fake total, nothing held yet
        assert rank["num_cpu_blocks"] == 32 * MIB // per_block
        assert (rank["pinned"], rank["host_kind"]) == (True, "cudaHostAlloc")


def test_more_ranks_than_devices_is_refused_with_the_device_count(env: dict[str, str]) -> None:
    done = run_cli("--model", QWEN, "--tp", "4", "--device-memory", "1GiB", env=env)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("fd-platforms: error: --ranks=4 is not valid; allowed: at most 2: platform iluvatar sees 2")
    assert "CUDA_VISIBLE_DEVICES" in line


def test_a_failed_device_allocation_in_the_cache_manager_fails_the_waiting_worker(env: dict[str, str]) -> None:
    done = run_cli("--model", QWEN, "--tp", "1", "--device-memory", "8GiB", "--role", "decode", "--json", env=env)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if ": WARNING: " not in line]
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("fd-platforms: error: cache manager: DeviceAllocError: could not allocate KV cache tensor")
    assert "on iluvatar_gpu:0" in line
    assert "rank 0: CacheNotReadyError: " in line and "exited without setting it" in line
