"""Pinned host memory through a vendor runtime (VendorHostRuntime), against the fake host runtime.

tools/fake-custom-device/build-host-runtime.sh compiles a malloc-backed ``libcudart.so`` and
``libmcruntime.so`` once per module; the tests load them by full path, in this process.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fd_platforms.contract.errors import HostAllocError
from fd_platforms.kit.host_memory import PinningUnavailable, allocate_host
from fd_platforms.kit.vendor_host import VendorHostRuntime

BUILD_SH = Path(__file__).resolve().parents[2] / "tools" / "fake-custom-device" / "build-host-runtime.sh"
HOST_LOGGER = "fd_platforms.kit.host_memory"


def build(outdir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(BUILD_SH), str(outdir)], capture_output=True, text=True, env={**os.environ, **env}, timeout=120
    )


@pytest.fixture(scope="module")
def cudart(fake_vendor_runtime: Path) -> str:
    return str(fake_vendor_runtime / "libcudart.so")


@pytest.fixture
def runtime(cudart: str) -> VendorHostRuntime:
    return VendorHostRuntime(library=cudart, alloc="cudaHostAlloc", free="cudaFreeHost")


@pytest.fixture(autouse=True)
def no_fake_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake's knobs come only from the test that sets them."""
    monkeypatch.delenv("FAKE_HOST_LIMIT", raising=False)
    monkeypatch.delenv("FAKE_HOST_STATUS", raising=False)


def live(library: str) -> int:
    """Allocations the fake at ``library`` has handed out and not had back (same handle as the runtime's)."""
    return int(ctypes.CDLL(library).fake_host_live())


def test_pinned_buffer_is_usable_and_release_frees(runtime: VendorHostRuntime, cudart: str) -> None:
    before = live(cudart)
    buffer = runtime.allocate(4096)
    assert (buffer.pinned, buffer.kind, buffer.nbytes) == (True, "cudaHostAlloc", 4096)
    assert buffer.address != 0
    assert live(cudart) == before + 1
    view = buffer.numpy()
    view[:] = 7
    view[4095] = 42
    again = buffer.numpy()
    assert again[0] == 7 and again[4095] == 42 and again.shape == (4096,)
    assert ctypes.string_at(buffer.address + 4094, 2) == bytes([7, 42])  # the view is the vendor memory itself
    del view, again
    buffer.release()
    assert buffer.released and live(cudart) == before


def test_context_manager_frees_each_buffer(runtime: VendorHostRuntime, cudart: str) -> None:
    before = live(cudart)
    with runtime.allocate(1 << 20) as first, runtime.allocate(1 << 20) as second:
        assert first.address != second.address
        assert live(cudart) == before + 2
    assert live(cudart) == before


def test_metax_symbols_in_libmcruntime(fake_vendor_runtime: Path) -> None:
    library = str(fake_vendor_runtime / "libmcruntime.so")
    before = live(library)
    with VendorHostRuntime(library=library, alloc="mcMallocHost", free="mcFreeHost").allocate(64) as buffer:
        assert (buffer.pinned, buffer.kind) == (True, "mcMallocHost")
        assert live(library) == before + 1
    assert live(library) == before


