"""The conformance kit: ``fd-platforms check``, ``pytest --fd-platform``, hook coverage and the guide.

``check --all`` runs every platform's suite once for the module (:func:`checked_all`); the tests of its table and
verdict hand its results to the command again (:func:`replayed`) instead of checking every platform a second time."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from run_helpers import main_in_process

from fd_platforms import API_VERSION
from fd_platforms.cli import check_command
from fd_platforms.conformance import CHECKS
from fd_platforms.conformance.fixtures import suite_files
from fd_platforms.conformance.pytest_plugin import HOOKS_MARKER
from fd_platforms.conformance.runner import (
    ConformanceUnavailableError,
    PlatformResult,
    require_pytest,
    run_suite,
    run_suites,
)
from fd_platforms.conformance.suite import test_device as suite_test_device
from fd_platforms.contract import hookspecs
from fd_platforms.loading.discovery import discover
from fd_platforms.loading.selection import IN_REPO_PLUGINS
from fd_platforms.rules.decision import TRUTH_TABLE
from fd_platforms.rules.shapes import shape_cases

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "nimbus"  # examples/plugin-template, installed by .ci/run
DECISION_TESTS = len(TRUTH_TABLE) + 1 + 3  # every table case, the drift guard's test, three bad inputs
SHAPES_TESTS = len(shape_cases()) + 2  # every load-time case, two allocations in the platform's shapes
DEVICE_TESTS = sum(name.startswith("test_") for name in vars(suite_test_device))  # hardware-only checks
SPECS = {name: getattr(hookspecs, name) for name in hookspecs.hook_names()}

OLD_XPU_PLUGIN = """
from fd_platforms import hookimpl
from fd_platforms.contract.types import CacheDecision, Detection, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity("oldxpu", "oldxpu", None)

@hookimpl
def detect_platform():
    return Detection(False, "no old XPU here. Fix: none, it is a test plugin")

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"

@hookimpl
def should_create_cache_tensor(profile, splitwise_role):
    create = profile or splitwise_role == "mixed"
    return CacheDecision(create, "profile" if profile else ("none" if create else "splitwise_role"), "old XPU rule")
"""


def check(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``fd-platforms check``, in this process: the suites run in pytest processes of their own (with ``env``)."""
    return main_in_process("check", *args, **env)


