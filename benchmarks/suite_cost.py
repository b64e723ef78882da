"""The test suite's cost: wall time, CPU-seconds of pytest and every process it started, and each test file's share.

Runs ``python -m pytest`` once, from the repository root, with the arguments given after ``--`` (or any this
script does not know: ``-m "not slow"``, a path, ``-n 0``); the suite's own options (``pyproject.toml``: two
xdist workers) apply as in any run. pytest's output goes to stderr, the report to stdout. Reports:

- **wall**: seconds from pytest's start to its exit;
- **CPU-seconds**: user + sys of pytest and of every process under it that was waited for: this script's
  ``getrusage(RUSAGE_CHILDREN)`` after pytest exits, minus before. A process's rusage takes in its waited-for
  children's, so that is the xdist controller, its workers and every process the tests started and reaped, at
  any depth. This script is a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): a process orphaned under
  pytest (a grandchild whose parent was killed, ``run``'s fork server, which ends only after ``run`` has) is
  re-parented here, not to init, and reaped here once pytest has exited, so its CPU counts too
  (``orphans_reaped``; ``orphans_running``: those still running 30 s after pytest exited, not counted, and a
  leftover to look into);
- **per test file** (``benchmarks/suite_cost_plugin.py``, loaded with ``-p`` in pytest and in each xdist
  worker): the CPU-seconds of the tests' protocols (setup, call, teardown) in the process that ran them, its
  waited-for children included, summed over the workers; slowest first, with each file's share of the
  suite's CPU-seconds, its number of tests and the wall seconds its tests took (summed over the workers, so
  the column adds up to about the workers times the suite's wall; an orphan's CPU is the suite's, not a
  file's). A module's fixtures count for the test
  that sets them up or tears them down, the session's for the first and the last test of each worker;
- **unattributed**: the CPU-seconds outside every test (collection in each process, the workers' start and
  exit, the controller, Paddle's bytecode warm-up): the total minus the files' sum.

Run-to-run noise is a few percent on an idle machine; on a loaded one the CPU-seconds still hold (they are
the processes' own), the wall does not. How many processes imported Paddle is not counted. The exit status
is pytest's, so a failed run shows; the report is printed either way.

Run from the repository root:
``python benchmarks/suite_cost.py [--json] [--top 25] [-- PYTEST-ARGS...]``; ``--json`` lists every file.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "benchmarks.suite_cost_plugin"
ENV = "FD_SUITE_COST_DIR"  # the plugin's (benchmarks/suite_cost_plugin.py)
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
ORPHAN_WAIT = 30.0  # seconds the orphans get to end after pytest has


def become_subreaper() -> None:
    """Orphans under this process are re-parented to it (Linux 3.4+), so their CPU reaches its rusage when reaped."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed: orphans' CPU would go uncounted")


def reap_orphans(wait: float = ORPHAN_WAIT) -> tuple[int, int]:
    """Reap every child left (pytest is reaped already: each is an orphan re-parented here), waiting up to ``wait``
    seconds for those still running; (reaped, still running)."""
    reaped, deadline = 0, time.monotonic() + wait
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped, 0
        if pid:
            reaped += 1
        elif time.monotonic() < deadline:
            time.sleep(0.05)
        else:
            running = Path(f"/proc/self/task/{os.getpid()}/children").read_text().split()
            return reaped, len(running)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This script's options, and pytest's: everything after ``--``, or else every argument not ours."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--json", action="store_true", help="print the report as JSON, every file listed")
    parser.add_argument("--top", type=int, default=25, help="files in the table, slowest first (default 25)")
    if "--" in argv:
        split = argv.index("--")
        args, rest = parser.parse_args(argv[:split]), argv[split + 1 :]
    else:
        args, rest = parser.parse_known_args(argv)
    if args.top < 0:
        parser.error("--top must be >= 0")
    return args, rest


