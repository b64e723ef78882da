"""Stand-ins for FastDeploy's own processes, speaking only its IPC: plain shared memory and numpy.

Run as a script (``python tests/support/fastdeploy_standins.py ROLE ...``); it imports nothing of
fd-platforms (it says so on exit), so what meets our processes is FastDeploy's format alone:

- ``engine SUFFIX TP [BLOCK_SUFFIX [iluvatar]]``: creates FastDeploy's signals as its engine does
  (``IPCSignal`` arrays named ``<name>.<suffix>``, int32, zeroed), prints ``ready``; prints
  ``profile_block_num N words [...]`` when a count is handed over (N is word 0, the one its engine
  reads), ``cache_transfer_inited TP`` / ``swap_space_ready TP`` once every rank's word is set (what
  FastDeploy's engine waits for before its cache service starts); at stdin's end removes them.
  ``get_profile_block_num`` is named with BLOCK_SUFFIX (default SUFFIX) and is TP words long with
  ``iluvatar``, else one (``fastdeploy/engine/engine.py`` ``LLMEngine._init_worker_signals``: its
  suffix is ``engine_worker_queue_port[0]``, the other signals' the data-parallel rank's port, and its
  length ``worker_num_per_node`` where Paddle has the ``iluvatar_gpu`` device; ``_stop_profile``
  reads word 0).
- ``creator SUFFIX RANK TP TENSORS``: the cache transfer manager of one rank, run with
  ``--create_cache_tensor`` (``fastdeploy/cache_manager/cache_transfer_manager.py``). Creates each tensor of
  ``TENSORS`` (a JSON list of ``[name, nbytes]``) in a sealed memfd, writes its handle in
  ``set_data_ipc``'s record (``size_t`` 0 + 64 handle bytes) under the tensor's name, fills byte 0
  with ``RANK + 1``, sets ``cache_ready_signal[RANK] = 1`` and ``cache_transfer_inited_signal[RANK] = 1``.
  Then it follows ``kv_cache_status`` as ``CacheTransferManager.check_cache_status`` does, every rank's
  manager for itself, looking every 0.1 s: on CLEARING it waits for its slot to drop to 0 (its runner let
  go), frees, waits for every slot to be 0 and writes CLEARED; on UPDATING it creates again (freeing first
  what it still holds, where its looks missed the CLEARING: FastDeploy's ``_init_gpu_cache`` replaces the
  tensors), sets its slot, waits for every slot to be 1 and writes NORMAL. It never resets its own slot.
  Every rank writes the answers, so a slower rank's CLEARED can land after the driver's UPDATING, as it
  can beside FastDeploy. Ends when stdin closes.
- ``messager SUFFIX RANK TP TENSORS``: the cache messager of one rank in P/D
  (``fastdeploy/cache_manager/cache_messager.py`` ``main``, launched for every splitwise role but mixed by
  ``prefix_cache_manager.py`` ``launch_cache_manager``):
  creates each tensor of ``TENSORS`` as ``creator`` does, then sets ``cache_ready_signal[RANK] = 1`` and no other
  word (no ``cache_transfer_inited_signal``: that is the transfer manager's). It never clears (it follows no
  ``kv_cache_status``: FastDeploy does not clear in P/D); prints ``touched`` once an attacher wrote byte 1, and
  frees when stdin closes.
- ``attacher SUFFIX RANK TP TENSORS CYCLES FIRST``: the worker of one rank that attaches. Polls its
  slot, opens every record's memfd, checks each tensor's byte 0 is ``FIRST`` (-1: any), writes
  byte 1 = 0x5A (the creator checks it), prints ``attached``. Then ``CYCLES`` clear/update rounds, as FastDeploy's
  workers do them (rank 0's word is every rank's): rank 0 writes CLEARING, lets go (unmaps, resets
  its slot), waits for CLEARED, writes UPDATING, waits for its slot, attaches again, waits for
  NORMAL; another rank waits for CLEARING, lets go, waits for its slot, attaches again. ``CYCLES``
  0 drives nothing. Prints ``done``, waits for stdin to close, then lets go (resets its slot).
- ``pd-transfer-manager SUFFIX RANK TP TENSORS``: the cache transfer manager of one rank in P/D, launched without
  ``--create_cache_tensor`` (``prefix_cache_manager.py`` ``launch_cache_manager`` ~L297-304 at c1b7c083, whenever
  the engine has swap space or a storage backend): its ``__init__`` attaches to the messager's cache
  (``_init_gpu_cache``, ~L242 and ~L440-446: waits for its slot, opens every record), then sets
  ``cache_transfer_inited_signal[RANK] = 1`` (~L303-311). Prints ``attached``, ``done``; when stdin closes it
  unmaps and resets its slot, as ``attacher`` does.

- ``rl SUFFIX CYCLES``: FastDeploy's engine side of the RL flow (``fastdeploy/entrypoints/engine_client.py``):
  per round, ``model_weights_status`` CLEARING, wait for CLEARED there and in ``kv_cache_status``; then
  UPDATING, wait for NORMAL in both. Prints ``done``, then waits for stdin to close.
- ``worker SUFFIX RANK TP TENSORS CYCLES``: FastDeploy's worker of one rank that attaches, following
  ``model_weights_status`` (``fastdeploy/rl/dynamic_weight_manager.py`` ``check_model_weights_status``): it
  writes ``kv_cache_status`` CLEARING or UPDATING itself, lets go or attaches again, and rank 0 answers the
  engine (CLEARED, NORMAL). Prints ``attached``, ``done``; lets go when stdin closes.

Every wait gives up after ``FD_STANDIN_TIMEOUT`` seconds (default 30) with exit status 3.

Tensors live in sealed memfds (the handle is ``memfd:<pid>:<fd>``, as the cpu platform's), or, with
``FD_STANDIN_RUNTIME=libmcruntime.so:mc`` (library and call prefix), in device memory of that vendor
runtime, as FastDeploy's MetaX build has them: ``mcSetDevice`` to the device the tensor's name
carries, ``mcMalloc``, ``mcMemset``, and the raw 64-byte ``mcIpcGetMemHandle`` in the record; the
attacher opens it with ``mcIpcOpenMemHandle`` and reads and writes through ``mcMemcpy``/``mcMemset``.
A failing runtime call exits with status 5, naming it.
"""