def checks_of(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {platform["name"]: platform for platform in payload["platforms"]}


@dataclass
class CheckedAll:
    """``check --all --json``'s output, and the results its suites gave the command."""

    done: subprocess.CompletedProcess[str]
    results: list[PlatformResult]


@pytest.fixture(scope="module")
def checked_all() -> CheckedAll:
    """``check --all --json --jobs 2``, run once for the module (every platform's suite: the longest step here)."""
    results: list[PlatformResult] = []

    def kept(*args: Any, **kwargs: Any) -> list[PlatformResult]:
        results.extend(run_suites(*args, **kwargs))
        return results

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(check_command, "run_suites", kept)
        done = check("--all", "--json", "--jobs", "2")
    return CheckedAll(done, results)


def replayed(checked: CheckedAll, *args: str) -> subprocess.CompletedProcess[str]:
    """``fd-platforms check *args`` given the results ``check --all`` found for the platforms it names: the command's
    own table, progress lines and verdict, without running any suite again."""

    def replay(candidates: list[Any], *, finished: Any, **_: Any) -> list[PlatformResult]:
        found = {result.name: result for result in checked.results}
        results = [found[candidate.name] for candidate in candidates]
        for result in results:
            if finished is not None:
                finished(result, 0.0)
        return results

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(check_command, "run_suites", replay)
        return check(*args)


def test_check_all_passes_for_every_installed_platform(checked_all: CheckedAll) -> None:
    done = checked_all.done
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", "no progress lines with --json"
    payload = json.loads(done.stdout)
    assert payload["passed"] is True and payload["checks"] == list(CHECKS) and payload["api_version"] == API_VERSION
    platforms = checks_of(payload)
    assert list(platforms) == list(discover())
    if os.environ.get("CI") and EXAMPLE not in platforms:
        pytest.fail(f"CI must install examples/plugin-template (platform {EXAMPLE!r}) before the tests")
    for name, result in platforms.items():
        assert result["passed"] and result["error"] is None, name
        assert result["checks"]["decision"] == {
            "status": "pass",
            "passed": DECISION_TESTS,
            "failed": 0,
            "skipped": 0,
            "failures": [],
            "skip_reasons": [],
        }, name
        for check_name in ("planner", "host_alloc", "wait"):
            assert result["checks"][check_name]["status"] == "pass", (name, check_name)
    assert all(status["status"] == "pass" for status in platforms["cpu"]["checks"].values())
    for name in IN_REPO_PLUGINS:  # no accelerator here: the device check skips, saying why
        simulated = platforms[name]["checks"]["simulated"]
        assert (simulated["status"], simulated["passed"], simulated["skipped"]) == ("pass", 4, 0), name
        device = platforms[name]["checks"]["device"]
        assert (device["status"], device["passed"], device["failed"]) == ("skip", 0, 0)
        assert all("not available here" in reason and "Fix:" in reason for reason in device["skip_reasons"])


@pytest.mark.parametrize(("platform", "device_type"), [("iluvatar", "iluvatar_gpu"), (EXAMPLE, "nimbus_npu")])
def test_hardware_checks_run_on_the_fake_custom_device(fake_device_root, platform: str, device_type: str) -> None:
    if platform not in discover():
        pytest.skip(f"platform {platform!r} is not installed (pip install ./examples/plugin-template)")
    done = check(platform, "--json", CUSTOM_DEVICE_ROOT=str(fake_device_root(device_type)))
    assert done.returncode == 0, done.stdout + done.stderr
    result = checks_of(json.loads(done.stdout))[platform]
    assert {name: c["status"] for name, c in result["checks"].items()} == dict.fromkeys(CHECKS, "pass")
    assert result["checks"]["device"]["passed"] == DEVICE_TESTS and result["checks"]["identity"]["skipped"] == 0


def test_custom_devices_share_through_the_vendor_runtime_in_the_kits_checks(
    fake_device_root, fake_vendor_runtime
) -> None:
    """With the (fake) vendor runtime loadable, MetaX declares sharing, and the kit's sharing checks run
    (Iluvatar goes through the same kit code; its runs attach in test_run_fake_device.py): a zero-filled export
    that another process opens zero-copy, writes both ways, and an open whose exporter is gone is a
    CacheSharingError."""
    platform = "metax"
    done = check(
        platform,
        "--json",
        CUSTOM_DEVICE_ROOT=str(fake_device_root("metax_gpu")),
        LD_LIBRARY_PATH=str(fake_vendor_runtime),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = checks_of(json.loads(done.stdout))[platform]
    sharing = result["checks"]["sharing"]
    assert (sharing["status"], sharing["passed"], sharing["failed"]) == ("pass", 3, 0), sharing
    assert sharing["skip_reasons"] == [f"{platform} shares cache tensors between processes"]
    assert result["checks"]["host_alloc"]["status"] == "pass"


def test_a_drifting_plugin_fails_the_decision_check_with_its_cases(make_plugin) -> None:
    site = make_plugin("oldxpu", source=OLD_XPU_PLUGIN)
    done = check("oldxpu", "--json", PYTHONPATH=str(site))
    assert done.returncode == 1, done.stderr
    result = checks_of(json.loads(done.stdout))["oldxpu"]
    assert result["passed"] is False
    decision = result["checks"]["decision"]
    # 21 differing cases and the guard's test; bad inputs are the core's ConfigError before the hook runs
    assert decision["status"] == "fail" and decision["failed"] == 21 + 1
    failed_cases = [f["test"] for f in decision["failures"]]
    assert not any("test_bad_inputs_are_config_errors" in case for case in failed_cases)
    assert (
        "test_decision.py::test_answers_as_the_rule[profile=False, num_cpu_blocks=64, storage_backend=None, "
        "splitwise_role='mixed']" in failed_cases
    )
    guard = next(f["message"] for f in decision["failures"] if "drift_guard" in f["test"])
    assert f"in 21 of {len(TRUTH_TABLE)} cases" in guard
    assert all(result["checks"][name]["status"] != "fail" for name in CHECKS if name != "decision")
    table = check("oldxpu", PYTHONPATH=str(site))
    assert (
        table.returncode == 1 and f"FAIL 22/{DECISION_TESTS}" in table.stdout and "some platforms FAIL" in table.stdout
    )


INT_MEMORY_MODULE = """
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity("intmem", "intmem", None)

@hookimpl
def detect_platform():
    return Detection(False, "no intmem device here. Fix: none, it is a test plugin")

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"

@hookimpl
def device_memory(device_id):
    return 80 * 2**30
"""

INT_MEMORY_SUBCLASS = """
from fd_platforms import hookimpl
from fd_platforms.kit.custom_device import CustomDeviceFacts
from fd_platforms.kit.paddle_platform import PaddlePlatform

class IntMemory(PaddlePlatform):
    @hookimpl
    def device_memory(self, device_id):
        count = self.device_facts().confirm().device_count  # asks Paddle: the simulated one in the kit
        return count * 80 * 2**30

PLATFORM = IntMemory(name="intmem", device_type="intmem_npu", visible_devices_env=None,
                     distributions=("paddle-intmem-npu",), device_glob=None, install_hint="x",
                     api_versions=">=1.0,<2", description="a test plugin", facts=CustomDeviceFacts)
"""


@pytest.mark.parametrize(
    ("source", "attribute"),
    [(INT_MEMORY_MODULE, None), (INT_MEMORY_SUBCLASS, "PLATFORM")],
    ids=["module-hook", "paddle-platform-override"],
)
def test_a_device_memory_of_the_wrong_type_fails_without_hardware(make_plugin, source: str, attribute: str) -> None:
    site = make_plugin("intmem", source=source, attribute=attribute)
    done = check("intmem", "--json", PYTHONPATH=str(site))
    assert done.returncode == 1, done.stdout + done.stderr
    result = checks_of(json.loads(done.stdout))["intmem"]
    simulated = result["checks"]["simulated"]
    assert simulated["status"] == "fail", simulated
    messages = " ".join(failure["message"] for failure in simulated["failures"])
    assert "hook device_memory returned int" in messages and "it must return DeviceMemory" in messages
    assert result["checks"]["device"]["status"] == "skip", "the hardware-only check could not have found it"


def test_the_guides_matrix_is_what_check_all_prints(checked_all: CheckedAll) -> None:
    done = replayed(checked_all, "--all")
    assert done.returncode == 0, done.stdout + done.stderr
    progress = done.stderr.splitlines()  # a line per platform as its suite ends, in any order
    assert sorted(
        re.fullmatch(r"fd-platforms: checked (\w+) \(\d+ of \d+\): ok in [0-9.]+ s", line).group(1) for line in progress
    ) == sorted(discover()), progress  # type: ignore[union-attr]
    assert [line.split("(")[1].split(")")[0] for line in progress] == [
        f"{k} of {len(progress)}" for k in range(1, len(progress) + 1)
    ]
    matrix = done.stdout.split("\n\n")[0].splitlines()
    guide = (ROOT / "docs" / "writing-a-plugin.md").read_text()
    start = re.search(r"```text\nPLATFORM +IDENTITY", guide)
    assert start is not None, "docs/writing-a-plugin.md shows the matrix"
    block = guide[start.start() :].split("```")[1].splitlines()[1:]
    assert [line for line in block if line.strip()] == matrix
    assert matrix[0].split() == ["PLATFORM", *(name.upper() for name in CHECKS), "RESULT"]
    assert {row.split()[0]: row.split()[-1] for row in matrix[1:]} == dict.fromkeys(discover(), "ok")
    assert re.search(rf"\nall platforms pass[^\n]* \(plugin API {re.escape(API_VERSION)}\)$", done.stdout.rstrip())


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("nosuch",), "NAME='nosuch' is not valid; allowed: an installed platform. Choose one of: cpu"),
        (("--all", "cpu"), "platform names or --all, not both"),
        (("cpu", "--jobs", "0"), "--jobs=0"),
    ],
)
def test_usage_errors_exit_2_in_one_line(args: tuple[str, ...], words: str) -> None:
    done = check(*args)
    assert done.returncode == 2 and words in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_check_without_pytest_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ConformanceUnavailableError, match=r"Fix: pip install 'pytest>=8'"):
        require_pytest()


