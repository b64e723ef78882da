"""The create-or-attach rule as a named, versioned thing: the engine pins a version, every platform decides by it."""

from __future__ import annotations

import json

import pytest
from run_helpers import QWEN, ROOT, console_script
from run_helpers import main_on_cpu as cli

from fd_platforms.contract.errors import ConfigError
from fd_platforms.rules.config import CacheConfig, load_deploy_config
from fd_platforms.rules.decision import (
    DEFAULT_RULE,
    RULE,
    RULE_VERSIONS,
    TRUTH_TABLE,
    decide_cache_creation,
    differing_cases,
)

SWAP_MIXED = {"profile": False, "num_cpu_blocks": 64, "storage_backend": None, "splitwise_role": "mixed"}


def test_each_version_is_one_entry_with_its_formula() -> None:
    assert list(RULE_VERSIONS) == ["2026-01", "2026-04", "2026-06"] and DEFAULT_RULE == "2026-01"
    assert (
        RULE
        == RULE_VERSIONS["2026-01"].text
        == ('profile or not (num_cpu_blocks > 0 or storage_backend or splitwise_role != "mixed")')
    )
    assert RULE_VERSIONS["2026-04"].text == 'profile or not (storage_backend or splitwise_role != "mixed")'
    assert RULE_VERSIONS["2026-06"].text == 'profile or not (splitwise_role != "mixed")'


def test_2026_06_differs_from_2026_04_exactly_where_a_storage_backend_decides() -> None:
    """PR #8046: a mixed instance's worker creates with a storage backend too; nothing else changed."""
    differing = differing_cases("2026-04", "2026-06")
    assert len(differing) == 6 and {inputs.num_cpu_blocks for inputs, _ in differing} == {0, 64}
    for inputs, answers in differing:
        assert inputs.storage_backend and inputs.splitwise_role == "mixed" and not inputs.profile
        assert (answers["2026-04"].deciding_term, answers["2026-06"].create) == ("storage_backend", True)


def test_the_versions_differ_exactly_where_swap_space_alone_decides() -> None:
    [(inputs, answers)] = differing_cases("2026-01", "2026-04")  # the one case
    old, new = answers["2026-01"], answers["2026-04"]
    assert {k: v for k, v in inputs.kwargs().items() if k != "rule"} == SWAP_MIXED
    assert (old.create, old.deciding_term, new.create, new.deciding_term) == (False, "num_cpu_blocks", True, "none")
    for case in TRUTH_TABLE:  # everywhere else the newer version is the older one without its swap term
        kwargs = {k: v for k, v in case.kwargs().items() if k != "rule"}
        without_swap = decide_cache_creation(**{**kwargs, "num_cpu_blocks": 0})
        assert decide_cache_creation(**kwargs, rule="2026-04").create == without_swap.create


def test_an_unknown_version_names_the_field_and_the_versions() -> None:
    with pytest.raises(ConfigError, match=r"rule='2027-01' is not valid; allowed: one of 2026-01, 2026-04, 2026-06"):
        CacheConfig(rule="2027-01")
    with pytest.raises(ConfigError) as info:
        CacheConfig(rule="2027-01")
    assert "Fix: pin a listed rule version, or leave it unset for 2026-01" in str(info.value)


def test_the_toml_pins_the_version(tmp_path) -> None:
    toml = tmp_path / "deploy.toml"
    toml.write_text(f'[model]\npath = "{ROOT / QWEN}"\n[cache]\nrule = "2026-04"\n')
    assert load_deploy_config(toml).cache.rule == "2026-04"


def test_rules_prints_the_versions_side_by_side_and_the_cases_where_they_differ() -> None:
    table = cli("rules")
    assert table.returncode == 0, table.stderr
    assert "2026-01 (default)" in table.stdout and RULE_VERSIONS["2026-04"].text in table.stdout
    assert RULE_VERSIONS["2026-06"].text in table.stdout
    assert f"7 of {len(TRUTH_TABLE)} cases decide differently" in table.stdout  # swap space or storage, mixed
    swap_only = next(line for line in table.stdout.splitlines() if "num_cpu_blocks=64, storage_backend=None" in line)
    assert swap_only.split()[4:] == ["attach", "(num_cpu_blocks)", "create", "(none)", "+tm", "create", "(none)", "+tm"]
    payload = json.loads(cli("rules", "--json").stdout)
    assert payload["default"] == DEFAULT_RULE and [v["name"] for v in payload["versions"]] == list(RULE_VERSIONS)
    assert len(payload["differing"]) == 7
    assert {
        "inputs": SWAP_MIXED,
        "create": {"2026-01": False, "2026-04": True, "2026-06": True},
        "deciding_term": {"2026-01": "num_cpu_blocks", "2026-04": "none", "2026-06": "none"},
        "attachers": {
            "2026-01": ["worker"],
            "2026-04": ["cache transfer manager"],
            "2026-06": ["cache transfer manager"],
        },
    } in payload["differing"]


def test_plan_decides_by_the_pinned_version_and_names_it() -> None:
    args = ("plan", "--model", QWEN, "--device-memory", "80GiB", "--swap-space", "1", "--json")
    default, newer = json.loads(cli(*args).stdout), json.loads(cli(*args, "--rule", "2026-04").stdout)
    assert (default["rule"], default["create_cache_tensor"], default["decision_term"]) == (
        "2026-01",
        False,
        "num_cpu_blocks",
    )
    assert (newer["rule"], newer["create_cache_tensor"], newer["decision_term"]) == ("2026-04", True, "none")
    assert newer["rule_text"] == RULE_VERSIONS["2026-04"].text
    everyone = cli("plan", "--model", QWEN, "--device-memory", "80GiB", "--platform", "all", "--rule", "2026-04")
    assert f"rule version 2026-04: {RULE_VERSIONS['2026-04'].text}" in everyone.stdout


