"""A vendor runtime's device memory and IPC through ctypes, and the operator that wraps it as a Paddle tensor.

Runs against the fake vendor runtime (``tools/fake-custom-device/fake_host_runtime.cc``, memfd-backed
device memory), loaded by its absolute path so no LD_LIBRARY_PATH is needed in this process.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from fd_platforms.contract.errors import CacheSharingError, ConfigError, DeviceAllocError
from fd_platforms.kit import foreign_tensor as operator
from fd_platforms.kit.custom_device import CustomDeviceFacts
from fd_platforms.kit.vendor_device import HANDLE_BYTES, VendorDeviceRuntime, handle_bytes, handle_text

ROOT = Path(__file__).resolve().parents[2]
OPEN_WRITE_CLOSE = """
import ctypes, sys
from fd_platforms.kit.vendor_device import VendorDeviceRuntime, handle_bytes
runtime = VendorDeviceRuntime(sys.argv[1], "mc")
fake = ctypes.CDLL(sys.argv[1])
address = runtime.open(handle_bytes(sys.argv[2]), 1, "t")
print(ctypes.string_at(address, 3).decode(), fake.fake_device_of(ctypes.c_void_p(address)))
ctypes.memmove(address + 100, b"back", 4)
ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(runtime.release_address("IpcCloseMemHandle", "t"))(address)
print(fake.fake_ipc_open_count())
"""


@pytest.fixture
def runtime(fake_vendor_runtime: Path) -> VendorDeviceRuntime:
    return VendorDeviceRuntime(str(fake_vendor_runtime / "libmcruntime.so"), "mc")


@pytest.fixture
def fake(runtime: VendorDeviceRuntime) -> ctypes.CDLL:
    """The fake runtime's own counters (the same library, so the same state)."""
    library = ctypes.CDLL(runtime.library)
    library.fake_device_of.argtypes = [ctypes.c_void_p]
    return library


@pytest.fixture
def ipc_status() -> Iterator[None]:
    """FAKE_IPC_STATUS=801 (CUDA's "operation not supported") for this test only."""
    os.environ["FAKE_IPC_STATUS"] = "801"
    yield
    del os.environ["FAKE_IPC_STATUS"]


