"""``fd-platforms check``: the conformance suite for installed platforms, as a platform x check matrix.

Exit 0 when every platform passes (skips are not failures), 1 when any fails, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import threading
from collections.abc import Callable
from typing import Any

from ..conformance import CHECKS
from ..conformance.runner import PlatformResult, run_suites
from ..contract.api_version import API_VERSION
from ..contract.errors import ConfigError, PluginLoadError, UnknownPlatformError
from ..contract.integers import check_int
from ..ipc.console import write_line
from ..ipc.timeouts import check_seconds
from ..kit.probes import stated_fact
from ..loading.discovery import Candidate, discover
from ..loading.isolation import import_plugin
from ..loading.selection import single_candidate
from ..rules.decision import DEFAULT_RULE, RULE_VERSIONS
from .output import emit
from .table import format_table


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser("check", help="run the conformance suite against installed platforms")
    parser.add_argument("names", nargs="*", metavar="NAME", help="platforms to check (default: the selected one)")
    parser.add_argument("--all", action="store_true", help="check every installed platform")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the matrix")
    parser.add_argument(
        "--jobs", type=int, default=min(4, os.cpu_count() or 1), metavar="N", help="platforms checked at once"
    )
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS", help="per platform")
    parser.add_argument(
        "--rule",
        choices=tuple(RULE_VERSIONS),
        default=DEFAULT_RULE,
        help="the create-or-attach rule version the engine pins: each platform's decision is checked against it",
    )
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    check_int("--jobs", args.jobs, 1, None, fix="pass e.g. --jobs 2")
    timeout = check_seconds("timeout", args.timeout, "pass a finite number of seconds > 0, e.g. --timeout 600")
    candidates = _candidates(args.names, args.all)
    finished = None if args.json else _said(len(candidates))
    results = run_suites(candidates, jobs=args.jobs, timeout=timeout, finished=finished, rule=args.rule)
    passed = all(result.passed for result in results)
    checked = paddle_checked(candidates)
    if args.json:
        payload = {"api_version": API_VERSION, "rule": args.rule, "checks": list(CHECKS), "passed": passed}
        platforms = [{**result.as_dict(), "paddle_checked": checked.get(result.name)} for result in results]
        emit(json.dumps({**payload, "platforms": platforms}, indent=2))
    else:
        emit(_matrix(results, checked))
    return 0 if passed else 1


def _said(total: int) -> Callable[[PlatformResult, float], None]:
    """A progress line on stderr as each platform's suite ends: ``checked cuda (2 of 6): ok in 9.1 s``."""
    done = itertools.count(1)
    lock = threading.Lock()

    def say(result: PlatformResult, seconds: float) -> None:
        with lock:
            outcome = "ok" if result.passed else ("FAIL" if result.error is None else f"error: {result.error}")
            write_line(f"fd-platforms: checked {result.name} ({next(done)} of {total}): {outcome} in {seconds:.1f} s")

    return say


def _candidates(names: list[str], everything: bool) -> list[Candidate]:
    found = discover()
    if everything and names:
        raise ConfigError("NAME", " ".join(names), "platform names or --all, not both", "drop --all or the names")
    if everything:
        return [single_candidate(found, name) for name in found]
    if not names:
        from ..loading.current import current_platform

        return [current_platform().candidate]
    for name in names:
        if name not in found:
            raise UnknownPlatformError("NAME", name, found, "check an installed name")
    return [single_candidate(found, name) for name in names]


def paddle_checked(candidates: list[Candidate]) -> dict[str, str]:
    """The Paddle releases each platform states it is checked against, with the reason
    (``PaddlePlatform.paddle_checked``), by name; a platform that states none, or cannot be imported (its
    suite says why), is left out."""
    stated: dict[str, str] = {}
    for candidate in candidates:
        try:
            text = stated_fact(import_plugin(candidate), "paddle_checked")
        except PluginLoadError:
            continue
        if text is not None:
            stated[candidate.name] = text
    return stated


def _cell(result: PlatformResult, check: str) -> str:
    outcome = next(c for c in result.checks if c.check == check)
    if outcome.status == "fail":
        return f"FAIL {outcome.failed}/{outcome.passed + outcome.failed + outcome.skipped}"
    if outcome.status == "skip":
        return "skip"
    return f"pass {outcome.passed}" + (f" ({outcome.skipped} skip)" if outcome.skipped else "")


def _matrix(results: list[PlatformResult], checked: dict[str, str]) -> str:
    rows = []
    notes = [f"{name}: checked against {text}" for name, text in checked.items()]
    for result in results:
        if result.error is not None:
            rows.append((result.name, *("-" for _ in CHECKS), "ERROR"))
            notes.append(f"{result.name}: {result.error}")
            continue
        rows.append((result.name, *(_cell(result, check) for check in CHECKS), "ok" if result.passed else "FAILED"))
        for outcome in result.checks:
            notes.extend(
                f"{result.name} {outcome.check} FAILED {test}: {message}" for test, message in outcome.failures
            )
            notes.extend(f"{result.name} {outcome.check} skipped: {reason}" for reason in outcome.skip_reasons)
    verdict = "all platforms pass" if all(r.passed for r in results) else "some platforms FAIL"
    unrun = [f"{r.name} {c.check}" for r in results if r.error is None for c in r.checks if c.status == "skip"]
    if unrun:  # a check none of whose tests could run here passed nothing: say so beside the verdict
        verdict += f" what could run here; not run: {', '.join(unrun)} (the reasons are above)"
    table = format_table(("PLATFORM", *(check.upper() for check in CHECKS), "RESULT"), rows)
    sections = [table, "\n".join(notes), f"{verdict} (plugin API {API_VERSION})"]
    return "\n\n".join(section for section in sections if section)
