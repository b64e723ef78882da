"""``fd-platforms run`` on the fake Iluvatar device: Paddle's real custom-device path, one device per rank.

The fake runtime (``tools/fake-custom-device``) and the fake vendor runtime (pinned host memory
through ``cudaHostAlloc``; device memory and its IPC through ``cudaIpc*`` / ``mcIpc*``) are built once
for the module.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from run_helpers import (
    MIB,
    QWEN,
    ROOT,
    check_rank,
    clean_env,
    expected_decision,
    qwen_bytes_per_block,
    run_cli,
    run_json,
    without_sweep,
)

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"

TOOLS = ROOT / "tools" / "fake-custom-device"
FAKE_TOTAL = 1024 * MIB


def platform_env(fake_device_root, platform: str, device_type: str, library_path: str | None) -> dict[str, str]:
    """The environment selecting ``platform`` on the fake device, with ``library_path`` (the fake vendor
    runtime's folder, or None: no vendor runtime) on LD_LIBRARY_PATH."""
    outer = os.environ.get("LD_LIBRARY_PATH")
    paths = [path for path in (library_path, outer) if path]
    return clean_env(
        FD_PLATFORM=platform,
        CUSTOM_DEVICE_ROOT=str(fake_device_root(device_type)),
        FAKE_DEVICE_TOTAL_MEMORY=str(FAKE_TOTAL),
        FLAGS_allocator_strategy="auto_growth",
        **({"LD_LIBRARY_PATH": ":".join(paths)} if paths else {}),
    )


@pytest.fixture(scope="module")
def env(fake_device_root, fake_vendor_runtime) -> dict[str, str]:
    """The environment selecting iluvatar on the fake device, with the fake vendor runtime loadable."""
    return platform_env(fake_device_root, "iluvatar", "iluvatar_gpu", str(fake_vendor_runtime))


@pytest.mark.parametrize(
    ("role", "backend"), [("mixed", "none"), ("decode", "none"), ("mixed", "attention_store"), ("prefill", "file")]
)
def test_workers_create_or_attach_as_the_rule_decides(env: dict[str, str], role: str, backend: str) -> None:
    """A run creates where the rule says so and, where it sends workers to attach (a role, a storage backend),
    they open the cache manager's tensors through the vendor runtime's IPC (cudaIpc* of CoreX's libcudart.so,
    faked) and prove it with tokens written both ways. (Every role and backend runs on cpu in test_run_cli.py.)"""
    create, term = expected_decision(role, backend)
    args = ("--model", QWEN, "--tp", "1", "--device-memory", "256MiB", "--role", role, "--storage-backend", backend)
    report = run_json(*args, env=env)
    per_block = qwen_bytes_per_block(1)
    assert (report["platform"], report["num_ranks"], report["bytes_per_block"]) == ("iluvatar", 1, per_block)
    [rank] = report["ranks"]
    check_rank(rank, per_block, create, term)
    assert rank["device"] == "iluvatar_gpu:0"
    assert rank["num_blocks"] == 256 * MIB * 9 // 10 // per_block
    assert (report["manager_pid"] is None) == create


@pytest.mark.parametrize("protocol", ["fd-platforms", "fastdeploy"])
def test_metax_decode_workers_attach_across_processes_on_their_own_devices(
    fake_device_root, fake_vendor_runtime, protocol: str, request: pytest.FixtureRequest
) -> None:
    """MetaX (mcIpc* of libmcruntime.so, faked): two decode workers, each on its own device, attach to the
    cache manager's tensors and verify tokens both ways; with FastDeploy's protocol the records hold the raw
    64-byte IPC handles, as FastDeploy's set_data_ipc writes them."""
    if protocol == "fastdeploy":  # FastDeploy's record names are the machine's: in turns with other runs
        request.getfixturevalue("fastdeploy_record_names")
    env = platform_env(fake_device_root, "metax", "metax_gpu", str(fake_vendor_runtime))
    report = run_json(
        "--model", QWEN, "--tp", "2", "--device-memory", "256MiB", "--role", "decode", "--protocol", protocol, env=env
    )
    per_block = qwen_bytes_per_block(2)
    assert [rank["device"] for rank in report["ranks"]] == ["metax_gpu:0", "metax_gpu:1"]
    for rank in report["ranks"]:
        check_rank(rank, per_block, *expected_decision("decode", "none"))


def test_without_the_vendor_runtime_an_attach_is_refused_when_the_rule_decides(fake_device_root) -> None:
    """Where the vendor runtime (and so its IPC) cannot be loaded, the platform declares no sharing and a
    run whose rule sends workers to attach is refused before any process starts, naming the deciding term.
    (MetaX: its libmcruntime.so is nowhere here; a CUDA toolkit's libcudart.so may be, so not Iluvatar.)"""
    platform = "metax"
    env = platform_env(fake_device_root, platform, "metax_gpu", None)
    loads = subprocess.run(
        [sys.executable, "-c", "import ctypes; ctypes.CDLL('libmcruntime.so')"], env=env, capture_output=True
    )
    assert loads.returncode != 0, "libmcruntime.so must not be loadable here"
    done = run_cli("--model", QWEN, "--tp", "1", "--device-memory", "256MiB", "--role", "decode", env=env)
    assert done.returncode == 2, done.stderr
    [line] = without_sweep(done.stderr)[-1:]
    assert line.startswith(
        f"fd-platforms: error: platform {platform}: the rule decided the workers attach to the "
        "cache manager's KV cache (deciding term splitwise_role: "
    )
    assert "cannot share KV cache tensors between processes" in line and "Fix: run so that workers create" in line
    assert "started" not in done.stderr and "Traceback" not in done.stderr, "refused before any process starts"


def test_each_rank_on_its_own_device_with_live_memory(env: dict[str, str]) -> None:
    report = run_json("--model", QWEN, "--tp", "2", env=env)
    per_block = qwen_bytes_per_block(2)
    ranks = report["ranks"]
    assert [rank["device"] for rank in ranks] == ["iluvatar_gpu:0", "iluvatar_gpu:1"]
    for rank in ranks:
        check_rank(rank, per_block, *expected_decision("mixed", "none"))
        assert rank["planned_blocks"] == FAKE_TOTAL * 9 // 10 // per_block  # the fake total, nothing held yet


def test_fastdeploys_block_count_fills_one_word_per_rank_under_its_own_suffix(env: dict[str, str]) -> None:
    """FastDeploy's Iluvatar engine makes get_profile_block_num one word per local rank (engine.py
    _init_worker_signals): the run's engine makes it so, under --block-count-suffix, and rank 0 hands the count
    into every word (a word of another length would be a CacheSignalError failing the run)."""
    suffix = f"fdb{os.getpid()}"
    done = run_cli(
        "--model",
        QWEN,
        "--tp",
        "2",
        "--device-memory",
        "256MiB",
        "--protocol",
        "fastdeploy",
        "--block-count-suffix",
        suffix,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    blocks = 256 * MIB * 9 // 10 // qwen_bytes_per_block(2)
    assert f"rank 0: handed the agreed {blocks} blocks to the engine (get_profile_block_num.{suffix})" in done.stderr
    assert not os.path.exists(f"/dev/shm/get_profile_block_num.{suffix}"), "removed with the run's signals"


def test_host_swap_cache_is_carved_from_the_vendors_pinned_memory(env: dict[str, str]) -> None:
    code = (
        "import fd_platforms\n"
        "from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config\n"
        "from fd_platforms.engine.host_cache import allocate_host_cache\n"
        "from fd_platforms.rules.layout import build_layout\n"
        "platform = fd_platforms.current_platform()\n"
        f"layout = build_layout(load_model_config({str(ROOT / QWEN)!r}), CacheConfig(), ParallelConfig(2, 1), "
        "device_id=1)\n"
        "host = allocate_host_cache(platform, layout, 3)\n"
        "first, last = host.tensors[0], host.tensors[-1]\n"
        "print(host.pinned, host.buffer.kind, host.names[0], host.names[-1], list(first.shape), str(first.dtype),\n"
        "      first.data_ptr() == host.buffer.address,\n"
        "      last.data_ptr() + 3 * 2 * 64 * 128 * 2 <= host.buffer.address + host.nbytes)\n"
        "del first, last\n"
        "host.clear()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "True",
        "cudaHostAlloc",
        "key_caches_0_rank1",
        "value_caches_47_rank1",
        "[3,",
        "2,",
        "64,",
        "128]",
        "paddle.bfloat16",
        "True",
        "True",
    ]


def test_more_ranks_than_devices_is_refused_with_the_device_count(env: dict[str, str]) -> None:
    done = run_cli("--model", QWEN, "--tp", "4", "--device-memory", "1GiB", env=env)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("fd-platforms: error: --ranks=4 is not valid; allowed: at most 2: platform iluvatar sees 2")
    assert "CUDA_VISIBLE_DEVICES" in line
