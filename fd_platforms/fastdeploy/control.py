"""FastDeploy's control path (``/v1/sleep``, ``/v1/wakeup``; PR #6761/#6974) answered by our cache manager:
:func:`serve_control_requests`.

FastDeploy's engine sends ``ControlRequest``s to its transfer managers where it has one (``num_cpu_blocks > 0`` or a
storage backend: ``common_engine.py`` L1492, L1589, L1721, L1749): ``pause`` then ``sleep`` (``_control_sleep``
L1689-1729), ``wakeup`` then ``resume`` (``_control_wakeup`` L1731-1760), each as ``(CacheStatus.CTRL, request)``
on its engine cache queue, and waits for every rank's ``ControlResponse`` on ``ctrl_c2e_rank{r}_{cache_queue_port}``
(60 s for pause, resume and sleep; 300 s for wakeup: L1501, L1597, L1729, L1755). Each rank's manager answers as
``CacheTransferManager.control_task`` does (``cache_transfer_manager.py`` L1172-1204): the handler, then FastDeploy's
``barrier`` across the ranks, then the reply (200 ``Success``; 400 ``Unknown control method: <m>``; 500 ``Failed to
execute <m>: <why>``). The handlers (L1124-1170):

- ``sleep``: let go of the device cache
  (:meth:`ManagedCache.clear() <fd_platforms.engine.initialize.ManagedCache.clear>`, which waits for the rank's runner
  to let go, as ``_clear_gpu_cache`` waits for its slot, L542-569) and of the host swap cache where
  ``FD_ENABLE_SWAP_SPACE_CLEARING`` was set (L1154; ``ManagedCache.swap_space_clearing``); a second sleep is a no-op.
- ``wakeup``: create again (``recreate(rank)``, as :func:`~.cache_server.serve_kv_cache_status` takes it, passing
  the kept host cache); a wakeup while awake is a no-op.
- ``pause``, ``resume``: our manager runs no block transfers, so there is nothing in flight to drain; the state is
  kept (a second pause or resume is a no-op) and answered 200.
- ``update_weights``: answered 200, as FastDeploy's is without a storage backend (L1142-1148): our cache manager has
  no storage key prefix to update.

``FD_ENABLE_V1_UPDATE_WEIGHTS`` changes nothing here: it reroutes FastDeploy's ``/clear_load_weight`` and
``/update_model_weight`` to this path and stops its workers following ``model_weights_status`` (``worker_process.py``
L472, L495); the transfer manager's requests are the same. A task other than CTRL (a swap or storage task: our
manager moves no blocks) or one refused by the allow-list (:mod:`.control_pickles`) is logged at ERROR and read
past, so the engine's next task is not held up; serving goes on.

The trust boundary is :mod:`.control_pickles`': only FastDeploy's ``ControlRequest`` and ``CacheStatus`` (and a
manager's exceptions) are unpickled from the engine cache queue. pyzmq (the extra ``fastdeploy``) is imported when
serving starts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..contract.errors import ConfigError, FdPlatformsError, PickleRefusedError
from ..engine.initialize import ManagedCache
from .cache_status import check_callable
from .control_pickles import CacheStatus, ControlRequest, ControlResponse
from .control_wire import CacheTaskQueue, ControlPlace, ReplyQueue

logger = logging.getLogger(__name__)
FASTDEPLOYS_WAIT = 60.0  # the engine's shortest wait for an answer (common_engine.py L1501, L1597, L1729)
POLL_SECONDS = 0.01  # how long the loop sleeps when the queue holds nothing for this rank


def serve_control_requests(
    managed: ManagedCache,
    recreate: Callable[[int], ManagedCache],
    place: ControlPlace,
    *,
    until: Callable[[], bool],
    timeout: float = 25.0,
) -> ManagedCache | None:
    """Answer FastDeploy's ``ControlRequest``s for one rank (``managed``, from
    :func:`~fd_platforms.engine.manage_kv_cache` with ``protocol="fastdeploy"``) until ``until()`` is
    true; the cache then held (None while asleep).

    ``timeout`` bounds each of the two waits before a reply, for the runner to let go and for every rank at the
    barrier, so that the reply comes within FastDeploy's 60 s: at most 29 s each. A wait that runs out is answered
    500, naming it; a gone engine (its queue's connection closed, its reply end not there) ends the serving with a
    :class:`~fd_platforms.contract.errors.ControlWireError`."""
    if not isinstance(managed, ManagedCache):
        raise ConfigError("managed", managed, "a ManagedCache", "pass what manage_kv_cache returned for this rank")
    check_callable("recreate", recreate, "pass a function of the rank that calls manage_kv_cache again")
    check_callable("until", until, "pass a function that says when to stop (e.g. threading.Event().is_set)")
    limit = FASTDEPLOYS_WAIT / 2 - 1
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= limit:
        raise ConfigError("timeout", timeout, f"seconds above 0 and at most {limit:.0f}", "pass a shorter timeout")
    if managed.rank != place.rank:
        raise ConfigError(
            "place.rank", place.rank, f"the managed cache's rank, {managed.rank}", "pass this rank's place"
        )
    server = _Handlers(managed, recreate, float(timeout))
    replies = ReplyQueue(place)
    try:
        tasks = CacheTaskQueue(place)
        while not until():
            task = tasks.take(timeout)
            if task is None:
                time.sleep(POLL_SECONDS)
                continue
            request = _control_request(task, place)
            if request is None:
                continue
            response = server.answer(request)
            missed = tasks.meet(timeout)
            if missed is not None and response.error_code == 200:
                response = ControlResponse(request.request_id, 500, f"Failed to execute {request.method}: {missed}")
            replies.put(response, timeout)
            logger.info("rank %d answered %r on %s: %r", place.rank, request, place.reply_queue, response)
    finally:
        replies.close()
    return server.held


def _control_request(task: object, place: ControlPlace) -> ControlRequest | None:
    """The ControlRequest a task carries; None (logged at ERROR) for a refused task or one of another kind."""
    if isinstance(task, PickleRefusedError):
        logger.error("rank %d: a task on FastDeploy's engine cache queue was refused, read past: %s", place.rank, task)
        return None
    if (
        isinstance(task, tuple)
        and len(task) == 2
        and task[0] is CacheStatus.CTRL
        and isinstance(task[1], ControlRequest)
    ):
        return task[1]
    kind = task[0] if isinstance(task, tuple) and task else task
    logger.error(
        "rank %d: a %s task on FastDeploy's engine cache queue was read past: our cache manager moves no blocks "
        "and answers only (CacheStatus.CTRL, ControlRequest); run FastDeploy's cache transfer manager for swap "
        "or storage tasks",
        place.rank,
        kind.name if isinstance(kind, CacheStatus) else type(kind).__name__,
    )
    return None


class _Handlers:
    """``control_task``'s handlers for one rank's cache (cache_transfer_manager.py L1124-1199)."""

    def __init__(self, managed: ManagedCache, recreate: Callable[[int], ManagedCache], timeout: float) -> None:
        self.held: ManagedCache | None = managed
        self.recreate, self.timeout, self.rank = recreate, timeout, managed.rank
        self.paused = False

    def answer(self, request: ControlRequest) -> ControlResponse:
        handler = {
            "pause": self.pause,
            "resume": self.resume,
            "update_weights": self.update_weights,
            "sleep": self.sleep,
            "wakeup": self.wakeup,
        }.get(request.method)
        if handler is None:
            logger.warning("rank %d: unknown control method %r", self.rank, request.method)
            return ControlResponse(request.request_id, 400, f"Unknown control method: {request.method}")
        try:
            handler()
        except Exception as error:  # answered 500, as FastDeploy's control_task does (L1192-1195)
            logger.error(
                "rank %d: control method %s failed: %s: %s",
                self.rank,
                request.method,
                type(error).__name__,
                error,
                exc_info=not isinstance(error, FdPlatformsError),
            )
            return ControlResponse(request.request_id, 500, f"Failed to execute {request.method}: {error}")
        return ControlResponse(request.request_id, 200, "Success")

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def update_weights(self) -> None:
        """Nothing to update: FastDeploy's updates a storage backend's key prefix, which ours has none of."""

    def sleep(self) -> None:
        if self.held is None:
            return
        self.held.clear(self.timeout)  # the host cache kept unless FD_ENABLE_SWAP_SPACE_CLEARING was set
        self.held = None

    def wakeup(self) -> None:
        if self.held is None:
            self.held = self.recreate(self.rank)
