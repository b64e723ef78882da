"""Stand-ins for FastDeploy's processes on its control path (``/v1/sleep``, ``/v1/wakeup``; FastDeploy c1b7c083).

Run as a script; it imports nothing of fd-platforms (it says so on exit). FastDeploy's classes are the ones of
``fastdeploy_shaped/`` (its module paths, so the pickles name them as FastDeploy's do); its transports are the
stdlib's ``multiprocessing.managers`` and pyzmq, as FastDeploy's are:

- ``engine SUFFIX CACHE_QUEUE_PORT TP ROUNDS [MODE]``: FastDeploy's engine. Starts its engine cache queue
  (``EngineCacheQueue`` server, ``engine_cache_queue.py`` L80-187: authkey ``b"cache_queue_service"``, ``tp``
  clients, at ``/dev/shm/fd_task_queue_{port}.sock`` with ``FD_ENGINE_TASK_QUEUE_WITH_SHM`` (default 1) else at
  ``127.0.0.1`` on an anonymous port, ``common_engine.py`` L462-509), its engine worker queue for the workers'
  control requests (``engine_worker_queue.py`` L539-581: its task list, read flags and lock; always on a unix
  socket here), and binds its control reply queues (FMQ consumers: PULL at ``/dev/shm/fmq_{name}.ipc``,
  ``common_engine.py`` L153-169). Prints ``queues PORT`` and waits for a ``go`` line on stdin; then ``ROUNDS``
  times: pause, sleep, wakeup, resume, printing ``answered METHOD SECONDS CODES`` for each (CODES: every rank's
  error code, transfer managers' then workers'). ``FD_ENABLE_V1_UPDATE_WEIGHTS=1`` sends sleep and wakeup as its
  rerouted ``/clear_load_weight`` and ``/update_model_weight`` do (no args: the tags default to ``weight,kv_cache``,
  ``api_server.py`` L666-699, ``common_engine.py`` L1668-1687); else as ``/v1/sleep`` and ``/v1/wakeup`` with
  ``{"tags": "kv_cache"}`` (L421-456). MODE ``refused`` instead puts a storage task (``ReadStorageTask``, a class
  outside the control protocol) and a ControlRequest of an unknown method, then a pause and a resume.
  Prints ``done``, and shuts its queues down when stdin closes.
- ``worker SUFFIX RANK TP TENSORS ROUNDS``: FastDeploy's worker of one rank. Attaches to its rank's cache as
  ``fastdeploy_standins.py attacher`` does (its slot, then each ``set_data_ipc`` record's memory; byte 1 written);
  then follows its engine worker queue: on ``sleep`` with the ``kv_cache`` tag lets go (unmaps, resets its slot:
  ``gpu_model_runner.py`` ``sleep`` L3137-3145 calls ``clear_cache``), on ``wakeup`` waits for its slot and attaches
  again (L3168-3177 ``initialize_kv_cache``), answering each on ``ctrl_w2e_rank{r}_{SUFFIX}`` (``worker_process.py``
  L186-190, L730-754). Prints ``attached``, ``reattached`` after each wakeup, ``done`` after ``ROUNDS``; lets go when
  stdin closes.

The engine's sleep at c1b7c083 pauses implicitly (``_control_pause(None)``, L1709) and its wakeup resumes
(``_control_resume(None)``, L1758); with a transfer manager those calls read ``None.request_id`` (L1495, L1592)
unless the engine is already paused (L1471-1473), so a client pauses first (``/v1/pause``). The stand-in sends what
FastDeploy's engine means to: ``{id}_pause_transfer`` before the sleep and ``{id}_resume_transfer`` after the
wakeup (L1494-1503, L1591-1598), each waited for 60 s; the sleep 60 s and the wakeup 300 s (L1729, L1755).
Every other wait gives up after ``FD_STANDIN_TIMEOUT`` seconds (default 30) with exit status 3.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from multiprocessing.managers import AcquirerProxy, BaseManager, ListProxy, Value, ValueProxy
from pathlib import Path

import zmq
from fastdeploy_standins import attach, open_all, stdin_closed, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent / "fastdeploy_shaped"))

from fastdeploy.cache_manager.cache_data import CacheStatus
from fastdeploy.cache_manager.cache_tasks import ReadStorageTask
from fastdeploy.engine.request import ControlRequest, ControlResponse
from fastdeploy.inter_communicator.fmq import Message

TIMEOUT = float(os.environ.get("FD_STANDIN_TIMEOUT", "30"))
WITH_SHM = int(os.environ.get("FD_ENGINE_TASK_QUEUE_WITH_SHM", "1"))  # envs.py L180
V1_UPDATE_WEIGHTS = bool(int(os.environ.get("FD_ENABLE_V1_UPDATE_WEIGHTS", "0")))  # envs.py L259
CACHE_AUTHKEY, WORKER_AUTHKEY = b"cache_queue_service", b"secret_key"  # common_engine.py L502; engine_worker_queue L45
POLL = 0.001  # put_transfer_task / put_tasks wait 1 ms between looks (engine_cache_queue.py L287, L550)


def endpoint(name: str) -> str:
    return f"ipc:///dev/shm/fmq_{name}.ipc"  # EndpointManager.get_endpoint (fmq.py L110-118)


def cache_queue_server(port: int, tp: int) -> tuple[BaseManager, int]:
    """FastDeploy's EngineCacheQueue(is_server=True) for one data-parallel group: the names its transfer managers
    read (engine_cache_queue.py L82-179)."""
    tasks: list = []
    read = Value("i", 0)
    lock = threading.Lock()
    barrier = threading.Barrier(tp)

    class QueueManager(BaseManager):
        pass

    QueueManager.register("get_transfer_task_queue", callable=lambda idx: tasks, proxytype=ListProxy)
    QueueManager.register("get_cache_sync_value", callable=lambda idx: read, proxytype=ValueProxy)
    QueueManager.register("get_transfer_task_lock", callable=lambda idx: lock, proxytype=AcquirerProxy)
    QueueManager.register("get_barrier", callable=lambda idx: barrier)
    address = f"/dev/shm/fd_task_queue_{port}.sock" if WITH_SHM else ("127.0.0.1", 0)
    manager = QueueManager(address=address, authkey=CACHE_AUTHKEY)
    manager.start()
    return manager, port if WITH_SHM else manager.address[1]


class CacheQueueClient:
    """The engine's own EngineCacheQueue handle (its proxies), and put_transfer_task (L274-292)."""

    def __init__(self, manager: BaseManager, tp: int) -> None:
        self.tasks = manager.get_transfer_task_queue(0)  # type: ignore[attr-defined]
        self.read = manager.get_cache_sync_value(0)  # type: ignore[attr-defined]
        self.lock = manager.get_transfer_task_lock(0)  # type: ignore[attr-defined]
        self.everyone = (1 << tp) - 1

    def put_transfer_task(self, item: object) -> None:
        self.lock.acquire()
        if 0 < self.read.get() < self.everyone:
            self.lock.release()
            wait_until(lambda: not 0 < self.read.get() < self.everyone, "every rank to read the last task", POLL)
            self.lock.acquire()
        self.read.set(0)
        self.tasks.append(item)
        self.lock.release()


