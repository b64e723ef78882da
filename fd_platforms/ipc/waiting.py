"""What a wait on another process says while it waits: one log line every few seconds.

A wait of the core — a rank's cache-ready slot (ours, :mod:`.cache_signal`), a word of FastDeploy's
(:mod:`fd_platforms.fastdeploy.signals`), a creator's wait for its attachers to let go
(:mod:`fd_platforms.engine.publication`) — may have no time limit (``timeout=math.inf``,
``FD_CACHE_READY_TIMEOUT=inf``), as FastDeploy's own waits have none: its runner polls its
``cache_ready_signal`` word once a second until it is 1 (``fastdeploy/worker/gpu_model_runner.py``,
``initialize_kv_cache``) and its engine polls ``get_profile_block_num`` until it is set
(``fastdeploy/engine/engine.py``, ``_stop_profile``). Such a wait shows it is alive only by what it
says, so every :data:`PROGRESS_SECONDS` it logs one WARNING line: what it waits for and why, the
signal and word, the value seen, who would set it, and for how long already. A bounded wait logs
the same line at INFO (its limit will end it anyway).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from .timeouts import check_seconds

logger = logging.getLogger(__name__)

#: Seconds between two lines of one wait; read at each wait's start (a test may shorten it).
PROGRESS_SECONDS = 5.0


class WaitProgress:
    """The lines of one wait that began at ``start`` (``time.monotonic()``) with limit ``limit`` seconds
    (``math.inf``: none), one every ``period`` seconds (default :data:`PROGRESS_SECONDS`)."""

    def __init__(self, limit: float, start: float, period: float | None = None) -> None:
        self.limit, self.start = limit, start
        self.period = (
            PROGRESS_SECONDS
            if period is None
            else check_seconds("progress_seconds", period, "pass the seconds between two progress lines, e.g. 5")
        )
        self.level = logging.WARNING if math.isinf(limit) else logging.INFO
        self._next = start + self.period

    def until_next(self, now: float) -> float:
        """Seconds from ``now`` to the next line (a wait sleeps no longer than this)."""
        return max(0.0, self._next - now)

    def say(self, now: float, waiting_for: Callable[[], str]) -> None:
        """Log ``waiting_for()`` (what, why, the word seen, who sets it), then for how long and the limit,
        if a line is due at ``now``."""
        if now < self._next:
            return
        bound = "no time limit" if math.isinf(self.limit) else f"limit {self.limit:g} s"
        logger.log(self.level, "%s; waited %.1f s, %s", waiting_for(), now - self.start, bound)
        self._next = now + self.period
