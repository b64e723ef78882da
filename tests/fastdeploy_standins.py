"""Stand-ins for FastDeploy's own processes, speaking only its IPC: plain shared memory and numpy.

Run as a script (``python tests/fastdeploy_standins.py ROLE ...``); it imports nothing of
fd-platforms (it says so on exit), so what meets our processes is FastDeploy's format alone:

- ``engine SUFFIX TP``: creates FastDeploy's signals as its engine does (``IPCSignal`` arrays named
  ``<name>.<suffix>``, int32, zeroed), prints ``ready``; prints ``profile_block_num N`` when a count is
  handed over, ``cache_transfer_inited TP`` / ``swap_space_ready TP`` once every rank's word is set
  (what FastDeploy's engine waits for before its cache service starts); at stdin's end removes them.
- ``creator SUFFIX RANK TP TENSORS``: the cache transfer manager of one rank. Creates each tensor of
  ``TENSORS`` (a JSON list of ``[name, nbytes]``) in a sealed memfd, writes its handle in
  ``set_data_ipc``'s record (``size_t`` 0 + 64 handle bytes) under the tensor's name, fills byte 0
  with ``RANK + 1``, sets ``cache_ready_signal[RANK] = 1`` and ``cache_transfer_inited_signal[RANK] = 1``.
  Then it follows ``kv_cache_status`` (polled every 0.1 s, as FastDeploy's does): on CLEARING it
  waits for its slot to drop to 0, frees, waits for every slot to drop, writes CLEARED; on UPDATING
  it creates again, sets its slot, waits for every slot, writes NORMAL. Only rank 0 waits for every
  slot and writes the answers (a late second writer could overwrite the driver's next word, and a
  rank waiting for every slot could miss a moment that passed); a rank whose look comes after rank 0
  answered sees CLEARED or UPDATING and acts the same. Ends when stdin closes.
- ``attacher SUFFIX RANK TP TENSORS CYCLES FIRST``: the worker of one rank that attaches. Polls its
  slot, opens every record's memfd, checks each tensor's byte 0 is ``FIRST`` (-1: any), writes
  byte 1 = 0x5A (the creator checks it), prints ``attached``. Then ``CYCLES`` clear/update rounds, as FastDeploy's
  workers do them (rank 0's word is every rank's): rank 0 writes CLEARING, lets go (unmaps, resets
  its slot), waits for CLEARED, writes UPDATING, waits for its slot, attaches again, waits for
  NORMAL; another rank waits for CLEARING, lets go, waits for its slot, attaches again. ``CYCLES``
  0 drives nothing. Prints ``done``, waits for stdin to close, then lets go (resets its slot).

Every wait gives up after ``FD_STANDIN_TIMEOUT`` seconds (default 30) with exit status 3.
"""

from __future__ import annotations

import _posixshmem
import fcntl
import json
import mmap
import os
import select
import struct
import sys
import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np

SIGNALS = ("cache_ready_signal", "swap_space_ready_signal", "cache_transfer_inited_signal")
ONE_WORD = ("kv_cache_status", "get_profile_block_num")
NORMAL, UPDATING, CLEARING, CLEARED = 0, 1, -1, -2
RECORD = struct.Struct("=Q64s")
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
POLL = 0.1  # FastDeploy's cache transfer manager polls kv_cache_status every 0.1 s
SLOT_POLL = 0.005
TIMEOUT = float(os.environ.get("FD_STANDIN_TIMEOUT", "30"))


def attach(name: str, suffix: str, length: int) -> tuple[shared_memory.SharedMemory, np.ndarray]:
    """FastDeploy's ``IPCSignal(create=False)``, without the resource tracker's unlink at exit."""
    block = shared_memory.SharedMemory(name=f"{name}.{suffix}")
    resource_tracker.unregister(block._name, "shared_memory")  # type: ignore[attr-defined]
    return block, np.ndarray((length,), dtype=np.int32, buffer=block.buf)


