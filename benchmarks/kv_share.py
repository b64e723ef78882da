"""KV-cache sharing on the cpu platform: create, attach, clear + re-create, and growth over many cycles.

One run, one size (``--size`` of cache per rank, default 1GiB), for each model (DeepSeek-V3: MLA,
61 tensors per rank; Qwen3-30B-A3B: GQA, 96 tensors per rank). This process owns the engine's
cache-ready signal and is the attaching worker; a spawned *creator* process is the cache manager:
it publishes rank 0's cache with :func:`~fd_platforms.engine.manage_kv_cache` (every tensor exported into a
memfd zero-filled by the kernel, the manifest published in ``/dev/shm``, the slot set). Per model:

1. **create**: the creator's ``manage_kv_cache`` call, as GiB/s of the rank's cache bytes, against
   the physical anchor for *fresh* memory: the kernel handing out zeroed pages for the same tensor
   sizes (raw ``memfd_create`` + ``posix_fallocate`` of each, in the creator, timed until every
   page is there). No fresh allocation can beat that; goal: create >= 0.8 of its speed. Beside it,
   for scale, a single-thread memset of the same bytes over a buffer already touched once (``numpy``
   ``fill(0)``: memory bandwidth without page faults, which no fresh allocation can reach).
2. **attach**: with the creator's cache already published, this process times
   ``initialize_kv_cache(platform, ..., splitwise_role="decode", creator_pid=<creator>)``: the
   KVCache's ``attach_seconds`` (opening every published tensor) apart from ``wait_seconds`` (the
   slot is set already, so the wait is near zero) and the whole call. Goal: attach <= 20 ms per rank.
   The model's first attach in this process (the first warm-up cycle: cold caches, as a worker's
   one attach at start-up is; Paddle is imported and used once before, as in a worker) is shown
   apart, not in the median.
3. **recreate**: one full cycle from the attached state, timed here: this process's ``clear()``, the
   creator's ``clear()`` and its re-publish, this process's re-initialize (which waits on the slot
   while the creator works). The overhead is, per cycle, the cycle minus the creator's allocation
   (``KVCache.create_seconds``: export + publish) and minus the creator's clear, which is almost all
   the kernel freeing the pages: the two costs proportional to the size that any clear and
   re-create of that much memory pays. Goal: overhead beyond allocating and freeing <= 20 ms. The
   *free anchor* beside it (raw ``memfd_create`` + ``posix_fallocate`` of the same tensor sizes, then
   timing their ``close()``) shows what freeing alone costs; the overhead beyond allocation alone
   is in the JSON too.
4. **growth**: after the warm-up (``--warmup`` cycles before anything is timed, and the timed
   cycles), ``--cycles`` more cycles (default 100); the growth, from before to after, in the
   attached state both times, of each process's RSS (``/proc/<pid>/statm``) and open fds
   (``/proc/<pid>/fd``), and of this run's ``/dev/shm`` entries (``fd_cache_ready.<instance>`` and
   ``fd_kv_cache.<instance>.rank*``; entries of other engines are not counted). Goal: 0 entries,
   0 fds, RSS growth <= 2 KiB a cycle in both processes (Paddle's own ``from_dlpack`` leaked 8.4 KiB a cycle
   of 96 tensors: :mod:`fd_platforms.contract.dlpack`).

Measures 1-3 and the anchors are the median of ``--repeat`` samples (default 5). Every wait is
bounded; the creator, the signal and any ``/dev/shm`` entry of the run are removed on every path.

Run from the repository root:
``python benchmarks/kv_share.py [--json] [--repeat N] [--size 1GiB] [--cycles 100] [--warmup 3] [--models a,b]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform as python_platform
import secrets
import signal as signals
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
try:
    import fd_platforms  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(ROOT))

from fd_platforms.cli.table import format_table  # noqa: E402
from fd_platforms.contract.errors import FdPlatformsError  # noqa: E402
from fd_platforms.engine import CacheRequest, initialize_kv_cache, manage_kv_cache  # noqa: E402
from fd_platforms.engine.publication import PUBLICATION_PREFIX  # noqa: E402
from fd_platforms.ipc.cache_signal import SIGNAL_PREFIX, CacheReadySignal, new_signal_name  # noqa: E402
from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config  # noqa: E402
from fd_platforms.rules.layout import CacheLayout, build_layout  # noqa: E402
from fd_platforms.rules.sizes import format_size, parse_size  # noqa: E402

MODELS = {"deepseek-v3": ROOT / "examples" / "deepseek-v3", "qwen3-30b-a3b": ROOT / "examples" / "qwen3-30b-a3b"}
GOAL = {"ratio": 0.8, "attach_ms": 20.0, "overhead_ms": 20.0, "rss_per_cycle_kib": 2.0}
GOAL_TEXT = {
    "create": "create/fresh pages >= 0.8",
    "attach": "attach <= 20 ms",
    "recreate": "beyond alloc+free <= 20 ms",
    "growth": "0 shm, 0 fds, RSS <= 2 KiB a cycle",
}
START_SECONDS = 180.0  # the creator's start (spawn, imports) on a loaded machine
STEP_SECONDS = 120.0  # any one step of the creator, and any wait of this process for a slot
CLEAR_SECONDS = 30.0  # a creator's clear waits at most this long for the attacher to let go
SHM_DIR = Path("/dev/shm")


def layout_of(model: str) -> CacheLayout:
    """Rank 0's layout of ``model`` at tensor parallel 1, default cache settings."""
    return build_layout(load_model_config(MODELS[model]), CacheConfig(), ParallelConfig(1, 0))