from __future__ import annotations

import _posixshmem
import ctypes
import fcntl
import json
import mmap
import os
import select
import struct
import sys
import time
from functools import partial
from multiprocessing import resource_tracker, shared_memory
from typing import Any, ClassVar

import numpy as np

SIGNALS = ("cache_ready_signal", "swap_space_ready_signal", "cache_transfer_inited_signal")
STATUS_WORDS = ("kv_cache_status", "model_weights_status")  # one word each, under the same suffix
BARRIER = "standin_tp_barrier"  # not FastDeploy's: where the worker stand-ins meet, as its ranks meet in a tp barrier
ENGINE_CLIENT_POLL = 0.01  # FastDeploy's engine client looks every 1 s; the stand-in every 0.01 s, to keep tests short
WORKER_POLL = 0.01  # FastDeploy's worker looks at model_weights_status every 0.01 s (check_model_weights_status)
NORMAL, UPDATING, CLEARING, CLEARED = 0, 1, -1, -2
RECORD = struct.Struct("=Q64s")
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
POLL = 0.1  # FastDeploy's cache transfer manager polls kv_cache_status every 0.1 s
SLOT_POLL = 0.005
TIMEOUT = float(os.environ.get("FD_STANDIN_TIMEOUT", "30"))
DEVICE_TO_HOST = 2  # cudaMemcpyDeviceToHost / mcMemcpyDeviceToHost


def attach(name: str, suffix: str, length: int) -> tuple[shared_memory.SharedMemory, np.ndarray]:
    """FastDeploy's ``IPCSignal(create=False)``, without the resource tracker's unlink at exit."""
    block = shared_memory.SharedMemory(name=f"{name}.{suffix}")
    resource_tracker.unregister(block._name, "shared_memory")  # type: ignore[attr-defined]
    return block, np.ndarray((length,), dtype=np.int32, buffer=block.buf)


def wait_until(test, what: str, poll: float = SLOT_POLL) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + TIMEOUT
    while not test():
        if time.monotonic() > deadline:
            print(f"stand-in timed out: {what}", flush=True)
            os._exit(3)
        time.sleep(poll)


def every_word_is(words: np.ndarray, value: int) -> bool:
    """Whether every word of a signal array holds ``value``."""
    return all(int(word) == value for word in words)


def stdin_closed(seconds: float) -> bool:
    ready, _, _ = select.select([sys.stdin], [], [], seconds)
    return bool(ready) and not sys.stdin.readline()


