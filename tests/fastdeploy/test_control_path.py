"""FastDeploy's control path (``/v1/sleep``, ``/v1/wakeup``) answered by our cache manager
(``fd_platforms.fastdeploy.control.serve_control_requests``), beside stand-ins of FastDeploy's engine and workers
(``tests/support/fastdeploy_control_standins.py``: its engine cache queue, its FMQ reply queues, its pickles), one
process per FastDeploy process and rank; and the allow-list that reads FastDeploy's pickles.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from multiprocessing.connection import Listener
from pathlib import Path

import pytest
from engine_processes import FASTDEPLOY_ATTACH, fastdeploy_control_manager, qwen_layout
from kv_requests import kv_request
from warm_processes import warm

from fd_platforms.contract.errors import CacheInUseError, ConfigError, ExtraNotInstalledError, PickleRefusedError
from fd_platforms.engine import initialize_kv_cache, manage_kv_cache
from fd_platforms.fastdeploy import FASTDEPLOY, SleepingKVCache
from fd_platforms.fastdeploy.control_pickles import CacheStatus, ControlRequest, restricted_loads
from fd_platforms.fastdeploy.control_wire import AUTHKEY, CacheTaskQueue, ControlPlace, ReplyQueue
from fd_platforms.fastdeploy.signals import CACHE_READY, FastDeploySignal
from fd_platforms.loading.platform import Platform

SUPPORT = Path(__file__).resolve().parents[1] / "support"
STANDINS, CONTROL = SUPPORT / "fastdeploy_standins.py", SUPPORT / "fastdeploy_control_standins.py"
SHAPED = SUPPORT / "fastdeploy_shaped"
BLOCKS, ROUNDS = 4, 2
FASTDEPLOYS_WAIT = 60.0  # common_engine.py L1501, L1597, L1729


def popen(script: Path, *args: object, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(script), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SUPPORT), **env},
    )


def said(process: subprocess.Popen[str]) -> str:
    line = process.stdout.readline().strip()  # type: ignore[union-attr]
    assert line, f"the stand-in ended: {process.stdout.read()}"  # type: ignore[union-attr]
    return line


def finish(process: subprocess.Popen[str]) -> str:
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    assert "imported of ours: []" in out, out
    return out


def ours_in_shm(suffix: str, port: int) -> set[str]:
    return {name for name in os.listdir("/dev/shm") if suffix in name or f"_{port}." in name}


@contextmanager
def fastdeploy_engine(
    tp: int, mode: str = "", rounds: int = ROUNDS, **env: str
) -> Iterator[tuple[str, int, subprocess.Popen[str]]]:
    """FastDeploy's signals (the ``fastdeploy_standins.py engine``) and its engine's control path under a fresh
    suffix and cache queue port (0: an anonymous TCP port, where the task queues are not on /dev/shm); nothing of
    either is left after."""
    suffix = f"t{secrets.token_hex(4)}"
    port = 0 if env.get("FD_ENGINE_TASK_QUEUE_WITH_SHM") == "0" else 20000 + secrets.randbelow(40000)
    signals = popen(STANDINS, "engine", suffix, tp)
    assert said(signals) == "ready"
    control = popen(CONTROL, "engine", suffix, port, tp, rounds, mode, **env)
    try:
        word, port = said(control).split()
        assert word == "queues"
        yield suffix, int(port), control
    finally:
        if control.poll() is None:
            finish(control)
        finish(signals)
        assert ours_in_shm(suffix, int(port)) == set(), "the queues' sockets and the signals are gone"


def our_managers(stack: ExitStack, suffix: str, tp: int, port: int) -> list:  # type: ignore[type-arg]
    """Our cache manager of each rank, spawned (one process per rank, as FastDeploy's transfer managers)."""
    links = []
    for rank in range(tp):
        link, far = warm.Pipe()
        process = warm.Process(target=fastdeploy_control_manager, args=(suffix, rank, tp, BLOCKS, port, far))
        process.start()
        stack.callback(process.kill)
        assert link.poll(120) and link.recv() == ("created", False)
        links.append(link)
    return links


def specs(cpu: Platform, rank: int, tp: int) -> str:
    layout = cpu.cache_layout(qwen_layout(rank, tp), BLOCKS)
    return json.dumps([[spec.name, spec.nbytes(BLOCKS)] for spec in layout.tensors])


def answered(engine: subprocess.Popen[str], method: str, ranks: int) -> float:
    """The engine's next answer: ``method``, every rank's code 200; the seconds it took."""
    word, got, seconds, codes = said(engine).split()
    assert (word, got) == ("answered", method), (word, got)
    assert codes.split(",") == ["200"] * ranks, f"{method}: {codes}"
    return float(seconds)


@pytest.mark.slow
@pytest.mark.usefixtures("fastdeploy_record_names", "cpu_for_children")
@pytest.mark.parametrize(
    ("v1_update_weights", "with_shm", "swap_clearing"),
    [("0", "1", "0"), ("1", "1", "0"), ("0", "0", "1")],
    ids=["v1-sleep", "v1-update-weights-reroute", "tcp-queue-swap-clearing"],
)
def test_fastdeploys_sleep_and_wakeup_are_answered_by_our_cache_managers_round_after_round(
    cpu: Platform, v1_update_weights: str, with_shm: str, swap_clearing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FastDeploy's engine pauses, sleeps, wakes up and resumes twice over two ranks: our cache managers let go and
    create again each time (the host swap cache kept, or freed with FD_ENABLE_SWAP_SPACE_CLEARING), meet at
    FastDeploy's barrier and reply on each rank's ctrl_c2e queue within 60 s; FastDeploy's workers let go on sleep
    and attach to the new caches on wakeup. FD_ENABLE_V1_UPDATE_WEIGHTS changes what the engine sends (the rerouted
    /clear_load_weight and /update_model_weight: tags weight,kv_cache), not what our managers do."""
    tp, env = 2, {"FD_ENABLE_V1_UPDATE_WEIGHTS": v1_update_weights, "FD_ENGINE_TASK_QUEUE_WITH_SHM": with_shm}
    for name, value in {**env, "FD_ENABLE_SWAP_SPACE_CLEARING": swap_clearing}.items():
        monkeypatch.setenv(name, value)
    with fastdeploy_engine(tp, **env) as (suffix, port, engine), ExitStack() as stack:
        links = our_managers(stack, suffix, tp, port)
        workers = [popen(CONTROL, "worker", suffix, rank, tp, specs(cpu, rank, tp), ROUNDS) for rank in range(tp)]
        for worker in workers:
            stack.callback(worker.kill)
            assert said(worker) == "attached"
        engine.stdin.write("go\n")  # type: ignore[union-attr]
        engine.stdin.flush()  # type: ignore[union-attr]
        for _ in range(ROUNDS):
            assert answered(engine, "pause", tp) < FASTDEPLOYS_WAIT
            assert answered(engine, "sleep", 2 * tp) < FASTDEPLOYS_WAIT  # the transfer managers' and the workers'
            assert answered(engine, "wakeup", 2 * tp) < FASTDEPLOYS_WAIT
            assert answered(engine, "resume", tp) < FASTDEPLOYS_WAIT
            for link in links:
                assert link.poll(30) and link.recv() == ("created", swap_clearing == "0"), "the host cache kept"
            for worker in workers:
                assert said(worker) == "reattached", "FastDeploy's worker attached to the new cache"
        assert said(engine) == "done"
        for worker in workers:
            assert said(worker) == "done"
            finish(worker)  # lets go: resets its slot
        for link in links:
            link.send("stop")
            assert link.poll(60) and link.recv() == ("cleared", ROUNDS + 1, True), "made once, then once per wakeup"


@pytest.mark.slow
@pytest.mark.usefixtures("fastdeploy_record_names", "cpu_for_children")
def test_a_task_outside_the_control_protocol_is_refused_and_an_unknown_method_answered_400(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """FastDeploy's engine puts a storage task (a ReadStorageTask: a class the allow-list refuses) and a
    ControlRequest of an unknown method: the first is refused, logged naming its class and read past; the second is
    answered 400 ``Unknown control method: bogus`` (cache_transfer_manager.py L1196-1199); serving goes on."""
    with fastdeploy_engine(1, "refused", rounds=0) as (suffix, port, engine), ExitStack() as stack:
        (link,) = our_managers(stack, suffix, 1, port)
        engine.stdin.write("go\n")  # type: ignore[union-attr]
        engine.stdin.flush()  # type: ignore[union-attr]
        assert said(engine) == f"error ctrl_c2e_rank0_{port}: 400 Unknown control method: bogus"
        word, method, _, codes = said(engine).split()
        assert (word, method, codes) == ("answered", "bogus", "400")
        answered(engine, "pause", 1)
        answered(engine, "resume", 1)
        assert said(engine) == "done"
        with FastDeploySignal.attach(CACHE_READY, suffix) as ready:
            ready.set(0, 0)  # no worker came: the slot our manager set is let go of here
        link.send("stop")
        assert link.poll(60) and link.recv() == ("cleared", 1, True)
    logged = capfd.readouterr().err
    assert "refused to unpickle fastdeploy.cache_manager.cache_tasks.ReadStorageTask" in logged, logged
    assert "read past" in logged


# -- the allow-list ---------------------------------------------------------------------------------------------


class _Shell:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return os.system, (f"touch {self.marker}",)


def test_a_pickle_that_would_run_a_command_is_refused_naming_it_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = pickle.dumps(("a task", _Shell(marker)))
    with pytest.raises(PickleRefusedError) as caught:
        restricted_loads(evil, "the test's queue")
    assert (caught.value.module, caught.value.name) == (os.system.__module__, "system")
    assert f"refused to unpickle {os.system.__module__}.system" in str(caught.value)
    assert not marker.exists(), "nothing of the pickle ran"


def fastdeploys_pickle(expression: str) -> bytes:
    """``expression`` pickled by a process that has FastDeploy's classes (the stand-ins' package)."""
    code = (
        f"import pickle, sys; sys.path.insert(0, {str(SHAPED)!r})\n"
        "from fastdeploy.engine.request import ControlRequest\n"
        "from fastdeploy.cache_manager.cache_data import CacheStatus\n"
        f"sys.stdout.buffer.write(pickle.dumps({expression}))"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout


def test_fastdeploys_control_task_is_read_as_our_classes() -> None:
    kind, request = restricted_loads(
        fastdeploys_pickle("(CacheStatus.CTRL, ControlRequest('c-1', 'sleep', {'tags': 'kv_cache'}))"), "test"
    )
    assert kind is CacheStatus.CTRL and isinstance(request, ControlRequest)
    assert (request.request_id, request.method, request.args) == ("c-1", "sleep", {"tags": "kv_cache"})


def test_a_control_request_of_another_shape_is_refused_naming_its_fields() -> None:
    with pytest.raises(PickleRefusedError) as caught:
        restricted_loads(fastdeploys_pickle("ControlRequest(7, 'sleep')"), "test")
    assert caught.value.name == "ControlRequest" and "request_id=7" in str(caught.value)


def test_a_hostile_server_at_the_engine_cache_queues_address_gets_nothing_run(tmp_path: Path) -> None:
    """Whatever listens at the queue's address and knows its authkey can answer anything: its pickle is refused
    when our manager client connects, naming the class, and none of it runs."""
    marker, port = tmp_path / "ran", 20000 + secrets.randbelow(40000)
    place = ControlPlace(port, 1, 0)
    listener = Listener(place.manager_address, authkey=AUTHKEY)

    def answer() -> None:
        with listener.accept() as conn:
            conn.recv()
            conn.send_bytes(pickle.dumps(("#RETURN", _Shell(marker))))

    server = threading.Thread(target=answer)
    server.start()
    try:
        with pytest.raises(PickleRefusedError) as caught:
            CacheTaskQueue(place)
        assert caught.value.name == "system" and not marker.exists()
    finally:
        server.join(10)
        listener.close()
    assert not os.path.exists(str(place.manager_address))


def test_the_control_path_without_pyzmq_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zmq", None)
    with pytest.raises(ExtraNotInstalledError) as caught:
        ReplyQueue(ControlPlace(9923, 1, 0))
    assert "pyzmq" in str(caught.value) and "fd-platforms[fastdeploy]" in str(caught.value)


def test_importing_fd_platforms_and_its_fastdeploy_wing_imports_no_zmq() -> None:
    code = "import sys, fd_platforms, fd_platforms.fastdeploy.control; print('zmq' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


# -- our runner's side ------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("fastdeploy_record_names")
@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_our_runners_sleep_lets_go_and_its_wakeup_attaches_to_the_cache_made_again(cpu: Platform) -> None:
    """SleepingKVCache is FastDeploy's model runner's sleep/wakeup for the kv_cache tag (gpu_model_runner.py
    L3118-3177): a sleep lets go (our cache manager's clear then frees, which it refuses while the runner holds
    it), a wakeup attaches to the cache made again; the weight tag alone and a repeated call change nothing."""
    suffix, made = FASTDEPLOY.create_signals(1, device_type="cpu", block_count_suffix=None)
    with made:
        manager_request = kv_request(
            qwen_layout(0, 1), BLOCKS, num_cpu_blocks=4, instance=suffix, protocol="fastdeploy", rule="2026-01"
        )
        managed = manage_kv_cache(cpu, manager_request)
        request = kv_request(
            qwen_layout(0, 1), BLOCKS, instance=suffix, protocol=FASTDEPLOY, timeout=5, **FASTDEPLOY_ATTACH
        )
        runner = SleepingKVCache(cpu, request, initialize_kv_cache(cpu, request))
        first = runner.cache
        runner.sleep("weight")
        assert runner.cache is first, "the weight tag is the runner's own"
        with pytest.raises(CacheInUseError):
            managed.clear(0.3)
        runner.sleep("weight,kv_cache")
        runner.sleep("kv_cache")
        assert runner.sleeping
        managed.clear(5)
        again = manage_kv_cache(cpu, dataclasses.replace(manager_request, host_cache=managed.host_cache))
        runner.wakeup("kv_cache")
        attached = runner.cache
        assert attached is not None and not attached.created and attached is not first
        runner.wakeup("weight,kv_cache")
        assert runner.cache is attached, "awake: nothing attached twice"
        with pytest.raises(ConfigError) as caught:
            runner.sleep("kv_cache,everything")
        assert caught.value.field == "tags"
        runner.sleep("kv_cache")
        again.clear(5, clear_host=True)
