"""FastDeploy's per-tensor ``set_data_ipc`` records as our creator writes and our attacher reads them."""

from __future__ import annotations

import ctypes
import fcntl
import glob
import json
import os
import re
import secrets
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from engine_processes import qwen_layout
from kv_requests import kv_request

from fd_platforms.contract.errors import CacheInUseError, CacheSharingError
from fd_platforms.engine import manage_kv_cache
from fd_platforms.engine.kv_cache import check_provenance
from fd_platforms.engine.publication import PublishedTensor
from fd_platforms.fastdeploy.handles import FastDeployHandles, encode_handle, read_handle
from fd_platforms.fastdeploy.marks import attacher_prefix
from fd_platforms.fastdeploy.protocol import FASTDEPLOY
from fd_platforms.fastdeploy.records import GPU_RECORD, XPU_RECORD, record_layout
from fd_platforms.fastdeploy.signals import CACHE_READY, KV_CACHE_STATUS, FastDeploySignal
from fd_platforms.ipc import shm
from fd_platforms.kit.vendor_device import handle_bytes, handle_text


@pytest.fixture
def names() -> list[str]:
    """Record names of this test alone (FastDeploy's names carry no instance; these carry a random rank)."""
    rank = secrets.randbelow(10**6) + 1000
    made = [f"key_caches_0_rank{rank}.device0", f"value_caches_0_rank{rank}.device0"]
    yield made
    for name in made:
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")
    assert not glob.glob(f"/dev/shm/{made[0]}.fdp-*"), "every creator's mark is removed"


def tensors(names: list[str], handle: str = "") -> list[PublishedTensor]:
    return [
        PublishedTensor(name, (4, 8), "uint8", handle or f"memfd:{os.getpid()}:{index + 3}")
        for index, name in enumerate(names)
    ]


