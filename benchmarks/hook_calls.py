"""What a call into the selected platform costs, against the plain pluggy call of the same hook.

A platform's hook call (``Platform.device_memory``) checks the caller's argument, runs the plugin's
hook as plugin code in the caller's thread (its deadline handed to the watchdog thread, the
standard descriptors compared, every exception isolated) and checks the answer's record type. The
anchor is the same hook of the same plugin called through a bare pluggy manager in the same run:
the built-in cpu platform's ``device_memory`` (it reads the host's memory facts, as a device
plugin asks its runtime). The goal: at most 2x the anchor. Two more rows show the fixed cost
alone, on a hook that returns at once. ``--json`` prints the rows and the ratio.

    python benchmarks/hook_calls.py [--calls 5000] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import timeit
from collections.abc import Callable
from importlib import metadata
from typing import Any

import pluggy

from fd_platforms.builtin import cpu as builtin_cpu
from fd_platforms.contract import hookspecs
from fd_platforms.contract.hookspecs import hookimpl
from fd_platforms.contract.types import Detection, DeviceMemory, PlatformIdentity
from fd_platforms.loading import defaults
from fd_platforms.loading.discovery import Candidate
from fd_platforms.loading.platform import Platform, register_platform
from fd_platforms.loading.selection import select_platform

GOAL_RATIO = 2.0  # a hook call through Platform costs at most twice the plain pluggy call


class BenchPlugin:
    """A platform whose device_memory answers at once: the call's own cost is all there is to measure."""

    memory = DeviceMemory(total_bytes=80 * 2**30, free_bytes=70 * 2**30, process_bytes=0, source="benchmark")

    @hookimpl
    def platform_identity(self) -> PlatformIdentity:
        return PlatformIdentity("bench", "cpu", None)

    @hookimpl
    def detect_platform(self) -> Detection:
        return Detection(True, "benchmark", 1)

    @hookimpl
    def supported_api_versions(self) -> str:
        return ">=1.0,<2"

    @hookimpl
    def device_memory(self, device_id: int) -> DeviceMemory:
        return self.memory


def bench_platform() -> Platform:
    entry_point = metadata.EntryPoint(name="bench", value="hook_calls:BenchPlugin", group="fd_platforms")
    return register_platform(Candidate("bench", entry_point, "fd-platforms-bench", "0", False), BenchPlugin())


def plain_manager(plugin: object, name: str) -> pluggy.PluginManager:
    """The anchor: the same specs, the core's defaults and the plugin in a bare pluggy manager."""
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    manager.register(defaults)
    manager.register(plugin, name=name)
    return manager


def per_call_us(call: Callable[[], object], calls: int, repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``calls`` calls, in microseconds per call."""
    return min(timeit.repeat(call, number=calls, repeat=repeat)) / calls * 1e6


ANCHOR = "plain pluggy call: the cpu platform's device_memory (anchor)"
MEASURED = "Platform.device_memory(0) on the cpu platform"


def measure(calls: int, repeat: int) -> list[dict[str, object]]:
    cpu = select_platform({"FD_PLATFORM": "cpu"}).platform
    plain_cpu, bench, plain_bench = (
        plain_manager(builtin_cpu, "cpu"),
        bench_platform(),
        plain_manager(BenchPlugin(), "b"),
    )
    runs = {
        ANCHOR: lambda: plain_cpu.hook.device_memory(device_id=0),
        MEASURED: lambda: cpu.device_memory(0),
        "plain pluggy call: a device_memory that returns at once": lambda: plain_bench.hook.device_memory(device_id=0),
        "Platform.device_memory(0) that returns at once: the fixed cost": lambda: bench.device_memory(0),
    }
    return [
        {"measurement": name, "us_per_call": round(per_call_us(run, calls, repeat), 2), "calls": calls}
        for name, run in runs.items()
    ]


def ratio(rows: list[dict[str, Any]]) -> dict[str, object]:
    """The platform's call as a multiple of the plain pluggy call, both from the same run."""
    us = {row["measurement"]: float(row["us_per_call"]) for row in rows}
    anchor, measured = us[ANCHOR], us[MEASURED]
    value = measured / anchor
    return {"ratio": round(value, 2), "goal": GOAL_RATIO, "met": value <= GOAL_RATIO}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = measure(args.calls, args.repeat)
    anchored = ratio(rows)
    if args.json:
        print(json.dumps({"rows": rows, "platform_vs_plain_pluggy": anchored}, indent=2))
        return
    print(f"{'measurement':66} {'us per call':>12}")
    for row in rows:
        print(f"{row['measurement']:66} {row['us_per_call']:>12.2f}")
    verdict = "met" if anchored["met"] else "NOT met"
    print(f"Platform call / plain pluggy call = {anchored['ratio']:.2f}x (goal <= {GOAL_RATIO:g}x: {verdict})")
    print(f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs, best of {args.repeat} x {args.calls} calls)")


if __name__ == "__main__":
    main()