def test_pytest_fd_platform_runs_the_suite_beside_a_projects_own_tests(tmp_path: Path) -> None:
    """What a vendor team types in its own repository: its tests and the suite, in one run."""
    (tmp_path / "test_own.py").write_text("def test_vendor_specific():\n    assert True\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--fd-platform", "cpu", "test_own.py", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    # identity, decision, shapes, planner, host_alloc, wait, sharing, simulated (cpu: device_memory as it is), device
    suite_size = 6 + DECISION_TESTS + SHAPES_TESTS + 9 + 14 + 5 + 3 + 1 + DEVICE_TESTS
    assert f"{suite_size} passed, 5 skipped" in summary, summary  # no limit, it can share, no simulated paddle (3)
    assert "No ccache found" not in done.stdout


OTHER_WORK_PLUGIN = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    raise RuntimeError("failed by a pytest plugin installed for other work")
"""


def test_a_pytest_plugin_installed_for_other_work_never_changes_the_kits_verdict(tmp_path: Path) -> None:
    """pytest loads every installed plugin (entry point group pytest11) into every run; the kit's suite
    process loads its own alone, so one that fails every test leaves check's verdict as it was."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "other_work_plugin.py").write_text(OTHER_WORK_PLUGIN)
    info = site / "other_work-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: other-work\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pytest11]\nother_work = other_work_plugin\n")
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    (tmp_path / "test_any.py").write_text("def test_any():\n    pass\n")
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_any.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environ,
        timeout=120,
    )
    assert plain.returncode == 1 and "failed by a pytest plugin installed for other work" in plain.stdout, plain.stdout
    [cpu] = discover()["cpu"]
    result = run_suite(cpu, timeout=300, environ=environ)
    assert result.error is None and result.passed, result
    assert sum(check.passed for check in result.checks) > 0 and not any(check.failed for check in result.checks)