def cpu_platform() -> Any:
    from fd_platforms.loading.selection import select_platform

    return select_platform({"FD_PLATFORM": "cpu"}).platform


def warm_paddle() -> None:
    """Import Paddle and wrap one small array as a tensor, as a worker that loaded its model has
    long done: the first attach is then timed without Paddle's import (about a second)."""
    import numpy as np

    from fd_platforms.contract.paddle_import import import_paddle

    paddle = import_paddle()
    paddle.from_dlpack(np.zeros((2, 4), dtype=np.uint8)).view("bfloat16")


# -- the creator process (the cache manager) --------------------------------------------------


def creator(instance: str, link: Connection) -> None:
    """Serve the benchmark: ``anchors``, ``publish``, ``clear``, ``recreate``, ``stop``; each answered
    with ``("ok", result)`` or ``("error", text)``. Ends on ``stop``, on an error, or when the benchmark
    is gone."""
    platform = cpu_platform()
    warm_paddle()
    managed: Any = None

    def publish(model: str, num_blocks: int) -> dict[str, float]:
        nonlocal managed
        layout = layout_of(model)
        started = time.perf_counter()
        request = CacheRequest(
            layout=layout, num_blocks=num_blocks, num_cpu_blocks=0, splitwise_role="mixed", instance=instance
        )
        managed = manage_kv_cache(platform, request)
        return {"create_s": time.perf_counter() - started, "export_s": managed.kv_cache.create_seconds}

    def clear() -> dict[str, float]:
        nonlocal managed
        started = time.perf_counter()
        if managed is not None:
            managed.clear(CLEAR_SECONDS)
            managed = None
        return {"clear_s": time.perf_counter() - started}

    link.send(("ok", os.getpid()))
    try:
        while link.poll(STEP_SECONDS * 10):
            try:
                kind, argument = link.recv()
            except (EOFError, OSError):  # the benchmark is gone
                return
            if kind == "stop":
                return
            try:
                if kind == "anchors":
                    result: Any = anchors(*argument)
                elif kind == "publish":
                    result = publish(*argument)
                elif kind == "clear":
                    result = clear()
                elif kind == "recreate":
                    result = clear()
                    result.update(publish(*argument))
                else:
                    raise ValueError(f"unknown request {kind!r}")
            except Exception as exc:  # noqa: BLE001 - reported to the benchmark, which stops with it; a worker waiting for
                link.send(("error", f"{type(exc).__name__}: {exc}"))  # the slot sees this process exit
                return
            else:
                link.send(("ok", result))
    finally:
        if managed is not None:
            with contextlib.suppress(Exception):  # the benchmark removes what is left once this process is gone
                managed.clear(5.0)