def run_suite(pytest_args: list[str]) -> dict[str, Any]:
    """Run pytest once with the plugin; the report as a dict."""
    command = [sys.executable, "-m", "pytest", "-p", PLUGIN, *pytest_args]
    with tempfile.TemporaryDirectory(prefix="fd-suite-cost-") as folder:
        load = os.getloadavg()[0]
        become_subreaper()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, ENV: folder}, stdout=sys.stderr, check=False)
        wall = time.perf_counter() - start
        reaped, running = reap_orphans()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        processes = [json.loads(path.read_text()) for path in sorted(Path(folder).glob("*.json"))]
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    total = user + system
    files: dict[str, dict[str, float]] = {}
    for process in processes:
        for name, cost in process["files"].items():
            summed = files.setdefault(name, {"cpu_s": 0.0, "wall_s": 0.0, "tests": 0})
            for key in summed:
                summed[key] += cost[key]
    attributed = sum(cost["cpu_s"] for cost in files.values())
    rows = [
        {
            "file": name,
            "cpu_s": round(cost["cpu_s"], 2),
            "share": round(cost["cpu_s"] / total, 4) if total else 0.0,
            "tests": int(cost["tests"]),
            "wall_s": round(cost["wall_s"], 2),
        }
        for name, cost in sorted(files.items(), key=lambda entry: -entry[1]["cpu_s"])
    ]
    return {
        "command": command,
        "exit_status": done.returncode,
        "wall_s": round(wall, 2),
        "cpu_s": round(total, 2),
        "user_s": round(user, 2),
        "sys_s": round(system, 2),
        "attributed_cpu_s": round(attributed, 2),
        "unattributed_cpu_s": round(total - attributed, 2),
        "tests": sum(row["tests"] for row in rows),
        "orphans_reaped": reaped,
        "orphans_running": running,
        "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],  # 1 minute, before and after
        "processes": [
            {
                "worker": process["worker"],
                "cpu_s": round(process["process_cpu_s"], 2),
                "tests_cpu_s": round(sum(cost["cpu_s"] for cost in process["files"].values()), 2),
            }
            for process in processes
        ],
        "files": rows,
    }


def table(report: dict[str, Any], top: int) -> str:
    total, wall, outside = report["cpu_s"], report["wall_s"], report["unattributed_cpu_s"]
    cores = total / wall if wall else 0.0
    summary = (
        f"wall {wall:.1f} s; CPU {total:.1f} s (user {report['user_s']:.1f}, sys {report['sys_s']:.1f}), "
        f"{cores:.2f} cores over the wall; {report['tests']} tests in {len(report['files'])} files; "
        f"pytest exited {report['exit_status']}"
    )
    orphans = f"; {report['orphans_reaped']} orphans reaped, {report['orphans_running']} still running"
    split = (
        f"in tests {report['attributed_cpu_s']:.1f} s; outside any test {outside:.1f} s "
        f"({outside / total if total else 0:.1%}: collection, the workers' start and exit, the controller, orphans)"
        + orphans
    )
    lines = [
        summary,
        split,
        "",
        f"{'file':66} {'CPU s':>8} {'share':>6} {'tests':>6} {'wall s':>7}",
    ]
    for row in report["files"][:top]:
        cells = f"{row['cpu_s']:>8.1f} {row['share']:>6.1%} {row['tests']:>6} {row['wall_s']:>7.1f}"
        lines.append(f"{row['file']:66} {cells}")
    rest = report["files"][top:]
    if rest:
        cpu, tests = sum(row["cpu_s"] for row in rest), sum(row["tests"] for row in rest)
        lines.append(f"{f'({len(rest)} more files)':66} {cpu:>8.1f} {cpu / total if total else 0:>6.1%} {tests:>6}")
    before, after = report["load_average"]
    python = sys.version.split()[0]
    lines.append(f"(python {python}, {os.cpu_count()} CPUs, load average {before:.2f} before and {after:.2f} after)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args, pytest_args = parse(sys.argv[1:] if argv is None else argv)
    report = run_suite(pytest_args)
    print(json.dumps(report, indent=2) if args.json else table(report, args.top))
    return int(report["exit_status"])


if __name__ == "__main__":
    sys.exit(main())
