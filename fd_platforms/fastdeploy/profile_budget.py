"""FastDeploy's profiled memory budget, restated as the planner's inputs.

FastDeploy's GPU worker measures around a profile run (``fastdeploy/worker/gpu_worker.py``
``determine_available_memory``, develop c1b7c083): ``pynvml``'s total and used memory of the physical device
after the run, and Paddle's peak allocation increase during it. Its budget is ``total * gpu_memory_utilization
- used - peak_increase``, plus the bytes of the profile run's own cache, which the peak counted although the run
has freed it (``model_block_memory_used * cache_config.total_block_num``, the add-back). Its worker then divides
by the bytes of a block (``worker_process.py`` ``PaddleDisWorkerProc.initialize_kv_cache``).

:class:`ProfiledBudget` holds the four numbers FastDeploy measured; :func:`plan_from_profile` plans on them with
our planner (``floor(total * utilization) - non_cache_bytes``, the platform's declared limits, MTP blocks counted
exactly), ``non_cache_bytes`` being ``used + peak_increase - profile_cache_bytes``: FastDeploy's budget, whose
add-back is :func:`profile_cache_bytes`, the bytes of the profile cache's blocks in our layout
(:meth:`~fd_platforms.rules.layout.CacheLayout.device_bytes`: every device tensor, MTP layers and block-wise fp8
scales included, which FastDeploy's own per-block figure leaves out).

FastDeploy's other workers (XPU, DCU, Iluvatar, MetaX, GCU, HPU) answer ``determine_available_memory`` with a number
of bytes, which their worker process divides by the worker's ``cal_theortical_kvcache()``; :func:`num_blocks_for`
is the worker process's one call for both answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..contract.errors import ConfigError
from ..contract.integers import MAX_COUNT, check_int
from ..contract.types import DeviceMemory, Plan
from ..loading.platform import Platform
from .config import FastDeploySettings

_BYTES = 1 << 62
"""The most bytes a measurement may state (far above any device)."""


@dataclass(frozen=True)
class ProfiledBudget:
    """What FastDeploy's ``determine_available_memory`` measured, in bytes: ``total_bytes`` and ``used_bytes``
    (``pynvml``'s ``total`` and ``used`` after the profile run), ``peak_increase_bytes`` (Paddle's
    ``max_memory_allocated`` after the run minus before it) and ``profile_blocks``, the blocks of the profile
    run's cache (``cache_config.total_block_num``)."""

    total_bytes: int
    used_bytes: int
    peak_increase_bytes: int
    profile_blocks: int

    def __post_init__(self) -> None:
        fix = "pass what FastDeploy's determine_available_memory measured"
        check_int("total_bytes", self.total_bytes, 1, _BYTES, fix=fix)
        check_int("used_bytes", self.used_bytes, 0, self.total_bytes, fix=fix, note="at most total_bytes")
        check_int("peak_increase_bytes", self.peak_increase_bytes, 0, _BYTES, fix=fix)
        check_int(
            "profile_blocks",
            self.profile_blocks,
            0,
            MAX_COUNT,
            fix="pass cache_config.total_block_num, the blocks the profile run allocated",
        )

    def memory(self) -> DeviceMemory:
        """The device as FastDeploy measured it (free memory is in ``used_bytes``, so not stated again)."""
        return DeviceMemory(self.total_bytes, None, None, "FastDeploy's profile run (pynvml and Paddle's peak)")

    def non_cache_bytes(self, settings: FastDeploySettings) -> int:
        """What the rank holds outside the cache: ``used + peak_increase`` less the profile cache, added back; a
        ConfigError where the peak did not hold the profile cache (the measurement missed the profile run)."""
        held = self.used_bytes + self.peak_increase_bytes - profile_cache_bytes(settings, self.profile_blocks)
        if held < 0:
            raise ConfigError(
                "peak_increase_bytes",
                self.peak_increase_bytes,
                f"at least the profile cache's {profile_cache_bytes(settings, self.profile_blocks)} bytes less "
                f"used_bytes: the profile run allocated {self.profile_blocks} blocks",
                "measure Paddle's peak allocation before and after the profile run, as determine_available_memory "
                "does, and pass cache_config.total_block_num as profile_blocks",
            )
        return held