def attach_in_child(suffix: str, names: list[str]) -> tuple[subprocess.Popen, list[str]]:
    """An attacher of ours in another process (it names no memory of its own): the handles it read. It lets go
    when its stdin closes."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys; from fd_platforms.fastdeploy.handles import FastDeployHandles\n"
                "from fd_platforms.engine.publication import PublishedTensor\n"
                f"expected = [PublishedTensor(n, (4, 8), 'uint8', '') for n in {names!r}]\n"
                f"h = FastDeployHandles.open({suffix!r}, 0, expected, 'cpu')\n"
                "print(*[t.handle for t in h.tensors], flush=True); sys.stdin.read(); h.let_go()"
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return child, child.stdout.readline().split()  # type: ignore[union-attr]


def let_go(child: subprocess.Popen) -> None:
    child.stdin.close()  # type: ignore[union-attr]
    assert child.wait(10) == 0


@pytest.mark.slow
def test_a_record_is_fastdeploys_struct_read_back_and_retracted_once_the_attacher_let_go(names: list[str]) -> None:
    suffix = f"t{secrets.token_hex(4)}"
    with FastDeploySignal.create(CACHE_READY, suffix, 1) as ready:
        held = FastDeployHandles.create(suffix, 0, tensors(names), "cpu", attachers=1)
        raw = Path(f"/dev/shm/{names[0]}").read_bytes()
        assert len(raw) == GPU_RECORD.size == 72 and raw[:8] == bytes(8), "size_t nprocesses 0, then 64 bytes"
        assert read_handle(names[0], "cpu") == f"memfd:{os.getpid()}:3"
        opened, handles = attach_in_child(suffix, names)
        assert handles == [f"memfd:{os.getpid()}:3", f"memfd:{os.getpid()}:4"]
        ready.set(0, 1)  # attached
        with pytest.raises(CacheInUseError, match="its slot in cache_ready_signal") as caught:
            held.retract(0.2)
        assert caught.value.ranks == (0,) and os.path.exists(f"/dev/shm/{names[0]}"), "nothing freed"
        ready.set(0, 0)  # FastDeploy's let-go
        with pytest.raises(
            CacheInUseError, match=f"attached by a process of fd-platforms .* holds /dev/shm/{names[0]}"
        ):
            held.retract(0.2)  # our attacher also holds the first record until it lets go
        let_go(opened)
        held.retract(5)
        assert not any(os.path.exists(f"/dev/shm/{name}") for name in names)


def test_a_creator_nobody_is_configured_to_attach_to_never_waits_for_its_own_slot(names: list[str]) -> None:
    """FastDeploy's runner without host swap space clears at once (gpu_model_runner.py clear_cache): its own
    slot stays set, since nobody else would reset it."""
    suffix = f"t{secrets.token_hex(4)}"
    with FastDeploySignal.create(CACHE_READY, suffix, 1) as ready:
        held = FastDeployHandles.create(suffix, 0, tensors(names), "cpu", attachers=0)
        ready.set(0, 1)  # its own
        started = time.monotonic()
        held.retract(30)
        assert time.monotonic() - started < 1 and not any(os.path.exists(f"/dev/shm/{name}") for name in names)


@pytest.mark.slow
def test_a_rank_two_processes_attach_to_is_freed_only_after_both_let_go(names: list[str]) -> None:
    """P/D decode with swap: the worker and the transfer manager attach to one rank and one slot; the creator
    frees once the slot is reset and no attacher of ours holds the first record. An attacher killed with
    SIGKILL holds nothing: the kernel dropped its lock."""
    suffix = f"t{secrets.token_hex(4)}"
    with FastDeploySignal.create(CACHE_READY, suffix, 1) as ready:
        held = FastDeployHandles.create(suffix, 0, tensors(names), "cpu", attachers=1)
        ready.set(0, 1)
        killed, _ = attach_in_child(suffix, names)
        second, _ = attach_in_child(suffix, names)
        ready.set(0, 0)  # the first attacher's let-go resets the one slot
        with pytest.raises(CacheInUseError, match="attached by a process of fd-platforms"):
            held.retract(0.3)
        let_go(second)
        with pytest.raises(CacheInUseError, match="attached by a process of fd-platforms"):
            held.retract(0.3)  # the other process still holds it
        killed.kill()
        killed.wait()
        held.retract(5)
        assert not any(os.path.exists(f"/dev/shm/{name}") for name in names)


def test_a_record_held_by_a_living_creator_is_refused_and_a_leftover_is_reused(names: list[str]) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys; from fd_platforms.fastdeploy.handles import FastDeployHandles\n"
                "from fd_platforms.engine.publication import PublishedTensor\n"
                "h = FastDeployHandles.create('9923', 0, "
                f"[PublishedTensor({names[0]!r}, (4,), 'uint8', 'memfd:1:3')], 'cpu', attachers=0)\n"
                "print('held', flush=True); sys.stdin.read()"
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"  # type: ignore[union-attr]
    with pytest.raises(CacheSharingError, match="already published by a running process"):
        FastDeployHandles.create("9923", 0, tensors(names[:1]), "cpu", attachers=0)
    holder.kill()  # SIGKILL: its record stays, as FastDeploy's creators leave theirs
    holder.wait()
    assert os.path.exists(f"/dev/shm/{names[0]}")
    held = FastDeployHandles.create("9923", 0, tensors(names[:1]), "cpu", attachers=0)
    assert read_handle(names[0], "cpu") == f"memfd:{os.getpid()}:3", "rewritten in place, as set_data_ipc does"
    assert held.creator


def test_records_naming_several_processes_are_refused(names: list[str]) -> None:
    for name, pid in zip(names, (os.getpid(), 1), strict=True):
        with open(f"/dev/shm/{name}", "wb") as file:
            file.write(GPU_RECORD.fields.pack(0, f"memfd:{pid}:3".encode()))
    with pytest.raises(
        CacheSharingError, match=r"publication \(FastDeploy.s records\) names handles of 2 processes \(pids 1, "
    ):
        FastDeployHandles.open("9923", 0, tensors(names, handle="-"), "cpu")


def test_a_record_naming_another_process_than_the_setter_is_refused(names: list[str]) -> None:
    for name in names:
        with open(f"/dev/shm/{name}", "wb") as file:
            file.write(GPU_RECORD.fields.pack(0, b"memfd:1:3"))
    opened = FastDeployHandles.open("9923", 0, tensors(names, handle="-"), "cpu")
    with pytest.raises(CacheSharingError, match="it was not published by that process"):
        check_provenance(opened, os.getpid())
    opened.let_go()


def test_a_short_record_is_a_typed_error(names: list[str]) -> None:
    with open(f"/dev/shm/{names[0]}", "wb") as file:
        file.write(b"\0" * 10)
    with pytest.raises(CacheSharingError, match="holds 10 bytes"):
        read_handle(names[0], "cpu")


def test_a_raw_ipc_handle_is_written_and_read_as_its_64_bytes(names: list[str]) -> None:
    """FastDeploy's set_data_ipc writes a raw cudaIpcMemHandle_t: a platform handle that is one (ipc64:...)
    is written as exactly those bytes, and a raw record reads back as the same handle."""
    raw = bytes(range(1, 65))
    record = encode_handle(names[0], handle_text(raw), "metax")
    assert record == GPU_RECORD.fields.pack(0, raw) and len(record) == GPU_RECORD.size
    with open(f"/dev/shm/{names[0]}", "wb") as file:
        file.write(record)
    assert read_handle(names[0], "metax") == handle_text(raw)
    assert handle_bytes(read_handle(names[0], "metax")) == raw


def test_a_missing_record_names_the_tensor(names: list[str]) -> None:
    with pytest.raises(CacheSharingError, match=f"KV cache tensor {names[0]} is not published"):
        read_handle(names[0], "cpu")


class GpuShmStruct(ctypes.Structure):
    """custom_ops/gpu_ops/cuda_multiprocess.h ``shmStruct``, laid out by the C compiler's rules (ctypes)."""

    _fields_ = [("nprocesses", ctypes.c_size_t), ("memHandle", ctypes.c_char * 64)]