@pytest.mark.slow
@pytest.mark.parametrize("role", ["mixed", "decode"])
def test_both_directions_run_with_swap_space_verified_both_ways_through_cycles(role: str) -> None:
    """Under 2026-04 with swap space a mixed instance's workers create and the cache manager attaches to
    hold the host swap cache; a decode instance (and every role under 2026-01) goes the other way."""
    for rule in ("2026-01", "2026-04"):
        done = console_script(
            "run",
            "--model",
            QWEN,
            "--tp",
            "2",
            "--device-memory",
            "256MiB",
            "--swap-space",
            "32MiB",
            "--role",
            role,
            "--rule",
            rule,
            "--cycles",
            "2",
            "--json",
        )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["rule"] == rule
        reversed_ = rule == "2026-04" and role == "mixed"
        for rank in report["ranks"]:
            assert rank["create"] is reversed_ and rank["verified"] is True
            assert rank["allocated_by"] == ("worker" if reversed_ else "cache manager")
            assert rank["attached_by"] == ("cache manager" if reversed_ else "worker")
            assert rank["attached_tensors"] == 96 and rank["num_cpu_blocks"] == 10 and rank["host_bytes"] > 0
        assert [cycle["verified"] for cycle in report["cycles"]] == [True, True]


@pytest.mark.slow
@pytest.mark.usefixtures("fastdeploy_record_names")  # FastDeploy's record names are the machine's
@pytest.mark.parametrize("protocol", ["fd-platforms", "fastdeploy"])
def test_under_2026_06_a_storage_backend_without_swap_space_has_the_workers_create_and_the_manager_attach(
    protocol: str,
) -> None:
    """PR #8046: the transfer manager FastDeploy starts for a storage backend attaches to the worker's cache, swap
    space or not; the run starts its cache manager for it, which attaches and holds no host cache (before: no
    manager started, and under FastDeploy's protocol the workers' clear waited for an attacher that never came)."""
    done = console_script(
        "run",
        "--model",
        QWEN,
        "--tp",
        "2",
        "--device-memory",
        "256MiB",
        "--storage-backend",
        "file",
        "--rule",
        "2026-06",
        "--protocol",
        protocol,
        "--cycles",
        "1",
        "--timeout",
        "60",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for rank in report["ranks"]:
        assert (rank["create"], rank["verified"], rank["attached_by"]) == (True, True, "cache manager")
        assert rank["num_cpu_blocks"] == 0
    assert [cycle["verified"] for cycle in report["cycles"]] == [True]


def test_a_platform_that_cannot_share_is_refused_the_manager_attaching_before_any_process_starts(make_plugin) -> None:
    make_plugin("loner")  # the template plugin: no cache_sharing
    done = cli(
        "run",
        "--platform",
        "loner",
        "--model",
        QWEN,
        "--tp",
        "2",
        "--device-memory",
        "256MiB",
        "--swap-space",
        "32MiB",
        "--rule",
        "2026-04",
    )
    assert done.returncode == 2
    [line] = done.stderr.splitlines()  # nothing started, nothing else said
    assert line.startswith("fd-platforms: error: --rule='2026-04' is not valid") and "loner, which cannot share" in line
    assert "Fix: pin --rule 2026-01 (the default)" in line


@pytest.mark.slow
def test_run_under_the_newer_version_without_swap_space_works_as_before() -> None:
    done = console_script(
        "run",
        "--model",
        QWEN,
        "--tp",
        "2",
        "--device-memory",
        "256MiB",
        "--role",
        "decode",
        "--rule",
        "2026-04",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    ranks = json.loads(done.stdout)["ranks"]
    assert [(rank["create"], rank["decided_by"], rank["verified"]) for rank in ranks] == [
        (False, "splitwise_role", True)
    ] * 2


@pytest.mark.slow
def test_check_holds_each_platform_to_the_pinned_version() -> None:
    done = cli("check", "cpu", "--rule", "2026-04", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    payload = json.loads(done.stdout)
    assert payload["rule"] == "2026-04" and payload["platforms"][0]["checks"]["decision"]["status"] == "pass"


def test_a_manager_the_rule_sends_to_attach_on_a_platform_that_cannot_share_is_refused_naming_the_fix(
    make_plugin,
) -> None:
    from fd_platforms.contract.errors import CacheSharingError
    from fd_platforms.engine import CacheRequest, manage_kv_cache
    from fd_platforms.loading.selection import select_platform
    from fd_platforms.rules.config import ParallelConfig, load_model_config
    from fd_platforms.rules.layout import build_layout

    make_plugin("loner")  # the template plugin: no cache_sharing
    platform = select_platform({"FD_PLATFORM": "loner"}).platform
    layout = build_layout(load_model_config(ROOT / QWEN), CacheConfig(), ParallelConfig())
    request = CacheRequest(
        layout=layout,
        num_blocks=4,
        num_cpu_blocks=2,
        splitwise_role="mixed",
        rule="2026-04",
        instance="fd_cache_ready.x",
    )
    with pytest.raises(CacheSharingError) as info:
        manage_kv_cache(platform, request)
    message = str(info.value)
    assert "platform loner cannot share KV cache tensors" in message and "cannot attach to a worker's cache" in message
    assert "Fix: pin a rule version under which the cache manager creates it (2026-01)" in message
