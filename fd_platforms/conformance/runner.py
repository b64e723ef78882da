"""Run the conformance suite for installed platforms: one pytest process per platform, a check matrix.

Each platform runs ``python -m pytest -p fd_platforms.conformance.pytest_plugin --fd-platform NAME``
in a scratch folder (so no project's ``conftest.py`` or ini file joins in), which writes every test's
outcome to JSON; the outcomes are grouped by check (:data:`~fd_platforms.conformance.CHECKS`). Importing this
module does not import pytest.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from ..contract.errors import FdPlatformsError
from ..loading.discovery import Candidate
from . import CHECKS

CheckStatus = Literal["pass", "fail", "skip"]
SCRATCH_INI = "[pytest]\n"
SUITE_PARENT = Path(__file__).parent  # the rootdir: test ids read suite/test_<check>.py::<test>
CORE_FOLDER = SUITE_PARENT.parent.parent  # where this process imported fd_platforms from
CALLERS_PYTEST = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")  # options and plugins for every run: the caller's, not ours


class ConformanceUnavailableError(FdPlatformsError):
    """The conformance suite cannot run here (pytest is missing)."""

    exit_code = 2


@dataclass(frozen=True)
class CheckResult:
    """One platform's outcome on one check: counts, each failure's message, each distinct skip reason."""

    check: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: tuple[tuple[str, str], ...] = ()
    skip_reasons: tuple[str, ...] = ()

    @property
    def status(self) -> CheckStatus:
        if self.failed:
            return "fail"
        return "pass" if self.passed else "skip"


@dataclass(frozen=True)
class PlatformResult:
    """The suite's outcome for one platform; ``error`` when the suite could not run at all."""

    name: str
    distribution: str
    version: str
    checks: tuple[CheckResult, ...] = ()
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and all(check.status != "fail" for check in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "passed": self.passed,
            "error": self.error,
            "checks": {
                check.check: {
                    "status": check.status,
                    "passed": check.passed,
                    "failed": check.failed,
                    "skipped": check.skipped,
                    "failures": [{"test": test, "message": message} for test, message in check.failures],
                    "skip_reasons": list(check.skip_reasons),
                }
                for check in self.checks
            },
        }


def require_pytest() -> None:
    """The suite is pytest tests; say how to get pytest when it is missing."""
    if importlib.util.find_spec("pytest") is None:
        raise ConformanceUnavailableError(
            "fd-platforms check runs the conformance suite with pytest, which is not installed in this "
            f"environment ({sys.executable}). Fix: pip install 'pytest>=8'"
        )


def run_suite(
    candidate: Candidate, *, timeout: float, environ: Mapping[str, str] | None = None, rule: str | None = None
) -> PlatformResult:
    """Run the suite against one platform in its own pytest process (``rule``: the pinned rule version)."""
    with tempfile.TemporaryDirectory(prefix="fd-platforms-check-") as scratch:
        ini = Path(scratch) / "pytest.ini"
        ini.write_text(SCRATCH_INI)
        report = Path(scratch) / "outcomes.json"
        command = [sys.executable, "-m", "pytest", "-p", "fd_platforms.conformance.pytest_plugin"]
        command += ["-p", "no:cacheprovider", "--fd-platform", candidate.name, "--fd-platform-report", str(report)]
        command += ["-c", str(ini), "-q", "--rootdir", str(SUITE_PARENT)]
        command += ["--fd-platform-rule", rule] if rule else []
        base = PlatformResult(candidate.name, candidate.distribution, candidate.version)
        env = _suite_environ(os.environ if environ is None else environ)
        try:
            done = subprocess.run(
                command, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return replace(base, error=f"the suite did not finish within {timeout:g} s. Fix: raise --timeout")
        if not report.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            return replace(base, error=f"pytest exited {done.returncode} before running the suite: {' | '.join(tail)}")
        outcomes = json.loads(report.read_text())["tests"]
    return replace(base, checks=tuple(_group(outcomes)))


def _suite_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for a suite's process. It imports fd_platforms from where this process did (a checkout's
    folder ``python -m`` put first on this process's path, say, beside an installed copy): otherwise its suite
    files lie outside the rootdir given, and pytest names their tests apart from their files. And it loads
    the kit's pytest plugin alone (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``; the command names it with ``-p``):
    pytest plugins installed for other work (an asyncio runner, a test shuffler, one that fails every test)
    never change a verdict, and the suite's process does not import them. Nor do the caller's own pytest
    variables (:data:`CALLERS_PYTEST`): options and plugins meant for the caller's run (``--cov``, ``-x``)."""
    outer = environ.get("PYTHONPATH")
    path = os.pathsep.join([str(CORE_FOLDER), *([outer] if outer else [])])
    kept = {name: value for name, value in environ.items() if name not in CALLERS_PYTEST}
    return {**kept, "PYTHONPATH": path, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def run_suites(
    candidates: list[Candidate],
    *,
    jobs: int,
    timeout: float,
    finished: Callable[[PlatformResult, float], None] | None = None,
    rule: str | None = None,
) -> list[PlatformResult]:
    """Run the suite for several platforms, ``jobs`` processes at a time; results in the given
    order. ``finished(result, seconds)`` is called as each platform's suite ends (from a worker thread)."""
    require_pytest()

    def one(candidate: Candidate) -> PlatformResult:
        started = time.monotonic()
        result = run_suite(candidate, timeout=timeout, rule=rule)
        if finished is not None:
            finished(result, time.monotonic() - started)
        return result

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, candidates))


def _group(outcomes: Mapping[str, Mapping[str, str]]) -> list[CheckResult]:
    """The outcomes (the pytest plugin's: passed, failed or skipped, with a message) as one result per check."""
    tests: dict[str, list[tuple[str, str, str]]] = {check: [] for check in CHECKS}
    for nodeid, outcome in outcomes.items():
        test = nodeid.rsplit("/", 1)[-1]
        tests.setdefault(outcome["check"], []).append((test, outcome["outcome"], outcome["message"]))
    return [_tally(check, ran) for check, ran in tests.items()]


def _tally(check: str, ran: list[tuple[str, str, str]]) -> CheckResult:
    failures = tuple((test, message) for test, outcome, message in ran if outcome == "failed")
    skips = [message for _, outcome, message in ran if outcome == "skipped"]
    passed = len(ran) - len(failures) - len(skips)
    return CheckResult(check, passed, len(failures), len(skips), failures, tuple(dict.fromkeys(skips)))
