"""The drift guard: a plugin answering should_create_cache_tensor itself is held to the rule's truth table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from drift_plugins import ALWAYS_THERE, RAISES_ON_DECODE, SAME_AS_THE_RULE, drifting
from run_helpers import main_in_process

from fd_platforms.contract.errors import ConfigError, PlatformDriftError
from fd_platforms.loading.selection import select_platform, survey
from fd_platforms.rules.decision import TRUTH_TABLE


def test_the_old_xpu_rule_is_refused_with_every_differing_case(make_plugin) -> None:
    drifting(make_plugin)
    with pytest.raises(PlatformDriftError) as info:
        select_platform({"FD_PLATFORM": "oldxpu"})
    error = info.value
    assert error.exit_code == 2 and error.distribution == "fd-test-oldxpu"
    flipped = [case for case in error.cases if case.got.create != case.expected.create]
    # create differs where swap space or any storage backend is on in a mixed instance
    assert {(c.inputs.num_cpu_blocks, c.inputs.storage_backend) for c in flipped} == {
        (0, "mooncake"),
        (0, "attention_store"),
        (0, "file"),
        (64, None),
        (64, "mooncake"),
        (64, "attention_store"),
        (64, "file"),
    } and len(flipped) == 7
    assert all(c.inputs.splitwise_role == "mixed" and not c.inputs.profile for c in flipped)
    assert all(case.got.create is True and case.expected.create is False for case in flipped)
    message = str(error)
    assert f"in {len(error.cases)} of {len(TRUTH_TABLE)} cases" in message and "fd-test-oldxpu" in message
    assert len(TRUTH_TABLE) == 48 and len(error.cases) == 21
    assert (
        "profile=False, num_cpu_blocks=64, storage_backend=None, splitwise_role='mixed': "
        "expected create=False (term 'num_cpu_blocks'), got create=True (term 'none')"
    ) in message
    assert "Fix: delete the plugin's should_create_cache_tensor hook" in message


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_drifting_plugin_is_never_selected_by_detection(make_plugin, caplog) -> None:
    drifting(make_plugin)
    selection = select_platform({})
    assert selection.platform.name == "cpu" and "oldxpu broken" in selection.reason
    report = {r.name: r for r in survey({}).reports}["oldxpu"]
    assert report.status == "broken" and "disagrees with the core rule" in report.reason


def test_a_plugin_that_repeats_the_rule_exactly_is_accepted(make_plugin) -> None:
    drifting(make_plugin, "faithful", SAME_AS_THE_RULE)
    platform = select_platform({"FD_PLATFORM": "faithful"}).platform
    assert "should_create_cache_tensor" in platform.implemented_hooks()


def test_an_answer_that_raises_is_a_differing_case(make_plugin) -> None:
    drifting(make_plugin, "partial", RAISES_ON_DECODE)
    with pytest.raises(PlatformDriftError) as info:
        select_platform({"FD_PLATFORM": "partial"})
    assert len(info.value.cases) == sum(case.splitwise_role == "decode" for case in TRUTH_TABLE) == 16
    assert "got PluginError: " in str(info.value) and "decode is not supported" in str(info.value)


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_the_cli_refuses_it_in_one_line_per_case(make_plugin) -> None:
    drifting(make_plugin)
    done = main_in_process("list", "--json", FD_PLATFORM="oldxpu")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n  - profile=") == 21  # 7 flipped decisions, 14 with another deciding term
    assert "disagrees with the core rule" in json.loads(done.stdout)["error"]


MOONCAKE_ONLY = """    # a backend test that knows only mooncake: `storage_backend == "mooncake"` for `storage_backend`
    create = profile or not (num_cpu_blocks > 0 or storage_backend == "mooncake" or splitwise_role != "mixed")
    return decide_cache_creation(profile=profile, num_cpu_blocks=num_cpu_blocks,
                                 storage_backend=storage_backend if not create else None,
                                 splitwise_role=splitwise_role)
