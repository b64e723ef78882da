"""One request record for a rank's cache: ``CacheRequest`` is validated when it is made (a ConfigError naming the
field), and ``initialize_kv_cache(platform, request)`` and ``manage_kv_cache(platform, request)`` take it and nothing
else; a record altered after it was made is still refused where the system is touched."""

from __future__ import annotations

import dataclasses

import pytest
from engine_processes import mtp_layout, qwen_layout
from hypothesis import given, settings
from hypothesis import strategies as st

from fd_platforms.contract.errors import ConfigError
from fd_platforms.contract.integers import MAX_COUNT
from fd_platforms.contract.types import CacheRoleShape
from fd_platforms.engine import CacheRequest, initialize_kv_cache, manage_kv_cache
from fd_platforms.engine.protocols import OURS
from fd_platforms.fastdeploy import FastDeploySuffix
from fd_platforms.ipc.process_watch import PID_MAX_LIMIT
from fd_platforms.loading.platform import Platform

BLOCKS = 2
MIXED = {"profile": False, "num_cpu_blocks": 0, "storage_backend": None, "splitwise_role": "mixed"}
SWAP = {**MIXED, "num_cpu_blocks": 2}


def request(**changes: object) -> CacheRequest:
    fields = {"layout": qwen_layout(), "num_blocks": BLOCKS, "instance": "fd_cache_ready.request-test", **MIXED}
    return CacheRequest(**{**fields, **changes})  # type: ignore[arg-type]