class XpuShmStruct(ctypes.Structure):
    """custom_ops/xpu_ops/src/ops/xpu_multiprocess.h ``shmStruct`` (XPURT 5), laid out by the C compiler's rules."""

    _fields_ = [("nprocesses", ctypes.c_size_t), ("memHandle", ctypes.c_char * 64), ("data_ptr_addr", ctypes.c_uint64)]


@pytest.mark.parametrize(("layout", "native"), [(GPU_RECORD, GpuShmStruct), (XPU_RECORD, XpuShmStruct)])
def test_each_record_layout_is_fastdeploys_struct_with_the_compilers_offsets(layout, native) -> None:
    """Sizes and offsets as the C compiler lays FastDeploy's structs out (padding included): 72 bytes on CUDA,
    80 on XPU, whose data_ptr_addr follows the 64-byte handle at byte 72."""
    assert layout.size == ctypes.sizeof(native)
    assert layout.handle_offset == native.memHandle.offset == 8
    assert layout.address_offset == (native.data_ptr_addr.offset if native is XpuShmStruct else None)
    assert (GPU_RECORD.size, XPU_RECORD.size, XPU_RECORD.address_offset) == (72, 80, 72)


def test_records_pack_a_known_handle_and_address_at_fastdeploys_offsets() -> None:
    handle, address = bytes(range(1, 65)), 0x7F12_3456_7000
    assert GPU_RECORD.pack(handle, None) == bytes(8) + handle
    xpu = XPU_RECORD.pack(handle, address)
    assert xpu == bytes(8) + handle + address.to_bytes(8, sys.byteorder)
    native = XpuShmStruct.from_buffer_copy(xpu)
    assert (native.nprocesses, native.memHandle, native.data_ptr_addr) == (0, handle, address)
    assert (GPU_RECORD.handle(bytes(8) + handle), XPU_RECORD.handle(xpu)) == (handle, handle)


@pytest.mark.parametrize(
    ("platform", "layout"),
    [("cuda", GPU_RECORD), ("metax", GPU_RECORD), ("iluvatar", GPU_RECORD), ("cpu", GPU_RECORD), ("xpu", XPU_RECORD)],
)
def test_each_platform_has_its_fastdeploy_builds_record(platform: str, layout) -> None:
    assert record_layout(platform) is layout


def test_an_xpu_record_holds_the_raw_handle_and_the_tensors_address_and_reads_back_through_the_handle(
    names: list[str],
) -> None:
    """FastDeploy's XPU runner attaches through data_ptr_addr, its transfer manager through the handle: our
    creator writes both; our attacher on XPU opens the handle, as the transfer manager does."""
    raw, address = bytes(range(1, 65)), 0x7F00_0000_1000
    record = encode_handle(names[0], handle_text(raw), "xpu", address)
    assert record == XPU_RECORD.pack(raw, address)
    with open(f"/dev/shm/{names[0]}", "wb") as file:
        file.write(record)
    assert read_handle(names[0], "xpu") == handle_text(raw)


