"""The fake custom-device runtime (tools/fake-custom-device) as Paddle's real loader sees it.

Each device type is compiled once per module; every Paddle check runs in a fresh
interpreter because Paddle reads ``CUSTOM_DEVICE_ROOT`` only when it is imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"

BUILD_SH = Path(__file__).resolve().parents[2] / "tools" / "fake-custom-device" / "build.sh"
DEVICE_TYPES = ("iluvatar_gpu", "metax_gpu")
DEFAULT_TOTAL = 16 << 30
CONFIGURED_TOTAL = 3 << 30  # what the main probe sets through FAKE_DEVICE_TOTAL_MEMORY

needs_gxx = pytest.mark.skipif(
    shutil.which("g++") is None, reason="g++ not found on PATH: cannot compile the fake custom-device runtime"
)

# Runs inside the subprocess; argv[1] is the device type. Prints one line "RESULT <json>".
PROBE = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import paddle

    T = sys.argv[1]
    d0, d1 = f"{T}:0", f"{T}:1"
    out = {}
    out["types"] = paddle.device.get_all_custom_device_type()
    out["device_count"] = paddle.device.device_count(T)
    out["core_count"] = paddle.base.core.get_custom_device_count(T)
    out["total_memory"] = paddle.device.get_device_properties(d0).total_memory
    if os.environ.get("PROBE_FULL"):
        out["default_device"] = paddle.device.get_device()
        paddle.set_device(d1)
        out["current_device"] = paddle.device.get_device()
        x = paddle.to_tensor([1.0, 2.0, 3.0])
        out["tensor_place"] = str(x.place)
        out["tensor_values"] = x.numpy().tolist()
        out["device_name"] = paddle.device.get_device_properties(d1).name

        before = paddle.device.memory_allocated(d0)
        kept = paddle.to_tensor(np.zeros(1 << 20, dtype="uint8"), place=paddle.CustomPlace(T, 0))
        out["allocated_growth"] = paddle.device.memory_allocated(d0) - before
        out["reserved_growth"] = paddle.device.memory_reserved(d0) - before
        out["peak_allocated"] = paddle.device.max_memory_allocated(d0)

        paddle.set_device(d0)
        before = paddle.device.memory_allocated(d0)
        try:
            paddle.empty([int(os.environ["FAKE_DEVICE_TOTAL_MEMORY"]) + 1], dtype="uint8")
            out["oversize_error"] = None
        except Exception as exc:
            out["oversize_error"] = f"{type(exc).__name__}: {exc}"
        out["allocated_after_oversize"] = paddle.device.memory_allocated(d0) - before
        out["small_after_oversize"] = str(paddle.empty([1024], dtype="uint8").place)

        raw = paddle.to_tensor(np.array([0x80, 0x3F, 0x00, 0x40], dtype="uint8"), place=paddle.CustomPlace(T, 0))
        view = raw.view(paddle.bfloat16)
        out["view_dtype"] = str(view.dtype)
        out["view_place"] = str(view.place)
        out["view_values"] = view.astype("float32").numpy().tolist()

        stream = paddle.device.Stream(d0)
        event = stream.record_event()
        event.synchronize()
        paddle.device.synchronize(d1)
        out["event_done"] = event.query() and stream.query()
    print("RESULT " + json.dumps(out))
    """
)


def build(device_type: str, outdir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(BUILD_SH), device_type, str(outdir)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable, **env},
        timeout=120,
    )


def probe(lib_dir: Path, device_type: str, **env: str) -> dict[str, Any]:
    """Import paddle with the fake runtime loaded and return what PROBE measured."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_DEVICE_", "FLAGS_selected_", "PROBE_"))}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, device_type],
        capture_output=True,
        text=True,
        env={**base, "CUSTOM_DEVICE_ROOT": str(lib_dir), "FLAGS_allocator_strategy": "auto_growth", **env},
        timeout=120,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, (
        f"probe failed (rc={result.returncode})\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.fixture(scope="module", params=DEVICE_TYPES)
def fake_lib(request: pytest.FixtureRequest, fake_device_root) -> tuple[str, Path]:
    """(device type, folder holding only its compiled runtime): the session's build (conftest), whose
    ``build.sh`` printed the library's path."""
    return request.param, fake_device_root(request.param)


