"""P/D decode under FastDeploy's protocol, one process per role: our cache messager (this process, told no swap space
or storage backend, as FastDeploy's ``launch_cache_messager`` tells it none), our worker (a spawned process) and
FastDeploy's cache transfer manager (the stand-in, holding no mark of ours). FastDeploy starts that transfer manager
beside the worker whenever the engine has swap space or a storage backend (``prefix_cache_manager.py``
``launch_cache_manager`` ~L297-304 at c1b7c083): the messager never frees the rank while it maps it, whatever our
worker was told, however it ends, and whatever marks lie in ``/dev/shm``.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_processes import decode_runner, first_bytes, qwen_layout
from kv_requests import kv_request
from warm_processes import warm

from fd_platforms.contract.errors import CacheInUseError
from fd_platforms.engine import CacheRequest, ManagedCache, manage_kv_cache
from fd_platforms.fastdeploy.marks import attacher_prefix
from fd_platforms.loading.platform import Platform

pytestmark = pytest.mark.slow  # multi-process: left out of -m "not slow"

STANDINS = Path(__file__).resolve().parents[1] / "support" / "fastdeploy_standins.py"
BLOCKS = 4


@pytest.fixture
def messager(cpu: Platform, fastdeploy_suffix: str, cpu_for_children: None) -> Iterator[ManagedCache]:
    """Our cache messager of rank 0 (P/D decode, FastDeploy's signals made as its engine makes them)."""
    managed = manage_kv_cache(cpu, messager_request(fastdeploy_suffix))
    assert managed.created and managed.host_cache is None
    yield managed
    if any(os.path.exists(f"/dev/shm/{name}") for name in managed.kv_cache.names):
        managed.clear(5)


def messager_request(suffix: str) -> CacheRequest:
    return kv_request(qwen_layout(), BLOCKS, splitwise_role="decode", protocol="fastdeploy", instance=suffix, tp=1)


class Worker:
    """Our worker of rank 0 in its own process, attached to the messager's cache."""

    def __init__(self, suffix: str, num_cpu_blocks: int, storage_backend: str | None) -> None:
        self.conn, theirs = warm.Pipe()
        self.process = warm.Process(
            target=decode_runner, args=(suffix, theirs, num_cpu_blocks, storage_backend), daemon=True
        )
        self.process.start()
        theirs.close()
        assert self.conn.poll(60) and self.conn.recv() == ("attached", False)

    def clear(self) -> None:
        self.conn.send("clear")
        assert self.conn.poll(30) and self.conn.recv() == "cleared"

    def kill(self) -> None:
        self.process.kill()
        self.process.join()

    def stop(self) -> None:
        self.conn.close()
        self.process.join(30)
        if self.process.is_alive():
            self.kill()


def fastdeploys_transfer_manager(suffix: str, names: list[str], nbytes: int) -> subprocess.Popen:
    """FastDeploy's transfer manager of rank 0 in P/D (the stand-in): attached, its ``cache_transfer_inited`` set."""
    specs = json.dumps([[name, nbytes] for name in names])
    process = subprocess.Popen(
        [sys.executable, str(STANDINS), "pd-transfer-manager", suffix, "0", "1", specs],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert [process.stdout.readline().strip() for _ in range(2)] == ["attached", "done"]  # type: ignore[union-attr]
    return process


def let_go(process: subprocess.Popen) -> None:
    process.stdin.close()  # type: ignore[union-attr]
    assert process.wait(10) == 0


def never_frees_while_fastdeploy_maps(managed: ManagedCache, transfer: subprocess.Popen) -> None:
    """The messager frees nothing while FastDeploy's transfer manager maps the rank; after its let-go it does."""
    names = managed.kv_cache.names
    with pytest.raises(CacheInUseError, match="rank 0's KV cache"):
        managed.clear(0.6)
    assert all(os.path.exists(f"/dev/shm/{name}") for name in names), "nothing freed"
    assert first_bytes(managed.kv_cache, 1) == {0x5A}, "FastDeploy's transfer manager still maps every tensor"
    let_go(transfer)
    managed.clear(5)
    assert not any(os.path.exists(f"/dev/shm/{name}") for name in names)


def nbytes(managed: ManagedCache) -> int:
    return int(managed.kv_cache.nbytes // len(managed.kv_cache.names))


@pytest.mark.parametrize(
    ("num_cpu_blocks", "storage_backend"),
    [(0, "file"), (BLOCKS, None), (0, None)],
    ids=["storage backend, no swap", "swap", "swap the worker was not told"],
)
def test_the_worker_letting_go_never_frees_under_fastdeploys_transfer_manager(
    messager: ManagedCache, fastdeploy_suffix: str, num_cpu_blocks: int, storage_backend: str | None
) -> None:
    worker = Worker(fastdeploy_suffix, num_cpu_blocks, storage_backend)
    try:
        transfer = fastdeploys_transfer_manager(fastdeploy_suffix, messager.kv_cache.names, nbytes(messager))
        worker.clear()
        never_frees_while_fastdeploy_maps(messager, transfer)
    finally:
        worker.stop()


def test_a_forged_dead_mark_beside_a_killed_worker_never_frees_under_fastdeploys_transfer_manager(
    messager: ManagedCache, fastdeploy_suffix: str
) -> None:
    """Any process of this user may drop an unheld mark in the rank's name saying one attacher per rank; with our
    worker SIGKILLed the two dead marks must not pass for every attacher the deployment has."""
    worker = Worker(fastdeploy_suffix, BLOCKS, None)
    transfer = fastdeploys_transfer_manager(fastdeploy_suffix, messager.kv_cache.names, nbytes(messager))
    forged = f"/dev/shm/{attacher_prefix(fastdeploy_suffix, 0)}424242-abcdef"
    Path(forged).write_bytes(struct.pack("=qqq", 424242, 0, 1))
    os.chmod(forged, 0o600)
    try:
        worker.kill()
        never_frees_while_fastdeploy_maps(messager, transfer)
    finally:
        worker.stop()
        if os.path.exists(forged):
            os.unlink(forged)


def test_without_a_transfer_manager_the_workers_let_go_and_its_death_each_free_at_once(
    cpu: Platform, messager: ManagedCache, fastdeploy_suffix: str
) -> None:
    """No swap space, no storage backend: FastDeploy starts no transfer manager, so the worker is the rank's only
    attacher; its let-go frees at once, and so, with a WARNING, does its SIGKILL."""
    worker = Worker(fastdeploy_suffix, 0, None)
    try:
        worker.clear()
        messager.clear(2)
        again = manage_kv_cache(cpu, messager_request(fastdeploy_suffix))
    finally:
        worker.stop()
    second = Worker(fastdeploy_suffix, 0, None)
    second.kill()
    again.clear(2)
    assert not glob.glob(f"/dev/shm/{attacher_prefix(fastdeploy_suffix, 0)}*")
