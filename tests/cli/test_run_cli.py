"""``fd-platforms run`` end to end on the cpu platform: every role and storage backend, swap space,
several ranks sharing host memory, the profile run, the table and its progress lines."""

from __future__ import annotations

import re

import pytest
from run_helpers import MIB, QWEN, check_rank, expected_decision, qwen_bytes_per_block, run_cli, run_json

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"

ROLES = ("mixed", "prefill", "decode")
BACKENDS = ("none", "mooncake", "attention_store", "file")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("role", ROLES)
def test_every_role_and_storage_backend(role: str, backend: str) -> None:
    report = run_json(
        "--model", QWEN, "--tp", "1", "--device-memory", "256MiB", "--role", role, "--storage-backend", backend
    )
    per_block = qwen_bytes_per_block(1)
    create, term = expected_decision(role, backend)
    assert (report["platform"], report["model"], report["num_ranks"]) == ("cpu", "qwen3-30b-a3b", 1)
    assert report["bytes_per_block"] == per_block
    assert report["splitwise_role"] == role
    assert report["storage_backend"] == (None if backend == "none" else backend)
    [rank] = report["ranks"]
    check_rank(rank, per_block, create, term)
    assert rank["device"] == "cpu" and rank["num_cpu_blocks"] == 0
    assert rank["num_blocks"] == rank["planned_blocks"] == 256 * MIB * 9 // 10 // per_block
    assert (report["manager_pid"] is None) == create
    assert report["wall_seconds"] > 0


def test_swap_space_goes_to_the_cache_manager_with_host_memory() -> None:
    report = run_json("--model", QWEN, "--tp", "1", "--device-memory", "256MiB", "--swap-space", "64MiB")
    per_block = qwen_bytes_per_block(1)
    [rank] = report["ranks"]
    check_rank(rank, per_block, *expected_decision("mixed", "none", swap=True))
    assert rank["num_cpu_blocks"] == 64 * MIB // per_block
    assert rank["host_bytes"] == rank["num_cpu_blocks"] * per_block > 0
    assert (rank["pinned"], rank["host_kind"]) == (False, "pageable")  # the cpu platform cannot pin


def test_two_ranks_share_host_memory_evenly_and_use_the_minimum() -> None:
    report = run_json(
        "--model",
        QWEN,
        "--tp",
        "2",
        "--memory-utilization",
        "0.01",
        "--non-cache-memory",
        "0",
        "--storage-backend",
        "file",
    )
    per_block = qwen_bytes_per_block(2)
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        total = int(re.search(r"MemTotal:\s+(\d+) kB", meminfo.read()).group(1)) * 1024  # type: ignore[union-attr]
    ranks = report["ranks"]
    assert [rank["rank"] for rank in ranks] == [0, 1]
    for rank in ranks:
        check_rank(rank, per_block, *expected_decision("mixed", "file"))
        assert rank["device"] == "cpu"
        assert rank["planned_blocks"] <= total // 2 // 100 // per_block, "each rank plans on half the host"
    assert {rank["num_blocks"] for rank in ranks} == {min(rank["planned_blocks"] for rank in ranks)}


def test_profile_run_creates_even_for_a_disaggregated_role() -> None:
    report = run_json(
        "--model",
        QWEN,
        "--tp",
        "1",
        "--device-memory",
        "256MiB",
        "--role",
        "prefill",
        "--storage-backend",
        "mooncake",
        "--profile",
    )
    [rank] = report["ranks"]
    check_rank(rank, qwen_bytes_per_block(1), *expected_decision("prefill", "mooncake", profile=True))
    assert report["profile"] is True and report["manager_pid"] is None


