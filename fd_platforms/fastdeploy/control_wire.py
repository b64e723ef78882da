"""FastDeploy's control transports, as one rank's transfer manager speaks them: its engine cache queue (read) and
its FMQ reply queue (written).

- The engine cache queue is FastDeploy's ``EngineCacheQueue``
  (``fastdeploy/inter_communicator/engine_cache_queue.py``): a stdlib ``multiprocessing.managers`` server the engine
  starts (``common_engine.py`` L500-507, authkey ``b"cache_queue_service"``, one client per tensor-parallel rank), at
  ``/dev/shm/fd_task_queue_{cache_queue_port}.sock`` with ``FD_ENGINE_TASK_QUEUE_WITH_SHM`` (default 1, ``envs.py``
  L180) else ``(pod_ip, cache_queue_port)`` (``cache_transfer_manager.py`` L211-221). :class:`CacheTaskQueue` is
  the stdlib's manager client, registered under FastDeploy's names (L194-211), whose connections unpickle through
  :func:`.control_pickles.restricted_loads`: the stdlib's client for a serializer of ours, registered beside
  ``pickle`` in the manager module's table of serializers.
- The reply queue is FastDeploy's FMQ ``Queue`` (``fmq.py`` L197-248): a ZeroMQ PUSH socket connected to the
  engine's PULL at ``ipc:///dev/shm/fmq_{name}.ipc`` (``EndpointManager.get_endpoint`` L110-118; ``FMQ_CONFIG_JSON``
  never takes effect at c1b7c083: ``load_config`` L98-108 calls ``vars`` on a dict and logs the error), one pickled
  ``Message`` a frame. :class:`ReplyQueue` is pyzmq's socket, imported when one is opened.

Every wait is bounded: a manager call's answer (:data:`MANAGER_ANSWER_SECONDS`),
the queue's lock and the barrier (the caller's bound), a reply's send (the caller's bound); a peer that is gone is a
:class:`~fd_platforms.contract.errors.ControlWireError`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from multiprocessing import AuthenticationError, connection, managers
from threading import BrokenBarrierError
from typing import Any

from ..contract.errors import ConfigError, ControlWireError, ExtraNotInstalledError, PickleRefusedError
from .control_pickles import ControlResponse, Message, fastdeploy_dumps, restricted_loads

AUTHKEY = b"cache_queue_service"  # engine_cache_queue.py L43, common_engine.py L502
SERIALIZER = "fd-platforms-restricted"
MANAGER_ANSWER_SECONDS = 120.0  #: a manager call's answer; above the longest call, a barrier wait (at most 60 s)
CONNECT_TRIES, CONNECT_INTERVAL = 5, 3.0  # EngineCacheQueue._connect_with_retry (L255-272)
REPLY_LINGER_MS = 5000  # FastDeploy's FMQ lingers forever (SocketOptions.linger -1, fmq.py L53); ours is bounded


@dataclass(frozen=True)
class ControlPlace:
    """Where FastDeploy's control path reaches the transfer manager of one rank: its engine cache queue (port,
    address kind) and its reply queue (named after the rank across data-parallel groups, L313-320)."""

    cache_queue_port: int
    tp: int
    rank: int
    dp_rank: int = 0
    pod_ip: str = "0.0.0.0"  # cache_transfer_manager.py parse_args --pod_ip (L93)
    shm_socket: bool = True  # FD_ENGINE_TASK_QUEUE_WITH_SHM (envs.py L180: default 1)

    def __post_init__(self) -> None:
        fix = "pass the transfer manager's --cache_queue_port, --mp_num, --rank and --local_data_parallel_id"
        for field, value, low, high in (
            ("cache_queue_port", self.cache_queue_port, 0, 65535),
            ("tp", self.tp, 1, 64),
            ("rank", self.rank, 0, self.tp - 1 if isinstance(self.tp, int) else 0),
            ("dp_rank", self.dp_rank, 0, 1024),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ConfigError(field, value, f"an integer from {low} to {high}", fix)

    @property
    def manager_address(self) -> str | tuple[str, int]:
        if self.shm_socket:
            return f"/dev/shm/fd_task_queue_{self.cache_queue_port}.sock"
        return (self.pod_ip, self.cache_queue_port)

    @property
    def reply_queue(self) -> str:
        """``ctrl_c2e_rank{r}_{cache_queue_port}``: the queue the engine reads this rank's answers from (L160-169)."""
        return f"ctrl_c2e_rank{self.rank + self.tp * self.dp_rank}_{self.cache_queue_port}"

    @property
    def reply_endpoint(self) -> str:
        return f"ipc:///dev/shm/fmq_{self.reply_queue}.ipc"


