"""The Iluvatar and MetaX plugins end to end on the fake Paddle custom device.

Paddle reads ``CUSTOM_DEVICE_ROOT`` only when it is imported, so every check runs in a fresh
interpreter. To keep the module quick, one probe process per platform measures many facts and
prints them as JSON; the tests below assert on that record. The CLI runs as the real console
script. The fake vendor host runtime (``build-host-runtime.sh``) is put on ``LD_LIBRARY_PATH`` only
where a test wants host memory pinned.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools" / "fake-custom-device"
SCRIPT = str(Path(sysconfig.get_path("scripts")) / "fd-platforms")
GIB = 2**30
FAKE_TOTAL = 4 * GIB
QWEN_BYTES_PER_BLOCK = 2 * 2 * 64 * 128 * (4 // 4) * 48  # bf16, key + value, block 64, 1 kv head per rank, 48 layers


@dataclass(frozen=True)
class Case:
    """One plugin as the tests expect it to behave."""

    name: str
    device_type: str
    visible_devices_env: str
    distribution: str
    host_library: str
    host_alloc: str


CASES = (
    Case("iluvatar", "iluvatar_gpu", "CUDA_VISIBLE_DEVICES", "paddle-iluvatar-gpu", "libcudart.so", "cudaHostAlloc"),
    Case("metax", "metax_gpu", "MACA_VISIBLE_DEVICES", "paddle-metax-gpu", "libmcruntime.so", "mcMallocHost"),
)
BY_NAME = {case.name: case for case in CASES}

# Runs in the subprocess with FD_PLATFORM set; prints one line "RESULT <json>".
PROBE = textwrap.dedent(
    """
    import ctypes, json, logging, sys
    import fd_platforms
    from fd_platforms.loading.selection import Prober
    from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config
    from fd_platforms.contract.errors import FdPlatformsError
    from fd_platforms.engine.kv_cache import allocate_kv_cache
    from fd_platforms.rules.layout import build_layout

    warnings = []

    class Collect(logging.Handler):
        def emit(self, record):
            warnings.append([record.levelname, record.getMessage()])

    logging.getLogger("fd_platforms.kit.host_memory").addHandler(Collect())

    def memory(platform, device_id):
        m = platform.device_memory(device_id)
        return {"total": m.total_bytes, "free": m.free_bytes, "process": m.process_bytes, "source": m.source}

    def host(platform, library, require_pinned):
        del warnings[:]
        out = {"warnings": warnings}
        try:
            buffer = platform.host_alloc(4096, require_pinned=require_pinned)
        except FdPlatformsError as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
            return out
        view = buffer.numpy()
        view[:] = 5
        out.update(pinned=buffer.pinned, kind=buffer.kind, nbytes=buffer.nbytes, sum=int(view.sum()))
        del view
        fake = fake_library(library)
        out["live_after_alloc"] = None if fake is None else fake.fake_host_live()
        buffer.release()
        out["live_after_release"] = None if fake is None else fake.fake_host_live()
        out["warnings"] = list(warnings)
        return out

    def fake_library(library):
        try:
            lib = ctypes.CDLL(library)  # the same handle the platform's runtime got
            return lib if hasattr(lib, "fake_host_live") else None
        except OSError:
            return None

    def main(mode, library, example):
        out = {}
        if mode == "fallback":
            prober = Prober()
            for name, lib in (("iluvatar", "libcudart.so"), ("metax", "libmcruntime.so")):
                platform = prober.probe(name).platform  # the plugin's platform, selected or not
                out[name] = {
                    "loadable": loads(lib),
                    "plain": host(platform, lib, False),
                    "required": host(platform, lib, True),
                }
            return out
        import paddle
        platform = fd_platforms.current_platform()
        selection = fd_platforms.current_selection()
        identity = platform.identity
        detection = platform.confirm()
        out["selected"] = [platform.name, selection.how]
        out["confirm"] = [detection.available, detection.device_count, detection.reason]
        out["identity"] = [identity.device_type, identity.visible_devices_env, identity.device_string(1)]
        out["limits"] = [[l.kind, l.value, l.reason] for l in platform.declared_limits()]
        out["memory0"] = memory(platform, 0)
        out["memory1_before"] = memory(platform, 1)

        layout = build_layout(load_model_config(example), CacheConfig(block_size=64, cache_dtype="bfloat16"),
                              ParallelConfig(4, 0), device_id=1)
        device = identity.device_string(1)
        out["layout"] = {"names": list(layout.names()), "bytes_per_block": layout.bytes_per_block,
                         "shapes": [[64, *spec.block_shape] for spec in layout.tensors]}
        before = paddle.device.memory_allocated(device)
        kv = allocate_kv_cache(layout, 64, platform.identity.device_string(layout.local_device))
        out["kv"] = {
            "device": kv.device, "num_blocks": kv.num_blocks, "names": list(kv.names), "nbytes": kv.nbytes,
            "places": sorted({str(t.place) for t in kv.tensors}),
            "dtypes": sorted({str(t.dtype) for t in kv.tensors}),
            "shapes": [list(t.shape) for t in kv.tensors],
            "allocated_growth": paddle.device.memory_allocated(device) - before,
        }
        out["memory1_after"] = memory(platform, 1)

        before = paddle.device.memory_allocated(device)
        too_many = out["memory0"]["total"] // layout.bytes_per_block + 64
        try:
            allocate_kv_cache(layout, too_many, platform.identity.device_string(layout.local_device))
            out["too_many"] = {"error": None}
        except Exception as exc:
            out["too_many"] = {"error": type(exc).__name__, "message": str(exc)}
        out["too_many"]["allocated_change"] = paddle.device.memory_allocated(device) - before
        out["too_many"]["num_blocks"] = too_many
        kv.clear()

        out["host"] = host(platform, library, False)
        out["host_required"] = host(platform, library, True)
        return out

    def loads(library):
        try:
            ctypes.CDLL(library)
            return True
        except OSError:
            return False

    print("RESULT " + json.dumps(main(*sys.argv[1:])))
    """
)


def clean_env(**env: str) -> dict[str, str]:
    """The outer environment without selection, fake-device or custom-device settings, plus ``env``."""
    drop = ("FD_PLATFORM", "FD_PLATFORM_PLUGINS", "CUSTOM_DEVICE_ROOT", "FLAGS_selected_")
    base = {k: v for k, v in os.environ.items() if not k.startswith(drop) and not k.startswith("FAKE_")}
    return {**base, "FLAGS_allocator_strategy": "auto_growth", "FAKE_DEVICE_TOTAL_MEMORY": str(FAKE_TOTAL), **env}


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def probe(mode: str, library: str, env: dict[str, str]) -> dict[str, Any]:
    """Run PROBE and return what it measured; a failure shows the subprocess's output."""
    result = run([sys.executable, "-c", PROBE, mode, library, str(ROOT / "examples" / "qwen3-30b-a3b")], env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, (
        f"probe failed (rc={result.returncode})\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return json.loads(lines[-1].removeprefix("RESULT "))


def with_library_path(directory: Path, env: dict[str, str]) -> dict[str, str]:
    outer = env.get("LD_LIBRARY_PATH")
    return {**env, "LD_LIBRARY_PATH": f"{directory}:{outer}" if outer else str(directory)}


@pytest.fixture(scope="module")
def fake_dirs(fake_device_root, fake_vendor_runtime: Path) -> dict[str, Path]:
    """Each device type's fake runtime in its own folder (a CUSTOM_DEVICE_ROOT), and ``host``: the fake
    vendor host runtime's folder (kept apart, since Paddle loads every .so in CUSTOM_DEVICE_ROOT); the
    session's builds (conftest)."""
    dirs = {case.device_type: fake_device_root(case.device_type) for case in CASES}
    dirs["host"] = fake_vendor_runtime
    for case in CASES:
        assert (dirs[case.device_type] / f"libfake_{case.device_type}.so").is_file()
    assert (dirs["host"] / "libcudart.so").is_file() and (dirs["host"] / "libmcruntime.so").is_file()
    return dirs


@pytest.fixture(scope="module", params=CASES, ids=[case.name for case in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    return request.param


@pytest.fixture(scope="module")
def facts(case: Case, fake_dirs: dict[str, Path]) -> dict[str, Any]:
    """What one probe process with ``FD_PLATFORM=<name>`` and the fake host runtime measured."""
    env = clean_env(FD_PLATFORM=case.name, CUSTOM_DEVICE_ROOT=str(fake_dirs[case.device_type]))
    return probe("device", case.host_library, with_library_path(fake_dirs["host"], env))


@pytest.fixture(scope="module")
def fallback(fake_dirs: dict[str, Path]) -> dict[str, Any]:
    """Both plugins' host_alloc without the fake host runtime on the library path (one process)."""
    env = clean_env(CUSTOM_DEVICE_ROOT=str(fake_dirs["metax_gpu"]))
    return probe("fallback", "", env)


def test_selected_and_confirmed_through_paddle(facts: dict[str, Any], case: Case) -> None:
    assert facts["selected"] == [case.name, "env"]
    available, count, reason = facts["confirm"]
    assert (available, count) == (True, 2), reason
    assert case.device_type in reason


def test_identity(facts: dict[str, Any], case: Case) -> None:
    assert facts["identity"] == [case.device_type, case.visible_devices_env, f"{case.device_type}:1"]


def test_device_memory_reports_the_fake_total_and_no_free(facts: dict[str, Any]) -> None:
    for key in ("memory0", "memory1_before", "memory1_after"):
        memory = facts[key]
        assert memory["total"] == FAKE_TOTAL and memory["free"] is None, memory
    assert "get_device_properties" in facts["memory0"]["source"]


def test_device_memory_process_bytes_is_the_peak_after_the_kv_cache(facts: dict[str, Any]) -> None:
    before, after = facts["memory1_before"]["process"], facts["memory1_after"]["process"]
    assert before is not None and after is not None
    assert after >= before + facts["kv"]["nbytes"]


def test_kv_cache_follows_the_layout_on_the_device(facts: dict[str, Any], case: Case) -> None:
    kv, layout = facts["kv"], facts["layout"]
    assert layout["bytes_per_block"] == QWEN_BYTES_PER_BLOCK
    assert kv["names"] == layout["names"] and len(kv["names"]) == 2 * 48
    assert kv["names"][:2] == ["key_caches_0_rank0.device1", "value_caches_0_rank0.device1"]
    assert (kv["device"], kv["num_blocks"]) == (f"{case.device_type}:1", 64)
    assert kv["places"] == [f"Place({case.device_type}:1)"]
    assert kv["dtypes"] == ["paddle.bfloat16"]
    assert kv["shapes"] == layout["shapes"] and kv["shapes"][0] == [64, 1, 64, 128]
    assert kv["nbytes"] == 64 * QWEN_BYTES_PER_BLOCK
    assert kv["allocated_growth"] >= kv["nbytes"]


def test_too_many_blocks_is_a_device_alloc_error_and_leaks_nothing(facts: dict[str, Any], case: Case) -> None:
    too_many = facts["too_many"]
    assert too_many["error"] == "DeviceAllocError", too_many
    assert f"on {case.device_type}:1" in too_many["message"]
    done = re.search(r"after (\d+) of 96 tensors", too_many["message"])
    assert done and int(done.group(1)) > 0, "the fake refused the first tensor, so no cleanup was exercised"
    assert too_many["allocated_change"] == 0


def test_host_alloc_pins_through_the_vendor_runtime(facts: dict[str, Any], case: Case) -> None:
    for key in ("host", "host_required"):
        host = facts[key]
        assert "error" not in host, host
        assert (host["pinned"], host["kind"], host["nbytes"], host["sum"]) == (True, case.host_alloc, 4096, 5 * 4096)
        assert (host["live_after_alloc"], host["live_after_release"]) == (1, 0), "not the fake runtime, or not freed"
        assert host["warnings"] == []


def test_declared_limits(facts: dict[str, Any], case: Case) -> None:
    if case.name == "iluvatar":
        [(kind, value, reason)] = facts["limits"]
        assert (kind, value) == ("max_tensor_elements", 2**31 - 1)
        assert "32-bit" in reason
    else:
        assert facts["limits"] == []


def test_metax_host_alloc_without_the_runtime_falls_back(fallback: dict[str, Any]) -> None:
    metax = fallback["metax"]
    if metax["loadable"]:
        pytest.skip("a libmcruntime.so is loadable on this machine, so the no-runtime path cannot be shown")
    plain = metax["plain"]
    assert (plain["pinned"], plain["kind"], plain["sum"]) == (False, "pageable", 5 * 4096)
    [(level, message)] = plain["warnings"]
    assert level == "WARNING" and "cannot pin" in message and "libmcruntime.so" in message
    assert metax["required"]["error"].startswith("HostAllocError: pinned host memory of 4096 bytes was required")
    assert metax["required"]["warnings"] == []


def test_iluvatar_host_alloc_keeps_the_contract_with_whatever_libcudart_is_here(fallback: dict[str, Any]) -> None:
    """This machine may have a real libcudart.so (pinning, or failing without a driver) or none."""
    plain, required = fallback["iluvatar"]["plain"], fallback["iluvatar"]["required"]
    if plain["pinned"]:
        assert plain["kind"] == "cudaHostAlloc" and plain["warnings"] == []
        assert required["pinned"] and required["kind"] == "cudaHostAlloc"
    else:
        assert plain["kind"] == "pageable" and plain["sum"] == 5 * 4096
        [(level, message)] = plain["warnings"]
        assert level == "WARNING" and "cannot pin" in message and "libcudart.so" in message
        assert required["error"].startswith("HostAllocError: pinned host memory of 4096 bytes was required")


def test_cli_list_selects_the_confirmed_platform(case: Case, fake_dirs: dict[str, Path]) -> None:
    env = clean_env(FD_PLATFORM=case.name, CUSTOM_DEVICE_ROOT=str(fake_dirs[case.device_type]))
    result = run([SCRIPT, "list", "--json"], env)
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    [report] = [r for r in payload["platforms"] if r["name"] == case.name]
    assert (report["status"], report["device_count"], report["device_type"]) == ("available", 2, case.device_type)
    assert payload["selected"]["name"] == case.name and payload["selected"]["how"] == "env"
    assert payload["error"] is None


def test_cli_plan_uses_the_live_device_memory(case: Case, fake_dirs: dict[str, Path]) -> None:
    env = clean_env(FD_PLATFORM=case.name, CUSTOM_DEVICE_ROOT=str(fake_dirs[case.device_type]))
    result = run(
        [SCRIPT, "plan", "--model", "examples/qwen3-30b-a3b", "--tp", "4", "--block-size", "64", "--json"], env
    )
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)
    memory = row["device_memory"]
    assert (row["platform"], memory["total_bytes"], memory["free_bytes"]) == (case.name, FAKE_TOTAL, None)
    non_cache = memory["non_cache_bytes"]
    assert isinstance(non_cache, int) and non_cache >= 0
    assert row["bytes_per_block"] == QWEN_BYTES_PER_BLOCK
    assert row["budget_bytes"] == FAKE_TOTAL * 9 // 10 - non_cache  # default memory_utilization 0.9
    assert row["num_blocks"] == row["budget_bytes"] // QWEN_BYTES_PER_BLOCK
    assert row["binding"] == "memory"


@pytest.mark.parametrize("name", BY_NAME)
def test_cli_without_custom_device_root_says_not_installed(name: str) -> None:
    try:
        metadata.version(BY_NAME[name].distribution)
    except metadata.PackageNotFoundError:
        pass
    else:
        pytest.skip(f"{BY_NAME[name].distribution} is installed here, so the platform is not missing")
    result = run([SCRIPT, "list"], clean_env(FD_PLATFORM=name))
    assert result.returncode == 2, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "not installed" in lines[0] and name in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_cli_custom_device_root_of_another_vendor_is_not_detected(fake_dirs: dict[str, Path]) -> None:
    env = clean_env(FD_PLATFORM="iluvatar", CUSTOM_DEVICE_ROOT=str(fake_dirs["metax_gpu"]))
    result = run([SCRIPT, "list", "--json"], env)
    assert result.returncode == 2, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "iluvatar" in lines[0] and "not available" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    payload = json.loads(result.stdout)
    reports = {r["name"]: r for r in payload["platforms"]}
    assert payload["selected"] is None
    assert reports["iluvatar"]["status"] == "unavailable" and "not installed" in reports["iluvatar"]["reason"]
    assert f"CUSTOM_DEVICE_ROOT={fake_dirs['metax_gpu']} holds no *iluvatar*.so" in reports["iluvatar"]["reason"]
    assert reports["metax"]["status"] == "available"  # its cheap detection does find the metax library