def test_a_request_holds_its_fields_checked_and_the_protocol_as_its_object() -> None:
    made = request(protocol="fd-platforms", creator_pid=1, timeout=5, tensor_specs=None)
    assert made.protocol is made.wire is OURS and made.instance == "fd_cache_ready.request-test"
    assert made.creator_pid == 1 and made.inputs.kwargs() == {**MIXED, "rule": "2026-01"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.num_blocks = 3  # type: ignore[misc]
    assert dataclasses.replace(made, num_blocks=3).num_blocks == 3, "replace makes a new record, checked again"
    with pytest.raises(ConfigError) as caught:
        dataclasses.replace(made, num_blocks=0)
    assert caught.value.field == "num_blocks"


BAD_FIELDS = [
    ("layout", "x", "layout"),
    ("num_blocks", 0, "num_blocks"),
    ("num_blocks", 2.0, "num_blocks"),
    ("num_cpu_blocks", -1, "num_cpu_blocks"),
    ("splitwise_role", "both", "splitwise_role"),
    ("storage_backend", "tape", "storage_backend"),
    ("profile", "no", "profile"),
    ("rule", "1999-01", "rule"),
    ("protocol", "grpc", "protocol"),
    ("instance", None, "instance"),
    ("instance", "../x", "instance"),
    ("tp", 0, "tp"),
    ("creator_pid", 0, "creator_pid"),
    ("creator_pid", PID_MAX_LIMIT + 1, "creator_pid"),
    ("creator_pid", True, "creator_pid"),
    ("timeout", -1, "timeout"),
    ("timeout", float("nan"), "timeout"),
    ("tensor_specs", ["key"], "tensor_specs"),
    ("tensor_specs", (), "tensor_specs"),
    ("draft", "x", "draft"),
    ("host_cache", "x", "host_cache"),
]


@pytest.mark.parametrize(("name", "value", "field"), BAD_FIELDS, ids=[f"{n}={v!r}" for n, v, _ in BAD_FIELDS])
def test_a_bad_field_is_a_config_error_naming_it_when_the_request_is_made(name: str, value: object, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        request(**{name: value})
    assert caught.value.field == field and "Fix: " in str(caught.value)


def test_a_draft_goes_with_its_main_part_and_a_rank_outside_tp_is_refused() -> None:
    whole = mtp_layout()
    assert request(layout=whole.main(), draft=whole.draft()).draft == whole.draft()
    with pytest.raises(ConfigError) as caught:
        request(layout=whole.draft(), draft=whole.draft())
    assert caught.value.field == "layout"
    with pytest.raises(ConfigError) as caught:
        request(layout=qwen_layout(rank=1, tp=2), tp=1)
    assert caught.value.field == "layout.rank"


@settings(max_examples=60, deadline=None)
@given(
    num_blocks=st.integers(-3, 2**64),
    creator_pid=st.one_of(st.none(), st.integers(-3, 2**40)),
    num_cpu_blocks=st.integers(-3, 2**64),
)
def test_integers_are_taken_exactly_in_their_range(
    num_blocks: int, creator_pid: int | None, num_cpu_blocks: int
) -> None:
    bad = [
        name
        for name, ok in (
            ("num_blocks", 1 <= num_blocks <= MAX_COUNT),
            ("num_cpu_blocks", 0 <= num_cpu_blocks <= MAX_COUNT),
            ("creator_pid", creator_pid is None or 1 <= creator_pid <= PID_MAX_LIMIT),
        )
        if not ok
    ]
    try:
        request(num_blocks=num_blocks, creator_pid=creator_pid, num_cpu_blocks=num_cpu_blocks)
    except ConfigError as error:
        assert error.field in bad
    else:
        assert not bad


@pytest.mark.parametrize("call", [initialize_kv_cache, manage_kv_cache])
def test_a_call_takes_the_platform_and_a_request_and_nothing_else(cpu: Platform, call) -> None:
    with pytest.raises(ConfigError) as caught:
        call(cpu, qwen_layout())
    assert caught.value.field == "request" and "Fix: build one: CacheRequest(layout=" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        call("cpu", request())
    assert caught.value.field == "platform"
    with pytest.raises(TypeError, match="unexpected keyword argument 'timeout'"):
        call(cpu, request(), timeout=5)


@pytest.mark.parametrize(("name", "value"), [("num_blocks", 0), ("layout", "x"), ("num_blocks", 2**70)])
def test_a_request_altered_after_it_was_made_is_refused_before_any_hook(
    cpu: Platform, name: str, value: object
) -> None:
    """The record is checked once, when made; the sinks that size and shape memory keep their own guard."""
    made = request()
    object.__setattr__(made, name, value)
    called: list[str] = []
    cpu._call = lambda hook, *a, **k: called.append(hook)  # type: ignore[method-assign]
    try:
        for call in (initialize_kv_cache, manage_kv_cache):
            with pytest.raises(ConfigError) as caught:
                call(cpu, made)
            assert caught.value.field == name
    finally:
        del cpu._call
    assert called == []


def test_each_call_refuses_what_only_the_other_takes(cpu: Platform) -> None:
    whole = mtp_layout()
    with pytest.raises(ConfigError) as caught:
        initialize_kv_cache(cpu, request(layout=whole.main(), draft=whole.draft()))
    assert caught.value.field == "draft" and "the proposer's call" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        manage_kv_cache(cpu, request(profile=True))
    assert caught.value.field == "profile" and "never profiles" in str(caught.value)


def test_tensor_specs_are_held_as_a_tuple() -> None:
    specs = [
        CacheRoleShape("key", (BLOCKS, 4, 64, 128), "bfloat16"),
        CacheRoleShape("value", (BLOCKS, 4, 64, 128), "bfloat16"),
    ]
    assert request(tensor_specs=specs).tensor_specs == tuple(specs)


def test_the_tp_a_fastdeploy_suffix_carries_travels_with_the_request_and_must_agree_with_tp() -> None:
    """``instance=FastDeploySuffix.of(port, tp=4)`` keeps its tp in the record (each per-rank signal is then checked
    to be exactly 4 words), ``tp=4`` beside it is the same, ``tp=2`` beside it is refused naming both, and the rank
    must be one of its 4."""
    suffix = FastDeploySuffix.of("9923", tp=4)
    for made in (
        request(protocol="fastdeploy", instance=suffix),
        request(protocol="fastdeploy", instance=suffix, tp=4),
    ):
        assert made.tp == 4 and isinstance(made.instance, FastDeploySuffix) and made.instance.tp == 4
    assert request(protocol="fastdeploy", instance="9923", tp=2).instance.tp == 2  # type: ignore[attr-defined]
    with pytest.raises(ConfigError) as caught:
        request(protocol="fastdeploy", instance=suffix, tp=2)
    assert (caught.value.field, caught.value.value) == ("tp", 2) and "4, the tp the instance carries" in str(
        caught.value
    )
    with pytest.raises(ConfigError) as caught:
        request(protocol="fastdeploy", instance=FastDeploySuffix.of("9923", tp=1), layout=qwen_layout(tp=2, rank=1))
    assert caught.value.field == "layout.rank"


class LyingInt(int):
    """An int whose comparisons and conversions lie: a check against it passes whatever its value."""

    def __lt__(self, other: object) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return False

    def __le__(self, other: object) -> bool:
        return True

    def __ge__(self, other: object) -> bool:
        return True

    def __int__(self) -> int:
        return 1

    def __index__(self) -> int:
        return 1


class LyingStr(str):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


def test_int_and_str_subclasses_are_held_as_their_plain_values_and_checked_as_such() -> None:
    made = CacheRequest(
        layout=qwen_layout(),
        num_blocks=LyingInt(64),
        instance="x",
        num_cpu_blocks=LyingInt(0),
        splitwise_role=LyingStr("mixed"),
        tp=LyingInt(1),
    )
    assert (made.num_blocks, made.num_cpu_blocks, made.tp, made.splitwise_role) == (64, 0, 1, "mixed")
    assert [type(value) for value in (made.num_blocks, made.num_cpu_blocks, made.tp, made.splitwise_role)] == [
        int,
        int,
        int,
        str,
    ]
    with pytest.raises(ConfigError, match="num_blocks=0 is not valid"):  # its value, not its comparisons, checked
        CacheRequest(
            layout=qwen_layout(), num_blocks=LyingInt(0), instance="x", num_cpu_blocks=0, splitwise_role="mixed"
        )
    with pytest.raises(ConfigError, match="splitwise_role"):
        CacheRequest(
            layout=qwen_layout(), num_blocks=4, instance="x", num_cpu_blocks=0, splitwise_role=LyingStr("nope")
        )