def test_the_callers_pytest_variables_never_reach_the_kits_suite(tmp_path: Path) -> None:
    """PYTEST_ADDOPTS and PYTEST_PLUGINS add options and plugins to every pytest run: the caller's (a coverage run's
    ``--cov``, a plugin for its own tests), which in the suite's run would be an unknown option or a foreign plugin."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "other_work_plugin.py").write_text(OTHER_WORK_PLUGIN)
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "PYTEST_ADDOPTS": "--an-option-of-other-work",
        "PYTEST_PLUGINS": "other_work_plugin",
    }
    [cpu] = discover()["cpu"]
    result = run_suite(cpu, timeout=300, environ=environ)
    assert result.error is None and result.passed, result
    assert sum(check.passed for check in result.checks) > 0 and not any(check.failed for check in result.checks)


def test_pytest_with_an_unknown_platform_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--fd-platform", "nosuch", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 4  # pytest's usage-error exit code
    assert "--fd-platform 'nosuch' is not an installed platform. Choose one of: cpu" in done.stderr


IMPORTED_BY_ANY_PYTEST = """
import sys


def test_only():
    ours = sorted(name for name in sys.modules if name.split(".")[0] in ("fd_platforms", "paddle", "numpy"))
    assert ours == ["fd_platforms", "fd_platforms.conformance", "fd_platforms.conformance.pytest_plugin"], ours
"""


def test_without_the_option_the_plugin_adds_nothing(tmp_path: Path) -> None:
    """No test, no fixture, and no import of ours beyond the package, the kit's package and the entry point itself:
    every pytest session of an environment with fd-platforms loads the plugin (37 of our modules, about 0.2 s,
    before the fixtures moved to :mod:`fd_platforms.conformance.fixtures`)."""
    (tmp_path / "test_own.py").write_text(IMPORTED_BY_ANY_PYTEST)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1].startswith("1 passed")


def _suite_hooks() -> dict[str, list[str]]:
    """Each hook the suite exercises, with the tests that declare it."""
    import importlib

    covered: dict[str, list[str]] = {}
    for path in suite_files():
        module = importlib.import_module(f"fd_platforms.conformance.suite.{path.stem}")
        for name, test in vars(module).items():
            if name.startswith("test_") and callable(test):
                for mark in getattr(test, "pytestmark", []):
                    if mark.name == HOOKS_MARKER:
                        for hook in mark.args:
                            covered.setdefault(hook, []).append(f"{path.stem}.{name}")
    return covered


def test_every_hook_spec_has_a_conformance_test() -> None:
    covered = _suite_hooks()
    assert set(covered) <= set(SPECS), f"tests declare unknown hooks: {set(covered) - set(SPECS)}"
    missing = sorted(set(SPECS) - set(covered))
    assert not missing, f"hook specs without a conformance test: {missing}"


def exact_signature(name: str) -> str:
    """``def name(param: type, ...) -> type`` as written in hookspecs.py."""
    signature = inspect.signature(SPECS[name])
    params = ", ".join(f"{p.name}: {p.annotation}" for p in signature.parameters.values())
    return f"def {name}({params}) -> {signature.return_annotation}"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_hook_is_in_the_guide_with_its_exact_signature(name: str) -> None:
    guide = (ROOT / "docs" / "writing-a-plugin.md").read_text()
    assert f"### `{name}`" in guide, f"docs/writing-a-plugin.md has no section for hook {name}"
    assert exact_signature(name) in guide, f"the guide's signature of {name} differs from: {exact_signature(name)}"


def test_a_check_that_could_not_run_is_named_beside_the_verdict(checked_all: CheckedAll) -> None:
    done = replayed(checked_all, "nimbus")  # the example plugin, without its device here
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(
        "all platforms pass what could run here; not run: nimbus device (the reasons are above) "
        f"(plugin API {API_VERSION})"
    )
