"""What each FastDeploy line runs on each platform, as data with its source: shown by ``fd-platforms rules
--fastdeploy``, pinned by ``from_fd_config(..., fastdeploy=, platform=)``, and refused, named, where that line would
allocate one cache twice, leave it with no creator, or free it under an attacher."""

from __future__ import annotations

import json

import pytest
from fastdeploy_config_standin import fd_config
from run_helpers import QWEN, main_in_process

from fd_platforms.contract.errors import ConfigError
from fd_platforms.fastdeploy.config import from_fd_config
from fd_platforms.fastdeploy.releases import SNAPSHOTS, line_on, snapshots
from fd_platforms.rules.decision import RULE_VERSIONS, DecisionInputs


def mixed(num_cpu_blocks: int = 0, backend: str | None = None) -> DecisionInputs:
    return DecisionInputs(False, num_cpu_blocks, backend, "mixed")


def test_release_2_6_as_of_june_2_on_xpu_allocates_twice_with_a_storage_backend_and_is_refused() -> None:
    """release/2.6 @41677b9a6: the XPU runner decides by the mixed role while launch_cache_manager still passes
    --create_cache_tensor for a storage backend (PR #7420's bug, back)."""
    with pytest.raises(ConfigError) as caught:
        line_on("2.6@2026-06-02", "xpu", mixed(backend="mooncake"))
    message = str(caught.value)
    assert caught.value.field == "fastdeploy" and caught.value.value == "2.6@2026-06-02"
    assert "on xpu, with no swap space, storage backend mooncake and role mixed" in message
    assert "both create the rank's cache (it is allocated twice)" in message
    assert "xpu_model_runner.py ~L1256" in message and "41677b9a6" in message
    assert line_on("2.6@2026-06-02", "cuda", mixed(backend="mooncake")).worker_rule == "2026-04"


def test_a_runner_that_frees_without_waiting_for_its_attacher_is_refused_where_one_attaches() -> None:
    """MetaX's clear_cache never waits for its transfer manager (c1b7c083 ~L2491, release/2.6 ~L2483)."""
    with pytest.raises(ConfigError, match=r"frees the cache without waiting for the cache transfer manager"):
        line_on("2.6@2026-06-02", "metax", mixed(num_cpu_blocks=64))
    assert line_on("2.6@2026-06-02", "metax", mixed()).worker_rule == "2026-04"  # nothing attaches: fine
    assert line_on("develop@7471", "cuda", mixed(num_cpu_blocks=64)).clear_waits == ("num_cpu_blocks",)


def test_iluvatar_and_dcu_run_the_gpu_runners_entries_and_an_unread_platform_is_named() -> None:
    assert line_on("2.6@8045", "iluvatar", mixed(backend="file")) is line_on("2.6@8045", "cuda", mixed(backend="file"))
    with pytest.raises(ConfigError, match=r"a snapshot read for gcu"):
        line_on("2.6@8045", "gcu", mixed())
    with pytest.raises(ConfigError, match=r"one of develop@2026-01, develop@7471, develop@8046, 2.6@2026-06-02"):
        line_on("2.7", "cuda", mixed())


def test_every_entry_names_a_known_version_and_its_source_and_marks_what_is_inferred() -> None:
    for entry in SNAPSHOTS:
        assert entry.worker_rule in RULE_VERSIONS and entry.launch_rule in RULE_VERSIONS
        assert entry.source
    assert [e.platform for e in snapshots("2.6@8045")] == ["cuda", "xpu", "metax"]
    assert all(e.inferred for e in snapshots("2.6@8045")), "no #8045 hunk of the runners was read"


def test_rules_fastdeploy_prints_the_per_platform_table_with_each_entrys_source() -> None:
    shown = main_in_process("rules", "--fastdeploy", "2.6")
    assert shown.returncode == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines() if line.startswith("2.6@")]
    assert [row[:4] for row in rows] == [
        ["2.6@2026-06-02", "cuda", "2026-04", "2026-04"],
        ["2.6@2026-06-02", "xpu", "2026-06", "2026-04"],
        ["2.6@2026-06-02", "metax", "2026-04", "2026-04"],
        ["2.6@8045", "cuda", "2026-06", "2026-06"],
        ["2.6@8045", "xpu", "2026-06", "2026-06"],
        ["2.6@8045", "metax", "2026-06", "2026-06"],
    ]
    assert rows[1][-3:] == ["swap;", "storage;", "swap+storage"]
    assert "[2] 2.6@2026-06-02 xpu: release/2.6 as merged into r3_eos_2.6 @41677b9a6" in shown.stdout
    assert "inferred, not read:" in shown.stdout
    listed = json.loads(main_in_process("rules", "--fastdeploy", "all", "--json").stdout)
    assert len(listed) == len(SNAPSHOTS) and listed[1]["refused"] == []
    unknown = main_in_process("rules", "--fastdeploy", "2.9")
    assert unknown.returncode == 2 and "fastdeploy='2.9' is not valid" in unknown.stderr


def test_from_fd_config_pins_what_the_line_runs_on_this_platform_or_refuses_it_named() -> None:
    storage = fd_config(QWEN, kvcache_storage_backend="file")
    assert from_fd_config(storage, local_rank=0, fastdeploy="2.6@8045", platform="cuda").rule == "2026-06"
    assert from_fd_config(storage, local_rank=0, fastdeploy="2.6@2026-06-02", platform="cuda").cache.rule == "2026-04"
    with pytest.raises(ConfigError, match=r"allocated twice") as caught:
        from_fd_config(storage, local_rank=0, fastdeploy="2.6@2026-06-02", platform="xpu")
    assert caught.value.field == "fastdeploy"
    with pytest.raises(ConfigError) as caught:
        from_fd_config(storage, local_rank=0, fastdeploy="2.6@8045", platform="cuda", rule="2026-06")
    assert caught.value.field == "rule"
    with pytest.raises(ConfigError) as caught:
        from_fd_config(storage, local_rank=0, fastdeploy="2.6@8045")
    assert caught.value.field == "platform" and "our_platform_name(current_platform)" in str(caught.value)
