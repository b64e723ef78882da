"""Multi-node agreement: what spreading one engine over nodes costs, next to one node in the same run.

Both rows run ``fd-platforms run --json`` on the cpu platform with the same model, ``--tp 2`` and
``--device-memory``: the anchor ``1 node`` runs both ranks on one node (the minimum taken over the
engine's pipes); ``2 nodes`` runs two ``fd-platforms run --nnodes 2`` on 127.0.0.1 (one rank each,
their own engines and cache-ready signals), each starting its worker through ``python -m
paddle.distributed.launch``; the workers agree over the launcher's process group (gloo). From the
reports: ``join`` (a rank's ``Cluster.current``: joining the launcher's group and comparing every rank's
facts), ``agree`` (the ``all_gather`` of the plans), ``run`` (the report's wall time, the launchers'
start included; the slower node's for two nodes); ``ratio`` is ``run`` over the anchor's. With
``--repeat N`` every number is the median of N.

Run from the repository root: ``python benchmarks/multinode.py [--json] [--repeat N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
try:
    import fd_platforms  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(ROOT))

from fd_platforms.cli.table import format_table  # noqa: E402


def command(model: str, memory: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "fd_platforms.cli",
        "run",
        "--model",
        model,
        "--tp",
        "2",
        "--device-memory",
        memory,
        "--json",
        *extra,
    ]


def finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    stdout, stderr = process.communicate(timeout=300)
    if process.returncode != 0:
        raise SystemExit(f"multinode.py: {' '.join(map(str, process.args[2:]))} failed: {stderr.strip()}")  # type: ignore[index]  # a list: command()
    return json.loads(stdout)


def sample(model: str, memory: str) -> dict[str, dict[str, Any]]:
    """One single-node run, then one two-node run."""
    env = {k: v for k, v in os.environ.items() if k not in ("FD_PLATFORM", "FD_PLATFORM_PLUGINS")}

    def start(*extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            command(model, memory, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
        )

    one = finish(start())
    with socket.socket() as probe:  # a free port for the launchers to meet at
        probe.bind(("127.0.0.1", 0))
        master = f"127.0.0.1:{probe.getsockname()[1]}"
    nodes = [start("--nnodes", "2", "--node-rank", str(node), "--master", master) for node in (0, 1)]
    reports = [finish(process) for process in nodes]
    ranks = reports[0]["ranks"]  # node 0 reports every node's ranks
    return {
        "1 node": {
            "run_s": one["wall_seconds"],
            "num_blocks": one["ranks"][0]["num_blocks"],
            "join_s": None,
            "agree_s": None,
        },
        "2 nodes": {
            "run_s": max(report["wall_seconds"] for report in reports),
            "num_blocks": ranks[0]["num_blocks"],
            "join_s": max(rank["join_seconds"] for rank in ranks),
            "agree_s": max(report["nodes"]["agree_seconds"] for report in reports),
        },
    }


def measure(model: str, memory: str, repeat: int) -> list[dict[str, Any]]:
    samples = [sample(model, memory) for _ in range(repeat)]
    rows = []
    for name in ("1 node", "2 nodes"):
        row: dict[str, Any] = {"setup": name, "runs": repeat}
        for key in samples[0][name]:
            values = [s[name][key] for s in samples if s[name][key] is not None]
            row[key] = round(statistics.median(values), 4) if values else None
        rows.append(row)
    for row in rows:
        row["ratio"] = round(row["run_s"] / rows[0]["run_s"], 3)
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{1000 * value:.1f}"

    lines = [
        (
            row["setup"],
            row["num_blocks"],
            ms(row["join_s"]),
            ms(row["agree_s"]),
            f"{row['run_s']:.2f}",
            f"{row['ratio']:.2f}",
        )
        for row in rows
    ]
    return f"median of {rows[0]['runs']} run(s); 2 ranks in all (--tp 2)\n" + format_table(
        ("setup", "blocks/rank", "join ms", "agree ms", "run s", "ratio"), lines
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print a JSON list of rows instead of a table")
    parser.add_argument("--repeat", type=int, default=3, help="samples per row; the median is shown (3)")
    parser.add_argument("--model", default="examples/llama-3.1-8b", help="model folder (examples/llama-3.1-8b)")
    parser.add_argument("--device-memory", default="256MiB", help="device memory per rank (256MiB)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    rows = measure(args.model, args.device_memory, args.repeat)
    print(json.dumps(rows, indent=2) if args.json else render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
