"""The rule in force is never a guess: beside FastDeploy, in the cases where the rule's versions
decide differently (a mixed instance with host swap space or a storage backend), a rule nobody pinned is
refused at every entry point, and a wait that times out there names the other versions.

FastDeploy's IPC has no word that says who creates: its runner decides by its own version of the
rule (``fastdeploy/worker/gpu_model_runner.py`` ``initialize_kv_cache``) and its cache transfer
manager creates only when started with ``--create_cache_tensor``
(``fastdeploy/cache_manager/cache_transfer_manager.py`` ``_init_gpu_cache``, which otherwise waits
for the runner's cache).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from engine_processes import qwen_layout
from kv_requests import kv_request
from run_helpers import QWEN, ROOT, console_script
from run_helpers import main_on_cpu as cli

from fd_platforms.contract.errors import CacheNotReadyError, ConfigError, SignalWaitError
from fd_platforms.engine import initialize_kv_cache, manage_kv_cache
from fd_platforms.fastdeploy.signals import FastDeploySignal
from fd_platforms.ipc.cache_signal import CacheReadySignal

#: The case where 2026-01 differs from 2026-04 and 2026-06 (``fd-platforms rules`` lists it).
DISAGREE = {"profile": False, "num_cpu_blocks": 4, "storage_backend": None, "splitwise_role": "mixed"}
BLOCKS = 4
SUFFIX = "9923"  # no signal of that suffix is ever made: a refusal comes before any is touched


@pytest.fixture
def no_hook(cpu, monkeypatch):
    """The cpu platform, every hook the calls below could reach failing the test if it runs."""

    def hook_ran(*args, **kwargs):
        raise AssertionError("a hook ran before the caller's arguments were checked")

    for name in ("cache_layout", "should_create_cache_tensor", "cache_sharing"):
        monkeypatch.setattr(cpu, name, hook_ran)
    return cpu


def clear_created(cache, suffix: str) -> None:
    """Clear a cache this process created, its attacher's let-go first: FastDeploy's cache transfer
    manager, where it attached, resets its rank's ``cache_ready_signal`` word when it lets go
    (``cache_manager/cache_transfer_manager.py`` ``_clear_gpu_cache``); nobody attached here, so the
    test writes it."""
    with FastDeploySignal.attach("cache_ready_signal", suffix) as ready:
        ready.set(0, 0)
    cache.clear(timeout=5)


def assert_names_both_versions(error: ConfigError, field: str) -> None:
    message = str(error)
    assert error.field == field and error.value is None, message
    assert f"{field} is not given" in message
    assert "2026-01 (FastDeploy before 2026-04-29)" in message
    assert "2026-04 (FastDeploy from PR #7471 (2026-04-29) to PR #8046)" in message
    assert "2026-06 (FastDeploy from PR #8046 (2026-06-15) on)" in message
    assert "the cache transfer manager creates; the worker attaches" in message
    assert "the worker creates; the cache transfer manager attaches" in message
    assert "host swap space (num_cpu_blocks=4), no storage backend and role mixed" in message
    assert "Fix: pin the rule version of the FastDeploy beside this engine" in message
    assert "--rule on the command line, rule under [cache] in the deploy file" in message


# -- the refusal, at each entry point -------------------------------------------------------------


def test_an_unpinned_runner_beside_fastdeploy_is_refused_before_any_hook(no_hook) -> None:
    with pytest.raises(ConfigError) as caught:
        initialize_kv_cache(
            no_hook, kv_request(qwen_layout(), BLOCKS, instance=SUFFIX, protocol="fastdeploy", **DISAGREE)
        )
    assert_names_both_versions(caught.value, "rule")
    assert "rule= in the Python API" in str(caught.value)


def test_an_unpinned_cache_manager_beside_fastdeploy_is_refused_before_any_hook(no_hook) -> None:
    with pytest.raises(ConfigError) as caught:
        manage_kv_cache(
            no_hook, kv_request(qwen_layout(), BLOCKS, num_cpu_blocks=4, instance=SUFFIX, protocol="fastdeploy")
        )
    assert_names_both_versions(caught.value, "rule")


def test_run_beside_fastdeploy_without_a_rule_is_refused_before_any_process_starts() -> None:
    ours = f"fdp{os.getpid()}-"  # the suffix of the signals a run in this process would create
    done = cli(
        "run",
        "--model",
        QWEN,
        "--tp",
        "2",
        "--device-memory",
        "256MiB",
        "--swap-space",
        "32MiB",
        "--protocol",
        "fastdeploy",
    )
    assert done.returncode == 2
    [line] = done.stderr.splitlines()  # nothing started, nothing else said
    assert line.startswith("fd-platforms: error: --rule is not given; allowed: a pinned version"), line
    assert "2026-01 (FastDeploy before 2026-04-29)" in line and "2026-04 (FastDeploy from PR #7471" in line
    assert not [name for name in os.listdir("/dev/shm") if ours in name], "no signal was created"


def test_plan_beside_fastdeploy_without_a_rule_is_refused_and_decides_by_a_pinned_one() -> None:
    args = ("plan", "--model", QWEN, "--device-memory", "80GiB", "--swap-space", "1", "--json")
    refused = cli(*args, "--protocol", "fastdeploy")
    assert refused.returncode == 2 and "--rule is not given" in refused.stderr
    for rule, create in (("2026-01", False), ("2026-04", True)):
        pinned = json.loads(cli(*args, "--protocol", "fastdeploy", "--rule", rule).stdout)
        assert (pinned["rule"], pinned["create_cache_tensor"]) == (rule, create)


def deploy_file(tmp_path: Path, rule: str | None) -> Path:
    toml = tmp_path / "deploy.toml"
    pinned = "" if rule is None else f'rule = "{rule}"\n'
    toml.write_text(
        f'[model]\npath = "{ROOT / QWEN}"\n[cache]\nswap_space = "32MiB"\n{pinned}'
        '[scheduler]\nprotocol = "fastdeploy"\n'
    )
    return toml


def test_a_deploy_file_beside_fastdeploy_without_a_rule_is_refused(tmp_path: Path) -> None:
    done = cli("run", "--config", str(deploy_file(tmp_path, None)), "--tp", "2", "--device-memory", "256MiB")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "--rule is not given" in line and "rule under [cache] in the deploy file" in line


def test_a_deploy_file_that_pins_the_rule_is_planned_by_it(tmp_path: Path) -> None:
    done = cli("plan", "--config", str(deploy_file(tmp_path, "2026-04")), "--device-memory", "80GiB", "--json")
    assert done.returncode == 0, done.stderr
    assert (json.loads(done.stdout)["rule"], json.loads(done.stdout)["create_cache_tensor"]) == ("2026-04", True)


# -- no refusal: pinned, where the versions agree, under our protocol -----------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("fastdeploy_record_names")
@pytest.mark.parametrize("rule", ["2026-01", "2026-04"])
def test_run_beside_fastdeploy_goes_the_way_its_pinned_rule_says(rule: str) -> None:
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
        "--protocol",
        "fastdeploy",
        "--rule",
        rule,
        "--cycles",
        "1",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["rule"], report["protocol"]) == (rule, "fastdeploy")
    workers_create = rule == "2026-04"  # FastDeploy from PR #7471 on: the runner creates, the manager attaches
    assert [(rank["create"], rank["verified"]) for rank in report["ranks"]] == [(workers_create, True)] * 2
    assert [cycle["verified"] for cycle in report["cycles"]] == [True]


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_pinned_runner_beside_fastdeploy_decides_by_its_pin(cpu, fastdeploy_suffix) -> None:
    cache = initialize_kv_cache(
        cpu,
        kv_request(
            qwen_layout(), BLOCKS, instance=fastdeploy_suffix, protocol="fastdeploy", rule="2026-04", **DISAGREE
        ),
    )
    assert cache.created and cache.decision.deciding_term == "none"  # FastDeploy from PR #7471 on: the runner creates
    clear_created(cache, fastdeploy_suffix)


@pytest.mark.parametrize(
    "agreeing",
    [{"profile": True}, {"num_cpu_blocks": 0}, {"splitwise_role": "decode"}],
    ids=["profile", "no swap space", "decode"],
)
def test_where_the_versions_agree_an_unpinned_rule_is_no_question(cpu, fastdeploy_suffix, agreeing) -> None:
    inputs = {**DISAGREE, **agreeing}
    try:
        cache = initialize_kv_cache(
            cpu,
            kv_request(
                qwen_layout(), BLOCKS, instance=fastdeploy_suffix, protocol="fastdeploy", timeout=0.05, **inputs
            ),
        )
    except SignalWaitError as error:  # sent to attach, as both versions decide; nobody creates here
        assert "rule" not in str(error), "no rule could be at fault where both versions decide alike"
        assert inputs["storage_backend"] or inputs["splitwise_role"] != "mixed"
    else:
        assert cache.created
        clear_created(cache, fastdeploy_suffix)


def test_under_our_protocol_an_unpinned_rule_is_2026_01_as_before(cpu, signal_name) -> None:
    with CacheReadySignal.create(1, signal_name), pytest.raises(CacheNotReadyError) as caught:
        initialize_kv_cache(cpu, kv_request(qwen_layout(), BLOCKS, instance=signal_name, timeout=0.05, **DISAGREE))
    assert caught.value.cause == "timeout"  # 2026-01: swap space on, the runner waited for a cache manager


# -- a wait that times out in the disagreeing case names the other version ------------------------


def test_a_runner_pinned_to_2026_01_that_times_out_names_the_newer_fastdeploy(cpu, fastdeploy_suffix) -> None:
    with pytest.raises(SignalWaitError) as caught:
        initialize_kv_cache(
            cpu,
            kv_request(
                qwen_layout(),
                BLOCKS,
                instance=fastdeploy_suffix,
                protocol="fastdeploy",
                rule="2026-01",
                timeout=0.05,
                **DISAGREE,
            ),
        )
    message = str(caught.value)
    assert caught.value.cause == "timeout" and "the limit is 0.05 s" in message
    assert "pinned rule 2026-01 (FastDeploy before 2026-04-29)" in message
    assert (
        "under rule 2026-04 (FastDeploy from PR #7471 (2026-04-29) to PR #8046) the worker creates; the cache "
        "transfer manager attaches" in message
    )
    assert "under rule 2026-06 (FastDeploy from PR #8046 (2026-06-15) on) the worker creates" in message
    assert "each side waits for the other" in message and "pin rule 2026-04 or 2026-06" in message


def test_a_manager_pinned_to_2026_04_that_times_out_names_the_older_fastdeploy(cpu, fastdeploy_suffix) -> None:
    with pytest.raises(SignalWaitError) as caught:
        manage_kv_cache(
            cpu,
            kv_request(
                qwen_layout(),
                BLOCKS,
                num_cpu_blocks=4,
                instance=fastdeploy_suffix,
                protocol="fastdeploy",
                rule="2026-04",
                timeout=0.05,
            ),
        )
    message = str(caught.value)
    assert "pinned rule 2026-04 (FastDeploy from PR #7471 (2026-04-29) to PR #8046)" in message
    assert (
        "under rule 2026-01 (FastDeploy before 2026-04-29) the cache transfer manager creates; the worker attaches"
        in message
    )
    assert "pin rule 2026-01" in message


def test_a_storage_backend_in_a_mixed_instance_needs_a_pin_since_fastdeploy_8046() -> None:
    """PR #8046 (2026-06-15) makes the worker create with a storage backend, where 2026-01 and 2026-04 had it attach:
    unpinned, that case is refused too, naming who creates under each version."""
    storage = {**DISAGREE, "num_cpu_blocks": 0, "storage_backend": "file"}
    with pytest.raises(ConfigError) as caught:
        kv_request(qwen_layout(), BLOCKS, instance=SUFFIX, protocol="fastdeploy", **storage)
    message = str(caught.value)
    assert caught.value.field == "rule" and "no swap space, storage backend file and role mixed" in message
    assert (
        "2026-04 (FastDeploy from PR #7471 (2026-04-29) to PR #8046): the cache transfer manager creates; the worker "
        "attaches; 2026-06 (FastDeploy from PR #8046 (2026-06-15) on): the worker creates; the cache transfer manager "
        "attaches" in message
    )
    assert kv_request(qwen_layout(), BLOCKS, instance=SUFFIX, protocol="fastdeploy", rule="2026-06", **storage)
