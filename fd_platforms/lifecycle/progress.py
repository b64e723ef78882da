"""Progress lines on stderr (``fd-platforms: rank 0: planned 170 blocks``), silent when quiet."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..ipc.console import write_line
from ..rules.sizes import format_size

ALLOCATION_INTERVAL = 1.0  # seconds between two lines about one allocation


class Progress:
    """Prints one progress line per call, prefixed with ``fd-platforms: `` and ``prefix``."""

    def __init__(self, quiet: bool, prefix: str = "") -> None:
        self.quiet, self.prefix = quiet, prefix

    def __call__(self, message: str) -> None:
        if not self.quiet:
            write_line(f"fd-platforms: {self.prefix}{message}")

    def allocation(self, what: str) -> Callable[[int, int], None] | None:
        """A KV-cache allocation callback (an engine call's ``progress=``: blocks done, of total) printing
        ``what: X of Y`` at most once a second."""
        if self.quiet:
            return None
        next_line = time.monotonic() + ALLOCATION_INTERVAL

        def report(done: int, total: int) -> None:
            nonlocal next_line
            now = time.monotonic()
            if now >= next_line and done < total:
                self(f"{what}: {format_size(done)} of {format_size(total)} ({100 * done // total}%)")
                next_line = now + ALLOCATION_INTERVAL

        return report
