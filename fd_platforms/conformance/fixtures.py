"""The conformance suite's fixtures and outcome recorder, registered by :mod:`.pytest_plugin` once
``--fd-platform NAME`` is given (so a pytest session without it imports none of this).

Tests that need the device itself skip with the detection's reason where the hardware is absent; tests that need
paddle skip with the platform's install hint where paddle cannot be imported, and tests that place tensors on the
device skip with the placement error's reason where this Paddle cannot place them there.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ..contract.errors import DevicePlacementError, FdPlatformsError, first_line
from ..contract.paddle_import import import_paddle
from ..contract.types import Detection
from ..kit.paddle_platform import PaddlePlatform
from ..kit.placement import check_placeable
from ..kit.probes import stated_fact
from ..loading.discovery import discover
from ..loading.isolation import call_plugin
from ..loading.platform import Platform, load_platform, register_platform
from ..loading.selection import single_candidate
from ..loading.watchdog import detect_bound
from . import CHECKS

SUITE_DIR = Path(__file__).parent / "suite"
SIMULATED_DEVICES = 2  #: the devices a simulated platform (fd_platform_simulated) has
SIMULATED_BYTES = 16 * 2**30  #: each simulated device's memory: 16 GiB
PADDLE_HINT = "pip install paddlepaddle"  #: the install hint of a platform that states none
NUMPY_HINT = "pip install 'fd-platforms[numpy]'"


def suite_files() -> list[Path]:
    """The suite's modules, in :data:`~fd_platforms.conformance.CHECKS` order."""
    return [SUITE_DIR / f"test_{check}.py" for check in CHECKS]


def check_of(path: Path) -> str:
    """The check a suite module holds: its name without ``test_`` (``test_wait.py`` -> ``wait``)."""
    return path.stem.removeprefix("test_")


def configure(config: pytest.Config, name: str) -> None:
    """Checks that ``name`` is installed, then adds the suite to the run (and the outcome recorder)."""
    installed = discover()
    if name not in installed:
        raise pytest.UsageError(
            f"--fd-platform {name!r} is not an installed platform. Choose one of: {', '.join(installed)}. "
            "Fix: install the plugin's distribution in this environment (pip install <folder or name>)"
        )
    config.addinivalue_line("filterwarnings", "ignore:No ccache found:UserWarning")
    files = [str(path) for path in suite_files()]
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        config.args.extend(files)  # the caller's own tests, and the suite
    else:
        config.args[:] = files  # not the project's testpaths: only the suite
    report = config.getoption("fd_platform_report")
    if report:
        config.pluginmanager.register(OutcomeRecorder(Path(report), name), "fd_platforms-outcomes")


class OutcomeRecorder:
    """Records every suite test's check and outcome (passed, failed, skipped) with its message, as JSON."""

    def __init__(self, path: Path, platform: str) -> None:
        self.path, self.platform = path, platform
        self.tests: dict[str, dict[str, Any]] = {}

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        self.tests[item.nodeid] = {"check": check_of(item.path), "outcome": "passed", "message": ""}

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            check = check_of(Path(str(report.fspath)))
            self.tests[report.nodeid] = {"check": check, "outcome": "failed", "message": _message(report)}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.tests[report.nodeid]
        if report.failed:
            entry.update(outcome="failed", message=entry["message"] or _message(report))
        elif report.skipped and entry["outcome"] == "passed":
            entry.update(outcome="skipped", message=_message(report))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.path.write_text(json.dumps({"platform": self.platform, "tests": self.tests}, indent=2))


