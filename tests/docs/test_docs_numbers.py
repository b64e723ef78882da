"""Numbers the README and ``docs/`` quote come from the code or a benchmark: a test recomputes each one.

A timing cannot be recomputed; what is checked of one is that the goal quoted beside it is the
benchmark's own and that the command shown is the benchmark's.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
from pathlib import Path
from types import ModuleType

import fastdeploy_own_tests
import fastdeploy_pr_8046
import port_lines
import pytest
from drift_plugins import OLD_XPU_RULE, drifting
from pyproject_file import pyproject
from run_helpers import SCRIPT, clean_env, main_in_process, without_sweep

from fd_platforms.contract.errors import PlatformDriftError
from fd_platforms.contract.types import DeviceMemory, Plan
from fd_platforms.ipc.cache_signal import DEFAULT_TIMEOUT, LAYOUT_VERSION
from fd_platforms.ipc.timeouts import MAX_SECONDS
from fd_platforms.ipc.waiting import PROGRESS_SECONDS
from fd_platforms.lifecycle.engine import HOST_ROOM_SHARE
from fd_platforms.loading.selection import select_platform
from fd_platforms.loading.watchdog import (
    BACKSTOP_EXIT_STATUS,
    BACKSTOP_SECONDS,
    DEFAULT_ALLOC_TIMEOUT,
    DEFAULT_DETECT_TIMEOUT,
    ENV_ALLOC_TIMEOUT,
    ENV_DETECT_TIMEOUT,
    EXIT_STATUS,
)
from fd_platforms.rules.config import (
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    load_model_config,
    tensor_parallel_sizes,
)
from fd_platforms.rules.config.limits import MAX_LAYERS, MAX_RANKS, MAX_WIDTH
from fd_platforms.rules.decision import TRUTH_TABLE, differing_cases
from fd_platforms.rules.layout import build_layout
from fd_platforms.rules.planner import plan_blocks

ROOT = Path(__file__).resolve().parents[2]
MIB, GIB = 2**20, 2**30


def prose(path: str) -> str:
    """A doc's text with its line breaks undone, so a quote may wrap anywhere."""
    return " ".join((ROOT / path).read_text().split())


GUIDE_TEXT = (ROOT / "docs" / "writing-a-plugin.md").read_text()
GUIDE = " ".join(GUIDE_TEXT.split())
PLATFORMS = prose("docs/platforms.md")
PLANNING = prose("docs/planning.md")
LIFECYCLE = prose("docs/lifecycle.md")


@pytest.fixture
def old_xpu_drift(make_plugin) -> PlatformDriftError:
    drifting(make_plugin, "oldxpu", OLD_XPU_RULE)
    with pytest.raises(PlatformDriftError) as info:
        select_platform({"FD_PLATFORM": "oldxpu"})
    return info.value


def test_the_drift_counts_quoted_are_the_guards(old_xpu_drift: PlatformDriftError) -> None:
    cases = old_xpu_drift.cases
    flipped = sum(case.got.create != case.expected.create for case in cases)
    quoted = f"differs in {len(cases)} of {len(TRUTH_TABLE)} cases ({flipped} flip the decision"
    assert quoted in GUIDE
    assert f"{len(cases) - flipped} name another deciding term" in GUIDE
    assert f"{len(TRUTH_TABLE)}-case table" in GUIDE and f"all {len(TRUTH_TABLE)} cases" in GUIDE


def test_the_rule_versions_differ_where_the_planning_guide_says() -> None:
    cases = differing_cases()
    assert all(
        inputs.splitwise_role == "mixed" and (inputs.num_cpu_blocks or inputs.storage_backend) for inputs, _ in cases
    )
    assert f"({len(cases)} of {len(TRUTH_TABLE)}: swap space or a storage backend in a mixed instance)" in PLANNING