@pytest.fixture(scope="module")
def full(fake_lib: tuple[str, Path]) -> dict[str, Any]:
    device_type, outdir = fake_lib
    return probe(outdir, device_type, PROBE_FULL="1", FAKE_DEVICE_TOTAL_MEMORY=str(CONFIGURED_TOTAL))


def test_defaults_register_two_devices_with_16_gib(fake_lib: tuple[str, Path]) -> None:
    device_type, outdir = fake_lib
    out = probe(outdir, device_type)
    assert out["types"] == [device_type]
    assert out["device_count"] == out["core_count"] == 2
    assert out["total_memory"] == DEFAULT_TOTAL


def test_device_count_knob(fake_lib: tuple[str, Path]) -> None:
    device_type, outdir = fake_lib
    assert probe(outdir, device_type, FAKE_DEVICE_COUNT="3")["device_count"] == 3


def test_set_device_and_tensor_placement(full: dict[str, Any], fake_lib: tuple[str, Path]) -> None:
    device_type, _ = fake_lib
    assert full["default_device"] == f"{device_type}:0"
    assert full["current_device"] == f"{device_type}:1"
    assert full["tensor_place"] == f"Place({device_type}:1)"
    assert full["tensor_values"] == [1.0, 2.0, 3.0]  # host -> fake device -> host round trip


def test_properties_report_configured_total_memory(full: dict[str, Any], fake_lib: tuple[str, Path]) -> None:
    assert full["total_memory"] == CONFIGURED_TOTAL
    assert full["device_name"] == f"Fake {fake_lib[0]}"


def test_allocator_stats_count_device_tensors(full: dict[str, Any]) -> None:
    assert full["allocated_growth"] >= 1 << 20
    assert full["reserved_growth"] >= full["allocated_growth"]
    assert full["peak_allocated"] >= 1 << 20


def test_allocation_beyond_total_memory_is_an_error(full: dict[str, Any], fake_lib: tuple[str, Path]) -> None:
    assert full["oversize_error"] is not None, "allocating more than the fake's total memory succeeded"
    assert "CustomDevice error" in full["oversize_error"]
    assert full["allocated_after_oversize"] == 0
    assert full["small_after_oversize"] == f"Place({fake_lib[0]}:0)"


def test_uint8_tensor_views_as_bfloat16(full: dict[str, Any], fake_lib: tuple[str, Path]) -> None:
    assert full["view_dtype"] == "paddle.bfloat16"
    assert full["view_place"] == f"Place({fake_lib[0]}:0)"
    assert full["view_values"] == [1.0, 2.0]  # little-endian 0x3f80, 0x4000


def test_streams_events_and_synchronize(full: dict[str, Any]) -> None:
    assert full["event_done"] is True


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["Bad-Type", "out"], "^[a-z][a-z0-9_]*$"),
        (["9gpu", "out"], "^[a-z][a-z0-9_]*$"),
        (["iluvatar_gpu"], "expected 2 arguments"),
        (["iluvatar_gpu", "out", "extra"], "expected 2 arguments"),
    ],
)
def test_build_rejects_bad_arguments(args: list[str], expected: str, tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(BUILD_SH), *args], capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "out").exists()


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@needs_gxx
def test_build_reports_missing_paddle(tmp_path: Path) -> None:
    no_site = write_script(tmp_path / "python-no-site", f'exec "{sys.executable}" -S "$@"\n')
    result = build("iluvatar_gpu", tmp_path / "out", PYTHON=str(no_site))
    assert result.returncode != 0
    assert "paddle is not installed" in result.stderr, result.stderr


@needs_gxx
def test_build_reports_missing_header(tmp_path: Path) -> None:
    (tmp_path / "paddle").mkdir()
    fake_python = write_script(tmp_path / "python-fake", f'cat >/dev/null\necho "{tmp_path / "paddle"}"\n')
    result = build("iluvatar_gpu", tmp_path / "out", PYTHON=str(fake_python))
    assert result.returncode != 0
    assert "device_ext.h is missing" in result.stderr, result.stderr


def test_build_reports_missing_compiler(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("dirname"), bin_dir / "dirname")  # the only external tool used before the check
    result = subprocess.run(
        [shutil.which("bash"), str(BUILD_SH), "iluvatar_gpu", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(bin_dir)},
        timeout=30,
    )
    assert result.returncode != 0
    assert "g++ not found" in result.stderr, result.stderr