def wait_until(test, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + TIMEOUT
    while not test():
        if time.monotonic() > deadline:
            print(f"stand-in timed out: {what}", flush=True)
            os._exit(3)
        time.sleep(SLOT_POLL)


def stdin_closed(seconds: float) -> bool:
    ready, _, _ = select.select([sys.stdin], [], [], seconds)
    return bool(ready) and not sys.stdin.readline()


def engine(suffix: str, tp: int) -> None:
    made = []
    for name in SIGNALS + ONE_WORD:
        length = tp if name in SIGNALS else 1
        block = shared_memory.SharedMemory(name=f"{name}.{suffix}", create=True, size=4 * length)
        np.ndarray((length,), dtype=np.int32, buffer=block.buf)[:] = 0
        made.append(block)
    print("ready", flush=True)
    profile = np.ndarray((1,), dtype=np.int32, buffer=made[-1].buf)
    swap, inited = (np.ndarray((tp,), dtype=np.int32, buffer=made[index].buf) for index in (1, 2))
    said = set()
    while not stdin_closed(0.01):
        if profile[0]:
            print(f"profile_block_num {int(profile[0])}", flush=True)
            profile[0] = 0
        for name, words in (("cache_transfer_inited", inited), ("swap_space_ready", swap)):
            if name not in said and int(words.sum()) == tp:  # what PrefixCacheManager waits for
                said.add(name)
                print(f"{name} {tp}", flush=True)
    del profile, swap, inited
    for block in made:
        block.close()
        block.unlink()


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
            # set_data_ipc: shm_open(O_CREAT | O_RDWR) (a record left by an earlier run is reused), ftruncate, write
            record_fd = _posixshmem.shm_open(f"/{name}", os.O_CREAT | os.O_RDWR, 0o600)
            os.ftruncate(record_fd, RECORD.size)
            os.pwrite(record_fd, RECORD.pack(0, f"memfd:{os.getpid()}:{fd}".encode()), 0)
            os.close(record_fd)
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


def creator(suffix: str, rank: int, tp: int, specs: list[list]) -> None:
    ready_block, ready = attach("cache_ready_signal", suffix, tp)
    inited_block, inited = attach("cache_transfer_inited_signal", suffix, tp)
    status_block, status = attach("kv_cache_status", suffix, 1)
    tensors: Tensors | None = Tensors(specs, rank)
    ready[rank] = 1
    inited[rank] = 1
    print("created", flush=True)
    touched_once = False
    while not stdin_closed(POLL):
        if tensors is not None and not touched_once and tensors.touched():
            touched_once = True
            print("touched", flush=True)
        now = int(status[0])
        # Looks 0.1 s apart can miss a whole phase (CLEARING, CLEARED, even the last NORMAL), so the
        # cue to let go is this rank's own word: only its attacher resets it, when it lets go.
        if tensors is not None and now != NORMAL and ready[rank] == 0:
            wait_until(lambda: ready[rank] == 0, f"rank {rank}'s attacher to let go")
            tensors.free()
            tensors = None
            if rank == 0:  # one writer: a late second one could overwrite the driver's next word
                wait_until(lambda: int(ready.sum()) == 0, "every rank to let go")
                status[0] = CLEARED
        elif now in (UPDATING, NORMAL) and tensors is None:
            tensors = Tensors(specs, rank)
            ready[rank] = 1
            if rank == 0:  # (another rank waiting for every slot could miss a moment that passed)
                wait_until(lambda: int(ready.sum()) == tp, "every rank to be created")
                status[0] = NORMAL
    if tensors is not None:
        tensors.free()
    # the signal mappings go with the process, as FastDeploy's do


def open_all(specs: list[list], first: int) -> list[mmap.mmap]:
    views = []
    for name, nbytes in specs:
        record = shared_memory.SharedMemory(name=name)
        resource_tracker.unregister(record._name, "shared_memory")  # type: ignore[attr-defined]
        _, raw = RECORD.unpack(bytes(record.buf[: RECORD.size]))
        record.close()
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
    ready_block, ready = attach("cache_ready_signal", suffix, tp)
    status_block, status = attach("kv_cache_status", suffix, 1)
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
    print("done", flush=True)
    while not stdin_closed(0.1):
        pass
    for view in views:
        view.close()
    ready[rank] = 0  # the signal mappings go with the process, as FastDeploy's do


def main(argv: list[str]) -> None:
    role, suffix, *rest = argv
    if role == "engine":
        engine(suffix, int(rest[0]))
    elif role == "creator":
        creator(suffix, int(rest[0]), int(rest[1]), json.loads(rest[2]))
    elif role == "attacher":
        attacher(suffix, int(rest[0]), int(rest[1]), json.loads(rest[2]), int(rest[3]), int(rest[4]))
    else:
        raise SystemExit(f"unknown role {role!r}")
    ours = sorted(name for name in sys.modules if name.split(".")[0] == "fd_platforms")
    print(f"imported of ours: {ours}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
