"""What each FastDeploy line runs on each platform, as data: its runner's rule, whether its launch makes the cache
transfer manager create, whether its runner's clear waits for an attacher, its block cap, and where each is read.

FastDeploy has no one rule: each runner (``fastdeploy/worker/<platform>_model_runner.py``) states its own, and its
engine's ``launch_cache_manager`` (``cache_manager/prefix_cache_manager.py``) decides apart from them whether the
transfer manager creates (``--create_cache_tensor``). :data:`SNAPSHOTS` lists what was read of each line, per
platform, each entry with its source; what was not read but follows from a PR's title or a cut-off hunk is marked
inferred. :func:`line_on` pins what a line runs on one platform and refuses, naming the line and the case, where that
line would allocate one cache twice, leave it with no creator, or free it under an attacher.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..contract.errors import ConfigError
from ..rules.decision import AttachTerm, DecisionInputs, decide_cache_creation


@dataclass(frozen=True)
class RunsOn:
    """What one FastDeploy snapshot runs on one platform."""

    snapshot: str
    platform: str
    """Our platform name (the FastDeploy runner it stands for: ``FASTDEPLOY_PLATFORMS``)."""
    worker_rule: str
    """The rule version its runner's ``initialize_kv_cache`` decides by."""
    launch_rule: str
    """The version whose worker-attach decision ``launch_cache_manager`` follows: it passes ``--create_cache_tensor``
    (the transfer manager creates) where that version makes a mixed instance's worker attach."""
    clear_waits: tuple[AttachTerm, ...]
    """The terms under which a creating runner's ``clear_cache`` waits for the transfer manager's let-go (none: it
    never waits)."""
    block_cap: int | None
    """The cap ``worker_process.py`` puts on the planned blocks (None: none)."""
    source: str
    inferred: str = ""
    """What in this entry is inferred rather than read ("": all read)."""

    def problem(self, inputs: DecisionInputs) -> str:
        """What this snapshot does wrong on ``inputs`` (a mixed instance's rule inputs), in words; "" where nothing."""
        if inputs.splitwise_role != "mixed" or inputs.profile:
            return ""  # P/D: the messager creates, worker and transfer manager attach, under every line
        worker_creates = decide_cache_creation(**{**inputs.kwargs(), "rule": self.worker_rule}).create
        started = inputs.holds("num_cpu_blocks", "storage_backend")
        launched = replace(inputs, rule=self.launch_rule)
        transfer_creates = started and not decide_cache_creation(**launched.kwargs()).create
        if worker_creates and transfer_creates:
            return "its runner and its cache transfer manager both create the rank's cache (it is allocated twice)"
        if not worker_creates and not transfer_creates:
            return "nothing creates the rank's cache: its runner waits for a transfer manager that attaches"
        if worker_creates and started and not inputs.holds(*self.clear_waits):
            return (
                "its runner's clear_cache frees the cache without waiting for the cache transfer manager that "
                "attaches to it (sleep and weight updates free memory another process maps)"
            )
        return ""


_C1B7 = "develop c1b7c083 (2026-05-20)"
_R26 = "release/2.6 as merged into r3_eos_2.6 @41677b9a6 (2026-06-02)"
_WAIT_7764 = "gpu_model_runner.py clear_cache waits for num_cpu_blocks > 0 (PR #7764, 2026-05-11; c1b7c083 ~L3022)"
_LAUNCH_7471 = (
    "prefix_cache_manager.py launch_cache_manager passes --create_cache_tensor with a storage backend, not in P/D"
)


def _develop_2026_01(platform: str) -> RunsOn:
    return RunsOn(
        "develop@2026-01",
        platform,
        "2026-01",
        "2026-01",
        (),
        None,
        "the design's rule, which GPU and MetaX followed from January 2026 and XPU from PR #7420; no runner's clear "
        "waited for an attacher before PR #7764 (reference facts, sections 1 and 7)",
    )


