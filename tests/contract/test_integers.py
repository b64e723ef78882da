"""The one integer check (``fd_platforms.contract.integers``): what passes, and the error that names the rest."""

from __future__ import annotations

import math

import pytest

from fd_platforms.contract.errors import ConfigError, RecordError
from fd_platforms.contract.integers import INT32_MAX, MAX_COUNT, bound_text, check_int, check_positive, is_int
from fd_platforms.contract.types import DeviceMemory
from fd_platforms.fastdeploy import values
from fd_platforms.rules.config.settings import CacheConfig
from fd_platforms.rules.planner import budget_bytes


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, True), (-3, True), (2**70, True), (True, False), (False, False), (1.0, False), ("1", False), (None, False)],
)
def test_is_int_is_an_int_that_is_not_a_bool(value: object, expected: bool) -> None:
    assert is_int(value) is expected


@pytest.mark.parametrize("value", [0, 1, 7])
def test_an_integer_in_range_is_returned(value: int) -> None:
    assert check_int("n", value, 0, 7, fix="f") == value


def test_the_default_maximum_is_the_largest_count_and_none_means_no_bound() -> None:
    assert check_int("n", MAX_COUNT, 0) == MAX_COUNT
    with pytest.raises(ConfigError):
        check_int("n", MAX_COUNT + 1, 0)
    assert check_int("n", 10**30, 1, None) == 10**30


@pytest.mark.parametrize("value", [True, False, 1.0, 3.5, "3", None, [3]])
def test_anything_but_an_int_is_refused(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        check_int("n", value, 0, 7, fix="pass a count")
    assert info.value.value is value


@pytest.mark.parametrize("value", [-1, 8, 2**64])
def test_an_integer_below_or_above_the_range_is_refused(value: int) -> None:
    with pytest.raises(ConfigError):
        check_int("n", value, 0, 7, fix="pass a count")


def test_the_config_error_names_the_field_the_value_what_is_allowed_and_the_fix() -> None:
    with pytest.raises(ConfigError) as info:
        check_int("num_blocks", True, 1, fix="plan the blocks first")
    error = info.value
    assert (error.field, error.value, error.allowed, error.fix) == (
        "num_blocks",
        True,
        "an integer from 1 to 2**63 - 1",
        "plan the blocks first",
    )
    assert (
        str(error)
        == "num_blocks=True is not valid; allowed: an integer from 1 to 2**63 - 1. Fix: plan the blocks first"
    )


def test_without_a_fix_the_error_says_to_set_a_whole_number_in_range() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^head_dim=0 is not valid; allowed: an integer from 1 to 65536\. "
        r"Fix: set head_dim to a whole number in that range$",
    ):
        check_int("head_dim", 0, 1, 65536)


@pytest.mark.parametrize(
    ("maximum", "words", "allowed"),
    [
        (INT32_MAX, {}, "an integer from 0 to 2**31 - 1"),
        (None, {}, "an integer >= 0"),
        (1, {"what": "a local rank"}, "a local rank from 0 to 1"),
        (None, {"what": "None or a process id"}, "None or a process id >= 0"),
        (3, {"what": "", "note": "this node's ranks"}, "0 to 3 (this node's ranks)"),
        (3, {"note": "tensor_parallel_size=4"}, "an integer from 0 to 3 (tensor_parallel_size=4)"),
    ],
)
def test_what_is_allowed_reads_from_what_the_range_and_the_note(
    maximum: int | None, words: dict[str, str], allowed: str
) -> None:
    with pytest.raises(ConfigError) as info:
        check_int("x", -1, 0, maximum, fix="f", **words)
    assert info.value.allowed == allowed


