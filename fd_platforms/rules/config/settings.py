"""The engine's settings the KV cache depends on: cache, scheduler (the splitwise role, the protocol) and
parallelism."""

from __future__ import annotations

from dataclasses import dataclass

from ...contract.errors import ConfigError
from ...contract.integers import check_int, check_positive
from ..decision import SPLITWISE_ROLES, STORAGE_BACKENDS, check_pin
from .limits import MAX_EXPAND_RATIO, MAX_RANKS, MAX_WIDTH, choice
from .vocabulary import resolve_cache_words

PROTOCOLS = ("fd-platforms", "fastdeploy")
"""The inter-process protocols: ours (the default), or FastDeploy's own signals and per-tensor handles."""


def check_memory_utilization(value: object) -> float:
    """``value`` as the fraction of device memory the KV cache may use (above 0, at most 1), else a ConfigError
    naming ``memory_utilization``: the engine's setting, and the planner's argument."""
    return check_positive("memory_utilization", value, 1, "give the fraction of device memory to use, e.g. 0.9")


@dataclass(frozen=True)
class CacheConfig:
    """How the KV cache is sized and stored.

    ``cache_dtype`` and ``kv_cache_quant_type`` take FastDeploy's words as they are, normalised through
    :mod:`.vocabulary` (``fp8``/``float8_e4m3`` are stored as ``float8_e4m3fn``; ``int8``, ``float8_e4m3fn``
    and their ``_zp`` variants as quantization words set an 8-bit ``cache_dtype``; ``block_wise_fp8``,
    also as a ``cache_dtype``, sets fp8 with scales); ``cache_dtype`` None (the default) is the
    quantization's element type, else ``bfloat16``. ``int4_zp`` stores key and value as packed 4-bit
    values whatever the ``cache_dtype``; ``block_wise_fp8`` needs an 8-bit ``cache_dtype``.
    ``num_gpu_block_expand_ratio`` (FastDeploy's name) scales the device blocks of MTP layers.
    ``rule`` pins the create-or-attach rule's version (:data:`~fd_platforms.rules.decision.RULE_VERSIONS`);
    None leaves it to the protocol (:meth:`~fd_platforms.engine.protocols.interface.WireProtocol.rule_in_force`).
    ``kvcache_storage_backend`` accepts ``"none"`` (stored as None). Host swap space is given
    either as ``num_cpu_blocks`` or as ``swap_space_bytes``, not both.
    """

    block_size: int = 64
    cache_dtype: str | None = None
    kv_cache_quant_type: str = "none"
    memory_utilization: float = 0.9
    num_cpu_blocks: int = 0
    swap_space_bytes: int = 0
    kvcache_storage_backend: str | None = None
    num_gpu_blocks_override: int | None = None
    num_gpu_block_expand_ratio: float = 1.0
    rule: str | None = None

    def __post_init__(self) -> None:
        check_int("block_size", self.block_size, 1, MAX_WIDTH)
        dtype, quant = resolve_cache_words(self.cache_dtype, self.kv_cache_quant_type, quant_decides=False)
        object.__setattr__(self, "cache_dtype", dtype)
        object.__setattr__(self, "kv_cache_quant_type", quant)
        check_memory_utilization(self.memory_utilization)
        check_int("num_cpu_blocks", self.num_cpu_blocks, 0)
        check_int("swap_space_bytes", self.swap_space_bytes, 0)
        if self.num_cpu_blocks and self.swap_space_bytes:
            raise ConfigError(
                "swap_space_bytes",
                self.swap_space_bytes,
                f"0 when num_cpu_blocks is set (num_cpu_blocks={self.num_cpu_blocks})",
                "give host swap space either as num_cpu_blocks or as swap_space, not both",
            )
        if self.kvcache_storage_backend is not None:
            backend = choice("kvcache_storage_backend", self.kvcache_storage_backend, ("none", *STORAGE_BACKENDS))
            object.__setattr__(self, "kvcache_storage_backend", None if backend == "none" else backend)
        if self.num_gpu_blocks_override is not None:
            check_int("num_gpu_blocks_override", self.num_gpu_blocks_override, 1)
        fix = "give the MTP layers' device blocks as a multiple of the main layers', e.g. 1.0 (FastDeploy's default)"
        ratio = check_positive("num_gpu_block_expand_ratio", self.num_gpu_block_expand_ratio, MAX_EXPAND_RATIO, fix)
        object.__setattr__(self, "num_gpu_block_expand_ratio", ratio)
        check_pin(self.rule)


@dataclass(frozen=True)
class SchedulerConfig:
    """Whether this instance does prefill and decode (``mixed``) or one of them (disaggregated), and
    which inter-process protocol its processes speak: ours, or FastDeploy's own (beside its processes)."""

    splitwise_role: str = "mixed"
    protocol: str = "fd-platforms"

    def __post_init__(self) -> None:
        object.__setattr__(self, "splitwise_role", choice("splitwise_role", self.splitwise_role, SPLITWISE_ROLES))
        object.__setattr__(self, "protocol", choice("protocol", self.protocol, PROTOCOLS))


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallelism: how many ranks split the KV heads, and which one this process is."""

    tensor_parallel_size: int = 1
    local_rank: int = 0

    def __post_init__(self) -> None:
        size = check_int("tensor_parallel_size", self.tensor_parallel_size, 1, MAX_RANKS)
        check_int(
            "local_rank",
            self.local_rank,
            0,
            size - 1,
            note=f"tensor_parallel_size={size}",
            fix="set local_rank below tensor_parallel_size",
        )
