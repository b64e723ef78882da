"""FastDeploy's own cpu unit tests of the files the port changes, before and after the port: the ids that pass.

``python tests/support/fastdeploy_own_tests.py TREE --python PYTHON --hooks-python HOOKS [--json]``: ``TREE`` is a
clean FastDeploy work tree at the guide's commit, ``PYTHON`` a Python with FastDeploy's requirements, pytest-timeout
and fd-platforms installed, ``HOOKS`` one with black, isort and ruff at FastDeploy's pins (for the port). Each file
runs as its own pytest session in the tree (``-p fastdeploy_cpu_ops``, a 30 s limit a test: four of the transfer
manager's tests loop for ever on cpu Paddle, before the port as after it); then the port (``port_splice``) is
applied, they run again, and the tree is put back. It prints the counts per file and exits 1 where an id that
passed before fails after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from port_splice import apply, format_as_fastdeploy  # noqa: E402

FILES = (
    "tests/cache_manager/test_cache_transfer_manager.py",
    "tests/cache_manager/test_cache_messager.py",
    "tests/worker/test_gpu_model_runner.py",
    "tests/worker/test_gpu_worker.py",
    "tests/worker/test_worker_process.py",
    "tests/inter_communicator/test_ipc_signal.py",
)
OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED) (\S+)", re.M)


def outcomes(tree: Path, python: str, file: str) -> dict[str, list[str]]:
    """The test ids of one FastDeploy test file by outcome (``PASSED``, ``FAILED``, ...), from ``pytest -rA``."""
    command = [python, "-m", "pytest", file, "-q", "-rA", "-p", "no:cacheprovider", "-p", "fastdeploy_cpu_ops"]
    environ = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{HERE}"}
    done = subprocess.run([*command, "--timeout=30"], cwd=tree, env=environ, capture_output=True, text=True)
    found: dict[str, list[str]] = {}
    for word, test in OUTCOME.findall(done.stdout):
        found.setdefault(word, []).append(test)
    return {word: sorted(tests) for word, tests in found.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", type=Path)
    parser.add_argument("--python", required=True, help="a Python with FastDeploy's requirements and fd-platforms")
    parser.add_argument("--hooks-python", default=sys.executable, help="a Python with FastDeploy's black, isort, ruff")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    before = {file: outcomes(args.tree, args.python, file) for file in FILES}
    try:
        format_as_fastdeploy(args.tree, apply(args.tree), args.hooks_python)
        after = {file: outcomes(args.tree, args.python, file) for file in FILES}
    finally:
        subprocess.run(["git", "checkout", "-q", "."], cwd=args.tree, check=True)
    report = {
        file: {
            "before": {word: len(tests) for word, tests in before[file].items()},
            "after": {word: len(tests) for word, tests in after[file].items()},
            "lost": sorted(set(before[file].get("PASSED", [])) - set(after[file].get("PASSED", []))),
        }
        for file in FILES
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for file, row in report.items():
            print(f"{file}: before {row['before']}, after {row['after']}, lost {len(row['lost'])}")
    return 1 if any(row["lost"] for row in report.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