def test_the_guides_drift_sample_is_the_real_first_line(old_xpu_drift: PlatformDriftError) -> None:
    first, second = str(old_xpu_drift).splitlines()[:2]
    sample = GUIDE_TEXT[GUIDE_TEXT.index("## The drift guard") :]
    assert f"fd-platforms: error: {first}" in sample and second in sample
    assert f"{len(TRUTH_TABLE)}-case truth table" in " ".join(sample.split())


def test_the_watchdogs_exit_statuses_and_backstop_quoted_are_the_codes() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"130 Ctrl-C, {EXIT_STATUS} a plugin call past its bound ({BACKSTOP_EXIT_STATUS} where the hook" in readme
    assert f"130 on Ctrl-C and {EXIT_STATUS} when a call into the selected plugin runs past its bound" in LIFECYCLE
    assert f"({BACKSTOP_EXIT_STATUS}, after faulthandler's `Timeout` line, where the hook held" in LIFECYCLE
    assert f"ends the process with exit status {EXIT_STATUS}." in PLATFORMS
    backstop = (
        f"kept {BACKSTOP_SECONDS:g} s past the latest deadline of the calls running (at least {BACKSTOP_SECONDS / 2:g}"
    )
    assert backstop in PLATFORMS
    assert f"the process with exit status {BACKSTOP_EXIT_STATUS}." in PLATFORMS
    quoted = f"set again at most once every {BACKSTOP_SECONDS / 2:g} s of back-to-back calls"
    assert quoted in prose("docs/performance.md")


def test_the_bounds_quoted_are_the_codes() -> None:
    assert f"`{ENV_DETECT_TIMEOUT}` seconds (default {DEFAULT_DETECT_TIMEOUT:g}; at most {MAX_SECONDS}" in PLATFORMS
    assert f"`{ENV_DETECT_TIMEOUT}` seconds (default {DEFAULT_DETECT_TIMEOUT:g};" in GUIDE
    assert f"`{ENV_ALLOC_TIMEOUT}` seconds (default {DEFAULT_ALLOC_TIMEOUT:g})" in PLATFORMS
    assert f"`{ENV_ALLOC_TIMEOUT}` seconds (default {DEFAULT_ALLOC_TIMEOUT:g})" in GUIDE
    assert f"layers up to {MAX_LAYERS}; heads, head and latent dims and block sizes up to {MAX_WIDTH}" in PLANNING
    assert f"tensor-parallel ranks up to {MAX_RANKS}" in PLANNING
    assert f"1 layout version {LAYOUT_VERSION}," in LIFECYCLE
    assert f"else `FD_CACHE_READY_TIMEOUT` (seconds), else {DEFAULT_TIMEOUT:g} s;" in LIFECYCLE
    assert f"Every {PROGRESS_SECONDS:g} s it logs one line saying what it waits for" in LIFECYCLE
    assert "at most half of the host's available memory (`HOST_ROOM_SHARE`)" in LIFECYCLE and HOST_ROOM_SHARE == 0.5


def test_the_tensor_parallel_example_is_computed() -> None:
    qwen = ModelConfig("qwen3-30b-a3b", 48, 32, 4, 128)
    works = ", ".join(map(str, tensor_parallel_sizes(qwen)))
    assert re.search(rf"`--tp 3` on Qwen3-30B-A3B: {re.escape(works)}\)", PLANNING)


def test_the_foreign_poll_and_the_stand_in_rounds_quoted_are_the_codes() -> None:
    from engine_processes import DRIVEN_ROUNDS as CYCLES

    from fd_platforms.ipc.futex import FIRST_POLL_SECONDS, FOREIGN_POLL_SECONDS

    first, last = f"{FIRST_POLL_SECONDS * 1000:g} ms", f"{FOREIGN_POLL_SECONDS * 1000:g} ms"
    assert f"first after {first}, then as far apart as the wait has lasted, up to {last}" in LIFECYCLE
    engine_guide = prose("docs/engine-integration.md")
    assert f"(from {first}, growing with the wait to {last})" in engine_guide and f"seen within {last}" in engine_guide
    assert f"a 4-rank clear/update runs {CYCLES} times driven from our side and {CYCLES} times from the" in LIFECYCLE