def worker_queue_server(suffix: str, tp: int) -> BaseManager:
    """FastDeploy's EngineWorkerQueue(is_server=True), the part that carries tasks (engine_worker_queue.py L82-203)."""
    tasks: list = []
    flags = [1] * tp
    lock = threading.Lock()

    class QueueManager(BaseManager):
        pass

    QueueManager.register("get_tasks", callable=lambda idx: tasks, proxytype=ListProxy)
    QueueManager.register("get_client_read_flag", callable=lambda idx: flags, proxytype=ListProxy)
    QueueManager.register("get_lock", callable=lambda idx: lock, proxytype=AcquirerProxy)
    manager = QueueManager(address=f"/dev/shm/fd_task_queue_{suffix}.sock", authkey=WORKER_AUTHKEY)
    manager.start()
    return manager


class WorkerQueueClient:
    """EngineWorkerQueue's put_tasks (L539-560) and get_tasks (L564-581)."""

    def __init__(self, suffix: str, tp: int, rank: int = -1) -> None:
        class QueueManager(BaseManager):
            pass

        for name in ("get_tasks", "get_client_read_flag"):
            QueueManager.register(name, proxytype=ListProxy)
        QueueManager.register("get_lock", proxytype=AcquirerProxy)
        manager = QueueManager(address=f"/dev/shm/fd_task_queue_{suffix}.sock", authkey=WORKER_AUTHKEY)
        manager.connect()
        self.tasks, self.flags = manager.get_tasks(0), manager.get_client_read_flag(0)  # type: ignore[attr-defined]
        self.lock, self.tp, self.rank = manager.get_lock(0), tp, rank  # type: ignore[attr-defined]

    def put_tasks(self, tasks: object) -> None:
        self.lock.acquire()
        while sum(self.flags) < self.tp:
            self.lock.release()
            time.sleep(POLL)
            self.lock.acquire()
        self.tasks[:] = []
        self.flags[:] = [0] * self.tp
        self.tasks.append(tasks)
        self.lock.release()

    def get_tasks(self) -> list:
        self.lock.acquire()
        tasks = list(self.tasks) if self.flags[self.rank] == 0 else []
        self.flags[self.rank] = 1
        if sum(self.flags) == self.tp:
            self.tasks[:] = []
        self.lock.release()
        return tasks


