"""The cache-ready signal under a neighbour sharing ``/dev/shm`` that truncates it: its waiter, in another process,
and its owner get a typed error naming the signal, never a SIGBUS."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from run_helpers import ROOT, clean_env

from fd_platforms.contract.errors import CacheSignalError
from fd_platforms.ipc.cache_signal import CacheReadySignal

WAITER = """
import sys
from fd_platforms.contract.errors import CacheSignalError
from fd_platforms.contract.errors import CacheSignalError
from fd_platforms.ipc.cache_signal import CacheReadySignal
signal = CacheReadySignal.attach(sys.argv[1])
print("waiting", flush=True)
try:
    signal.wait(0, timeout=30)
except CacheSignalError as exc:
    print(exc, flush=True)
    sys.exit(3)
"""


@pytest.mark.slow
def test_a_signal_truncated_under_its_waiter_is_a_typed_error_not_sigbus() -> None:
    with CacheReadySignal.create(num_ranks=2) as signal:
        waiter = subprocess.Popen(
            [sys.executable, "-c", WAITER, signal.name], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=clean_env()
        )
        assert waiter.stdout is not None and waiter.stdout.readline() == "waiting\n"
        os.truncate(f"/dev/shm/{signal.name}", 0)  # what a hostile neighbour sharing /dev/shm could do
        out, _ = waiter.communicate(timeout=60)
        assert waiter.returncode == 3, (waiter.returncode, out)  # -7 would be SIGBUS
        assert f"cache-ready signal {signal.name!r} was truncated to 0 bytes while in use" in out
        with pytest.raises(CacheSignalError, match="was truncated to 0 bytes"):
            signal.slots()  # the owner too: a typed error, no SIGBUS