def test_the_fastdeploy_record_table_is_the_layouts() -> None:
    """Each row's offsets, size and declaring file are the platform's record layout's own."""
    from fd_platforms.fastdeploy.records import record_layout

    table = [
        line
        for line in (ROOT / "docs" / "engine-integration.md").read_text().splitlines()
        if line.startswith("| `") and "shmStruct" not in line and "memHandle` at byte" in line
    ]
    assert len(table) == 2, "one row per record layout"
    for row in table:
        platforms, struct_text, size, source, _ = (cell.strip() for cell in row.strip("|").split(" | "))
        for platform in re.findall(r"`(\w+)`", platforms):
            layout = record_layout(platform)
            assert size == str(layout.size) and source.startswith(f"`{layout.source}`"), (platform, row)
            assert f"memHandle` at byte {layout.handle_offset}" in struct_text
            assert (f"at byte {layout.address_offset}" in struct_text) == (layout.address_offset is not None)
            assert struct_text.count(" at byte ") == (1 if layout.address_offset is None else 2)


def test_the_porting_guides_line_counts_are_the_counted_lines() -> None:
    """Each part's count in the guide's table is what its blocks add to FastDeploy's files (:mod:`port_lines`), and
    what FastDeploy's hooks leave is the splice's recorded count (``fastdeploy_port_count.json``, written by
    ``port_splice.py --json``: on c1b7c083, then with PR #8046 by hand), per part and in all, each at most the 100
    lines FastDeploy would take; the #8046 table is ``fastdeploy_pr_8046.PR_8046``."""
    assert port_lines.stated() == port_lines.counts()
    plain, with_8046 = json.loads((Path(port_lines.__file__).parent / "fastdeploy_port_count.json").read_text())
    per_part = {
        part: sum(plain["files"].get(file, 0) for file in files) for part, (files, _) in port_lines.PARTS.items()
    }
    assert port_lines.stated(column=1) == per_part
    assert (
        set(plain["files"])
        == set(with_8046["files"])
        == {file for files, _ in port_lines.PARTS.values() for file in files}
    )
    text = port_lines.GUIDE.read_text(encoding="utf-8")
    assert f"**{sum(port_lines.counts().values())} lines** in the blocks and **{plain['total']} lines** after" in text
    assert f"The port on that tree adds **{with_8046['total']} lines** after FastDeploy's hooks" in text
    tests = ", ".join(f"`{file.removeprefix('tests/')}` {count}" for file, count in sorted(plain["tests"].items()))
    assert f"add **{plain['tests_total']} lines** more:\n{tests}." in text
    assert plain["tests"] == with_8046["tests"] and plain["tests_total"] == sum(plain["tests"].values())
    for record, flag in ((plain, False), (with_8046, True)):
        assert record["total"] == sum(record["files"].values()) <= 100 and record["with_8046"] is flag
        assert record["fastdeploy"] == port_lines.FASTDEPLOY["commit"]
    rows = re.findall(r"^\| `([\w/]+\.py)` \| (\d+) \| (seen|\*\*inferred\*\*) \| (.+) \|$", text, re.M)
    assert rows == [
        (hunk.file.removeprefix("fastdeploy/"), str(hunk.count), "seen" if hunk.seen else "**inferred**", hunk.source)
        for hunk in fastdeploy_pr_8046.PR_8046
    ]