class _Connection:
    """A stdlib ``Connection`` whose answers are unpickled through the allow-list, each waited for at most
    :data:`MANAGER_ANSWER_SECONDS`."""

    def __init__(self, raw: connection.Connection, where: str) -> None:
        self.raw, self.where = raw, where

    def send(self, obj: object) -> None:
        self.raw.send(obj)

    def recv(self) -> Any:
        if not self.raw.poll(MANAGER_ANSWER_SECONDS):
            raise ControlWireError(f"{self.where} sent no answer within {MANAGER_ANSWER_SECONDS:.0f} s")
        return restricted_loads(self.raw.recv_bytes(), self.where)

    def close(self) -> None:
        self.raw.close()


def _client(address: Any, family: str | None = None, authkey: bytes | None = None) -> _Connection:
    raw = connection.Client(address, family, authkey=authkey)
    return _Connection(raw, f"FastDeploy's engine cache queue at {address}")


def _register_serializer() -> None:
    """Our client beside the stdlib's ``pickle`` one: a manager and its proxies made with ``serializer=SERIALIZER``
    connect through :func:`_client`. Adds one entry of ours; the stdlib's entries are untouched."""
    vars(managers)["listener_client"].setdefault(SERIALIZER, (connection.Listener, _client))


class _QueueManager(managers.BaseManager):
    """The client's side of FastDeploy's ``QueueManager`` (engine_cache_queue.py L73-78), the names it reads."""


_QueueManager.register("get_transfer_task_queue", proxytype=managers.ListProxy)
_QueueManager.register("get_cache_sync_value", proxytype=managers.ValueProxy)
_QueueManager.register("get_transfer_task_lock", proxytype=vars(managers)["AcquirerProxy"])  # not in typeshed
_QueueManager.register("get_barrier", proxytype=vars(managers)["BarrierProxy"])