def test_out_of_memory_is_host_alloc_error_naming_the_size(
    runtime: VendorHostRuntime, cudart: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HOST_LIMIT", "1000")
    before = live(cudart)
    with runtime.allocate(1000) as buffer:  # at the limit still fits
        assert buffer.pinned
    with pytest.raises(HostAllocError, match=r"cudaHostAlloc could not allocate 1001 bytes .*status 2"):
        runtime.allocate(1001)
    assert live(cudart) == before


def test_missing_library_means_pinning_unavailable(tmp_path: Path) -> None:
    missing = str(tmp_path / "libnothere.so")
    runtime = VendorHostRuntime(library=missing, alloc="cudaHostAlloc", free="cudaFreeHost")
    with pytest.raises(PinningUnavailable, match=re.escape("libnothere.so")):
        runtime.allocate(4096)


@pytest.mark.parametrize(("alloc", "free"), [("cudaHostAllocMissing", "cudaFreeHost"), ("cudaHostAlloc", "nofree")])
def test_library_lacking_a_symbol_means_pinning_unavailable(cudart: str, alloc: str, free: str) -> None:
    runtime = VendorHostRuntime(library=cudart, alloc=alloc, free=free)
    with pytest.raises(PinningUnavailable, match="cannot be loaded"):
        runtime.allocate(4096)


def test_other_status_means_pinning_unavailable(
    runtime: VendorHostRuntime, cudart: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HOST_STATUS", "35")  # what a CUDA runtime without a driver answers
    before = live(cudart)
    with pytest.raises(PinningUnavailable, match="returned status 35"):
        runtime.allocate(4096)
    assert live(cudart) == before


def test_contract_pins_when_the_runtime_can(runtime: VendorHostRuntime, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=HOST_LOGGER)
    for require_pinned in (False, True):
        with allocate_host(8192, require_pinned, runtime.allocate, "iluvatar") as buffer:
            assert (buffer.pinned, buffer.kind, buffer.nbytes) == (True, "cudaHostAlloc", 8192)
    assert caplog.records == []


@pytest.mark.parametrize("cause", ["missing library", "status 35"])
def test_contract_falls_back_to_pageable_with_one_warning(
    cause: str, cudart: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    library = str(tmp_path / "libnothere.so") if cause == "missing library" else cudart
    if cause == "status 35":
        monkeypatch.setenv("FAKE_HOST_STATUS", "35")
    runtime = VendorHostRuntime(library=library, alloc="cudaHostAlloc", free="cudaFreeHost")
    caplog.set_level(logging.WARNING, logger=HOST_LOGGER)
    with allocate_host(4096, False, runtime.allocate, "iluvatar") as buffer:
        assert (buffer.pinned, buffer.kind, buffer.nbytes) == (False, "pageable", 4096)
        view = buffer.numpy()
        view[:] = 3
        assert int(view.sum()) == 3 * 4096
        del view
    warnings = [r for r in caplog.records if r.name == HOST_LOGGER]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "cannot pin" in warnings[0].getMessage() and "iluvatar" in warnings[0].getMessage()


def test_contract_require_pinned_is_an_error_with_the_reason(
    cudart: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("FAKE_HOST_STATUS", "35")
    runtime = VendorHostRuntime(library=cudart, alloc="cudaHostAlloc", free="cudaFreeHost")
    caplog.set_level(logging.WARNING, logger=HOST_LOGGER)
    with pytest.raises(HostAllocError, match=r"pinned host memory of 4096 bytes was required.*status 35"):
        allocate_host(4096, True, runtime.allocate, "iluvatar")
    assert caplog.records == []


def test_contract_out_of_memory_is_not_a_fallback(
    runtime: VendorHostRuntime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("FAKE_HOST_LIMIT", "100")
    caplog.set_level(logging.WARNING, logger=HOST_LOGGER)
    with pytest.raises(HostAllocError, match="4096 bytes"):
        allocate_host(4096, False, runtime.allocate, "iluvatar")
    assert caplog.records == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [([], "expected 1 argument (OUTDIR), got 0"), (["out", "extra"], "expected 1 argument (OUTDIR), got 2")],
)
def test_build_rejects_bad_arguments(args: list[str], expected: str, tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(BUILD_SH), *args], capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert result.returncode == 2
    assert result.stderr.startswith("build-host-runtime.sh: ") and expected in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1 and result.stdout == ""
    assert not (tmp_path / "out").exists()


def test_build_reports_missing_compiler(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("dirname"), bin_dir / "dirname")  # the only external tool used before the check
    result = subprocess.run(
        [shutil.which("bash"), str(BUILD_SH), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(bin_dir)},
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("build-host-runtime.sh: g++ not found"), result.stderr
    assert not (tmp_path / "out").exists()