def test_the_porting_guides_table_of_fastdeploys_own_tests_is_the_recorded_run() -> None:
    """The guide's before/after table of FastDeploy's own tests is ``fastdeploy_own_tests.json`` (written by
    ``fastdeploy_own_tests.py --json``): every file it runs, and no id that passed before fails after."""
    recorded = json.loads((Path(port_lines.__file__).parent / "fastdeploy_own_tests.json").read_text())
    order = ("PASSED", "FAILED", "ERROR", "SKIPPED")

    def cell(outcomes: dict[str, int]) -> str:
        return ", ".join(
            f"{count} {word.lower()}" for word, count in sorted(outcomes.items(), key=lambda kv: order.index(kv[0]))
        )

    text = port_lines.GUIDE.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(tests/[\w/]+\.py)` \| ([^|]+) \| ([^|]+) \| (\d+) \|$", text, re.M)
    assert rows == [
        (file, cell(row["before"]), cell(row["after"]), str(len(row["lost"]))) for file, row in recorded.items()
    ]
    assert not any(row["lost"] for row in recorded.values())
    assert list(recorded) == list(fastdeploy_own_tests.FILES)


def test_the_porting_guides_before_table_states_fastdeploys_functions_and_their_lines() -> None:
    """Each row of the first table is functions of FastDeploy's file at c1b7c083 and their physical lines; the
    guide's totals are the table's sum and the counted lines' sum."""
    text = port_lines.GUIDE.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([\w/]+\.py)` \| ([^|]+) \| (\d+) \|", text, re.M)
    assert len(rows) >= 10
    for file, names, lines in rows:
        known = port_lines.FASTDEPLOY["files"][f"fastdeploy/{file}"]
        found = [
            key for name in re.findall(r"`([\w.]+)`", names) for key in known if key == name or key.endswith(f".{name}")
        ]
        assert found and sum(known[key]["physical"] for key in found) == int(lines), (file, names, lines)
    assert f"**{sum(int(lines) for _, _, lines in rows)} lines** at c1b7c083" in text


def benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (its ``main`` does not run)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def planned(model: str, tp: int, total: int, *, non_cache: int = 0, swap: int = 0, limits=()) -> Plan:
    cache = CacheConfig(block_size=64, memory_utilization=0.9, swap_space_bytes=swap)
    layout = build_layout(load_model_config(ROOT / "examples" / model), cache, ParallelConfig(tensor_parallel_size=tp))
    memory = DeviceMemory(total_bytes=total, free_bytes=None, process_bytes=None, source="docs")
    return plan_blocks(layout, memory, cache, non_cache_bytes=non_cache, limits=limits)


def test_the_planning_guides_examples_are_the_planners() -> None:
    plan = planned("qwen3-30b-a3b", 4, 80 * GIB, non_cache=20 * GIB)
    assert plan.bytes_per_block == 2 * 2 * 64 * 128 * 1 * 48 and plan.binding == "memory"
    assert (
        f"`bytes_per_block` {plan.bytes_per_block} (= 2 B × 2 tensors × 64 tokens × 128 head_dim × 1 KV head "
        f"per rank × 48 layers), `budget_bytes` {plan.budget_bytes} (80 GiB × 0.9 − 20 GiB), "
        f"`num_blocks` {plan.num_blocks}, `binding` `memory`, `num_cpu_blocks` 0"
    ) in PLANNING
    swap = planned("llama-3.1-8b", 1, 80 * GIB, swap=16 * GIB)
    assert f"gives `num_cpu_blocks` {swap.num_cpu_blocks} (16 GiB // {swap.bytes_per_block // MIB} MiB)" in PLANNING


def test_the_fake_iluvatar_plan_quoted_is_the_planners() -> None:
    """The fake runtime's devices report 16 GiB and no free memory; Iluvatar declares its 32-bit limit."""
    from fd_platforms_iluvatar import PLATFORM

    plan = planned("qwen3-30b-a3b", 4, 16 * GIB, limits=PLATFORM.limits)
    assert plan.binding == "memory"
    quoted = (
        f"16.00 GiB from the runtime's device properties, free unknown, budget "
        f"{plan.budget_bytes / GIB:.2f} GiB, {plan.num_blocks} blocks, and lists Iluvatar's declared limit"
    )
    assert quoted in PLATFORMS


