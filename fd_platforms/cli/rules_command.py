"""``fd-platforms rules``: every version of the create-or-attach rule, side by side, the cases where they decide
differently and who attaches there (an engine pins one with ``--rule`` or ``[cache] rule``); with ``--fastdeploy
LINE`` what each snapshot of that FastDeploy line runs on each platform, with its source."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

from ..contract.types import CacheDecision
from ..fastdeploy.releases import RunsOn, snapshots
from ..rules.decision import DEFAULT_RULE, RULE_VERSIONS, TRUTH_TABLE, DecisionInputs, differing_cases
from ..rules.roles import TRANSFER_MANAGER, CacheRoles, cache_roles
from .output import emit
from .table import format_table


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser("rules", help="show the create-or-attach rule's versions and where they differ")
    parser.add_argument(
        "--fastdeploy",
        metavar="LINE",
        help="show what each snapshot of FastDeploy's LINE (develop, 2.6, a snapshot, or all) runs on each platform",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.fastdeploy is not None:
        return _lines(args.fastdeploy, as_json=args.json)
    names = list(RULE_VERSIONS)
    differing = differing_cases()
    if args.json:
        listed = [
            {"name": v.name, "rule": v.text, "transfer_terms": list(v.transfer_terms), "origin": v.origin}
            for v in RULE_VERSIONS.values()
        ]
        compared = [
            {
                "inputs": {k: v for k, v in inputs.kwargs().items() if k != "rule"},
                "create": {name: answer.create for name, answer in answers.items()},
                "deciding_term": {name: answer.deciding_term for name, answer in answers.items()},
                "attachers": {name: list(_roles(inputs, name).attachers) for name in answers},
            }
            for inputs, answers in differing
        ]
        payload = {"default": DEFAULT_RULE, "versions": listed, "cases": len(TRUTH_TABLE), "differing": compared}
        emit(json.dumps(payload, indent=2))
        return 0
    versions = format_table(
        ("VERSION", "RULE", "ORIGIN"),
        [
            (f"{v.name}{' (default)' if v.name == DEFAULT_RULE else ''}", v.text, v.origin)
            for v in RULE_VERSIONS.values()
        ],
    )
    cases = format_table(
        ("CASE", *(name.upper() for name in names)),
        [(str(inputs), *(_answer(inputs, name, answers[name]) for name in names)) for inputs, answers in differing],
    )
    emit(
        f"{versions}\n\n{len(differing)} of {len(TRUTH_TABLE)} cases decide differently "
        f"(+tm: the cache transfer manager attaches to the worker's cache):\n{cases}"
    )
    return 0


def _roles(inputs: DecisionInputs, rule: str) -> CacheRoles:
    return cache_roles(replace(inputs, rule=rule))


def _answer(inputs: DecisionInputs, rule: str, answer: CacheDecision) -> str:
    attached = answer.create and TRANSFER_MANAGER in _roles(inputs, rule).attachers
    return f"{'create' if answer.create else 'attach'} ({answer.deciding_term}){' +tm' if attached else ''}"


_MIXED_CASES = (("swap", 64, None), ("storage", 0, "file"), ("swap+storage", 64, "file"), ("neither", 0, None))


def _refused(entry: RunsOn) -> list[str]:
    """The mixed-instance cases where ``entry`` goes wrong, each with what it does."""
    found = []
    for label, swap, backend in _MIXED_CASES:
        problem = entry.problem(DecisionInputs(False, swap, backend, "mixed"))
        if problem:
            found.append(f"{label}: {problem}")
    return found


def _lines(line: str, *, as_json: bool) -> int:
    entries = snapshots(None if line == "all" else line)
    if as_json:
        emit(
            json.dumps(
                [
                    {
                        "snapshot": e.snapshot,
                        "platform": e.platform,
                        "worker_rule": e.worker_rule,
                        "launch_rule": e.launch_rule,
                        "clear_waits": list(e.clear_waits),
                        "block_cap": e.block_cap,
                        "refused": _refused(e),
                        "source": e.source,
                        "inferred": e.inferred,
                    }
                    for e in entries
                ],
                indent=2,
            )
        )
        return 0
    table = format_table(
        ("SNAPSHOT", "PLATFORM", "RUNNER", "LAUNCH", "CLEAR WAITS FOR", "CAP", "REFUSED IN A MIXED INSTANCE WITH"),
        [
            (
                e.snapshot,
                e.platform,
                e.worker_rule,
                e.launch_rule,
                " or ".join(e.clear_waits) or "never",
                e.block_cap or "-",
                "; ".join(label.split(":")[0] for label in _refused(e)) or "-",
            )
            for e in entries
        ],
    )
    notes = []
    for number, e in enumerate(entries, 1):
        notes.append(f"[{number}] {e.snapshot} {e.platform}: {e.source}")
        if e.inferred:
            notes.append(f"    inferred, not read: {e.inferred}")
        notes.extend(f"    refused with {text}" for text in _refused(e))
    emit(
        f"{table}\n\nRUNNER: the rule version its runner decides by; LAUNCH: the version launch_cache_manager follows "
        "(the transfer manager creates where it makes the worker attach); cuda stands for the GPU runner, which "
        "Iluvatar and DCU subclass.\n\n" + "\n".join(notes)
    )
    return 0
