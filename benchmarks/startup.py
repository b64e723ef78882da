"""Start-up cost of fd-platforms, with ``import paddle`` measured in the same run for comparison.

Each measurement runs in a fresh interpreter (so nothing is warm) ``--repeat`` times; the table
shows the median and minimum in milliseconds and the child's peak RSS, then discovery + selection
as a fraction of ``import paddle`` from the same run (the goal is at most 5 %). ``--json`` prints
the rows and that ratio.

    python benchmarks/startup.py [--repeat 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import time
from functools import partial
from pathlib import Path
from typing import Any

# A child prints "<seconds> <peak RSS KiB>" for the timed statement.
TIMED = (
    "import resource, time\n"
    "t = time.perf_counter()\n"
    "{statement}\n"
    "elapsed = time.perf_counter() - t\n"
    "print(elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
)

MEASUREMENTS = {
    "python -c pass (interpreter baseline)": None,
    "import fd_platforms": "import fd_platforms",
    "discovery + selection (all installed)": "import fd_platforms\nfd_platforms.current_platform()",
    "import paddle": "import warnings\nwarnings.simplefilter('ignore')\nimport paddle",
}


def child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("FD_PLATFORM", "FD_PLATFORM_PLUGINS")}


def timed_statement(statement: str) -> tuple[float, float]:
    """Seconds spent in ``statement`` inside a fresh interpreter, and that interpreter's peak RSS (MiB)."""
    out = subprocess.run(
        [sys.executable, "-c", TIMED.format(statement=statement)],
        capture_output=True,
        text=True,
        check=True,
        env=child_env(),
    ).stdout.split()
    return float(out[0]), int(out[1]) / 1024


def wall(command: list[str]) -> tuple[float, float]:
    """Wall seconds of a whole command (interpreter start-up included); RSS not measured."""
    start = time.perf_counter()
    subprocess.run(command, capture_output=True, check=True, env=child_env())
    return time.perf_counter() - start, float("nan")


def measure(repeat: int) -> list[dict[str, object]]:
    script = str(Path(sysconfig.get_path("scripts")) / "fd-platforms")
    runs = {
        name: partial(timed_statement, statement) if statement else partial(wall, [sys.executable, "-c", "pass"])
        for name, statement in MEASUREMENTS.items()
    }
    runs["fd-platforms list (whole command, wall)"] = partial(wall, [script, "list"])
    rows = []
    for name, run in runs.items():
        samples = [run() for _ in range(repeat)]
        seconds = [s for s, _ in samples]
        rss = [r for _, r in samples]
        rows.append(
            {
                "measurement": name,
                "median_ms": round(statistics.median(seconds) * 1000, 1),
                "min_ms": round(min(seconds) * 1000, 1),
                "peak_rss_mib": None if rss[0] != rss[0] else round(statistics.median(rss), 1),
                "repeat": repeat,
            }
        )
    return rows


SELECTION, ANCHOR = "discovery + selection (all installed)", "import paddle"
GOAL_RATIO = 0.05  # discovery + selection should cost at most 5 % of importing paddle, which every worker pays


def ratio(rows: list[dict[str, Any]]) -> dict[str, object]:
    """Discovery + selection as a fraction of ``import paddle``, both medians of the same run."""
    median = {row["measurement"]: row["median_ms"] for row in rows}
    value = float(median[SELECTION]) / float(median[ANCHOR])
    return {"ratio": round(value, 3), "goal": GOAL_RATIO, "met": value <= GOAL_RATIO}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = measure(args.repeat)
    anchored = ratio(rows)
    if args.json:
        print(json.dumps({"rows": rows, "selection_vs_import_paddle": anchored}, indent=2))
        return
    print(f"{'measurement':42} {'median ms':>10} {'min ms':>8} {'peak RSS MiB':>13}")
    for row in rows:
        rss = "-" if row["peak_rss_mib"] is None else f"{row['peak_rss_mib']:.1f}"
        print(f"{row['measurement']:42} {row['median_ms']:>10.1f} {row['min_ms']:>8.1f} {rss:>13}")
    verdict = "met" if anchored["met"] else "NOT met"
    print(f"discovery + selection / import paddle = {anchored['ratio']:.1%} (goal <= {GOAL_RATIO:.0%}: {verdict})")
    print(f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.repeat} fresh interpreters each)")


if __name__ == "__main__":
    main()