class CacheTaskQueue:
    """One rank's reader of FastDeploy's engine cache queue: :meth:`take` is ``get_transfer_task``
    (engine_cache_queue.py L294-316), :meth:`meet` the ranks' barrier before a control answer
    (cache_transfer_manager.py L1201)."""

    def __init__(self, place: ControlPlace) -> None:
        _register_serializer()
        self.place, self.where = place, f"FastDeploy's engine cache queue at {place.manager_address}"
        manager = _QueueManager(address=place.manager_address, authkey=AUTHKEY, serializer=SERIALIZER)
        for attempt in range(CONNECT_TRIES):
            try:
                manager.connect()
                break
            except (ConnectionRefusedError, FileNotFoundError) as error:
                if attempt == CONNECT_TRIES - 1:
                    raise ControlWireError(
                        f"{self.where} refused {CONNECT_TRIES} connections {CONNECT_INTERVAL:.0f} s apart ({error}): "
                        "start this cache manager after FastDeploy's engine, with its --cache_queue_port"
                    ) from None
                time.sleep(CONNECT_INTERVAL)
            except AuthenticationError as error:
                raise ControlWireError(
                    f"{self.where} refused our authkey ({error}): it is not FastDeploy's engine cache queue"
                ) from None
        index = 0  # the transfer manager reads data-parallel group 0's lists (cache_transfer_manager.py L220)
        self.tasks: Any = manager.get_transfer_task_queue(index)  # type: ignore[attr-defined]
        self.read: Any = manager.get_cache_sync_value(index)  # type: ignore[attr-defined]
        self.lock: Any = manager.get_transfer_task_lock(index)  # type: ignore[attr-defined]
        self.barrier: Any = manager.get_barrier(index)  # type: ignore[attr-defined]
        self.position, self.everyone = 1 << place.rank, (1 << place.tp) - 1  # L239-243

    def take(self, within: float) -> tuple[object, ...] | PickleRefusedError | None:
        """The task at the queue's head, once per rank (the last rank to read it removes it); None when there is
        none this rank has not read; a refused one is marked read and returned as its error."""
        try:
            if len(self.tasks) == 0:
                return None
            if not self.lock.acquire(True, within):
                raise ControlWireError(f"{self.where}: its transfer_task_lock was held for {within:.0f} s")
            try:
                seen = self.read.get()
                if seen & self.position or len(self.tasks) == 0:
                    return None
                task: tuple[object, ...] | PickleRefusedError
                try:
                    task = self.tasks[0]
                except PickleRefusedError as refused:
                    task = refused
                now = seen | self.position
                if now >= self.everyone:
                    del self.tasks[0]  # not pop(0), which would send the task again
                    now = 0
                self.read.set(now)
            finally:
                self.lock.release()
        except (EOFError, ConnectionError) as error:
            raise ControlWireError(
                f"{self.where} closed the connection ({error!r}): FastDeploy's engine is gone"
            ) from None
        return task

    def meet(self, within: float) -> str | None:
        """Wait for every rank at FastDeploy's ``barrier`` (a ``threading.Barrier`` of ``tp`` parties in the
        engine's manager); why not, where the wait broke (after which rank 0 resets it for the next answer)."""
        try:
            self.barrier.wait(within)
            return None
        except BrokenBarrierError:
            if self.place.rank == 0:
                self.barrier.reset()
            return f"the {self.place.tp} ranks' cache managers did not all reach FastDeploy's barrier in {within:.0f} s"
        except (EOFError, ConnectionError) as error:
            raise ControlWireError(
                f"{self.where} closed the connection ({error!r}): FastDeploy's engine is gone"
            ) from None


def _gone(where: str, error: BaseException) -> ControlWireError:
    return ControlWireError(f"{where} closed the connection ({error!r}): FastDeploy's engine is gone")


class ReplyQueue:
    """The producer's end of this rank's FMQ reply queue (fmq.py ``Queue``, role producer: PUSH, connect)."""

    def __init__(self, place: ControlPlace) -> None:
        try:
            import zmq
        except ImportError:
            raise ExtraNotInstalledError("pyzmq", "fastdeploy", "FastDeploy's control path (its FMQ queues)") from None
        self.zmq, self.name, self.endpoint = zmq, place.reply_queue, place.reply_endpoint
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.IMMEDIATE, 1)  # SocketOptions (fmq.py L49-68): sndhwm 0, immediate 1
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.LINGER, REPLY_LINGER_MS)
        self.socket.connect(self.endpoint)
        self.sent = 0  # Queue._msg_id (fmq.py L206, L243-248)

    def put(self, response: ControlResponse, within: float) -> None:
        """Send ``response`` in a ``Message`` as FastDeploy's producer does; a ControlWireError if the engine's end
        takes it not within ``within`` seconds (no engine bound there)."""
        self.socket.setsockopt(self.zmq.SNDTIMEO, max(1, int(within * 1000)))
        try:
            self.socket.send(fastdeploy_dumps(Message(response, self.sent)))
        except self.zmq.Again:
            raise ControlWireError(
                f"FastDeploy's engine took no reply on {self.name} ({self.endpoint}) within {within:.0f} s: "
                "its engine is gone or was started without this rank's cache control queue"
            ) from None
        self.sent += 1

    def close(self) -> None:
        self.socket.close()
        self.context.term()