def test_the_capacity_figures_are_the_benchmarks() -> None:
    capacity = benchmark("capacity")
    qwen = {row["device_gib"]: row for row in capacity.rows() if row["model"] == "qwen3-30b-a3b"}
    sizes = (80, 96, 141)
    blocks = " / ".join(str(qwen[gib]["planned_blocks"]) for gib in sizes)
    ratios = " / ".join(f"×{qwen[gib]['planned_over_legacy']:.2f}" for gib in sizes)
    assert f"Qwen3-30B-A3B gets {blocks} blocks on 80 / 96 / 141 GiB devices ({ratios} the legacy cap)" in PLANNING
    assert f"old `min(blocks, {capacity.LEGACY_CAP})`" in PLANNING
    assert all(row["binding"] == "memory" for row in capacity.rows()), "the declared limit never binds, as quoted"


def test_the_goals_quoted_are_the_benchmarks() -> None:
    performance = prose("docs/performance.md")
    startup, hooks = benchmark("startup"), benchmark("hook_calls")
    wait, share = benchmark("wait_ready"), benchmark("kv_share")
    assert f"goal: at most {startup.GOAL_RATIO:.0%}".replace("%", " %") in performance
    assert f"goal: at most {hooks.GOAL_RATIO:g}x" in performance
    ours, foreign = wait.GOAL, wait.FOREIGN_GOAL
    assert (
        f"p50 <= {ours['p50_ms']:g} ms, p99 <= {ours['p99_ms']:g} ms, CPU <= {ours['cpu_percent']:g} % of a core"
    ) in performance
    assert (
        f"p50 <= {foreign['p50_ms']:g} ms, p99 <= {foreign['p99_ms']:g} ms, CPU <= {foreign['cpu_percent']:g} %"
    ) in performance
    goal = share.GOAL
    assert f"create ≥ {goal['ratio']:g} of the kernel's fresh pages" in performance
    assert f"attach ≤ {goal['attach_ms']:g} ms" in performance and f"≤ {goal['overhead_ms']:g} ms" in performance
    assert f"RSS ≤ {goal['rss_per_cycle_kib']:g} KiB a cycle" in performance


README_TEXT = (ROOT / "README.md").read_text()
SECONDS = re.compile(r"\b\d+\.\d{3}\b")  # the report's and the progress lines' seconds
# An allocation's line while it lasts, once a second (Progress.allocation): as many as the machine is slow, none
# on the quiet one the sample comes from ("rank 0: publishing 921.00 MiB: 873.03 MiB of 921.00 MiB (94%)").
INTERIM = re.compile(r": [\d.]+ \S+ of [\d.]+ \S+ \(\d+%\)$")


def masked(line: str) -> list[str]:
    """A line of the run's output without what changes from run to run: pids, the signal's name, seconds."""
    line = re.sub(r"pid \d+(, \d+)*", "pid P", line)
    line = re.sub(r"fd_cache_ready\.\S+", "SIGNAL", line)
    line = re.sub(r"wall [0-9.]+ s", "wall W s", SECONDS.sub("S", line))
    return line.split()