def engine(suffix: str, tp: int, block_suffix: str, iluvatar: bool) -> None:
    made = []
    signals = [(f"{name}.{suffix}", tp) for name in (*SIGNALS, BARRIER)]
    signals += [(f"{name}.{suffix}", 1) for name in STATUS_WORDS]
    for name, length in [*signals, (f"get_profile_block_num.{block_suffix}", tp if iluvatar else 1)]:
        block = shared_memory.SharedMemory(name=name, create=True, size=4 * length)
        np.ndarray((length,), dtype=np.int32, buffer=block.buf)[:] = 0
        made.append(block)
    print("ready", flush=True)
    profile = np.ndarray((tp if iluvatar else 1,), dtype=np.int32, buffer=made[-1].buf)
    swap, inited = (np.ndarray((tp,), dtype=np.int32, buffer=made[index].buf) for index in (1, 2))
    said = set()
    while not stdin_closed(0.01):
        if profile[0]:  # _stop_profile polls word 0 only
            print(f"profile_block_num {int(profile[0])} words {profile.tolist()}", flush=True)
            profile[:] = 0
        for name, words in (("cache_transfer_inited", inited), ("swap_space_ready", swap)):
            if name not in said and int(words.sum()) == tp:  # what PrefixCacheManager waits for
                said.add(name)
                print(f"{name} {tp}", flush=True)
    del profile, swap, inited
    for block in made:
        block.close()
        block.unlink()


def write_record(name: str, handle: bytes) -> None:
    """set_data_ipc: shm_open(O_CREAT | O_RDWR) (a record left by an earlier run is reused), ftruncate, write."""
    record_fd = _posixshmem.shm_open(f"/{name}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(record_fd, RECORD.size)
    os.pwrite(record_fd, RECORD.pack(0, handle), 0)
    os.close(record_fd)


def read_record(name: str) -> bytes:
    """The 64 handle bytes of FastDeploy's record ``name``."""
    record = shared_memory.SharedMemory(name=name)
    resource_tracker.unregister(record._name, "shared_memory")  # type: ignore[attr-defined]
    _, raw = RECORD.unpack(bytes(record.buf[: RECORD.size]))
    record.close()
    return raw


XPU_RECORD = struct.Struct("=Q64sQ")  # xpu_multiprocess.h shmStruct (XPURT 5): nprocesses, memHandle, data_ptr_addr


def read_xpu_record(name: str) -> tuple[bytes, int]:
    """FastDeploy's XPU ``share_external_data`` (custom_ops/xpu_ops/src/ops/share_external_data.cc): it maps
    ``sizeof(shmStruct)`` bytes of the record, checking no size (bytes past a shorter record's end read as
    0), and takes ``memHandle`` (``use_ipc=True``, its transfer manager) or ``data_ptr_addr`` (``use_ipc=False``,
    its XPU runner, xpu_model_runner.py ``initialize_kv_cache``) as the tensor's address. Both, in that order."""
    record = shared_memory.SharedMemory(name=name)
    resource_tracker.unregister(record._name, "shared_memory")  # type: ignore[attr-defined]
    raw = bytes(record.buf[: XPU_RECORD.size]).ljust(XPU_RECORD.size, b"\0")
    record.close()
    _, handle, data_ptr_addr = XPU_RECORD.unpack(raw)
    return handle, data_ptr_addr


class Tensors:
    """One rank's cache tensors in sealed memfds, each handle in its ``set_data_ipc`` record."""

    def __init__(self, specs: list[list], rank: int) -> None:
        self.fds, self.maps, self.records = [], [], []
        for name, nbytes in specs:
            fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, nbytes)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            self.fds.append(fd)
            self.maps.append(mmap.mmap(fd, nbytes))
            self.maps[-1][0] = rank + 1
            write_record(name, f"memfd:{os.getpid()}:{fd}".encode())
            self.records.append(name)

    def touched(self) -> bool:
        return all(view[1] == 0x5A for view in self.maps)

    def free(self) -> None:
        for view in self.maps:
            view.close()
        for fd in self.fds:
            os.close(fd)
        for name in self.records:  # FastDeploy leaves its records; the stand-in removes them, so tests can count
            _posixshmem.shm_unlink(f"/{name}")


class Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]  # cudaIpcMemHandle_t, passed by value