@pytest.mark.parametrize(
    ("handle", "address", "why"),
    [
        (handle_text(bytes(range(1, 65))), None, "gave no device address"),
        (handle_text(bytes(range(1, 65))), 0, "device address 0"),
        ("memfd:1:3", 0x1000, "is not a raw 64-byte IPC handle"),
    ],
)
def test_an_xpu_record_that_fastdeploy_could_not_open_is_refused(handle: str, address, why: str) -> None:
    with pytest.raises(CacheSharingError, match=f"key_caches_0_rank0.device0.*{why}.*Fix: "):
        encode_handle("key_caches_0_rank0.device0", handle, "xpu", address)


@pytest.mark.parametrize(("writer", "reader"), [("xpu", "cuda"), ("cuda", "xpu"), ("xpu", "metax")])
def test_a_record_of_another_platforms_size_is_refused_naming_both_sizes(names: list[str], writer, reader) -> None:
    """A record FastDeploy's build of another platform wrote (or a creator of ours on one) is not misread."""
    written, expected = record_layout(writer), record_layout(reader)
    with open(f"/dev/shm/{names[0]}", "wb") as file:
        file.write(written.pack(bytes(range(1, 65)), 0x1000))
    with pytest.raises(CacheSharingError) as caught:
        read_handle(names[0], reader)
    message = str(caught.value)
    assert f"/dev/shm/{names[0]} holds {written.size} bytes" in message
    assert f"platform {reader}'s record is {expected.size} bytes" in message
    assert "a creator of another platform or FastDeploy build" in message and "Fix: " in message
    ours = [PublishedTensor(names[0], (4, 8), "uint8", handle_text(bytes(range(1, 65))), 0x1000)]
    with pytest.raises(CacheSharingError, match=f"holds {written.size} bytes.*is {expected.size} bytes"):
        FastDeployHandles.create("9923", 0, ours, reader, attachers=0)


def test_a_record_truncated_after_its_size_check_is_a_typed_error_never_struct_error(
    names: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record cut short between the size check and the read (a rewriter, or anyone) is named, not a struct.error."""
    with open(f"/dev/shm/{names[0]}", "wb") as file:
        file.write(GPU_RECORD.fields.pack(0, f"memfd:{os.getpid()}:3".encode()))
    inspect = shm.Segment.inspect

    def inspect_then_truncate(name: str, min_size: int = 0) -> shm.Segment:
        segment = inspect(name, min_size)
        os.truncate(f"/dev/shm/{name}", 10)  # what a rewriter (or anyone) does right after the check
        return segment

    monkeypatch.setattr(shm.Segment, "inspect", staticmethod(inspect_then_truncate))
    with pytest.raises(CacheSharingError, match=rf"/dev/shm/{names[0]} holds 10 bytes, .* record is 72 bytes.*Fix: "):
        read_handle(names[0], "cpu")


def test_a_record_rewritten_in_place_while_read_gives_the_new_handle_never_a_torn_one(
    names: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A creator rewrites a leftover record in place (set_data_ipc): a read in the middle of that write saw
    a torn handle such as 'me', and read_handle returned it."""
    path, whole = f"/dev/shm/{names[0]}", GPU_RECORD.fields.pack(0, f"memfd:{os.getpid()}:3".encode())
    with open(path, "wb") as file:
        file.write(bytes(GPU_RECORD.size))
    read = shm.Segment.read
    calls = []

    def read_during_the_rewrite(segment: shm.Segment, nbytes: int, offset: int = 0) -> bytes:
        calls.append(nbytes)
        if len(calls) == 1:
            os.pwrite(segment.fd, whole[:10], 0)  # the creator has written its first bytes...
            torn = read(segment, nbytes, offset)
            os.pwrite(segment.fd, whole, 0)  # ...and then the rest
            return torn
        return read(segment, nbytes, offset)

    monkeypatch.setattr(shm.Segment, "read", read_during_the_rewrite)
    assert read_handle(names[0], "cpu") == f"memfd:{os.getpid()}:3"
    assert len(calls) == 3, "read until two reads agree"


@pytest.mark.parametrize(
    ("handle", "found"),
    [(b"me", "holds the text handle 'me', not a memfd:<pid>:<fd> handle"), (b"", "holds no handle")],
)
def test_a_record_left_torn_or_unwritten_is_a_typed_error_naming_it(
    names: list[str], handle: bytes, found: str
) -> None:
    with open(f"/dev/shm/{names[0]}", "wb") as file:
        file.write(GPU_RECORD.fields.pack(0, handle))
    with pytest.raises(CacheSharingError, match=rf"record /dev/shm/{names[0]} {re.escape(found)}.*Fix: "):
        read_handle(names[0], "cpu")


def test_an_unheld_record_of_the_wrong_size_says_its_size_that_nobody_holds_it_and_the_fix(names: list[str]) -> None:
    """An odd-sized leftover nobody holds is named as such, never as another creator's."""
    with open(f"/dev/shm/{names[0]}", "wb") as file:
        file.write(bytes(10))
    with pytest.raises(CacheSharingError) as caught:
        FastDeployHandles.create("9923", 0, tensors(names[:1]), "cpu", attachers=0)
    message = str(caught.value)
    assert f"/dev/shm/{names[0]} holds 10 bytes, but platform cpu's record is 72 bytes" in message
    assert "no process of fd-platforms holds it" in message and f"Fix: remove /dev/shm/{names[0]}" in message
    with open(f"/dev/shm/{names[0]}", "rb") as held:
        fcntl.flock(held, fcntl.LOCK_SH)  # a running process of ours (on another platform) holds it
        with pytest.raises(CacheSharingError, match=r"holds 10 bytes, .* a running process of fd-platforms holds it"):
            FastDeployHandles.create("9923", 0, tensors(names[:1]), "cpu", attachers=0)


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="plays another user with os.setuid, which needs root")