"""
SWAP_THRESHOLD = """    # treats a little swap space as none: passes every table case (0 and 64 CPU blocks)
    # and drifts between
    blocks = num_cpu_blocks if num_cpu_blocks == 0 or num_cpu_blocks >= 64 else 0
    return decide_cache_creation(profile=profile, num_cpu_blocks=blocks,
                                 storage_backend=storage_backend, splitwise_role=splitwise_role, rule=rule)
"""


def test_a_rule_that_knows_one_storage_backend_is_refused_at_load(make_plugin) -> None:
    """A guard that sampled only None and mooncake let `== "mooncake"` through: every backend is sampled."""
    drifting(make_plugin, "onebackend", MOONCAKE_ONLY)
    with pytest.raises(PlatformDriftError) as info:
        select_platform({"FD_PLATFORM": "onebackend"})
    backends = {case.inputs.storage_backend for case in info.value.cases}
    assert backends == {"attention_store", "file"}


def test_a_drift_outside_the_table_passes_load_and_is_refused_at_the_call(make_plugin) -> None:
    drifting(make_plugin, "threshold", SWAP_THRESHOLD)
    platform = select_platform({"FD_PLATFORM": "threshold"}).platform  # every table case agrees
    assert (
        platform.should_create_cache_tensor(
            profile=False, num_cpu_blocks=64, storage_backend=None, splitwise_role="mixed"
        ).create
        is False
    )
    with pytest.raises(PlatformDriftError) as info:
        platform.should_create_cache_tensor(
            profile=False, num_cpu_blocks=10, storage_backend=None, splitwise_role="mixed"
        )
    message = str(info.value)
    assert "disagrees with the core rule" in message and "on the inputs of this call" in message
    assert (
        "profile=False, num_cpu_blocks=10, storage_backend=None, splitwise_role='mixed': "
        "expected create=False (term 'num_cpu_blocks'), got create=True (term 'none')"
    ) in message
    [case] = info.value.cases
    assert case.inputs.num_cpu_blocks == 10


@pytest.mark.parametrize("command", ["plan", "run"])
def test_the_call_check_stops_plan_and_run_before_a_worker_creates_wrongly(make_plugin, command: str) -> None:
    drifting(make_plugin, "threshold", SWAP_THRESHOLD)
    done = main_in_process(
        command,
        "--model",
        "examples/qwen3-30b-a3b",
        "--device-memory",
        "1GiB",
        "--swap-space",
        "12MiB",
        FD_PLATFORM="threshold",
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert re.search(
        r"num_cpu_blocks=2, storage_backend=None, splitwise_role='mixed': expected create=False "
        r"\(term 'num_cpu_blocks'\), got create=True",
        done.stderr,
    ), done.stderr
    assert "on the inputs of this call" in done.stderr


# -- max_num_blocks: fewer blocks than memory allows only through a declared limit -----------------

CAPPED = (
    ALWAYS_THERE
    + """
@hookimpl
def device_memory(device_id):
    return DeviceMemory(2**30, None, 0, "stated")

@hookimpl
def declared_limits():
    return {limits}

@hookimpl
def max_num_blocks(layout, memory, cache, limits, non_cache_bytes):
    plan = plan_blocks(layout, memory, cache, non_cache_bytes=non_cache_bytes, limits=limits)
    return dataclasses.replace(plan, num_blocks=min(plan.num_blocks, {cap}))
