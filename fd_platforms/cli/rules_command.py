"""``fd-platforms rules``: every version of the create-or-attach rule, side by side, and the cases
where they decide differently (an engine pins one with ``--rule`` or ``[cache] rule``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..contract.types import CacheDecision
from ..rules.decision import DEFAULT_RULE, RULE_VERSIONS, TRUTH_TABLE, differing_cases
from .output import emit
from .table import format_table


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser("rules", help="show the create-or-attach rule's versions and where they differ")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    names = list(RULE_VERSIONS)
    differing = differing_cases()
    if args.json:
        listed = [{"name": v.name, "rule": v.text, "origin": v.origin} for v in RULE_VERSIONS.values()]
        compared = [
            {
                "inputs": {k: v for k, v in inputs.kwargs().items() if k != "rule"},
                "create": {name: answer.create for name, answer in answers.items()},
                "deciding_term": {name: answer.deciding_term for name, answer in answers.items()},
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
        [(str(inputs), *(_answer(answers[name]) for name in names)) for inputs, answers in differing],
    )
    emit(f"{versions}\n\n{len(differing)} of {len(TRUTH_TABLE)} cases decide differently:\n{cases}")
    return 0


def _answer(answer: CacheDecision) -> str:
    return f"{'create' if answer.create else 'attach'} ({answer.deciding_term})"