def spawn(code: str) -> tuple[subprocess.Popen, str]:
    """A Python child running ``code`` until its stdin closes: its first line."""
    child = subprocess.Popen(
        [sys.executable, "-c", f"import os, sys\n{code}\nsys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return child, child.stdout.readline().strip()  # type: ignore[union-attr]


def stop(child: subprocess.Popen) -> None:
    child.stdin.close()  # type: ignore[union-attr]
    child.wait(10)


def memfds_of_another_user(names: list[str], user: int) -> tuple[int, list[int], int]:
    """A forked child that becomes ``user`` and makes a sealed memfd named like each tensor (as the cpu platform
    does): its pid, its descriptors, and the pipe end whose closing ends it."""
    ready_read, ready_write = os.pipe()
    stop_read, stop_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(stop_write)
            os.close(ready_read)
            os.setgid(user)
            os.setuid(user)
            fds = []
            for name in names:
                fd = os.memfd_create(name, os.MFD_ALLOW_SEALING)
                os.ftruncate(fd, 32)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
                fds.append(fd)
            os.write(ready_write, " ".join(map(str, fds)).encode())
            os.read(stop_read, 1)
        finally:
            os._exit(0)
    os.close(ready_write)
    os.close(stop_read)
    fds = [int(fd) for fd in os.read(ready_read, 1024).split()]
    os.close(ready_read)
    return pid, fds, stop_write


@pytest.mark.slow
@root_only
def test_a_record_naming_another_users_memfd_is_refused_by_the_attacher_and_by_the_opener(names: list[str]) -> None:
    """Another user rewrote the records to name its own memfds (named like the tensors, sealed): a root runner
    without creator_pid must not map them as its KV cache."""
    from fd_platforms.kit.host_sharing import open_host_tensor

    pid, fds, stop_write = memfds_of_another_user(names, 65534)
    try:
        for name, fd in zip(names, fds, strict=True):
            with open(f"/dev/shm/{name}", "wb") as file:
                file.write(GPU_RECORD.fields.pack(0, f"memfd:{pid}:{fd}".encode()))
        with pytest.raises(
            CacheSharingError,
            match=rf"/dev/shm/{names[-1]} names memory of pid {pid}, a process of "
            r"uid 65534, not of this user \(uid 0\).*nothing was opened.*Fix: ",
        ):
            FastDeployHandles.open("9923", 0, tensors(names, handle="-"), "cpu")
        with pytest.raises(
            CacheSharingError,
            match=rf"{names[0]} \(/proc/{pid}/fd/{fds[0]}, .*\) is memory of uid "
            r"65534, not of this user \(uid 0\).*Fix: ",
        ):
            open_host_tensor(names[0], f"memfd:{pid}:{fds[0]}", (4, 8), "uint8")
    finally:
        os.close(stop_write)
        os.waitpid(pid, 0)


def test_a_record_naming_the_attacher_itself_is_refused(names: list[str]) -> None:
    for name in names:
        with open(f"/dev/shm/{name}", "wb") as file:
            file.write(GPU_RECORD.fields.pack(0, f"memfd:{os.getpid()}:3".encode()))
    with pytest.raises(CacheSharingError, match=f"names memory of pid {os.getpid()}, which is this attaching process"):
        FastDeployHandles.open("9923", 0, tensors(names, handle="-"), "cpu")


@pytest.mark.slow
def test_a_record_naming_another_process_than_the_creator_of_ours_holding_it_is_refused(names: list[str]) -> None:
    """A creator of ours holds each record it publishes (the kernel lists it in /proc/locks): handles naming a
    neighbour process of the same user are refused, even without creator_pid."""
    neighbour, pid = spawn("print(os.getpid(), flush=True)")
    creator, said = spawn(
        "from fd_platforms.fastdeploy.handles import FastDeployHandles\n"
        "from fd_platforms.engine.publication import PublishedTensor\n"
        f"h = FastDeployHandles.create('9923', 0, [PublishedTensor(n, (4, 8), 'uint8', 'memfd:{pid}:3') "
        f"for n in {names!r}], 'cpu', attachers=0)\n"
        "print(os.getpid(), flush=True)"
    )
    try:
        with pytest.raises(
            CacheSharingError,
            match=f"names memory of pid {pid}, which does not hold the record, while "
            rf"the creator of ours does \(pids {said}\)",
        ):
            FastDeployHandles.open("9923", 0, tensors(names, handle="-"), "cpu")
    finally:
        stop(creator)
        stop(neighbour)


def test_a_leftover_record_of_ours_writable_by_others_is_reused_with_mode_0600(names: list[str]) -> None:
    with open(f"/dev/shm/{names[0]}", "wb") as file:
        file.write(bytes(GPU_RECORD.size))
    os.chmod(f"/dev/shm/{names[0]}", 0o666)
    held = FastDeployHandles.create("9923", 0, tensors(names[:1]), "cpu", attachers=0)
    assert oct(os.stat(f"/dev/shm/{names[0]}").st_mode & 0o777) == "0o600"
    held.retract(1)


def test_a_record_writable_by_others_is_refused_when_read_naming_its_mode_and_owner(names: list[str]) -> None:
    with open(f"/dev/shm/{names[0]}", "wb") as file:
        file.write(GPU_RECORD.fields.pack(0, b"memfd:1:3"))
    os.chmod(f"/dev/shm/{names[0]}", 0o666)
    with pytest.raises(
        CacheSharingError,
        match=rf"/dev/shm/{names[0]} \(owner uid {os.geteuid()}\) has mode 0666: "
        "users other than its owner may rewrite its handle.*Fix: ",
    ):
        read_handle(names[0], "cpu")


@root_only
def test_a_leftover_record_of_another_user_is_refused_naming_its_owner(names: list[str]) -> None:
    with open(f"/dev/shm/{names[0]}", "wb") as file:
        file.write(bytes(GPU_RECORD.size))
    os.chmod(f"/dev/shm/{names[0]}", 0o666)
    os.chown(f"/dev/shm/{names[0]}", 65534, 65534)
    with pytest.raises(CacheSharingError, match=rf"/dev/shm/{names[0]} belongs to uid 65534, not this user.*Fix: "):
        FastDeployHandles.create("9923", 0, tensors(names[:1]), "cpu", attachers=0)


@pytest.mark.slow
def test_a_sigkilled_attacher_of_ours_never_blocks_the_creators_clear(
    names: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """An attacher of ours killed while attached leaves its slot at 1: the creator's clear does not fail on every
    retry naming a process that no longer exists. Its mark, no longer held, says it is gone."""
    suffix = f"t{secrets.token_hex(4)}"
    with FastDeploySignal.create(CACHE_READY, suffix, 1) as ready:
        held = FastDeployHandles.create(suffix, 0, tensors(names), "cpu", attachers=1)
        ready.set(0, 1)
        attacher, _ = attach_in_child(suffix, names)
        attacher.kill()
        attacher.wait()
        started = time.monotonic()
        held.retract(3)
        assert time.monotonic() - started < 2 and ready.get(0) == 0
    assert not any(os.path.exists(f"/dev/shm/{name}") for name in names)
    warned = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert any(f"attacher of fd-platforms (pid {attacher.pid}) is gone without letting go" in line for line in warned)


@pytest.mark.slow
def test_fastdeploys_own_attacher_still_makes_the_creator_wait_and_the_error_names_it(names: list[str]) -> None:
    """FastDeploy's attacher (the stand-in, which imports nothing of ours) holds no mark: a slot it keeps set is
    waited for, and the error says the attacher is FastDeploy's own and how to get out."""
    suffix = f"t{secrets.token_hex(4)}"
    memfds = [os.memfd_create(name) for name in names]
    for fd in memfds:
        os.ftruncate(fd, 32)
    published = [
        PublishedTensor(name, (4, 8), "uint8", f"memfd:{os.getpid()}:{fd}")
        for name, fd in zip(names, memfds, strict=True)
    ]
    standins = os.path.join(os.path.dirname(__file__), "..", "support", "fastdeploy_standins.py")
    with FastDeploySignal.create(CACHE_READY, suffix, 1) as ready, FastDeploySignal.create(KV_CACHE_STATUS, suffix, 1):
        held = FastDeployHandles.create(suffix, 0, published, "cpu", attachers=1)
        ready.set(0, 1)
        specs = json.dumps([[name, 32] for name in names])
        theirs = subprocess.Popen(
            [sys.executable, standins, "attacher", suffix, "0", "1", specs, "0", "-1"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            said = [theirs.stdout.readline().strip() for _ in range(2)]  # type: ignore[union-attr]
            assert said == ["attached", "done"]
            with pytest.raises(CacheInUseError) as caught:
                held.retract(0.5)
            message = str(caught.value)
            assert f"its slot in cache_ready_signal.{suffix} is still set" in message
            assert "No attacher of fd-platforms is attached" in message and "FastDeploy's own process" in message
            assert f"FastDeploySignal.attach(CACHE_READY, '{suffix}').set(0, 0)" in message
            assert os.path.exists(f"/dev/shm/{names[0]}"), "nothing freed"
        finally:
            theirs.stdin.close()  # type: ignore[union-attr]  # its let-go resets the slot
            theirs.wait(10)
        held.retract(5)
    for fd in memfds:
        os.close(fd)


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_dead_attachers_mark_left_from_before_is_removed_when_the_cache_is_published(names: list[str]) -> None:
    """A mark left by an attacher of ours that died beside FastDeploy's creator (which removes none) must not
    pass, at the next clear, for an attacher of the new publication gone without letting go."""
    suffix = f"t{secrets.token_hex(4)}"
    mark = f"/dev/shm/{attacher_prefix(suffix, 0)}999999-abcdef"
    with open(mark, "wb") as file:
        file.write(struct.pack("=qqq", 999999, 0, 1))
    os.chmod(mark, 0o600)
    with FastDeploySignal.create(CACHE_READY, suffix, 1) as ready:
        held = FastDeployHandles.create(suffix, 0, tensors(names), "cpu", attachers=1)
        assert not os.path.exists(mark)
        ready.set(0, 1)  # FastDeploy's own attacher, which holds nothing
        with pytest.raises(CacheInUseError, match="No attacher of fd-platforms is attached"):
            held.retract(0.1)
        ready.set(0, 0)
        held.retract(2)


def test_a_leftover_record_writable_by_others_is_replaced_so_a_descriptor_opened_before_cannot_rewrite_it(
    names: list[str],
) -> None:
    path = f"/dev/shm/{names[0]}"
    with open(path, "wb") as file:
        file.write(bytes(GPU_RECORD.size))
    os.chmod(path, 0o666)
    with open(path, "r+b") as theirs:  # opened by anyone while it was writable
        held = FastDeployHandles.create("9923", 0, tensors(names[:1]), "cpu", attachers=0)
        os.pwrite(theirs.fileno(), GPU_RECORD.fields.pack(0, b"memfd:1:3"), 0)
    assert read_handle(names[0], "cpu") == f"memfd:{os.getpid()}:3"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    held.retract(1)


def test_a_handle_beside_handles_naming_no_process_says_what_they_name_not_pid_none(names: list[str]) -> None:
    """A publication whose handles name no one creator (one names a process, the other a raw device handle): the
    refusal says what the handles name instead of an unknown creator's ``pid None``. (FastDeploy's records of such
    a mix are refused when opened: the next test.)"""
    from types import SimpleNamespace

    other = os.getppid()  # a process of this user that holds no record
    handles = [f"memfd:{other}:3", handle_text(bytes(range(1, 65)))]
    published = SimpleNamespace(
        rank=0,
        creator_pid=None,
        name=names[0],
        tensors=[PublishedTensor(name, (4, 8), "uint8", handle) for name, handle in zip(names, handles, strict=False)],
    )
    with pytest.raises(CacheSharingError) as refused:
        check_provenance(published, None)  # type: ignore[arg-type]
    said = str(refused.value)
    assert "pid None" not in said, said
    known = f"1 names pid {other}, 1 names no process"
    assert f"with a handle of pid {other}, but its handles name no one creator ({known}): it would map" in said, said


def test_records_that_mix_a_memfd_handle_with_a_raw_one_are_refused_naming_both(names: list[str]) -> None:
    """One creator writes every record of a rank alike; a mix is refused when opened, naming both kinds (its error
    once said 'pid None')."""
    for name, handle in zip(names, (f"memfd:{os.getpid()}:3".encode(), bytes(range(1, 65))), strict=False):
        fd = os.open(f"/dev/shm/{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, GPU_RECORD.fields.pack(0, handle))
        os.close(fd)
    expected = [PublishedTensor(name, (4, 8), "uint8", "") for name in names]
    with pytest.raises(
        CacheSharingError,
        match=(
            r"publication \(FastDeploy.s records\) mixes handles of two kinds: "
            rf"1 name no process .* 1 name pid {os.getpid()}"
        ),
    ):
        FastDeployHandles.open(f"t{secrets.token_hex(4)}", 0, expected, "cpu")


@pytest.mark.slow
@pytest.mark.usefixtures("fastdeploy_record_names")
def test_a_neighbour_engine_on_the_same_device_ids_is_named_as_the_cause_when_it_holds_fastdeploys_names(cpu) -> None:
    """FastDeploy's record names carry no instance: a second engine's creator of rank 0 on device 0 collides with the
    first engine's, whose caches are published (with an attacher expected: host swap space)."""
    first, first_signals = FASTDEPLOY.create_signals(2, device_type="cpu", block_count_suffix=None)
    with first_signals:
        managed = [
            manage_kv_cache(
                cpu,
                kv_request(
                    qwen_layout(rank, 2), 4, num_cpu_blocks=4, instance=first, protocol="fastdeploy", rule="2026-01"
                ),
            )
            for rank in range(2)
        ]
        try:
            neighbour, made = FASTDEPLOY.create_signals(1, device_type="cpu", block_count_suffix=None)
            with made, pytest.raises(CacheSharingError) as caught:
                manage_kv_cache(
                    cpu,
                    kv_request(
                        qwen_layout(0, 2),
                        4,
                        num_cpu_blocks=0,
                        instance=neighbour,
                        protocol="fastdeploy",
                        rule="2026-01",
                    ),
                )
        finally:
            with FastDeploySignal.attach(CACHE_READY, first) as ready:
                ready.write_all(0)
            for cache in managed:
                cache.clear(1)
    assert "another engine on this machine with the same device ids took them" in str(caught.value)
    assert "FastDeploy's own engines collide the same way" in str(caught.value)
    assert "Fix: give each engine distinct device ids, or run one engine per device" in str(caught.value)


@pytest.mark.parametrize("size", [0, 10])
def test_a_creators_clear_removes_its_first_record_even_truncated_since(names: list[str], size: int) -> None:
    held = FastDeployHandles.create("9923", 0, tensors(names), "cpu", attachers=0)
    os.truncate(f"/dev/shm/{names[0]}", size)
    held.retract(1)
    assert [name for name in names if os.path.exists(f"/dev/shm/{name}")] == [], "the damaged record stays"
