"""The block-count hand-off: its own suffix and, on Iluvatar, one word per rank (in-process; the signals are
made here as FastDeploy's engine makes them; test_fastdeploy_protocol.py hands off to a stand-in engine)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from fd_platforms.contract.errors import CacheSignalError, ConfigError
from fd_platforms.contract.types import PlatformIdentity
from fd_platforms.fastdeploy import FASTDEPLOY, hand_off_block_count
from fd_platforms.fastdeploy.signals import PROFILE_BLOCK_NUM, FastDeploySignal
from fd_platforms.loading.platform import Platform


@pytest.fixture(scope="module")
def iluvatar(cpu: Platform) -> Platform:
    """A platform that says it is Iluvatar: the hand-off reads nothing of a platform but its identity."""
    return Platform(cpu.candidate, cpu.manager, PlatformIdentity("iluvatar", "iluvatar_gpu", "CUDA_VISIBLE_DEVICES"))


def fresh(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(4)}"


@contextmanager
def block_count_word(suffix: str, words: int) -> Iterator[FastDeploySignal]:
    """``get_profile_block_num.<suffix>`` as FastDeploy's engine creates it (``words`` long, zeroed)."""
    with FastDeploySignal.create(PROFILE_BLOCK_NUM, suffix, words) as signal:
        yield signal


def test_the_count_goes_under_the_block_counts_own_suffix_not_the_signal_suffix() -> None:
    """FastDeploy names get_profile_block_num with engine_worker_queue_port[0] (its workers' engine_pid), the cache
    signals with the data-parallel rank's port: the two differ with data parallelism."""
    port, engine_pid = fresh("t"), fresh("e")
    with block_count_word(engine_pid, 1) as word:
        assert hand_off_block_count(port, 14448, block_count_suffix=engine_pid) == f"get_profile_block_num.{engine_pid}"
        assert word.values() == (14448,)
        with pytest.raises(CacheSignalError, match=rf"get_profile_block_num\.{port}' does not exist"):
            hand_off_block_count(port, 14448)  # the default is the signal suffix: not this engine's word


def test_by_default_the_block_count_shares_the_signal_suffix() -> None:
    suffix = fresh("t")
    with block_count_word(suffix, 1) as word:
        assert hand_off_block_count(suffix, 7) == f"get_profile_block_num.{suffix}"
        assert word.values() == (7,)


def test_on_iluvatar_every_ranks_word_holds_the_agreed_count(iluvatar: Platform) -> None:
    """FastDeploy's Iluvatar engine makes one word per local rank, and its workers leave the agreed minimum in every
    one (iluvatar_worker.py): the hand-off writes that end state."""
    suffix = fresh("t")
    with block_count_word(suffix, 4) as words:
        hand_off_block_count(suffix, 300, platform=iluvatar, ranks=4)
        assert words.values() == (300, 300, 300, 300)


@pytest.mark.parametrize(
    ("made", "platform_name", "ranks"), [(4, "cpu", 4), (4, None, 1), (1, "iluvatar", 4), (2, "iluvatar", 4)]
)
def test_a_word_of_another_length_than_fastdeploys_engine_makes_is_refused_untouched(
    request: pytest.FixtureRequest, made: int, platform_name: str | None, ranks: int
) -> None:
    platform = None if platform_name is None else request.getfixturevalue(platform_name)
    suffix = fresh("t")
    with block_count_word(suffix, made) as words:
        with pytest.raises(CacheSignalError, match=rf"holds {made} words, but FastDeploy's engine makes") as caught:
            hand_off_block_count(suffix, 300, platform=platform, ranks=ranks)
        assert "Fix: pass platform= (the selected platform) and ranks=" in str(caught.value)
        assert words.values() == (0,) * made, "nothing written"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"block_count_suffix": "../x"}, "block_count_suffix"),
        ({"block_count_suffix": ""}, "block_count_suffix"),
        ({"platform": "iluvatar"}, "platform"),
        ({"ranks": 0}, "ranks"),
        ({"ranks": True}, "ranks"),
        ({"num_blocks": 0}, "num_blocks"),
        ({"num_blocks": 2**31}, "num_blocks"),
        ({"suffix": "a/b"}, "instance"),
    ],
)
def test_bad_arguments_are_config_errors_naming_the_field_before_any_signal(kwargs: dict, field: str) -> None:
    arguments = {"suffix": "nobody-made-this", "num_blocks": 8, **kwargs}
    with pytest.raises(ConfigError) as caught:
        hand_off_block_count(arguments.pop("suffix"), arguments.pop("num_blocks"), **arguments)
    assert caught.value.field == field


def test_a_runs_fastdeploy_signals_make_the_block_count_as_fastdeploys_engine_does() -> None:
    """One word under the run's suffix by default; under its own suffix, one word per rank on Iluvatar."""
    engine_pid = fresh("e")
    with ExitStack() as stack:
        suffix, held = FASTDEPLOY.create_signals(3, device_type="gpu", block_count_suffix=None)
        stack.enter_context(held)
        with FastDeploySignal.attach(PROFILE_BLOCK_NUM, suffix) as word:
            assert word.length == 1
        suffix, held = FASTDEPLOY.create_signals(3, device_type="iluvatar_gpu", block_count_suffix=engine_pid)
        stack.enter_context(held)
        assert not os.path.exists(f"/dev/shm/get_profile_block_num.{suffix}")
        with FastDeploySignal.attach(PROFILE_BLOCK_NUM, engine_pid) as words:
            assert words.length == 3
    assert not os.path.exists(f"/dev/shm/get_profile_block_num.{engine_pid}"), "removed with the run's signals"
