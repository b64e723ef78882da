"""Numbers the README and the plugin guide quote come from the code: a test recomputes each one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fd_platforms.contract.errors import PlatformDriftError
from fd_platforms.ipc.cache_signal import LAYOUT_VERSION
from fd_platforms.ipc.timeouts import MAX_SECONDS
from fd_platforms.loading.watchdog import (
    DEFAULT_ALLOC_TIMEOUT,
    DEFAULT_DETECT_TIMEOUT,
    ENV_ALLOC_TIMEOUT,
    ENV_DETECT_TIMEOUT,
)
from fd_platforms.loading.selection import select_platform
from fd_platforms.rules.config import ModelConfig, tensor_parallel_sizes
from fd_platforms.rules.config.limits import MAX_LAYERS, MAX_RANKS, MAX_WIDTH
from fd_platforms.rules.decision import TRUTH_TABLE
from test_drift_guard import OLD_XPU_RULE, drifting

ROOT = Path(__file__).resolve().parents[1]
README = " ".join((ROOT / "README.md").read_text().split())  # prose compared with its line breaks undone
GUIDE_TEXT = (ROOT / "docs" / "writing-a-plugin.md").read_text()
GUIDE = " ".join(GUIDE_TEXT.split())


@pytest.fixture
def old_xpu_drift(make_plugin) -> PlatformDriftError:
    drifting(make_plugin, "oldxpu", OLD_XPU_RULE)
    with pytest.raises(PlatformDriftError) as info:
        select_platform({"FD_PLATFORM": "oldxpu"})
    return info.value


def test_the_drift_counts_quoted_are_the_guards(old_xpu_drift: PlatformDriftError) -> None:
    cases = old_xpu_drift.cases
    flipped = sum(case.got.create != case.expected.create for case in cases)
    quoted = f"differs in {len(cases)} of {len(TRUTH_TABLE)} cases ({flipped} flip the decision"
    assert quoted in README
    assert f"{len(cases) - flipped} name another deciding term" in README
    assert f"{len(TRUTH_TABLE)}-case table" in README and f"all {len(TRUTH_TABLE)} cases" in README
    assert f"{len(TRUTH_TABLE)} cases)" in README and f"all {len(TRUTH_TABLE)} cases" in GUIDE


def test_the_guides_drift_sample_is_the_real_first_line(old_xpu_drift: PlatformDriftError) -> None:
    first, second = str(old_xpu_drift).splitlines()[:2]
    sample = GUIDE_TEXT[GUIDE_TEXT.index("## The drift guard") :]
    assert f"fd-platforms: error: {first}" in sample and second in sample
    assert f"{len(TRUTH_TABLE)}-case truth table" in " ".join(sample.split())


def test_the_bounds_quoted_are_the_codes() -> None:
    assert f"`{ENV_DETECT_TIMEOUT}` seconds (default {DEFAULT_DETECT_TIMEOUT:g}; at most {MAX_SECONDS}" in README
    assert f"`{ENV_DETECT_TIMEOUT}` seconds (default {DEFAULT_DETECT_TIMEOUT:g};" in GUIDE
    assert f"`{ENV_ALLOC_TIMEOUT}` seconds (default {DEFAULT_ALLOC_TIMEOUT:g})" in README
    assert f"`{ENV_ALLOC_TIMEOUT}` seconds (default {DEFAULT_ALLOC_TIMEOUT:g})" in GUIDE
    assert f"layers up to {MAX_LAYERS}; heads, head and latent dims and block sizes up to {MAX_WIDTH}" in README
    assert f"tensor-parallel ranks up to {MAX_RANKS}" in README
    assert f"1 layout version {LAYOUT_VERSION}," in README


def test_the_tensor_parallel_example_is_computed() -> None:
    qwen = ModelConfig("qwen3-30b-a3b", 48, 32, 4, 128)
    works = ", ".join(map(str, tensor_parallel_sizes(qwen)))
    assert re.search(rf"`--tp 3` on Qwen3-30B-A3B: {re.escape(works)}\)", README)


def test_the_foreign_poll_and_the_stand_in_rounds_quoted_are_the_codes() -> None:
    from fd_platforms.ipc.futex import FIRST_POLL_SECONDS, FOREIGN_POLL_SECONDS
    from test_fastdeploy_protocol import CYCLES

    first, last = f"{FIRST_POLL_SECONDS * 1000:g} ms", f"{FOREIGN_POLL_SECONDS * 1000:g} ms"
    assert f"first after {first}, then as far apart as the wait has lasted, up to {last}" in README
    assert f"growing from {first} to {last} over the wait" in README
    engine_guide = " ".join((ROOT / "docs" / "engine-integration.md").read_text().split())
    assert f"(from {first}, growing with the wait to {last})" in engine_guide and f"seen within {last}" in engine_guide
    assert f"a 4-rank clear/update runs {CYCLES} times driven from our side and {CYCLES} times from the" in README