SNAPSHOTS: tuple[RunsOn, ...] = (
    *(_develop_2026_01(platform) for platform in ("cuda", "xpu", "metax")),
    RunsOn(
        "develop@7471",
        "cuda",
        "2026-04",
        "2026-04",
        ("num_cpu_blocks",),
        None,
        f"{_C1B7}: gpu_model_runner.py initialize_kv_cache ~L1597; {_LAUNCH_7471} (~L299-301); {_WAIT_7764}",
    ),
    RunsOn(
        "develop@7471",
        "xpu",
        "2026-04",
        "2026-04",
        (),
        None,
        f"{_C1B7}: xpu_model_runner.py initialize_kv_cache ~L971; {_LAUNCH_7471}; the XPU runner's clear_cache "
        "pops its caches without a wait",
    ),
    RunsOn(
        "develop@7471",
        "metax",
        "2026-04",
        "2026-04",
        (),
        None,
        f"{_C1B7}: metax_model_runner.py initialize_kv_cache ~L1350, clear_cache ~L2491 (no wait); {_LAUNCH_7471}",
    ),
    RunsOn(
        "develop@8046",
        "cuda",
        "2026-06",
        "2026-06",
        ("num_cpu_blocks", "storage_backend"),
        None,
        "PR #8046 (2026-06-15): prefix_cache_manager.py no longer passes --create_cache_tensor for a storage "
        "backend (seen in its review hunks)",
        "the runner's create side (from the PR's title) and the clear's wait for num_cpu_blocks > 0 or a storage "
        "backend (mtp.py:463's hunk, cut off there)",
    ),
    RunsOn(
        "develop@8046",
        "metax",
        "2026-06",
        "2026-06",
        (),
        None,
        "PR #8046: metax_model_runner.py clear_cache's expression shrinks to the mixed role (seen); launch as on cuda",
        "its create side, and that its clear still does not wait",
    ),
    RunsOn(
        "2.6@2026-06-02",
        "cuda",
        "2026-04",
        "2026-04",
        ("num_cpu_blocks",),
        40000,
        f"{_R26}: gpu_model_runner.py ~L1537, clear_cache ~L2927-2935 (waits with swap space); prefix_cache_manager.py "
        "~L299-301; worker_process.py ~L692-694 caps the blocks at 40000",
    ),
    RunsOn(
        "2.6@2026-06-02",
        "xpu",
        "2026-06",
        "2026-04",
        (),
        40000,
        f'{_R26}: xpu_model_runner.py ~L1256 decides `profile or splitwise_role == "mixed"` while launch_cache_manager '
        "~L299-301 still makes the transfer manager create for a storage backend (PR #7420's double allocation); its "
        "clear_cache ~L1812 pops the caches without a wait; worker_process.py ~L692-694",
    ),
    RunsOn(
        "2.6@2026-06-02",
        "metax",
        "2026-04",
        "2026-04",
        (),
        40000,
        f"{_R26}: metax_model_runner.py ~L1337, clear_cache ~L2483 (no wait for its transfer manager); "
        "worker_process.py ~L692-694",
    ),
    RunsOn(
        "2.6@8045",
        "cuda",
        "2026-06",
        "2026-06",
        ("num_cpu_blocks", "storage_backend"),
        40000,
        "PR #8045 (2026-06-15, #8046 cherry-picked): mtp.py clear_mtp_cache decides `profile or splitwise_role == "
        '"mixed"` (seen)',
        "the runner's create side, the launch without --create_cache_tensor and the clear's wait (as #8046); the "
        "40000 cap kept",
    ),
    RunsOn(
        "2.6@8045",
        "xpu",
        "2026-06",
        "2026-06",
        (),
        40000,
        "release/2.6 @41677b9a6 for the XPU runner (it already decided by the mixed role), with PR #8045's launch",
        "the launch without --create_cache_tensor on release/2.6 (as #8046 on develop); the 40000 cap kept",
    ),
    RunsOn(
        "2.6@8045",
        "metax",
        "2026-06",
        "2026-06",
        (),
        40000,
        "PR #8045 as #8046",
        "its create side, its clear without a wait, the launch, the 40000 cap kept",
    ),
)
"""Every entry read: develop before PR #7471, from #7471 (c1b7c083), from #8046; release/2.6 as of 2026-06-02 and
after #8045, per platform (the GPU runner's for cuda; Iluvatar and DCU run it too)."""


def snapshots(line: str | None = None) -> list[RunsOn]:
    """The entries of ``line`` (``develop``, ``2.6``, or a snapshot's name; None: all); a ConfigError naming
    ``fastdeploy`` for a line the table does not hold."""
    if line is None:
        return list(SNAPSHOTS)
    found = [entry for entry in SNAPSHOTS if line in (entry.snapshot, entry.snapshot.split("@")[0])]
    if not found:
        raise ConfigError("fastdeploy", line, f"one of {', '.join(_names())}, or develop or 2.6", _FIX)
    return found


def line_on(snapshot: str, platform: str, inputs: DecisionInputs) -> RunsOn:
    """What FastDeploy ``snapshot`` runs on our ``platform``; a ConfigError naming ``fastdeploy`` where the table has
    no such entry, or where that snapshot does wrong on ``inputs`` (:meth:`RunsOn.problem`)."""
    entries = [entry for entry in SNAPSHOTS if entry.snapshot == snapshot]
    if not entries:
        raise ConfigError("fastdeploy", snapshot, f"a snapshot: one of {', '.join(_names())}", _FIX)
    entry = {entry.platform: entry for entry in entries}.get(RUNNER_OF.get(platform, platform))
    if entry is None:
        read = ", ".join(sorted({*(e.platform for e in entries), *RUNNER_OF}))
        raise ConfigError(
            "fastdeploy",
            snapshot,
            f"a snapshot read for {platform} (this table holds {read})",
            "pin the rule version its runner follows instead (rule=)",
        )
    problem = entry.problem(inputs)
    if problem:
        raise ConfigError(
            "fastdeploy",
            snapshot,
            f"a FastDeploy that keeps the rank's cache whole here; on {platform}, with {_case(inputs)}, {snapshot} "
            f"{problem} ({entry.source}{'; inferred: ' + entry.inferred if entry.inferred else ''})",
            "run a FastDeploy line that does not (fd-platforms rules --fastdeploy shows each), or port the runner "
            "and cache processes so ours decide",
        )
    return entry


_FIX = "name a snapshot fd-platforms rules --fastdeploy lists"
RUNNER_OF = {"iluvatar": "cuda", "dcu": "cuda"}
"""Platforms whose FastDeploy runner is the GPU one (``iluvatar_model_runner.py``, ``dcu_model_runner.py`` subclass
it), so its entries stand for them."""


def _names() -> list[str]:
    return list(dict.fromkeys(entry.snapshot for entry in SNAPSHOTS))


def _case(inputs: DecisionInputs) -> str:
    swap = f"num_cpu_blocks={inputs.num_cpu_blocks}" if inputs.num_cpu_blocks else "no swap space"
    backend = f"storage backend {inputs.storage_backend}" if inputs.storage_backend else "no storage backend"
    return f"{swap}, {backend} and role {inputs.splitwise_role}"


__all__ = ["SNAPSHOTS", "RunsOn", "line_on", "snapshots"]