class Runtime:
    """The vendor runtime's CUDA-shaped calls (``FD_STANDIN_RUNTIME``, e.g. ``libmcruntime.so:mc``)."""

    SIGNATURES: ClassVar[dict[str, tuple[Any, ...]]] = {
        "SetDevice": (ctypes.c_int,),
        "Malloc": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t),
        "Free": (ctypes.c_void_p,),
        "Memset": (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t),
        "Memcpy": (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int),
        "IpcGetMemHandle": (ctypes.POINTER(Handle), ctypes.c_void_p),
        "IpcOpenMemHandle": (ctypes.POINTER(ctypes.c_void_p), Handle, ctypes.c_uint),
        "IpcCloseMemHandle": (ctypes.c_void_p,),
    }

    def __init__(self, spec: str) -> None:
        library, self.prefix = spec.split(":")
        self.library = ctypes.CDLL(library)
        for name, argtypes in self.SIGNATURES.items():
            function = getattr(self.library, self.prefix + name)
            function.argtypes, function.restype = argtypes, ctypes.c_int

    def __call__(self, name: str, *args: object) -> None:
        status = getattr(self.library, self.prefix + name)(*args)
        if status:
            print(f"stand-in: {self.prefix}{name} returned {status}", flush=True)
            os._exit(5)

    def byte(self, pointer: int, offset: int) -> int:
        out = ctypes.create_string_buffer(1)
        self("Memcpy", ctypes.addressof(out), pointer + offset, 1, DEVICE_TO_HOST)
        return out.raw[0]


def device_of(name: str) -> int:
    """The device a FastDeploy tensor name was made for (``....device{N}``)."""
    return int(name.rsplit(".device", 1)[1])


class DeviceTensors:
    """One rank's cache tensors in the vendor runtime's device memory, as FastDeploy's MetaX build has them."""

    def __init__(self, runtime: Runtime, specs: list[list], rank: int) -> None:
        self.runtime, self.pointers, self.records = runtime, [], []
        for name, nbytes in specs:
            pointer, handle = ctypes.c_void_p(), Handle()
            runtime("SetDevice", device_of(name))
            runtime("Malloc", ctypes.byref(pointer), nbytes)
            self.pointers.append(pointer.value)
            runtime("Memset", pointer, 0, nbytes)
            runtime("Memset", pointer, rank + 1, 1)
            runtime("IpcGetMemHandle", ctypes.byref(handle), pointer)
            write_record(name, bytes(handle))  # all 64 bytes (the field itself would stop at a NUL)
            self.records.append(name)

    def touched(self) -> bool:
        return all(self.runtime.byte(pointer, 1) == 0x5A for pointer in self.pointers)

    def free(self) -> None:
        for pointer in self.pointers:
            self.runtime("Free", pointer)
        for name in self.records:
            _posixshmem.shm_unlink(f"/{name}")


class DeviceView:
    """An opened handle: the attacher's mapping of one tensor, closed with ``*IpcCloseMemHandle``."""

    def __init__(self, runtime: Runtime, name: str, raw: bytes) -> None:
        pointer = ctypes.c_void_p()
        runtime("SetDevice", device_of(name))
        runtime("IpcOpenMemHandle", ctypes.byref(pointer), Handle.from_buffer_copy(raw), 1)  # LazyEnablePeerAccess
        self.runtime, self.pointer = runtime, pointer.value

    def __getitem__(self, offset: int) -> int:
        return self.runtime.byte(self.pointer, offset)

    def __setitem__(self, offset: int, value: int) -> None:
        self.runtime("Memset", self.pointer + offset, value, 1)

    def close(self) -> None:
        self.runtime("IpcCloseMemHandle", self.pointer)


RUNTIME = Runtime(os.environ["FD_STANDIN_RUNTIME"]) if os.environ.get("FD_STANDIN_RUNTIME") else None


def make_tensors(specs: list[list], rank: int) -> Tensors | DeviceTensors:
    return Tensors(specs, rank) if RUNTIME is None else DeviceTensors(RUNTIME, specs, rank)


