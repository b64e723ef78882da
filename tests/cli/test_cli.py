"""``fd-platforms list``: output, exit codes, no tracebacks.

``main`` runs in this process, as the console script runs it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import pytest
from run_helpers import console_script
from run_helpers import main_in_process as cli

import fd_platforms_cuda
from fd_platforms.cli import check_command
from fd_platforms.conformance import CHECKS
from fd_platforms.conformance.runner import CheckResult, PlatformResult
from fd_platforms.loading.discovery import discover
from fd_platforms.loading.selection import IN_REPO_PLUGINS as IN_REPO


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_list_json_on_a_machine_without_accelerators() -> None:
    result = cli("list", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    platforms = {p["name"]: p for p in payload["platforms"]}
    assert list(platforms) == list(discover())  # cpu first, then by name, vendor plugins included
    assert {"cpu", *IN_REPO} <= set(platforms)
    assert platforms["cpu"]["status"] == "available" and platforms["cpu"]["builtin"]
    for name in IN_REPO:
        assert platforms[name]["status"] == "unavailable"
        assert platforms[name]["distribution"] == f"fd-platforms-{name.replace('_', '-')}"
        assert platforms[name]["version"] == "0.1.0"
        assert "not installed" in platforms[name]["reason"]
    assert payload["selected"]["name"] == "cpu" and payload["selected"]["how"] == "fallback"
    assert payload["error"] is None


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_list_table_names_the_selection() -> None:
    result = cli("list")
    assert result.returncode == 0
    assert result.stdout.splitlines()[0].split() == [
        "PLATFORM",
        "DISTRIBUTION",
        "VERSION",
        "STATUS",
        "DEVICES",
        "REASON",
    ]
    assert "selected: cpu (fallback:" in result.stdout


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_unknown_platform_exits_2_naming_every_installed_one() -> None:
    result = cli("list", FD_PLATFORM="nosuch")
    assert result.returncode == 2
    assert f"Choose one of: {', '.join(discover())}" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_selected_unavailable_platform_exits_2_with_the_reason() -> None:
    result = cli("list", "--json", FD_PLATFORM="cuda")
    assert result.returncode == 2
    assert "paddlepaddle-gpu is not installed" in result.stderr and "Traceback" not in result.stderr
    payload = json.loads(result.stdout)
    assert payload["selected"] is None and "not available here" in payload["error"]


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_broken_plugin_is_listed_with_its_error(make_plugin) -> None:
    site = make_plugin("broken", source="raise RuntimeError('vendor SDK too old')\n")
    result = cli("list", "--json", PYTHONPATH=str(site))
    assert result.returncode == 0, result.stderr
    broken = {p["name"]: p for p in json.loads(result.stdout)["platforms"]}["broken"]
    assert broken["status"] == "broken" and "RuntimeError: vendor SDK too old" in broken["reason"]
    assert "skipping broken platform plugin" in result.stderr


def test_allow_list_shows_excluded_platforms() -> None:
    result = cli("list", "--json", FD_PLATFORM_PLUGINS="cuda")
    statuses = {p["name"]: p["status"] for p in json.loads(result.stdout)["platforms"]}
    assert (statuses.pop("cpu"), statuses.pop("cuda")) == ("available", "unavailable")
    assert set(statuses) >= {"iluvatar", "metax", "xpu"} and set(statuses.values()) == {"excluded"}


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_list_shows_every_platform_beside_a_duplicate_name(make_plugin) -> None:
    make_plugin("acme", dist="fd-acme-one")
    site = make_plugin("acme", dist="fd-acme-two")
    result = cli("list", "--json", PYTHONPATH=str(site))
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    rows = [(p["name"], p["distribution"], p["status"]) for p in payload["platforms"]]
    assert [row[0] for row in rows] == ["cpu", "acme", "acme", *sorted(set(discover()) - {"cpu", "acme"})]
    assert ("acme", "fd-acme-one", "broken") in rows and ("acme", "fd-acme-two", "broken") in rows
    assert payload["selected"]["name"] == "cpu" and "acme broken" in payload["selected"]["reason"]
    table = cli("list", PYTHONPATH=str(site))
    assert table.returncode == 0 and table.stdout.count("registered by 2 distributions") == 2


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_multi_line_reason_is_one_line_in_the_table_and_whole_with_verbose_or_json(make_plugin) -> None:
    from drift_plugins import drifting

    site = drifting(make_plugin)
    table = cli("list", PYTHONPATH=str(site))
    assert table.returncode == 0, table.stderr
    _header, *rows = table.stdout.split("\n\n")[0].splitlines()
    assert len(rows) == len({row.split()[0] for row in rows}), "one line per platform"
    row = next(row for row in rows if row.startswith("oldxpu"))
    assert "disagrees with the core rule" in row and "more lines: fd-platforms list -v, or --json]" in row
    full = json.loads(cli("list", "--json", PYTHONPATH=str(site)).stdout)
    reason = next(p["reason"] for p in full["platforms"] if p["name"] == "oldxpu")
    assert reason.count("\n") > 20 and f"[{reason.count(chr(10))} more lines" in row
    verbose = cli("list", "-v", PYTHONPATH=str(site)).stdout
    assert f"oldxpu (fd-test-oldxpu): {reason}" in verbose


@pytest.mark.parametrize(
    ("args", "prefix", "words"),
    [
        ((), "fd-platforms: error: ", "arguments are required: COMMAND"),
        (("lst",), "fd-platforms: error: ", "invalid choice: 'lst'"),
        (("list", "--jsn"), "fd-platforms list: error: ", "unrecognized arguments: --jsn"),
        (("plan", "--role", "prefil"), "fd-platforms plan: error: ", "invalid choice: 'prefil'"),
        (("run", "--cylces", "3"), "fd-platforms run: error: ", "unrecognized arguments: --cylces 3"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: tuple[str, ...], prefix: str, words: str) -> None:
    result = cli(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(prefix) and words in result.stderr, result.stderr
    assert "usage:" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "meant"),
    [
        (("lst",), "did you mean 'list'?"),
        (("list", "--jsn"), "did you mean --json?"),
        (("plan", "--role", "prefil"), "did you mean 'prefill'?"),
        (("run", "--cylces", "3"), "did you mean --cycles?"),
    ],
)
def test_usage_errors_say_what_was_likely_meant(args: tuple[str, ...], meant: str) -> None:
    assert meant in cli(*args).stderr


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_version_and_verbose_after_the_subcommand() -> None:
    from importlib.metadata import version

    from fd_platforms import API_VERSION

    result = cli("--version")
    expected = f"fd-platforms {version('fd-platforms')} (plugin API {API_VERSION})"
    assert result.returncode == 0 and result.stdout.strip() == expected
    assert cli("list", "-v").returncode == 0 and cli("-v", "list").returncode == 0


@pytest.mark.parametrize(
    "args",
    [("list", "--json"), ("lst",), ("-v", "plan", "--model", "examples/qwen3-30b-a3b", "--device-memory", "1GiB")],
    ids=["list --json", "usage error", "plan -v"],
)
@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_main_in_process_reports_what_the_console_script_does(args: tuple[str, ...]) -> None:
    """The CLI tests run ``main`` in pytest's process (run_helpers.main_in_process): it answers as the
    console script does, and leaves this process's descriptors, streams and logging as they were."""
    root = logging.getLogger()
    before = (os.fstat(1).st_ino, os.fstat(2).st_ino, sys.stdout, sys.stderr, root.handlers[:], root.level)
    inside, outside = cli(*args), console_script(*args)
    assert (inside.returncode, inside.stdout, inside.stderr) == (outside.returncode, outside.stdout, outside.stderr)
    assert (os.fstat(1).st_ino, os.fstat(2).st_ino, sys.stdout, sys.stderr, root.handlers, root.level) == before


