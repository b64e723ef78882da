"""P/D with a cache transfer manager: the cache messager creates, the worker and the
transfer manager attach, each through a public, non-deprecated call, and nothing is freed before both let go.

FastDeploy's side (develop c1b7c083): in a split deployment ``cache_manager/prefix_cache_manager.py``
``launch_cache_manager`` starts the cache messager (``cache_manager/cache_messager.py`` ``main``: it creates every
layer's cache, ``set_data_ipc``, then sets ``cache_ready_signal[rank]`` and no other word) and, with swap space, the
cache transfer manager without ``--create_cache_tensor`` (``cache_transfer_manager.py`` ``_init_gpu_cache``: "Waiting
for runners or messagers to create kv cache"); the worker's rule sends it to attach (``gpu_model_runner.py``
``initialize_kv_cache``). Two attachers, one ``cache_ready`` slot. Every process here is its own, as there.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from engine_processes import PD_BLOCKS, PD_CPU_BLOCKS, pd_process, qwen_layout
from kv_requests import kv_request
from warm_processes import warm

from fd_platforms.contract.errors import ConfigError
from fd_platforms.fastdeploy.signals import (
    CACHE_READY,
    CACHE_TRANSFER_INITED,
    KV_CACHE_STATUS,
    SWAP_SPACE_READY,
    FastDeploySignal,
)
from fd_platforms.ipc.cache_signal import CacheReadySignal
from fd_platforms.rules.decision import DecisionInputs
from fd_platforms.rules.roles import cache_roles

STANDINS = Path(__file__).resolve().parents[1] / "support" / "fastdeploy_standins.py"
pytestmark = pytest.mark.usefixtures("fastdeploy_record_names", "cpu_for_children")  # its processes select cpu too
multi_process = pytest.mark.slow  # our processes spawned beside FastDeploy's: left out of -m "not slow"


@contextmanager
def fastdeploy_signals() -> Iterator[tuple[str, dict[str, FastDeploySignal]]]:
    """FastDeploy's engine's signals for tp 1 under a fresh suffix (``engine.py`` ``_init_worker_signals``)."""
    suffix = f"t{secrets.token_hex(4)}"
    with ExitStack() as stack:
        made = {
            name: stack.enter_context(FastDeploySignal.create(name, suffix, 1))
            for name in (CACHE_READY, SWAP_SPACE_READY, CACHE_TRANSFER_INITED, KV_CACHE_STATUS)
        }
        yield suffix, made


class Spawned:
    """One process of ours running :func:`engine_processes.pd_process`, reached through a pipe."""

    def __init__(self, role: str, name: str, protocol: str) -> None:
        self.conn, theirs = warm.Pipe()
        self.process = warm.Process(target=pd_process, args=(role, name, protocol, theirs), daemon=True)
        self.process.start()
        self.role = role

    def up(self) -> tuple[bool, int, list[int]]:
        assert self.conn.poll(60), f"our {self.role} never came up"
        kind, created, host, bytes0 = self.conn.recv()
        assert kind == "up"
        return created, host, bytes0

    def clear(self, timeout: float) -> tuple[str, str]:
        self.conn.send(("clear", timeout))
        assert self.conn.poll(60)
        return self.conn.recv()

    def stop(self) -> None:
        if self.process.is_alive():
            self.conn.send(("stop", None))
            self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)


def records() -> list[str]:
    return qwen_layout().names()


def published() -> bool:
    return all(os.path.exists(f"/dev/shm/{name}") for name in records())


def standin(role: str, suffix: str, cpu, *extra: str) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    """FastDeploy's process ``role`` for rank 0 of tp 1.

    The stand-in is ``tests/support/fastdeploy_standins.py``: it imports nothing of ours.
    """
    layout = cpu.cache_layout(qwen_layout(), PD_BLOCKS)
    specs = json.dumps([[spec.name, spec.nbytes(PD_BLOCKS)] for spec in layout.tensors])
    return subprocess.Popen(
        [sys.executable, str(STANDINS), role, suffix, "0", "1", specs, *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def said(process: subprocess.Popen[str]) -> str:
    return process.stdout.readline().strip()  # type: ignore[union-attr]


def finish(process: subprocess.Popen[str]) -> None:
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and "imported of ours: []" in out, out


def test_two_processes_attach_each_rank_in_either_split_role_with_swap_space() -> None:
    """FastDeploy starts the messager for prefill as for decode (``prefix_cache_manager.py`` ``enable_splitwise``), and
    the transfer manager wherever there is swap space: the prefill side has two attachers too (it said one)."""

    def attachers(role: str, num_cpu_blocks: int, backend: str | None = None) -> int:
        return len(cache_roles(DecisionInputs(False, num_cpu_blocks, backend, role, "2026-04")).attachers)

    assert [attachers(role, 4) for role in ("mixed", "prefill", "decode")] == [1, 2, 2]
    assert [attachers(role, 0) for role in ("prefill", "decode")] == [1, 1]
    assert [attachers(role, 0, "file") for role in ("prefill", "decode")] == [2, 2], "a storage backend starts it too"


@multi_process
@pytest.mark.parametrize("protocol", ["fastdeploy", "fd-platforms"])
@pytest.mark.parametrize("first", ["worker", "transfer"])
def test_our_messager_creates_our_worker_and_transfer_manager_attach_and_nothing_is_freed_before_both_let_go(
    cpu, protocol: str, first: str
) -> None:
    """Our three processes, each its own: the messager (``manage_kv_cache`` with no swap space) creates and says only
    the slot; the worker (``initialize_kv_cache``) and the transfer manager (``manage_kv_cache(..., attach=True)``)
    attach, the latter with its host swap cache and FastDeploy's manager words. Whichever lets go first, the
    messager's clear waits for the other, then frees."""
    with ExitStack() as stack:
        if protocol == "fastdeploy":
            name, signals = stack.enter_context(fastdeploy_signals())
        else:
            name, signals = stack.enter_context(CacheReadySignal.create(1)).name, {}
        messager = Spawned("messager", name, protocol)
        stack.callback(messager.stop)
        assert messager.up()[:2] == (True, 0), "the messager creates, with no host swap cache"
        if signals:
            assert signals[CACHE_READY].get(0) == 1 and published()
            assert signals[CACHE_TRANSFER_INITED].get(0) == 0, "the messager writes no transfer-manager word"
        attachers = {role: Spawned(role, name, protocol) for role in ("worker", "transfer")}
        for process in attachers.values():
            stack.callback(process.stop)
        ups = {role: process.up() for role, process in attachers.items()}
        assert ups["worker"] == (False, 0, [0]) and ups["transfer"] == (False, PD_CPU_BLOCKS, [0]), ups
        if signals:
            assert signals[SWAP_SPACE_READY].get(0) == 1 and signals[CACHE_TRANSFER_INITED].get(0) == 1
        second = "transfer" if first == "worker" else "worker"
        assert attachers[first].clear(10) == ("cleared", "")
        kind, message = messager.clear(0.5)
        assert kind == "CacheInUseError" and "rank 0" in message, (kind, message)
        if signals:
            assert published(), "nothing freed while the other attacher holds the cache"
        assert attachers[second].clear(10) == ("cleared", "")
        assert messager.clear(10) == ("cleared", "")
        if signals:
            assert not published() and signals[CACHE_READY].get(0) == 0