def creator(suffix: str, rank: int, tp: int, specs: list[list]) -> None:
    _ready_block, ready = attach("cache_ready_signal", suffix, tp)
    _inited_block, inited = attach("cache_transfer_inited_signal", suffix, tp)
    _status_block, status = attach("kv_cache_status", suffix, 1)
    tensors: Tensors | DeviceTensors | None = make_tensors(specs, rank)
    ready[rank] = 1
    inited[rank] = 1
    print("created", flush=True)
    touched_once = False
    while not stdin_closed(POLL):
        if tensors is not None and not touched_once and tensors.touched():
            touched_once = True
            print("touched", flush=True)
        now = int(status[0])
        if now == CLEARING:  # check_cache_status, its create_cache_tensor branch
            wait_until(lambda: ready[rank] == 0, f"rank {rank}'s runner to let go", POLL)
            if tensors is not None:
                tensors.free()
                tensors = None
            wait_until(lambda: int(ready.sum()) == 0, "every rank to let go", POLL)
            status[0] = CLEARED
        elif now == UPDATING:
            if tensors is not None:
                tensors.free()
            tensors = make_tensors(specs, rank)
            ready[rank] = 1
            wait_until(lambda: int(ready.sum()) == tp, "every rank to be created", POLL)
            status[0] = NORMAL
    if tensors is not None:
        tensors.free()
    # the signal mappings go with the process, as FastDeploy's do


def messager(suffix: str, rank: int, tp: int, specs: list[list]) -> None:
    _ready_block, ready = attach("cache_ready_signal", suffix, tp)
    tensors = make_tensors(specs, rank)
    ready[rank] = 1  # cache_messager.py main: the one word it writes
    print("created", flush=True)
    touched_once = False
    while not stdin_closed(POLL):
        if not touched_once and tensors.touched():
            touched_once = True
            print("touched", flush=True)
    tensors.free()


def open_all(specs: list[list], first: int) -> list[mmap.mmap | DeviceView]:
    views: list[mmap.mmap | DeviceView] = []
    for name, nbytes in specs:
        raw = read_record(name)
        if RUNTIME is not None:
            view: mmap.mmap | DeviceView = DeviceView(RUNTIME, name, raw)
        else:
            _, pid, fd = raw.rstrip(b"\0").decode().split(":")
            with open(f"/proc/{pid}/fd/{fd}", "r+b") as file:
                view = mmap.mmap(file.fileno(), nbytes)
        if first >= 0 and view[0] != first:
            print(f"tensor {name} byte 0 is {view[0]}, not {first}", flush=True)
            os._exit(4)
        view[1] = 0x5A
        views.append(view)
    return views


def attacher(suffix: str, rank: int, tp: int, specs: list[list], cycles: int, first: int) -> None:
    _ready_block, ready = attach("cache_ready_signal", suffix, tp)
    _status_block, status = attach("kv_cache_status", suffix, 1)
    wait_until(lambda: ready[rank] == 1, f"rank {rank}'s cache to be created")
    views = open_all(specs, first)
    print("attached", flush=True)
    for _ in range(cycles):
        if rank == 0:
            status[0] = CLEARING
        else:
            wait_until(lambda: status[0] == CLEARING, "rank 0 to start clearing")
        for view in views:
            view.close()
        ready[rank] = 0
        if rank == 0:
            wait_until(lambda: status[0] == CLEARED, "the cache to be cleared")
            status[0] = UPDATING
        wait_until(lambda: ready[rank] == 1, f"rank {rank}'s cache to be created again")
        views = open_all(specs, first)
        if rank == 0:
            wait_until(lambda: status[0] == NORMAL, "the update to finish")
    done_then_let_go(views, ready, rank)


def pd_transfer_manager(suffix: str, rank: int, tp: int, specs: list[list]) -> None:
    _ready_block, ready = attach("cache_ready_signal", suffix, tp)
    _inited_block, inited = attach("cache_transfer_inited_signal", suffix, tp)
    wait_until(lambda: ready[rank] == 1, f"rank {rank}'s cache to be created")  # _init_gpu_cache
    views = open_all(specs, -1)
    inited[rank] = 1  # the end of CacheTransferManager.__init__
    print("attached", flush=True)
    done_then_let_go(views, ready, rank)


def done_then_let_go(views: list[mmap.mmap | DeviceView], ready: np.ndarray, rank: int) -> None:
    """Print ``done``, wait for stdin to close, then let go: unmap, reset the rank's slot."""
    print("done", flush=True)
    while not stdin_closed(0.1):
        pass
    for view in views:
        view.close()
    ready[rank] = 0  # the signal mappings go with the process, as FastDeploy's do