class ControlReplies:
    """The engine's control reply queues (FMQ consumers) and _wait_for_control_responses (L1777-1879)."""

    def __init__(self, context: zmq.Context, names: list[str]) -> None:
        self.sockets = {}
        for name in names:
            socket = context.socket(zmq.PULL)
            socket.setsockopt(zmq.LINGER, 0)
            socket.bind(endpoint(name))
            self.sockets[name] = socket
        self.mailboxes: dict[str, dict[str, ControlResponse]] = {name: {} for name in names}

    def wait(self, request_id: str, timeout: float, names: list[str]) -> list[int]:
        """Every named queue's answer to ``request_id`` (others stashed), within ``timeout``; their error codes."""
        deadline, codes = time.monotonic() + timeout, []
        for name in names:
            while request_id not in self.mailboxes[name]:
                left = deadline - time.monotonic()
                if left <= 0 or not self.sockets[name].poll(int(left * 1000)):
                    print(f"control request {request_id} timed out after {timeout}s on {name}", flush=True)
                    os._exit(3)
                response = Message.deserialize(self.sockets[name].recv()).payload
                self.mailboxes[name][response.request_id] = response
            response = self.mailboxes[name].pop(request_id)
            codes.append(response.error_code)
            if response.error_code != 200:
                print(f"error {name}: {response.error_code} {response.error_message}", flush=True)
        return codes

    def close(self) -> None:
        """Closed, and their socket files removed: libzmq leaves an ipc endpoint's file behind (FastDeploy's
        engine leaves them in /dev/shm), so the test can check that nothing else is left."""
        for name, socket in self.sockets.items():
            socket.close()
            os.unlink(endpoint(name).removeprefix("ipc://"))