def anchors(nbytes: int, tensor_bytes: list[int], repeat: int) -> dict[str, list[float]]:
    """The physical anchors, ``repeat`` samples each: a single-thread memset of ``nbytes`` over a
    buffer touched once before (memory bandwidth, no page faults); the kernel handing out zeroed
    pages for memfds of ``tensor_bytes`` (``memfd_create`` + ``posix_fallocate``, timed); and the
    kernel freeing them again (only the ``close()`` timed)."""
    import numpy as np

    buffer = np.empty(nbytes, dtype=np.uint8)
    buffer.fill(0)  # touch every page: the samples below measure bandwidth only
    memset = []
    for _ in range(repeat):
        started = time.perf_counter()
        buffer.fill(0)
        memset.append(time.perf_counter() - started)
    del buffer
    fresh, free = [], []
    for _ in range(repeat):
        fds: list[int] = []
        try:
            started = time.perf_counter()
            for size in tensor_bytes:
                fds.append(os.memfd_create("fd_kv.kv_share-anchor", os.MFD_CLOEXEC))
                os.posix_fallocate(fds[-1], 0, size)
            fresh.append(time.perf_counter() - started)
            started = time.perf_counter()
            while fds:
                os.close(fds.pop())
            free.append(time.perf_counter() - started)
        finally:
            while fds:
                os.close(fds.pop())
    return {"memset_s": memset, "fresh_s": fresh, "free_s": free}


# -- this process (the engine and the attaching worker) --------------------------------------


class Run:
    """The run's signal, creator process and this process's attached cache; :meth:`close` removes all."""

    def __init__(self) -> None:
        self.instance = f"kv_share-{os.getpid()}-{secrets.token_hex(4)}"
        self.platform = cpu_platform()
        warm_paddle()
        self.cache: Any = None
        self.ready = CacheReadySignal.create(1, new_signal_name(self.instance))
        spawn = multiprocessing.get_context("spawn")
        self.link, far_end = spawn.Pipe()
        self.process = spawn.Process(target=creator, args=(self.ready.name, far_end), daemon=True)
        try:
            self.process.start()
            far_end.close()
            self.pid: int = self.receive(START_SECONDS, "start")
        except BaseException:
            self.close()
            raise

    # requests to the creator

    def receive(self, timeout: float, what: str) -> Any:
        try:
            if not self.link.poll(timeout):
                raise RuntimeError(f"the creator process did not answer {what!r} within {timeout:g} s")
            status, result = self.link.recv()
        except (EOFError, OSError) as exc:
            raise RuntimeError(f"the creator process exited before answering {what!r} ({exc!r})") from None
        if status != "ok":
            raise RuntimeError(f"the creator process failed at {what!r}: {result}")
        return result

    def ask(self, kind: str, argument: object = None) -> Any:
        self.send(kind, argument)
        return self.receive(STEP_SECONDS, kind)

    def send(self, kind: str, argument: object = None) -> None:
        try:
            self.link.send((kind, argument))
        except OSError as exc:
            raise RuntimeError(f"the creator process is gone; cannot send {kind!r} ({exc!r})") from None

    # this process's side

    def attach(self, layout: CacheLayout, num_blocks: int) -> float:
        """Initialize this process's cache by attaching; the whole call's seconds."""
        started = time.perf_counter()
        request = CacheRequest(
            layout=layout,
            num_blocks=num_blocks,
            num_cpu_blocks=0,
            splitwise_role="decode",
            instance=self.ready.name,
            creator_pid=self.pid,
            timeout=STEP_SECONDS,
        )  # made inside the timed call, as every runner makes it
        self.cache = initialize_kv_cache(self.platform, request)
        return time.perf_counter() - started

    def detach(self) -> float:
        started = time.perf_counter()
        if self.cache is not None:
            self.cache.clear(CLEAR_SECONDS)
            self.cache = None
        return time.perf_counter() - started

    def cycle(self, model: str, layout: CacheLayout, num_blocks: int) -> dict[str, float]:
        """One full clear + re-create from the attached state (see the module docstring, measure 3)."""
        started = time.perf_counter()
        detached = self.detach()
        self.send("recreate", (model, num_blocks))  # the creator clears and re-publishes while we wait
        try:
            call = self.attach(layout, num_blocks)
        except FdPlatformsError:
            if self.link.poll(1.0):
                self.receive(0, "recreate")  # the creator's own error, if it failed
            raise
        cycle = time.perf_counter() - started
        creator = self.receive(STEP_SECONDS, "recreate")
        return {
            "cycle_s": cycle,
            "attacher_clear_s": detached,
            "creator_clear_s": creator["clear_s"],
            "create_s": creator["create_s"],
            "export_s": creator["export_s"],
            "call_s": call,
            "attach_s": self.cache.attach_seconds,
            "wait_s": self.cache.wait_seconds,
        }

    # the machine's view of both processes

    def entries(self) -> int:
        """This run's entries in /dev/shm (the signal and the rank's publication)."""
        ours = (SIGNAL_PREFIX + self.instance, f"{PUBLICATION_PREFIX}{self.instance}.")
        return sum(1 for entry in os.listdir(SHM_DIR) if entry == ours[0] or entry.startswith(ours[1]))

    def snapshot(self) -> dict[str, int]:
        facts = {"shm_entries": self.entries()}
        for who, pid in (("benchmark", os.getpid()), ("creator", self.pid)):
            facts[f"rss_{who}"] = resident(pid)
            facts[f"fds_{who}"] = len(os.listdir(f"/proc/{pid}/fd"))
        return facts

    def close(self) -> None:
        """Let go of everything, whatever state the run stopped in. Never raises."""
        try:
            self.detach()
        except Exception as exc:  # noqa: BLE001 - cleanup goes on; the process exit drops the mappings
            print(f"kv_share.py: clearing this process's cache failed: {exc}", file=sys.stderr)
            self.cache = None
        if self.process.pid is not None and self.process.is_alive():
            with contextlib.suppress(OSError):
                self.link.send(("stop", None))
            self.process.join(CLEAR_SECONDS + 10)
        if self.process.pid is not None and self.process.is_alive():
            self.process.kill()
            self.process.join(10)
        self.link.close()
        self.ready.close()
        for entry in os.listdir(SHM_DIR):  # a creator that had to be killed leaves its publication
            if entry.startswith(f"{PUBLICATION_PREFIX}{self.instance}.") or entry == SIGNAL_PREFIX + self.instance:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(SHM_DIR / entry)