def test_a_profile_run_with_swap_space_reports_no_host_blocks_it_did_not_allocate() -> None:
    report = run_json("--model", QWEN, "--tp", "1", "--device-memory", "256MiB", "--swap-space", "64MiB", "--profile")
    [rank] = report["ranks"]
    per_block = qwen_bytes_per_block(1)
    assert rank["planned_cpu_blocks"] == 64 * MIB // per_block > 0
    assert (rank["num_cpu_blocks"], rank["host_bytes"], report["manager_pid"]) == (0, 0, None)
    done = run_cli("--model", QWEN, "--tp", "1", "--device-memory", "256MiB", "--swap-space", "64MiB", "--profile")
    assert done.returncode == 0, done.stderr
    assert f"0 ({rank['planned_cpu_blocks']} planned)" in done.stdout.splitlines()[2]


def test_the_table_names_the_outcome_when_no_term_decides() -> None:
    done = run_cli("--model", QWEN, "--tp", "1", "--device-memory", "256MiB")
    assert done.returncode == 0, done.stderr
    row = done.stdout.splitlines()[2]
    assert "rule: no cache manager needed" in row and " none " not in row


def test_table_and_progress_from_a_config_file_with_ranks_from_tp() -> None:
    done = run_cli("--config", "examples/deploy.toml", "--tp", "2", "--device-memory", "256MiB", "--role", "decode")
    assert done.returncode == 0, done.stderr
    title, header, *rows = done.stdout.splitlines()
    assert title.startswith("platform cpu, model qwen3-30b-a3b, 2 rank(s), role decode, storage backend none")
    assert header.split()[:4] == ["RANK", "DEVICE", "CREATE", "DECIDED"]
    assert [row.split()[:4] for row in rows] == [[str(rank), "cpu", "no", "splitwise_role"] for rank in (0, 1)]
    assert all("cache manager" in row for row in rows)
    manager = re.search(r"starting the cache manager \(pid (\d+)\) for rank\(s\) 0, 1", done.stderr)
    assert manager, done.stderr
    pid = manager.group(1)
    for expected in (
        "started 2 worker(s)",
        "rank 0: planned 76 blocks",
        f"rank 1: waiting for the cache manager (pid {pid}) to publish this rank's cache",
        f"cache manager (pid {pid}): publishing 228.00 MiB of KV cache for rank 1",
        "rank 0: attached to 96 tensors of the cache manager's KV cache in",
        "every rank's KV cache is ready; shared memory verified: True",
    ):
        assert expected in done.stderr
    assert "Traceback" not in done.stderr


def test_cycles_clear_and_reinitialize_every_rank_with_the_memory_still_shared() -> None:
    report = run_json("--model", QWEN, "--tp", "2", "--device-memory", "256MiB", "--role", "decode", "--cycles", "3")
    per_block = qwen_bytes_per_block(2)
    for rank in report["ranks"]:
        check_rank(rank, per_block, *expected_decision("decode", "none"))
    cycles = report["cycles"]
    assert [cycle["cycle"] for cycle in cycles] == [1, 2, 3]
    for cycle in cycles:
        assert cycle["verified"] is True, "after every re-initialization each rank maps the manager's memory again"
        assert cycle["clear_seconds"] > 0 and cycle["init_seconds"] > 0
        assert set(cycle["rss"]) == {"engine", "cache manager", "rank 0", "rank 1"}
        assert all(isinstance(rss["before"], int) and isinstance(rss["after"], int) for rss in cycle["rss"].values())


def test_cycles_on_the_creator_path_have_nothing_to_verify() -> None:
    report = run_json("--model", QWEN, "--tp", "1", "--device-memory", "256MiB", "--cycles", "2")
    assert [cycle["verified"] for cycle in report["cycles"]] == [None, None]
    assert set(report["cycles"][0]["rss"]) == {"engine", "rank 0"}


@pytest.mark.parametrize("cycles", ["-1", "100001"])
def test_a_bad_cycle_count_is_a_configuration_error(cycles: str) -> None:
    done = run_cli("--model", QWEN, "--device-memory", "256MiB", "--cycles", cycles)
    assert done.returncode == 2 and f"--cycles={cycles} is not valid; allowed: 0 to 100000" in done.stderr