@pytest.mark.slow
def test_the_readmes_sample_run_is_what_the_main_job_prints() -> None:
    """Every line of the README's sample output, pids, names and seconds aside, from the README's own command, run as
    a user runs it (the default start method, spawn)."""
    first = re.findall(r"^```sh\n(.*?)^```", README_TEXT, re.S | re.M)[0]
    command = shlex.split(first.split(" && ")[-1])
    assert command[:2] == ["fd-platforms", "run"], first
    sample = re.findall(r"^```text\n(fd-platforms: platform cpu: .*?)^```", README_TEXT, re.S | re.M)[0]
    env = clean_env(FD_PLATFORMS_START_METHOD="spawn")
    done = subprocess.run([SCRIPT, *command[1:]], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = [line for line in [*without_sweep(done.stderr), *done.stdout.splitlines()] if not INTERIM.search(line)]
    assert sorted(map(masked, printed)) == sorted(masked(line) for line in sample.splitlines() if line.strip())


def test_lifecycle_quotes_the_readmes_import_line() -> None:
    """The Paddle-import line docs/lifecycle.md quotes is the README's sample run's, seconds and all."""
    sample = re.findall(r"^```text\n(fd-platforms: platform cpu: .*?)^```", README_TEXT, re.S | re.M)[0]
    [line] = [line for line in sample.splitlines() if "imported Paddle" in line]
    assert f"`{line.removeprefix('fd-platforms: ')}`" in LIFECYCLE
    assert "`importing Paddle in 2 worker(s)`" in LIFECYCLE
    assert "fd-platforms: importing Paddle in 2 worker(s)" in sample


def test_the_readmes_list_sample_is_what_list_prints() -> None:
    """After the first command the eight in-repo plugins are installed: the README's rows are theirs (the
    example plugin this venv also holds is left out with FD_PLATFORM_PLUGINS)."""
    sample = re.findall(r"^```text\n(PLATFORM +DISTRIBUTION.*?)^```", README_TEXT, re.S | re.M)[0]
    done = main_in_process("list", FD_PLATFORM_PLUGINS="cuda,xpu,iluvatar,metax,dcu,gcu,intel_hpu,npu")
    assert done.returncode == 0, done.stderr
    printed = [line for line in done.stdout.splitlines() if " excluded " not in line]

    def rows(lines: list[str]) -> list[tuple[list[str], str]]:
        """Each row's first five columns and its reason up to the README's shortening."""
        out = []
        for line in lines:
            words = re.sub(r"\(\d+ logical CPUs", "(N logical CPUs", line).split(maxsplit=5)
            out.append((words[:5], " ".join(words[5:])))
        return out

    shown = rows([line for line in sample.splitlines() if line.strip()])
    real = rows([line for line in printed if line.strip()])
    assert [columns for columns, _ in shown] == [columns for columns, _ in real]
    for (_, quoted), (_, reason) in zip(shown, real, strict=True):
        assert reason.startswith(quoted.removesuffix(" ...").removesuffix("...")), (quoted, reason)


def test_the_drivers_settle_time_and_the_managers_look_are_the_codes() -> None:
    from fd_platforms.fastdeploy.cache_status import SETTLE_SECONDS

    guide = (Path(__file__).resolve().parents[2] / "docs" / "engine-integration.md").read_text()
    quoted = re.search(r"at least `SETTLE_SECONDS` \(([0-9.]+) s\)", guide)
    assert quoted is not None and float(quoted.group(1)) == SETTLE_SECONDS
    standins = (Path(__file__).resolve().parents[1] / "support" / "fastdeploy_standins.py").read_text()
    assert re.search(r"\nPOLL = 0\.1 ", standins) and "look at the slots every 0.1 s" in guide


def test_the_let_go_hold_is_the_codes() -> None:
    from fd_platforms.fastdeploy.signals import LET_GO_HOLD_SECONDS

    quoted = re.search(r"`LET_GO_HOLD_SECONDS` \(([0-9.]+) s\)", prose("docs/engine-integration.md"))
    assert quoted is not None and float(quoted.group(1)) == LET_GO_HOLD_SECONDS


def test_the_coverage_floor_quoted_is_the_one_ci_holds() -> None:
    """docs/performance.md quotes the floor ``.ci/run`` holds the whole suite to, and a figure measured above it."""
    floor = pyproject()["tool"]["coverage"]["report"]["fail_under"]
    performance = prose("docs/performance.md")
    assert f"held to a floor of {floor:g} %" in performance
    measured = float(re.search(r"\): ([0-9.]+) % on \d{4}-\d\d-\d\d \(lines", performance)[1])  # type: ignore[index]
    assert measured > floor
