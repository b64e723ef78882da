"""KV-cache lifecycle: where ``fd-platforms run`` spends its time, for 1, 2 and 4 ranks.

Each sample is one real ``fd-platforms run --json`` (a fresh engine process and its children) on
the cpu platform with ``--tp N --ranks N``, a small model and a small ``--device-memory``, along
two paths:

- ``creator``: role ``mixed``, no swap space: every worker allocates its own cache;
- ``manager``: role ``prefill`` with ``--swap-space``: the cache manager allocates every rank's
  cache and host swap space while the workers wait for their slots.

From the run's own report: ``plan`` (a worker's layout + planning), ``allocate`` (device cache,
plus host swap on the manager path), ``wait`` (a worker's wait for its slot; creators do not
wait), each as the max and mean over ranks; ``run`` is the report's wall time (engine start of
the signal to its removal: process start-up and paddle imports included) and ``command`` the
whole command with interpreter start-up. With ``--repeat N`` every number is the median of N runs.

Run from the repository root: ``python benchmarks/lifecycle.py [--json] [--repeat N] [--ranks 1,2,4]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
try:
    import fd_platforms  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(ROOT))

from fd_platforms.cli.table import format_table  # noqa: E402

PATHS = {
    "creator": ("--role", "mixed"),
    "manager": ("--role", "prefill", "--swap-space", "64MiB"),
}
PHASES = ("plan", "allocate", "wait")


def run_once(ranks: int, path: str, model: str, device_memory: str) -> dict[str, Any]:
    """One ``fd-platforms run --json``; the phase times of its report, in seconds."""
    argv = [
        sys.executable,
        "-m",
        "fd_platforms.cli",
        "run",
        "--model",
        model,
        "--tp",
        str(ranks),
        "--ranks",
        str(ranks),
        "--device-memory",
        device_memory,
        *PATHS[path],
        "--json",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("FD_PLATFORM", "FD_PLATFORM_PLUGINS")}
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300, check=False)
    command = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"lifecycle.py: {' '.join(argv[2:])} failed (exit {done.returncode}): {done.stderr.strip()}")
    report = json.loads(done.stdout)
    per_rank = {
        "plan": [rank["plan_seconds"] for rank in report["ranks"]],
        "allocate": [rank["allocate_seconds"] for rank in report["ranks"]],
        "wait": [rank["wait_seconds"] for rank in report["ranks"] if rank["wait_seconds"] is not None],
    }
    sample: dict[str, Any] = {
        "num_blocks": report["ranks"][0]["num_blocks"],
        "device_bytes": report["ranks"][0]["device_bytes"],
        "host_bytes": report["ranks"][0]["host_bytes"],
        "run_s": report["wall_seconds"],
        "command_s": command,
    }
    for phase, values in per_rank.items():
        sample[f"{phase}_max_s"] = max(values) if values else None
        sample[f"{phase}_mean_s"] = statistics.fmean(values) if values else None
    return sample


def measure(ranks: int, path: str, model: str, device_memory: str, repeat: int) -> dict[str, Any]:
    """The median of ``repeat`` runs, field by field."""
    samples = [run_once(ranks, path, model, device_memory) for _ in range(repeat)]
    row: dict[str, Any] = {"ranks": ranks, "path": path, "runs": repeat}
    for key in samples[0]:
        values = [sample[key] for sample in samples if sample[key] is not None]
        row[key] = round(statistics.median(values), 4) if values else None
    return row


def render(rows: list[dict[str, Any]]) -> str:
    """The rows as a text table, times in milliseconds (max / mean over ranks)."""

    def ms(row: dict[str, Any], phase: str) -> str:
        if row[f"{phase}_max_s"] is None:
            return "-"
        return f"{1000 * row[f'{phase}_max_s']:.1f} / {1000 * row[f'{phase}_mean_s']:.1f}"

    headers = (
        "ranks",
        "path",
        "blocks/rank",
        "MiB/rank (device+host)",
        "plan ms",
        "allocate ms",
        "wait ms",
        "run s",
        "command s",
    )
    lines = [
        (
            row["ranks"],
            row["path"],
            row["num_blocks"],
            f"{(row['device_bytes'] + row['host_bytes']) / 2**20:.0f}",
            ms(row, "plan"),
            ms(row, "allocate"),
            ms(row, "wait"),
            f"{row['run_s']:.2f}",
            f"{row['command_s']:.2f}",
        )
        for row in rows
    ]
    runs = rows[0]["runs"]
    return f"median of {runs} run(s); plan/allocate/wait as max / mean over ranks\n" + format_table(headers, lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print a JSON list of rows instead of a table")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row; the median is shown (3)")
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts (1,2,4)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of: {', '.join(PATHS)}")
    parser.add_argument("--model", default="examples/qwen3-30b-a3b", help="model folder (examples/qwen3-30b-a3b)")
    parser.add_argument("--device-memory", default="512MiB", help="device memory per rank (512MiB)")
    args = parser.parse_args(argv)
    try:
        ranks = [int(value) for value in args.ranks.split(",")]
    except ValueError:
        ranks = []
    if not ranks or min(ranks) < 1:
        parser.error(f"--ranks={args.ranks!r}: give whole numbers >= 1, e.g. 1,2,4")
    paths = [name.strip() for name in args.paths.split(",") if name.strip()]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown or not paths:
        parser.error(f"--paths={args.paths!r}: unknown {unknown}; choose from: {', '.join(PATHS)}")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    rows = [measure(n, path, args.model, args.device_memory, args.repeat) for n in ranks for path in paths]
    print(json.dumps(rows, indent=2) if args.json else render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