@multi_process
def test_fastdeploys_messager_creates_and_our_worker_and_transfer_manager_attach(cpu) -> None:
    """FastDeploy's cache messager (the stand-in) creates; our worker and transfer manager attach through the
    public calls, write into every tensor, let go; FastDeploy's records stay its own until it exits."""
    with fastdeploy_signals() as (suffix, signals), ExitStack() as stack:
        theirs = standin("messager", suffix, cpu)
        assert said(theirs) == "created"
        attachers = {role: Spawned(role, suffix, "fastdeploy") for role in ("worker", "transfer")}
        for process in attachers.values():
            stack.callback(process.stop)
        ups = {role: process.up() for role, process in attachers.items()}
        assert ups["worker"] == (False, 0, [1]) and ups["transfer"] == (False, PD_CPU_BLOCKS, [1]), ups
        assert said(theirs) == "touched", "our attachers map FastDeploy's memory"
        assert signals[SWAP_SPACE_READY].get(0) == 1 and signals[CACHE_TRANSFER_INITED].get(0) == 1
        for process in attachers.values():
            assert process.clear(10) == ("cleared", "")
        assert signals[CACHE_READY].get(0) == 0, "the last of our two attachers reset the slot"
        assert published(), "FastDeploy's records are its own"
        finish(theirs)
    assert not published()