@pytest.mark.slow
def test_device_memory_crosses_processes_by_its_64_byte_handle(runtime: VendorDeviceRuntime, fake: ctypes.CDLL) -> None:
    """Allocated zeroed on device 1 with device 1 current (and device 0 current again after); another process
    opens it on device 1 through the handle, reads and writes the same memory, and closes its mapping."""
    live = fake.fake_device_live()
    address, raw = runtime.share(4096, 1, "t")
    try:
        assert len(raw) == HANDLE_BYTES and handle_bytes(handle_text(raw)) == raw
        assert ctypes.string_at(address, 4096) == bytes(4096), "zeroed"
        assert fake.fake_device_of(address) == 1 and fake.fake_device_live() == live + 1
        current = ctypes.c_int()
        assert fake.mcGetDevice(ctypes.byref(current)) == 0 and current.value == 0, "the previous device is restored"
        ctypes.memmove(address, b"abc", 3)
        done = subprocess.run(
            [sys.executable, "-c", OPEN_WRITE_CLOSE, runtime.library, handle_text(raw)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["abc", "1", "0"], "read, opened on device 1, closed"
        assert ctypes.string_at(address + 100, 4) == b"back"
    finally:
        runtime.release("Free", address, "t")
    assert fake.fake_device_live() == live


def test_a_handle_whose_memory_was_freed_is_a_sharing_error(runtime: VendorDeviceRuntime) -> None:
    address, raw = runtime.share(64, 0, "t")
    runtime.release("Free", address, "t")
    with pytest.raises(CacheSharingError, match=r"mcIpcOpenMemHandle could not open KV cache tensor t \(status 400\)"):
        runtime.open(raw, 0, "t")


def test_a_failing_ipc_call_names_the_call_and_status_and_leaks_nothing(
    runtime: VendorDeviceRuntime, fake: ctypes.CDLL, ipc_status: None
) -> None:
    live = fake.fake_device_live()
    with pytest.raises(
        CacheSharingError,
        match=r"mcIpcGetMemHandle of .*libmcruntime.so failed for KV cache tensor "
        r"key_caches_0_rank0 \(status 801\)\. Fix: ",
    ):
        runtime.share(4096, 0, "key_caches_0_rank0")
    assert fake.fake_device_live() == live, "the allocation is freed when its handle cannot be had"


def test_a_runtime_that_cannot_be_loaded_declares_no_sharing_and_says_why() -> None:
    absent = VendorDeviceRuntime("libfd-no-such-runtime.so", "mc")
    assert absent.sharing() is None
    assert (absent.missing() or "").startswith("libfd-no-such-runtime.so (the mcIpc* calls) cannot be loaded: ")
    with pytest.raises(
        CacheSharingError, match=r"Fix: install the vendor runtime and put its folder on LD_LIBRARY_PATH"
    ):
        absent.share(64, 0, "t")


def test_a_runtime_without_a_device_declares_no_sharing(runtime: VendorDeviceRuntime, fake: ctypes.CDLL) -> None:
    """A runtime that loads but cannot answer which device is current (no driver: a CUDA toolkit's
    libcudart.so on a machine without the GPU) is no way to share."""
    assert runtime.missing() is None and "mcIpcGetMemHandle" in (runtime.sharing() or "")
    wrong_prefix = VendorDeviceRuntime(runtime.library, "hip")
    assert "cannot be loaded" in (wrong_prefix.missing() or "") and "hipMalloc" in (wrong_prefix.missing() or "")


def test_a_foreign_tensor_releases_its_memory_once_when_its_last_view_is_gone(
    runtime: VendorDeviceRuntime, fake: ctypes.CDLL
) -> None:
    """The operator wraps the vendor's memory as a Paddle tensor (here on the CPU place) without a copy; the
    vendor's Free runs once, when the last tensor over it (a dtype view included) is dropped."""
    import paddle

    live = fake.fake_device_live()
    address, _ = runtime.share(64, 0, "t")
    free = runtime.release_address("Free", "t")
    raw = operator.foreign_tensor(paddle, address, free, (4, 16), "uint8", "cpu")
    view = raw.view("float16")
    assert raw.data_ptr() == address and list(view.shape) == [4, 8] and str(view.dtype) == "paddle.float16"
    ctypes.memmove(address + 17, b"\x07", 1)
    assert raw[1, 1].item() == 7, "the tensor is the vendor's memory, not a copy"
    del raw
    assert fake.fake_device_live() == live + 1, "a view keeps the memory"
    del view
    assert fake.fake_device_live() == live


def test_the_cache_folder_must_be_absolute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(operator.ENV_CACHE_DIR, "relative/ops")
    with pytest.raises(ConfigError, match=r"FD_PLATFORMS_CACHE_DIR='relative/ops' is not valid; allowed: an absolute"):
        operator.cache_dir()


BUILD = """
import paddle
from fd_platforms.kit.foreign_tensor import load_operator
load_operator(paddle)
print("loaded")
"""


@pytest.mark.slow
def test_ranks_starting_together_compile_the_operator_once_and_reuse_it(tmp_path: Path) -> None:
    """Two processes compile into an empty cache at once: one compiles (under the lock), both load the same
    library, nothing partial is left; a later process loads it without compiling."""
    env = {**os.environ, operator.ENV_CACHE_DIR: str(tmp_path)}
    first = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for process in first:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0 and out.split()[-1] == "loaded", err
    [library] = tmp_path.glob("*.so")
    assert not list(tmp_path.glob("*.partial")), "a compile writes whole, then renames"
    built = library.stat().st_mtime_ns
    again = subprocess.run([sys.executable, "-c", BUILD], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and library.stat().st_mtime_ns == built and list(tmp_path.glob("*.so")) == [library]


@pytest.mark.slow
def test_without_a_compiler_the_error_names_g_plus_plus_and_the_fix(tmp_path: Path) -> None:
    env = {**os.environ, operator.ENV_CACHE_DIR: str(tmp_path), "PATH": str(tmp_path / "empty")}
    code = (
        "import paddle\nfrom fd_platforms.kit.foreign_tensor import load_operator\n"
        "try:\n    load_operator(paddle)\nexcept Exception as exc:\n    print(f'{type(exc).__name__}: {exc}')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "CacheSharingError: g++ is not on PATH, and sharing a custom device's KV cache "
        "needs the fd_platforms_foreign_tensor operator"
    ), done.stdout
    assert "Fix: install g++" in done.stdout and not list(tmp_path.glob("*.so"))


def test_a_device_allocation_the_runtime_refuses_is_a_device_alloc_error(runtime: VendorDeviceRuntime) -> None:
    with pytest.raises(
        DeviceAllocError,
        match=r"mcMalloc could not allocate 4611686018427387904 bytes on device 0 for "
        r"KV cache tensor t \(status 2\)\. Fix: plan fewer blocks",
    ):
        runtime.share(1 << 62, 0, "t")


def test_a_runtime_without_a_usable_device_declares_no_sharing_and_says_why(
    runtime: VendorDeviceRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAKE_DEVICE_STATUS=35 (CUDA's "insufficient driver"): the runtime loads but answers no device."""
    monkeypatch.setenv("FAKE_DEVICE_STATUS", "35")
    assert runtime.sharing() is None
    assert runtime.missing() == f"mcGetDevice of {runtime.library} returned status 35: no usable device or driver"
    with pytest.raises(
        CacheSharingError,
        match=r"mcGetDevice of .*libmcruntime.so failed for KV cache tensor t "
        r"\(status 35\)\. Fix: check the device and driver",
    ):
        runtime.share(64, 0, "t")


def test_a_handle_of_another_kind_is_refused_by_name(runtime: VendorDeviceRuntime) -> None:
    facts = CustomDeviceFacts(None, "metax_gpu", "MACA_VISIBLE_DEVICES", None, runtime)
    with pytest.raises(
        CacheSharingError,
        match=r"KV cache tensor t's handle 'memfd:1:3' is not a metax_gpu IPC handle\. "
        r"Fix: create and attach on the same platform",
    ):
        facts.open("t", "memfd:1:3", (4,), "uint8", "metax_gpu:0")


def test_a_paddle_without_headers_is_named_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(operator.ENV_CACHE_DIR, str(tmp_path / "cache"))
    headless = SimpleNamespace(__file__=str(tmp_path / "paddle" / "__init__.py"), __version__="0.0")
    with pytest.raises(
        CacheSharingError,
        match=r"ships no headers \(no include/paddle/extension.h\).*Fix: install a "
        r"paddlepaddle wheel that ships paddle/include",
    ):
        operator.load_operator(headless)


def unloaded_paddle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: Path) -> SimpleNamespace:
    """A ``paddle`` this process never loaded, with the installed Paddle's headers, for which the operator
    is compiled from ``source`` into an empty cache under ``tmp_path``."""
    import paddle

    monkeypatch.setattr(operator, "SOURCE", source)
    monkeypatch.setenv(operator.ENV_CACHE_DIR, str(tmp_path / "cache"))
    home = tmp_path / "paddle"
    home.mkdir()
    (home / "include").symlink_to(Path(paddle.__file__).parent / "include")
    return SimpleNamespace(__file__=str(home / "__init__.py"), __version__="0.0")


def test_a_failed_compile_names_the_compiler_output_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken.cc"
    broken.write_text("this is not C++;\n")
    headless = unloaded_paddle(tmp_path, monkeypatch, broken)
    with pytest.raises(
        CacheSharingError,
        match=r"g\+\+ could not compile the fd_platforms_foreign_tensor operator .*"
        r"\(exit status 1\): .*Fix: use a paddlepaddle wheel",
    ):
        operator.load_operator(headless)
    assert not list((tmp_path / "cache").glob("*.so")) and not list((tmp_path / "cache").glob("*.partial"))


@pytest.mark.slow
def test_a_compile_over_its_time_is_stopped_whole_and_named_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stuck compile is killed with every compiler pass g++ started (none keeps running), nothing partial is
    left, and the error names the bound and the fix. A killed cc1plus leaves its ``cc*.s`` in g++'s temp folder:
    the test's."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    source = tmp_path / "slow-operator.cc"
    source.write_text(operator.SOURCE.read_text())  # a name of its own, to find its compiler passes by
    unloaded = unloaded_paddle(tmp_path, monkeypatch, source)
    monkeypatch.setattr(operator, "COMPILE_SECONDS", 0.5)
    with pytest.raises(
        CacheSharingError,
        match=r"compiling the fd_platforms_foreign_tensor operator took over "
        r"0\.5 s\. Fix: check the machine's load",
    ):
        operator.load_operator(unloaded)
    assert not compiling(source), "no compiler pass outlives the timeout"
    assert not list((tmp_path / "cache").glob("*.so")) and not list((tmp_path / "cache").glob("*.partial"))


def compiling(source: Path) -> list[str]:
    """Command lines of the processes that name ``source`` (g++, cc1plus)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(source).encode() in words:
            found.append(b" ".join(words).decode(errors="replace"))
    return found


def test_a_cache_folder_that_cannot_be_made_is_named_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(operator.ENV_CACHE_DIR, str(tmp_path / "a-file" / "cache"))
    anywhere = SimpleNamespace(__file__=str(tmp_path / "paddle" / "__init__.py"), __version__="0.0")
    with pytest.raises(
        CacheSharingError,
        match=r"cannot keep the compiled fd_platforms_foreign_tensor operator in "
        r".*a-file/cache: .*Fix: set FD_PLATFORMS_CACHE_DIR to a writable",
    ):
        operator.load_operator(anywhere)