"""
)
DECLARED = '(PlatformLimit("max_num_blocks", 3, "the block table holds 3 entries"),)'


def capped(make_plugin, name: str, cap: int, limits: str = "()") -> Path:
    return make_plugin(name, source=CAPPED.format(name=name, cap=cap, limits=limits))


def qwen_plan_inputs():
    from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config
    from fd_platforms.rules.layout import build_layout

    cache = CacheConfig()
    return build_layout(load_model_config("examples/qwen3-30b-a3b"), cache, ParallelConfig()), cache


def test_a_plan_with_fewer_blocks_than_memory_and_no_declared_limit_is_drift(make_plugin) -> None:
    from fd_platforms.rules.planner import plan_blocks

    capped(make_plugin, "capped", cap=1)
    platform = select_platform({"FD_PLATFORM": "capped"}).platform
    layout, cache = qwen_plan_inputs()
    core = plan_blocks(layout, platform.device_memory(0), cache)
    assert core.num_blocks > 1 and core.binding == "memory"
    with pytest.raises(PlatformDriftError) as info:
        platform.max_num_blocks(layout=layout, cache=cache)
    message = str(info.value)
    assert message.startswith("platform plugin 'capped' (distribution fd-test-capped): its max_num_blocks answer")
    assert f"num_blocks=1, but the core plans {core.num_blocks} blocks (memory: " in message
    assert "a platform plans fewer blocks only through a declared limit" in message
    assert "Fix: delete the plugin's max_num_blocks hook" in message and "declared_limits" in message


def test_the_same_cap_declared_as_a_limit_is_the_cores_own_plan(make_plugin) -> None:
    capped(make_plugin, "declared", cap=3, limits=DECLARED)
    platform = select_platform({"FD_PLATFORM": "declared"}).platform
    layout, cache = qwen_plan_inputs()
    plan = platform.max_num_blocks(layout=layout, cache=cache)
    assert (plan.num_blocks, plan.binding) == (3, "platform_limit")
    assert plan.binding_reason == "max_num_blocks=3: the block table holds 3 entries"


def test_a_cap_that_does_not_bind_is_no_drift(make_plugin) -> None:
    capped(make_plugin, "loose", cap=10**9)
    platform = select_platform({"FD_PLATFORM": "loose"}).platform
    layout, cache = qwen_plan_inputs()
    assert platform.max_num_blocks(layout=layout, cache=cache).binding == "memory"


def test_plan_refuses_an_undeclared_cap_naming_both_counts(make_plugin) -> None:
    capped(make_plugin, "capped", cap=1)
    done = main_in_process("plan", "--model", "examples/qwen3-30b-a3b", "--device-memory", "1GiB", FD_PLATFORM="capped")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert re.search(r"num_blocks=1, but the core plans \d+ blocks \(memory: ", done.stderr), done.stderr
    assert "binding: memory" not in done.stdout


ONE_VERSION_ONLY = """    # the default version, whatever the engine pinned
    return decide_cache_creation(profile=profile, num_cpu_blocks=num_cpu_blocks,
                                 storage_backend=storage_backend, splitwise_role=splitwise_role)
"""

NEWER_VERSION_ONLY = """    # FastDeploy's rule since PR #7471, whatever the engine pinned
    return decide_cache_creation(profile=profile, num_cpu_blocks=num_cpu_blocks,
                                 storage_backend=storage_backend, splitwise_role=splitwise_role, rule="2026-04")
"""


@pytest.mark.parametrize(
    ("body", "version", "cases"), [(NEWER_VERSION_ONLY, "2026-01", 12), (ONE_VERSION_ONLY, "2026-04", 12)]
)
def test_a_plugin_answering_one_rule_version_whatever_is_pinned_is_refused_at_load(
    make_plugin, body: str, version: str, cases: int
) -> None:
    drifting(make_plugin, "oneversion", body)
    with pytest.raises(PlatformDriftError) as info:
        select_platform({"FD_PLATFORM": "oneversion"})
    message = str(info.value)
    assert f"(version {version}) in {cases} of {len(TRUTH_TABLE)} cases" in message
    assert len(info.value.cases) == cases and all(case.inputs.rule == version for case in info.value.cases)


def test_the_call_check_holds_the_plugin_to_the_pinned_version(make_plugin) -> None:
    drifting(make_plugin, "faithful", SAME_AS_THE_RULE)
    platform = select_platform({"FD_PLATFORM": "faithful"}).platform
    swap = {"profile": False, "num_cpu_blocks": 64, "storage_backend": None, "splitwise_role": "mixed"}
    assert platform.should_create_cache_tensor(**swap).create is False
    newer = platform.should_create_cache_tensor(**swap, rule="2026-04")
    assert newer.create is True and "rule 2026-04: host swap space does not decide" in newer.reason
    with pytest.raises(ConfigError, match="rule='2026-13' is not valid; allowed: one of 2026-01, 2026-04"):
        platform.should_create_cache_tensor(**swap, rule="2026-13")