def resident(pid: int) -> int:
    with open(f"/proc/{pid}/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def median(samples: list[dict[str, float]], key: str) -> float:
    return statistics.median(sample[key] for sample in samples)


def measure_model(run: Run, model: str, size: int, repeat: int, warmup: int, cycles: int) -> list[dict[str, Any]]:
    """The four rows of one model."""
    layout = layout_of(model)
    num_blocks = size // layout.bytes_per_block
    nbytes = num_blocks * layout.bytes_per_block
    tensors = [num_blocks * spec.bytes_per_block for spec in layout.tensors]
    base = {"model": model, "tensors": len(tensors), "num_blocks": num_blocks, "bytes": nbytes}
    anchor = run.ask("anchors", (nbytes, tensors, repeat))
    memset_s, free_s = statistics.median(anchor["memset_s"]), statistics.median(anchor["free_s"])
    fresh_s = statistics.median(anchor["fresh_s"])

    def publish_attach_clear() -> dict[str, float]:
        created = run.ask("publish", (model, num_blocks))
        call = run.attach(layout, num_blocks)
        sample = {**created, "call_s": call, "attach_s": run.cache.attach_seconds, "wait_s": run.cache.wait_seconds}
        run.detach()
        run.ask("clear")
        return sample

    first = publish_attach_clear()  # this model's first attach in this process: cold, shown apart
    for _ in range(warmup - 1):
        publish_attach_clear()
    fresh = [publish_attach_clear() for _ in range(repeat)]  # measures 1 and 2
    run.ask("publish", (model, num_blocks))
    run.attach(layout, num_blocks)
    full = [run.cycle(model, layout, num_blocks) for _ in range(repeat)]  # measure 3
    before = run.snapshot()
    for _ in range(cycles):  # measure 4
        run.cycle(model, layout, num_blocks)
    after = run.snapshot()
    run.detach()
    run.ask("clear")

    create_s = median(fresh, "create_s")
    create = {
        **base,
        "measure": "create",
        "samples": repeat,
        "create_ms": ms(create_s),
        "create_gib_s": gib_s(nbytes, create_s),
        "fresh_ms": ms(fresh_s),
        "fresh_gib_s": gib_s(nbytes, fresh_s),
        "ratio": round(fresh_s / create_s, 3),
        "memset_ms": ms(memset_s),
        "memset_gib_s": gib_s(nbytes, memset_s),
        "memset_ratio": round(memset_s / create_s, 3),
    }
    create["met"] = create["ratio"] >= GOAL["ratio"]
    attach: dict[str, Any] = {
        **base,
        "measure": "attach",
        "samples": repeat,
        "attach_ms": ms(median(fresh, "attach_s")),
        "wait_ms": ms(median(fresh, "wait_s")),
        "initialize_ms": ms(median(fresh, "call_s")),
        "first_attach_ms": ms(first["attach_s"]),
    }
    attach["met"] = attach["attach_ms"] <= GOAL["attach_ms"]
    overheads = [sample["cycle_s"] - sample["export_s"] for sample in full]
    recreate: dict[str, Any] = {
        **base,
        "measure": "recreate",
        "samples": repeat,
        "cycle_ms": ms(median(full, "cycle_s")),
        "export_ms": ms(median(full, "export_s")),
        "overhead_ms": ms(statistics.median(overheads)),
        "attacher_clear_ms": ms(median(full, "attacher_clear_s")),
        "creator_clear_ms": ms(median(full, "creator_clear_s")),
        "attach_ms": ms(median(full, "attach_s")),
        "free_anchor_ms": ms(free_s),
        "overhead_beyond_free_ms": ms(
            statistics.median(sample["cycle_s"] - sample["export_s"] - sample["creator_clear_s"] for sample in full)
        ),
    }
    recreate["met"] = recreate["overhead_beyond_free_ms"] <= GOAL["overhead_ms"]
    growth: dict[str, Any] = {**base, "measure": "growth", "cycles": cycles, "cycles_before": warmup + 2 * repeat}
    growth["shm_entries"] = after["shm_entries"]
    growth["shm_entries_growth"] = after["shm_entries"] - before["shm_entries"]
    for who in ("benchmark", "creator"):
        growth[f"fds_{who}"] = after[f"fds_{who}"]
        growth[f"fds_growth_{who}"] = after[f"fds_{who}"] - before[f"fds_{who}"]
        growth[f"rss_{who}_bytes"] = after[f"rss_{who}"]
        growth[f"rss_growth_{who}_bytes"] = after[f"rss_{who}"] - before[f"rss_{who}"]
        growth[f"rss_growth_{who}_percent"] = round(100 * growth[f"rss_growth_{who}_bytes"] / before[f"rss_{who}"], 3)
        growth[f"rss_growth_{who}_kib_per_cycle"] = round(growth[f"rss_growth_{who}_bytes"] / cycles / 1024, 2)
    growth["met"] = (
        growth["shm_entries_growth"] == 0
        and growth["fds_growth_benchmark"] == 0
        and growth["fds_growth_creator"] == 0
        and max(growth["rss_growth_benchmark_kib_per_cycle"], growth["rss_growth_creator_kib_per_cycle"])
        <= GOAL["rss_per_cycle_kib"]
    )
    rows = [create, attach, recreate, growth]
    for row in rows:
        row["goal"] = GOAL_TEXT[row["measure"]]
    return rows


def ms(seconds: float) -> float:
    return round(1000 * seconds, 3)


def gib_s(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 2**30, 3)


def machine() -> dict[str, Any]:
    """The facts the numbers depend on."""
    cpus_usable: int | None
    try:
        cpus_usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus_usable = os.cpu_count()
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled", encoding="ascii") as handle:
            thp = next(word.strip("[]") for word in handle.read().split() if word.startswith("["))
    except (OSError, StopIteration):
        thp = "unknown"
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        total = int(meminfo.readline().split()[1]) * 1024
    return {
        "python": python_platform.python_version(),
        "cpus": os.cpu_count(),
        "cpus_usable": cpus_usable,
        "kernel": python_platform.release(),
        "memory": format_size(total),
        "shmem_thp": thp,
    }


def result_text(row: dict[str, Any]) -> str:
    if row["measure"] == "create":
        return (
            f"{row['create_gib_s']:.2f} GiB/s ({row['create_ms']:.1f} ms) vs fresh pages "
            f"{row['fresh_gib_s']:.2f} GiB/s ({row['fresh_ms']:.1f} ms): ratio {row['ratio']:.2f}; memset over "
            f"touched memory {row['memset_gib_s']:.2f} GiB/s (ratio {row['memset_ratio']:.2f})"
        )
    if row["measure"] == "attach":
        return (
            f"attach {row['attach_ms']:.2f} ms, wait {row['wait_ms']:.2f} ms, whole initialize_kv_cache "
            f"{row['initialize_ms']:.2f} ms; first (cold) attach {row['first_attach_ms']:.2f} ms"
        )
    if row["measure"] == "recreate":
        return (
            f"{row['overhead_beyond_free_ms']:.1f} ms beyond allocating and freeing (cycle {row['cycle_ms']:.1f} "
            f"- export {row['export_ms']:.1f} - creator's clear {row['creator_clear_ms']:.1f}; free anchor "
            f"{row['free_anchor_ms']:.1f}); in it: attacher's clear {row['attacher_clear_ms']:.1f}, attach "
            f"{row['attach_ms']:.1f}"
        )
    return (
        f"shm {row['shm_entries_growth']:+d} (now {row['shm_entries']}), "
        f"fds {row['fds_growth_benchmark']:+d}/{row['fds_growth_creator']:+d}, "
        f"RSS {row['rss_growth_benchmark_kib_per_cycle']:+.2f}/{row['rss_growth_creator_kib_per_cycle']:+.2f} KiB a "
        f"cycle ({format_size(row['rss_growth_benchmark_bytes'])}/{format_size(row['rss_growth_creator_bytes'])}) "
        "benchmark/creator"
    )


def render(rows: list[dict[str, Any]], facts: dict[str, Any], repeat: int) -> str:
    """The rows as a text table, the goal check per row, the machine in the footer."""
    headers = ("model", "tensors", "MiB/rank", "measure", "goal", "met", "result")
    lines = [
        (
            row["model"],
            row["tensors"],
            f"{row['bytes'] / 2**20:.0f}",
            row["measure"] + _cycles(row),
            row["goal"],
            "met" if row["met"] else "missed",
            result_text(row),
        )
        for row in rows
    ]
    header = (
        f"cpu platform, one rank; create/attach/recreate: median of {repeat}; fresh pages = memfd_create + "
        "posix_fallocate of the same tensors (the kernel's zeroed pages); memset = single-thread numpy fill(0) "
        "over an already-touched buffer (memory bandwidth, no page faults)"
    )
    footer = (
        f"python {facts['python']}, {facts['cpus']} CPUs ({facts['cpus_usable']} usable), kernel {facts['kernel']}, "
        f"{facts['memory']} memory, shmem THP {facts['shmem_thp']}"
    )
    return f"{header}\n{format_table(headers, lines)}\n{footer}"


def _cycles(row: dict[str, Any]) -> str:
    return f" ({row['cycles']} cycles)" if row["measure"] == "growth" else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print a JSON list of rows instead of a table")
    parser.add_argument("--repeat", type=int, default=5, help="samples per timed measure; the median is shown (5)")
    parser.add_argument("--size", default="1GiB", help="KV cache per rank, e.g. 512MiB (1GiB)")
    parser.add_argument("--cycles", type=int, default=100, help="clear + re-create cycles for the growth (100)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed cycles per model before anything is timed (3; its first attach is reported apart)",
    )
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of: {', '.join(MODELS)}")
    args = parser.parse_args(argv)
    try:
        size = parse_size(args.size, "--size")
    except FdPlatformsError as exc:
        parser.error(str(exc))
    if size < 1:
        parser.error("--size must be > 0")
    if args.repeat < 1 or args.cycles < 1 or args.warmup < 1:
        parser.error("--repeat, --cycles and --warmup must be >= 1")
    models = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = sorted(set(models) - set(MODELS))
    if unknown or not models:
        parser.error(f"--models={args.models!r}: unknown {unknown}; choose from: {', '.join(MODELS)}")
    for model in models:
        per_block = layout_of(model).bytes_per_block
        if size < per_block:
            parser.error(f"--size={args.size!r} holds no block of {model} ({format_size(per_block)} per block)")
    warm_paddle()  # Paddle's import installs its own SIGTERM handler (which exits at once): replace it
    previous = signals.signal(signals.SIGTERM, _terminate)  # run the cleanup on SIGTERM as on Ctrl-C
    try:
        run = Run()
        try:
            rows = []
            for model in models:
                rows += measure_model(run, model, size, args.repeat, args.warmup, args.cycles)
        finally:
            run.close()
    except (RuntimeError, FdPlatformsError) as exc:
        print(f"kv_share.py: {exc}", file=sys.stderr)
        return 1
    finally:
        signals.signal(signals.SIGTERM, previous)
    print(json.dumps(rows, indent=2) if args.json else render(rows, machine(), args.repeat))
    return 0


def _terminate(number: int, frame: object) -> None:
    raise SystemExit(128 + number)


if __name__ == "__main__":
    raise SystemExit(main())