def _message(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The one-line reason: a skip's reason, or a failure's crash message."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    return str(longrepr).strip().splitlines()[-1] if longrepr else ""


@pytest.fixture(scope="session")
def fd_platform_name(request: pytest.FixtureRequest) -> str:
    """The platform under test (``--fd-platform``)."""
    name = request.config.getoption("fd_platform")
    if not name:
        pytest.skip("no platform to check: run pytest --fd-platform NAME")
    return str(name)


@pytest.fixture(scope="session")
def fd_platform_rule(request: pytest.FixtureRequest) -> str:
    """The rule version the platform is checked against (``--fd-platform-rule``, else the default)."""
    from ..contract.errors import ConfigError
    from ..rules.decision import DEFAULT_RULE, check_rule

    rule = request.config.getoption("fd_platform_rule") or DEFAULT_RULE
    try:
        return check_rule(rule, "--fd-platform-rule").name
    except ConfigError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def fd_platform(fd_platform_name: str) -> Platform:
    """The platform loaded as selection loads it, except that the decision check, not the drift
    guard, reports a drifting ``should_create_cache_tensor``."""
    try:
        return load_platform(single_candidate(discover(), fd_platform_name), drift_guard=False)
    except FdPlatformsError as exc:
        pytest.fail(f"platform {fd_platform_name!r} does not load: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def fd_platform_simulated(fd_platform: Platform) -> Platform:
    """A copy of the platform whose ``paddle`` is its facts class's simulation (:data:`SIMULATED_DEVICES`
    devices of :data:`SIMULATED_BYTES`), registered as a plugin again; skips where there is none."""
    plugin = fd_platform.manager.get_plugin(fd_platform.name)
    if (
        not isinstance(plugin, PaddlePlatform)
        or (simulated := plugin.facts.simulated_paddle(plugin.device_type, SIMULATED_DEVICES, SIMULATED_BYTES)) is None
    ):
        pytest.skip(f"{fd_platform.name} is not a PaddlePlatform whose facts class simulates Paddle")
    copy = dataclasses.replace(plugin, load_paddle=lambda: simulated)
    candidate = fd_platform.candidate
    return call_plugin(
        candidate,
        "loading a simulated copy",
        lambda: register_platform(candidate, copy, drift_guard=False),
        detect_bound(),
    )


@pytest.fixture(scope="session")
def fd_platform_hardware(fd_platform: Platform) -> Detection:
    """The confirmed detection; hardware-only tests skip with its reason when the device is absent."""
    detection = fd_platform.detect()
    if detection.available:
        detection = fd_platform.confirm() or detection
    if not detection.available:
        pytest.skip(f"hardware-only check: {fd_platform.name} is not available here: {detection.reason}")
    return detection


@pytest.fixture(scope="session")
def fd_paddle(fd_platform: Platform) -> ModuleType:
    """``paddle``, imported the core's way; tests that need it skip, naming the platform's install hint,
    where it cannot be imported here."""
    try:
        return import_paddle()
    except (ImportError, OSError) as exc:
        reason = f"needs paddle, which cannot be imported here ({first_line(exc)})"
        pytest.skip(f"{reason}. Fix: {install_hint(fd_platform)}")


@pytest.fixture(scope="session")
def fd_numpy() -> ModuleType:
    """``numpy``, for the tests of host buffers' numpy views (the core needs it for those alone); they skip where
    numpy is not installed, naming the extra that installs it."""
    try:
        return importlib.import_module("numpy")
    except ModuleNotFoundError:
        pytest.skip(f"needs numpy, which is not installed here. Fix: {NUMPY_HINT}")


@pytest.fixture(scope="session")
def fd_platform_placeable(fd_platform: Platform, fd_paddle: ModuleType) -> str:
    """Device 0's string, where this Paddle can place tensors on the platform's device type; tests that
    allocate there skip with the :class:`~fd_platforms.contract.errors.DevicePlacementError`'s reason where it
    cannot."""
    device = fd_platform.identity.device_string(0)
    try:
        check_placeable(fd_paddle, device)
    except DevicePlacementError as exc:
        pytest.skip(str(exc))
    return device


def install_hint(platform: Platform) -> str:
    """What the plugin states a user runs to get its runtime (a :class:`~fd_platforms.kit.probes.RuntimeFacts`
    record's field, read without running plugin code), else :data:`PADDLE_HINT`."""
    return stated_fact(platform.manager.get_plugin(platform.name), "install_hint") or PADDLE_HINT