def engine(suffix: str, port: int, tp: int, rounds: int, mode: str) -> None:
    cache_manager, port = cache_queue_server(port, tp)
    worker_manager = worker_queue_server(suffix, tp)
    cache_queue, workers = CacheQueueClient(cache_manager, tp), WorkerQueueClient(suffix, tp)
    context = zmq.Context()
    cache_names = [f"ctrl_c2e_rank{rank}_{port}" for rank in range(tp)]
    worker_names = [f"ctrl_w2e_rank{rank}_{suffix}" for rank in range(tp)]
    replies = ControlReplies(context, cache_names + worker_names)
    print(f"queues {port}", flush=True)
    assert sys.stdin.readline().strip() == "go"

    def send(method: str, timeout: float, *, to_workers: bool, args: dict | None = None, rid: str = "") -> None:
        request = ControlRequest(rid or f"control-{uuid.uuid4()}", method, args)
        start = time.monotonic()
        cache_queue.put_transfer_task((CacheStatus.CTRL, request))  # _dispatch_control_request (L1762-1775)
        if to_workers:
            workers.put_tasks(([request], 1))
        codes = replies.wait(request.request_id, timeout, cache_names + (worker_names if to_workers else []))
        print(f"answered {method} {time.monotonic() - start:.3f} {','.join(map(str, codes))}", flush=True)

    if mode == "refused":
        task = ReadStorageTask(task_id="t0", keys=["k"], token_ids=[1], gpu_block_ids=[0], start_read_block_idx=0)
        cache_queue.put_transfer_task((CacheStatus.STORAGE2GPU, task))
        send("bogus", 60, to_workers=False)
        send("pause", 60, to_workers=False)
        send("resume", 60, to_workers=False)
    for _ in range(rounds):
        pause_id = f"control-{uuid.uuid4()}"
        send("pause", 60, to_workers=False, rid=f"{pause_id}_pause_transfer")  # /v1/pause (L1494-1503)
        args = None if V1_UPDATE_WEIGHTS else {"tags": "kv_cache"}
        send("sleep", 60, to_workers=True, args=_tags(args))
        send("wakeup", 300, to_workers=True, args=_tags(args))
        send("resume", 60, to_workers=False, rid=f"{pause_id}_resume_transfer")  # L1591-1598
    print("done", flush=True)
    while not stdin_closed(0.1):
        pass
    replies.close()
    context.term()
    cache_manager.shutdown()
    worker_manager.shutdown()


def _tags(args: dict | None) -> dict:
    """_parse_tags (L1668-1687): no tags is every tag."""
    args = dict(args or {})
    args.setdefault("tags", "weight,kv_cache")
    return args


def worker(suffix: str, rank: int, tp: int, specs: list[list], rounds: int) -> None:
    _ready_block, ready = attach("cache_ready_signal", suffix, tp)
    wait_until(lambda: ready[rank] == 1, f"rank {rank}'s cache to be created")
    views = open_all(specs, -1)
    print("attached", flush=True)
    queue = WorkerQueueClient(suffix, tp, rank)
    context = zmq.Context()
    out = context.socket(zmq.PUSH)  # FMQ().queue(name, "producer") (fmq.py L208-216)
    out.setsockopt(zmq.IMMEDIATE, 1)
    out.connect(endpoint(f"ctrl_w2e_rank{rank}_{suffix}"))
    sent, woken = 0, 0
    while woken < rounds:
        for payload, _ in queue.get_tasks():
            request = payload[0]
            tags = request.args.get("tags", "").split(",")
            if request.method == "sleep" and "kv_cache" in tags and views:
                for view in views:
                    view.close()
                views = []
                ready[rank] = 0  # clear_cache: the runner lets go
            elif request.method == "wakeup" and "kv_cache" in tags and not views:
                wait_until(lambda: ready[rank] == 1, f"rank {rank}'s cache to be created again")
                views = open_all(specs, -1)
                woken += 1
                print("reattached", flush=True)
            out.send(Message(ControlResponse(request.request_id, 200, "Success"), msg_id=sent).serialize())
            sent += 1
        time.sleep(0.005)
    print("done", flush=True)
    while not stdin_closed(0.1):
        pass
    for view in views:
        view.close()
    ready[rank] = 0
    out.close(linger=5000)
    context.term()


def main(argv: list[str]) -> None:
    import json

    role, suffix, *rest = argv
    if role == "engine":
        engine(suffix, int(rest[0]), int(rest[1]), int(rest[2]), rest[3] if len(rest) > 3 else "")
    elif role == "worker":
        worker(suffix, int(rest[0]), int(rest[1]), json.loads(rest[2]), int(rest[3]))
    else:
        raise SystemExit(f"unknown role {role!r}")
    ours = sorted(name for name in sys.modules if name.split(".")[0] == "fd_platforms")
    print(f"imported of ours: {ours}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
