"""A bounded collective call (``fd_platforms.engine.bounded``): its value or its own exception in the caller's
thread, or the caller's timeout error once the deadline passes, however long the call goes on."""

from __future__ import annotations

import threading
import time

import pytest

from fd_platforms.contract.errors import FdPlatformsError
from fd_platforms.engine.bounded import bounded


class StoreTimeout(FdPlatformsError):
    """The caller's own timeout error."""


def test_the_calls_value_comes_back_as_it_is() -> None:
    answer = object()
    assert bounded(lambda: answer, 5, lambda: StoreTimeout("unused")) is answer


@pytest.mark.parametrize("raised", [RuntimeError("store refused"), SystemExit(3), KeyboardInterrupt()])
def test_what_the_call_raises_is_raised_in_the_callers_thread(raised: BaseException) -> None:
    def call() -> None:
        raise raised

    with pytest.raises(type(raised)) as info:
        bounded(call, 5, lambda: StoreTimeout("unused"))
    assert info.value is raised


def test_a_call_past_its_deadline_raises_the_callers_error_and_is_left_behind() -> None:
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(StoreTimeout, match="no answer from the master"):
        bounded(lambda: release.wait(30), 0.2, lambda: StoreTimeout("no answer from the master"))
    assert 0.2 <= time.monotonic() - started < 5
    (left,) = [thread for thread in threading.enumerate() if thread.name == "fd-platforms collective call"]
    assert left.daemon  # it cannot keep the process from exiting
    release.set()
    left.join(5)


def test_a_deadline_already_past_gives_up_at_once() -> None:
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(StoreTimeout):
        bounded(lambda: release.wait(30), -1, lambda: StoreTimeout("the deadline passed before the call"))
    assert time.monotonic() - started < 1
    release.set()
    for thread in threading.enumerate():
        if thread.name == "fd-platforms collective call":
            thread.join(5)
