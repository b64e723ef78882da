"""``fd-platforms list``: every discovered platform, its status, and which one is selected and why.

The table shows each reason's first line; ``-v`` adds the multi-line ones (a drift report) in
full below it, and ``--json`` has every reason whole.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from ..ipc.console import write_line
from ..loading.selection import survey
from .output import emit
from .table import format_table


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser("list", help="show discovered platforms and the selected one")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table (every reason in full)")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    result = survey()
    selected = None
    if result.selection is not None:
        selection = result.selection
        selected = {"name": selection.platform.name, "how": selection.how, "reason": selection.reason}
    error = None if result.error is None else str(result.error)
    if args.json:
        reports = [dataclasses.asdict(report) for report in result.reports]
        emit(json.dumps({"platforms": reports, "selected": selected, "error": error}, indent=2))
    else:
        rows = [
            (
                r.name,
                r.distribution + (" (built-in)" if r.builtin else ""),
                r.version,
                r.status,
                r.device_count,
                _one_line(r.reason),
            )
            for r in result.reports
        ]
        emit(format_table(("PLATFORM", "DISTRIBUTION", "VERSION", "STATUS", "DEVICES", "REASON"), rows))
        if args.verbose:
            for r in result.reports:
                if "\n" in r.reason:
                    emit(f"\n{r.name} ({r.distribution}): {r.reason}")
        if selected is not None:
            emit(f"\nselected: {selected['name']} ({selected['how']}: {selected['reason']})")
    if result.error is not None:
        write_line(f"fd-platforms: error: {error}")
        return result.error.exit_code
    return 0


def _one_line(reason: str) -> str:
    """A reason for the table's last column: its first line, saying how to see the rest (a drift
    report lists every differing case on a line of its own)."""
    first, *rest = reason.splitlines() or [""]
    return first if not rest else f"{first} [{len(rest)} more lines: fd-platforms list -v, or --json]"
