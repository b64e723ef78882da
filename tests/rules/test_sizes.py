"""parse_size / format_size: units, rounding, and errors that name the field and the fix."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fd_platforms.contract.errors import ConfigError
from fd_platforms.contract.integers import MAX_COUNT
from fd_platforms.rules.sizes import decimal_note, format_size, parse_size

UNITS = {
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * 1024**3),
        ("80GB", 80 * 10**9),
        ("81920MiB", 81920 * 1024**2),
        ("512KiB", 512 * 1024),
        ("1.5GiB", 1024**3 + 512 * 1024**2),
        ("1073741824", 1073741824),
        ("  16 gib ", 16 * 1024**3),
        ("2tb", 2 * 10**12),
        ("1TiB", 1024**4),
        ("100b", 100),
        ("7KB", 7000),
        ("3mb", 3 * 10**6),
        (".5KiB", 512),
        ("0", 0),
        (0, 0),
        (123, 123),
    ],
)
def test_parse_size_accepts(text: str | int, expected: int) -> None:
    assert parse_size(text, "swap_space") == expected


def test_parse_size_rounds_fractional_bytes_down() -> None:
    assert parse_size("0.3KiB", "swap_space") == 307  # 0.3 * 1024 = 307.2
    assert parse_size("1.9", "swap_space") == 1


@pytest.mark.parametrize("bad", ["-1GiB", "abc", "", "  ", "GiB", "1.2.3GB", "10 G iB", -5, True, 1.5])
def test_parse_size_rejects(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(bad, "cache.swap_space")  # type: ignore[arg-type]
    message = str(info.value)
    assert info.value.field == "cache.swap_space"
    assert info.value.value == bad
    assert "cache.swap_space=" in message and repr(bad) in message
    assert "allowed:" in message and "GiB" in message
    assert "Fix:" in message
    assert "\n" not in message


def test_parse_size_unknown_unit_is_named() -> None:
    with pytest.raises(ConfigError, match=r"unknown unit 'XB'") as info:
        parse_size("10XB", "swap_space")
    assert "80GiB" in info.value.fix


@given(st.integers(min_value=0, max_value=2**40), st.sampled_from(sorted(UNITS)), st.booleans())
def test_parse_size_is_number_times_unit_any_case(number: int, unit: str, upper: bool) -> None:
    written = unit.upper() if upper else unit.lower()
    if number * UNITS[unit] > MAX_COUNT:
        with pytest.raises(ConfigError, match="at most 8 EiB"):
            parse_size(f"{number}{written}", "size")
    else:
        assert parse_size(f"{number}{written}", "size") == number * UNITS[unit]


@pytest.mark.parametrize(
    "text",
    [
        "9223372036854775808B",
        "8388608TiB",
        pytest.param("9" * 5000, id="5000-digit-text"),
        2**63,
        pytest.param(10**5000, id="5000-digit-int"),
    ],
)
def test_sizes_beyond_8_eib_are_refused_naming_the_field(text: object) -> None:
    with pytest.raises(ConfigError, match=r"swap_space=.* is not valid; allowed: .*at most 8 EiB") as info:
        parse_size(text, "swap_space")  # type: ignore[arg-type]
    assert len(str(info.value)) < 600


def test_the_largest_size_is_accepted() -> None:
    assert parse_size(MAX_COUNT, "size") == parse_size(f"{MAX_COUNT}B", "size") == 2**63 - 1


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (1536, "1.50 KiB"),
        (80 * 1024**3, "80.00 GiB"),
        (3 * 1024**2 // 2, "1.50 MiB"),
        (1024**4, "1.00 TiB"),
        (-(1024**3), "-1.00 GiB"),
    ],
)
def test_format_size(n: int, text: str) -> None:
    assert format_size(n) == text


@given(st.integers(min_value=1024, max_value=2**50))
def test_format_then_parse_is_within_rounding(n: int) -> None:
    number, unit = format_size(n).split()
    factor = UNITS[unit]
    assert abs(parse_size(f"{number}{unit}", "size") - n) <= factor * 0.005 + 1


def test_a_missing_size_says_not_given_never_none() -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(None, "--device-memory")  # type: ignore[arg-type]
    assert "--device-memory is not given" in str(info.value) and "None" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16", 16 * 2**30),
        (16, 16 * 2**30),
        (1.5, 3 * 2**29),
        ("0.5", 2**29),
        ("512MiB", 512 * 2**20),
        ("4GB", 4 * 10**9),
    ],
)
def test_a_bare_number_counts_in_the_fields_bare_unit(text: object, expected: int) -> None:
    assert parse_size(text, "--swap-space", bare="GiB") == expected  # type: ignore[arg-type]


def test_the_bare_unit_is_named_in_the_error() -> None:
    with pytest.raises(ConfigError, match="a number alone counts in GiB"):
        parse_size("-1", "--swap-space", bare="GiB")


@pytest.mark.parametrize(("text", "meant"), [("80G", "80GiB"), ("80g", "80GiB"), ("512M", "512MiB"), ("1T", "1TiB")])
def test_a_unit_letter_alone_is_refused_with_both_meanings(text: str, meant: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(text, "--device-memory")
    decimal = meant.replace("iB", "B")
    assert f"did you mean {meant} (powers of 1024) or {decimal} (powers of 1000)?" in str(info.value)


def test_a_misspelled_unit_gets_the_closest_one() -> None:
    with pytest.raises(ConfigError, match=r"did you mean 80GiB\?"):
        parse_size("80GIiB", "--device-memory")


def test_a_decimal_unit_gets_one_note_with_its_binary_value() -> None:
    nbytes = parse_size("80GB", "--device-memory")
    note = decimal_note("80GB", nbytes)
    assert nbytes == 80 * 10**9 and note is not None and "\n" not in note
    assert "80000000000 bytes (powers of 1000) = 74.51 GiB" in note and "write 80GiB for powers of 1024" in note
    assert decimal_note("80GiB", 80 * 2**30) is None and decimal_note(1024, 1024) is None
