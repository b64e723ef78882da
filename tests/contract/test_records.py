"""The records plugins return and the core builds (``fd_platforms.contract.types``) check their fields when made: a
field of the wrong type or range is a RecordError naming the record, the field and its value, with a fix."""

from __future__ import annotations

import pytest

from fd_platforms.contract.errors import RecordError
from fd_platforms.contract.types import CacheDecision, Detection, DeviceMemory, HostBuffer, Plan, PlatformLimit


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: DeviceMemory("80GiB", None, None, "x"), "DeviceMemory.total_bytes='80GiB'"),
        (lambda: DeviceMemory(8.0e10, None, None, "x"), "DeviceMemory.total_bytes=80000000000.0"),
        (
            lambda: DeviceMemory(2**30, 2**31, None, "x"),
            "DeviceMemory.free_bytes=2147483648 is not valid; allowed: at most",
        ),
        (lambda: DeviceMemory(2**30, None, -1, "x"), "DeviceMemory.process_bytes=-1"),
        (lambda: Detection("yes", "r", 1), "Detection.available='yes'"),
        (lambda: Detection(True, "r", 1.0), "Detection.device_count=1.0"),
        (lambda: CacheDecision(1, "none", "r"), "CacheDecision.create=1"),
        (lambda: CacheDecision(True, "always", "r"), "CacheDecision.deciding_term='always'"),
        (lambda: PlatformLimit("max_num_blocks", 0, "kernel limit"), "PlatformLimit.value=0"),
        (lambda: PlatformLimit("max_num_blocks", 10, " "), "PlatformLimit.reason=' '"),
        (lambda: Plan(1.5, 1, 1, 64, 1, "memory", "r", 0), "Plan.num_blocks=1.5"),
        (lambda: Plan(1, 1, 1, 64, 1, "luck", "r", 0), "Plan.binding='luck'"),
        (lambda: HostBuffer(0x1000, 10, "no", "pageable", _free=lambda: None), "HostBuffer.pinned='no'"),
        (lambda: HostBuffer(0x1000, 0, False, "pageable", _free=lambda: None), "HostBuffer.nbytes=0"),
    ],
)
def test_records_refuse_fields_of_the_wrong_type_or_range(build, words: str) -> None:
    with pytest.raises(RecordError) as info:
        build()
    assert words in str(info.value) and "Fix:" in str(info.value)