@multi_process
@pytest.mark.parametrize("ours", ["worker", "transfer"])
def test_our_messager_frees_nothing_before_fastdeploys_attacher_lets_go_beside_ours(cpu, ours: str) -> None:
    """Our messager creates; one of FastDeploy's attachers (the stand-in, which holds nothing and resets the slot when
    it lets go) and one of ours attach. Ours lets go first: it leaves the slot to FastDeploy's (on b3265ec it reset
    it, and the messager freed the cache under FastDeploy's mapping), so the messager's clear names whom it waits for;
    once FastDeploy's lets go, it frees."""
    with fastdeploy_signals() as (suffix, signals), ExitStack() as stack:
        messager = Spawned("messager", suffix, "fastdeploy")
        stack.callback(messager.stop)
        assert messager.up()[0] is True
        theirs = standin("attacher", suffix, cpu, "0", "0")
        assert [said(theirs) for _ in range(2)] == ["attached", "done"]
        our = Spawned(ours, suffix, "fastdeploy")
        stack.callback(our.stop)
        assert our.up()[0] is False
        assert our.clear(10) == ("cleared", "")
        assert signals[CACHE_READY].get(0) == 1, "the slot is left to FastDeploy's attacher"
        kind, message = messager.clear(0.5)
        assert kind == "CacheInUseError" and "FastDeploy's own" in message, (kind, message)
        assert published(), "nothing freed under FastDeploy's attacher"
        finish(theirs)  # FastDeploy's let-go resets the slot
        assert messager.clear(10) == ("cleared", "")
        assert not published()


def test_attach_is_refused_where_it_would_leave_the_rank_without_a_creator(cpu) -> None:
    """A mixed instance whose workers the rule sends to attach (2026-01, swap space) has the manager as their creator;
    without swap space FastDeploy starts no transfer manager. Both refused before anything is published."""
    from fd_platforms.engine import manage_kv_cache

    with fastdeploy_signals() as (suffix, _):
        with pytest.raises(ConfigError) as caught:
            manage_kv_cache(
                cpu,
                kv_request(
                    qwen_layout(), PD_BLOCKS, num_cpu_blocks=4, protocol="fastdeploy", instance=suffix, rule="2026-01"
                ),
                attach=True,
            )
        assert caught.value.field == "attach" and "rule 2026-01" in str(caught.value)
        assert "this cache manager is the one that creates" in str(caught.value)
        with pytest.raises(ConfigError) as caught:
            manage_kv_cache(
                cpu,
                kv_request(
                    qwen_layout(),
                    PD_BLOCKS,
                    num_cpu_blocks=0,
                    protocol="fastdeploy",
                    instance=suffix,
                    splitwise_role="decode",
                ),
                attach=True,
            )
        assert caught.value.field == "num_cpu_blocks" and "attach=True" in str(caught.value)
        assert not published()


@multi_process
def test_our_manager_holding_the_swap_space_frees_once_the_worker_its_only_attacher_lets_go(cpu) -> None:
    """Our cache manager creating in decode with its own swap space (``fd-platforms run`` has it so) is the rank's
    transfer manager: only the worker attaches, though the worker's settings count two. The worker's let-go resets
    the slot (its creator's mark says one), so the manager's clear frees at once instead of waiting out its timeout."""
    from fd_platforms.engine import manage_kv_cache

    with fastdeploy_signals() as (suffix, signals), ExitStack() as stack:
        managed = manage_kv_cache(
            cpu,
            kv_request(
                qwen_layout(),
                PD_BLOCKS,
                num_cpu_blocks=PD_CPU_BLOCKS,
                protocol="fastdeploy",
                instance=suffix,
                splitwise_role="decode",
                tp=1,
            ),
        )
        stack.callback(managed.clear, 5)
        assert managed.created and managed.host_cache is not None
        worker = Spawned("worker", suffix, "fastdeploy")
        stack.callback(worker.stop)
        assert worker.up()[0] is False
        assert worker.clear(10) == ("cleared", "")
        assert signals[CACHE_READY].get(0) == 0, "the only attacher reset the slot"
        managed.clear(2)
        assert not published()