def test_check_shows_the_paddle_releases_a_platform_is_checked_against(monkeypatch: pytest.MonkeyPatch) -> None:
    """``check cuda`` names the Paddle the plugin states it is checked against and why (its ``paddle_checked``);
    the suite itself is replaced by a passing result here (tests/conformance runs it)."""

    def passing(candidates: list[Any], **_: Any) -> list[PlatformResult]:
        checks = tuple(CheckResult(check, passed=1) for check in CHECKS)
        return [
            PlatformResult(candidate.name, candidate.distribution, candidate.version, checks)
            for candidate in candidates
        ]

    monkeypatch.setattr(check_command, "run_suites", passing)
    stated = fd_platforms_cuda.PLATFORM.paddle_checked
    assert (
        stated is not None and "Paddle 3.3.x" in stated and "FLAGS_use_vmm_auto_growth_best_fit_allocator_v2" in stated
    )
    table = cli("check", "cuda", "cpu")
    assert table.returncode == 0, table.stdout + table.stderr
    assert f"cuda: checked against {stated}" in table.stdout and "cpu: checked against" not in table.stdout
    payload = json.loads(cli("check", "cuda", "cpu", "--json").stdout)
    assert {platform["name"]: platform["paddle_checked"] for platform in payload["platforms"]} == {
        "cuda": stated,
        "cpu": None,
    }