def profile_cache_bytes(settings: FastDeploySettings, num_blocks: int) -> int:
    """Bytes of the rank's device cache of ``num_blocks`` blocks (main and MTP draft layers, scales included):
    what FastDeploy's profile run allocated and adds back, ``settings.layout().device_bytes(num_blocks)``."""
    check_int("num_blocks", num_blocks, 0, MAX_COUNT, fix="pass the profile run's cache_config.total_block_num")
    return settings.layout().device_bytes(num_blocks)


def plan_from_profile(platform: Platform, settings: FastDeploySettings, budget: ProfiledBudget) -> Plan:
    """The rank's plan on FastDeploy's measured ``budget``: ``platform.max_num_blocks`` with its memory and
    non-cache bytes (:class:`ProfiledBudget`), the rank's whole layout and cache settings."""
    if not isinstance(budget, ProfiledBudget):
        raise ConfigError("budget", budget, "a ProfiledBudget", "build one from determine_available_memory's numbers")
    return platform.max_num_blocks(
        layout=settings.layout(),
        cache=settings.cache,
        memory=budget.memory(),
        non_cache_bytes=budget.non_cache_bytes(settings),
    )


def num_blocks_for(worker: object, budget: object) -> int:
    """The blocks FastDeploy's worker process allocates for what its ``worker`` measured (``budget``, the answer of
    ``worker.determine_available_memory()``), on every platform it runs: a :class:`ProfiledBudget` (the ported GPU
    worker) is planned by :func:`plan_from_profile` on the ported runner's ``platform`` and ``kv``; a number of bytes
    (the XPU, DCU, Iluvatar, MetaX, GCU and HPU workers) is divided by ``worker.cal_theortical_kvcache()``, as
    ``worker_process.py`` ``initialize_kv_cache`` divides it (a ported runner's answers our layout's bytes).
    A ConfigError names the measurement, the figure or the runner that cannot give a count of at least one."""
    if isinstance(budget, ProfiledBudget):
        runner = getattr(worker, "model_runner", None)
        platform, settings = getattr(runner, "platform", None), getattr(runner, "kv", None)
        if not isinstance(platform, Platform) or not isinstance(settings, FastDeploySettings):
            raise ConfigError(
                "worker.model_runner",
                type(runner).__name__,
                "a ported runner (its platform and kv set in __init__) beside a worker that answers a ProfiledBudget",
                "port the runner's __init__ as docs/porting-fastdeploy.md shows, or keep the worker's own budget",
            )
        return plan_from_profile(platform, settings, budget).num_blocks
    fix = "raise gpu_memory_utilization, or lower max_num_batched_tokens or the model length"
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget < 0:
        raise ConfigError(
            "available_kv_cache_memory",
            budget,
            "the bytes determine_available_memory measured: a finite number, at least 0, or a ProfiledBudget",
            "return the worker's measured budget from determine_available_memory",
        )
    per_block = worker.cal_theortical_kvcache()  # type: ignore[attr-defined]
    if isinstance(per_block, bool) or not isinstance(per_block, int) or per_block <= 0:
        raise ConfigError(
            "cal_theortical_kvcache()",
            per_block,
            "the bytes of one block on this rank: a positive int",
            "return the runner's bytes per block (a ported runner: self.kv.layout().bytes_per_block)",
        )
    num_blocks = int(budget // per_block)
    if num_blocks < 1:
        raise ConfigError(
            "available_kv_cache_memory",
            budget,
            f"at least one block of {per_block} bytes",
            fix,
        )
    return num_blocks


__all__ = ["ProfiledBudget", "num_blocks_for", "plan_from_profile", "profile_cache_bytes"]
