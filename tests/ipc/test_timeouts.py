"""Every limit a command takes is a finite number of seconds > 0 and at most 7 days (``fd_platforms.ipc.timeouts``):
anything else, from a ``--timeout`` flag or ``FD_CACHE_READY_TIMEOUT``, is one line naming it before anything
starts, never a hang or an overflow deep inside a wait."""

from __future__ import annotations

import pytest
from error_lines import one_error_line
from run_helpers import QWEN
from run_helpers import main_in_process as cli

from fd_platforms.ipc.timeouts import ALLOWED

RUN = ("run", "--model", QWEN, "--device-memory", "256MiB")


@pytest.mark.parametrize("value", ["nan", "inf", "1e300", "3e6", "-1", "0"])  # 3e6 s: past poll's int32 milliseconds
@pytest.mark.parametrize("command", [RUN, ("check", "cpu")], ids=lambda command: command[0])
def test_every_timeout_flag_refuses_what_is_not_seconds(command: tuple[str, ...], value: str) -> None:
    line = one_error_line(cli(*command, "--timeout", value))
    assert f"timeout={float(value)!r} is not valid; allowed: {ALLOWED}" in line
    assert ALLOWED == "a finite number of seconds > 0 and at most 604800 (7 days)"


def test_a_timeout_variable_too_long_for_the_os_is_refused_before_anything_starts() -> None:
    line = one_error_line(cli(*RUN, FD_CACHE_READY_TIMEOUT="1e9"))
    assert f"FD_CACHE_READY_TIMEOUT='1e9' is not valid; allowed: {ALLOWED}" in line