def rl(suffix: str, cycles: int) -> None:
    """FastDeploy's engine side of the RL flow, its two requests per round: ``EngineClient.clear_load_weight``
    writes ``model_weights_status`` CLEARING and waits for CLEARED there and in ``kv_cache_status`` (with a
    cache transfer manager); ``update_model_weight`` writes UPDATING and waits for NORMAL in both
    (``fastdeploy/entrypoints/engine_client.py``)."""
    _weights_block, weights = attach("model_weights_status", suffix, 1)
    _status_block, status = attach("kv_cache_status", suffix, 1)
    for _ in range(cycles):
        weights[0] = CLEARING
        wait_until(
            lambda: weights[0] == CLEARED and status[0] == CLEARED, "the weights and caches cleared", ENGINE_CLIENT_POLL
        )
        weights[0] = UPDATING
        wait_until(
            lambda: weights[0] == NORMAL and status[0] == NORMAL, "the weights and caches updated", ENGINE_CLIENT_POLL
        )
    print("done", flush=True)
    while not stdin_closed(0.1):
        pass
    # the signal mappings go with the process, as FastDeploy's do


def worker(suffix: str, rank: int, tp: int, specs: list[list], cycles: int) -> None:
    """FastDeploy's worker of one rank that attaches to its cache transfer manager's cache, following
    ``model_weights_status`` as ``DynamicWeightManager.check_model_weights_status`` does
    (``fastdeploy/rl/dynamic_weight_manager.py``, called from ``worker_process.py``'s event loop): on CLEARING it
    writes ``kv_cache_status`` CLEARING, lets go (unmaps, resets its slot: ``gpu_model_runner.py``
    ``clear_cache``) and, on rank 0, writes CLEARED once every rank let go (where FastDeploy's ranks meet at a
    tp barrier in ``clear_parameters``); on UPDATING it writes ``kv_cache_status`` UPDATING, waits for its slot,
    attaches again and, on rank 0, writes NORMAL. Prints ``attached``, then ``done`` after ``cycles`` rounds."""
    _ready_block, ready = attach("cache_ready_signal", suffix, tp)
    _status_block, status = attach("kv_cache_status", suffix, 1)
    _weights_block, weights = attach("model_weights_status", suffix, 1)
    _barrier_block, barrier = attach(BARRIER, suffix, tp)
    wait_until(lambda: ready[rank] == 1, f"rank {rank}'s cache to be created")
    views = open_all(specs, -1)
    print("attached", flush=True)
    for done in range(1, cycles + 1):
        wait_until(lambda: weights[0] == CLEARING, "a clear request", WORKER_POLL)
        status[0] = CLEARING
        for view in views:
            view.close()
        ready[rank] = 0
        if rank == 0:  # clear_parameters' tp barrier: every rank let go
            wait_until(lambda: int(ready.sum()) == 0, "every rank to let go", WORKER_POLL)
            weights[0] = CLEARED
        wait_until(lambda: weights[0] == UPDATING, "an update request", WORKER_POLL)
        status[0] = UPDATING
        wait_until(lambda: ready[rank] == 1, f"rank {rank}'s cache to be created again")
        views = open_all(specs, -1)
        barrier[rank] = done  # finalize_update's tp barrier: rank 0 answers once every rank updated
        if rank == 0:
            wait_until(partial(every_word_is, barrier, done), "every rank to update", WORKER_POLL)
            weights[0] = NORMAL
        wait_until(lambda: weights[0] != UPDATING, "the update to finish", WORKER_POLL)  # NORMAL, or the next CLEARING
    done_then_let_go(views, ready, rank)


def main(argv: list[str]) -> None:
    role, suffix, *rest = argv
    if role == "engine":
        engine(suffix, int(rest[0]), rest[1] if len(rest) > 1 else suffix, rest[2:] == ["iluvatar"])
    elif role == "creator":
        creator(suffix, int(rest[0]), int(rest[1]), json.loads(rest[2]))
    elif role == "messager":
        messager(suffix, int(rest[0]), int(rest[1]), json.loads(rest[2]))
    elif role == "rl":
        rl(suffix, int(rest[0]))
    elif role == "worker":
        worker(suffix, int(rest[0]), int(rest[1]), json.loads(rest[2]), int(rest[3]))
    elif role == "pd-transfer-manager":
        pd_transfer_manager(suffix, int(rest[0]), int(rest[1]), json.loads(rest[2]))
    elif role == "attacher":
        attacher(suffix, int(rest[0]), int(rest[1]), json.loads(rest[2]), int(rest[3]), int(rest[4]))
    else:
        raise SystemExit(f"unknown role {role!r}")
    ours = sorted(name for name in sys.modules if name.split(".")[0] == "fd_platforms")
    print(f"imported of ours: {ours}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