def test_a_record_field_is_a_record_error_with_the_records_own_fix() -> None:
    with pytest.raises(RecordError) as info:
        check_int("total_bytes", 8.0e10, 1, record="DeviceMemory", fix="ignored")
    error = info.value
    assert (error.record, error.field, error.value, error.allowed) == (
        "DeviceMemory",
        "total_bytes",
        8.0e10,
        "an integer from 1 to 2**63 - 1",
    )
    assert str(error) == (
        "DeviceMemory.total_bytes=80000000000.0 is not valid; allowed: an integer from 1 to 2**63 - 1. Fix: build "
        "DeviceMemory with total_bytes as allowed (a size such as '80GiB' becomes an int with "
        "fd_platforms.rules.sizes.parse_size)"
    )
    assert not isinstance(error, ConfigError)


def test_a_huge_value_is_shown_by_its_digits() -> None:
    with pytest.raises(ConfigError, match=r"^n=<an integer of 400 digits> is not valid"):
        check_int("n", 10**399, 0, fix="f")


@pytest.mark.parametrize(
    ("bound", "text"),
    [
        (MAX_COUNT, "2**63 - 1"),
        (INT32_MAX, "2**31 - 1"),
        (-MAX_COUNT, "-(2**63 - 1)"),
        (2**22, "4194304"),
        (1023, "1023"),
        (2**30 - 1, "1073741823"),
        (0, "0"),
        (-5, "-5"),
    ],
)
def test_a_bound_one_below_a_large_power_of_two_is_written_as_one(bound: int, text: str) -> None:
    assert bound_text(bound) == text


@pytest.mark.parametrize("text", ["²", "٣", "0,²", "١٢", "1e3", "-1", "", str(2**63)])
def test_only_ascii_digits_are_read_as_counts_wherever_digit_text_comes_from_outside(text: str) -> None:
    """``str.isdigit`` takes ``"²"`` (``int`` then raises ValueError) and ``"٣"`` (``int`` reads 3): a device list
    ``CUDA_VISIBLE_DEVICES=0,²`` gave a traceback."""
    from fd_platforms.contract.integers import decimal
    from fd_platforms.rules.devices import listed_device

    assert decimal(text) is None
    with pytest.raises(ConfigError, match=r"CUDA_VISIBLE_DEVICES=.* is not valid; allowed: comma-separated device"):
        listed_device("CUDA_VISIBLE_DEVICES", f"0,{text}", 1, ("fix", "fix"))


def test_ascii_digits_are_read_up_to_the_bound() -> None:
    from fd_platforms.contract.integers import decimal

    assert decimal("0") == 0 and decimal("0042") == 42 and decimal(str(INT32_MAX), INT32_MAX) == INT32_MAX
    assert decimal(str(INT32_MAX + 1), INT32_MAX) is None


@pytest.mark.parametrize("value", [0.5, 1, 1.0, 2**-1074])
def test_a_positive_number_up_to_the_maximum_is_returned_as_a_float(value: float) -> None:
    assert check_positive("ratio", value, 1, "fix it") == float(value)
    assert type(check_positive("ratio", value, 1, "fix it")) is float


BAD_FRACTIONS = [0, 0.0, -0.5, 1.01, math.nan, math.inf, -math.inf, "0.9", True, None, 10**400]


@pytest.mark.parametrize("value", BAD_FRACTIONS)
def test_a_fraction_is_refused_in_the_same_words_by_the_config_the_planner_and_fastdeploys_reader(
    value: object,
) -> None:
    """memory_utilization is read in three places: the engine's CacheConfig, the planner's budget and FastDeploy's
    gpu_memory_utilization; each refuses a bad value naming it, with one statement of what is allowed."""
    refusals = []
    for read in (
        lambda: CacheConfig(memory_utilization=value),  # type: ignore[arg-type]
        lambda: budget_bytes(DeviceMemory(2**30, None, None, "test"), value, 0),  # type: ignore[arg-type]
        lambda: values.positive("memory_utilization", value, 1.0, "give a fraction"),
    ):
        with pytest.raises(ConfigError) as info:
            read()
        refusals.append((info.value.field, info.value.allowed, info.value.fix))
    allowed = "a number greater than 0 and at most 1 (not a bool or text)"
    ours = ("memory_utilization", allowed, "give the fraction of device memory to use, e.g. 0.9")
    assert refusals == [ours, ours, ("memory_utilization", allowed, "give a fraction")]
