"""Stand-ins of FastDeploy's runner, MTP proposer, worker, cache transfer manager and cache messager: the parts a
KV-cache port leaves as they are, so the porting guide's ported methods run on cpu beside them.

Read from gongshaotian/FastDeploy develop c1b7c083 (2026-05-20). Each class holds, under FastDeploy's names, what
its KV-cache methods read and the call sites that stay (``profile_run``, ``update_share_input_block_num``,
``update_mtp_block_num``, ``initialize_cache``, ``check_cache_status``); nothing of fd-platforms is imported, so
the ported methods meet FastDeploy's objects as they would in FastDeploy. What each stands for:

- :data:`current_platform`: ``fastdeploy/platforms/__init__.py`` picks it from Paddle's build; here the cpu build's
  ``CPUPlatform`` (``platforms/cpu.py``, ``device_name = "cpu"``), as this machine has no accelerator.
- The attention backends' ``get_kv_cache_shape`` (``model_executor/layers/attention/append_attn_backend.py``: key
  ``[blocks, kv_num_heads, block_size, head_dim]``, the last halved for ``int4_zp``, value the same;
  ``mla_attention_backend.py``: key ``[blocks, 1, block_size, kv_lora_rank + qk_rope_head_dim]``, value ``[]``;
  ``dsa_attention_backend.py``: three shapes; ``backends/xpu/attention.py``: key and value, no int4 halving), chosen
  by ``FD_ATTENTION_BACKEND`` (``gpu_model_runner.py`` ``_initialize_attn_backend``, ``self.dsa_cache``).
- :class:`GPUModelRunnerBase`: ``worker/gpu_model_runner.py`` ``GPUModelRunner``: ``__init__`` (its attributes),
  ``load_model`` creating the proposer (``_init_speculative_proposer`` → ``create_mtp_proposer(self.fd_config,
  main_model, local_rank, device_id, share_inputs)``), ``profile_run`` (runner, then proposer; cleared proposer
  first) and ``update_share_input_block_num`` (runner, then ``proposer.update_mtp_block_num``).
- :class:`XPUModelRunnerBase`: ``worker/xpu_model_runner.py``: the proposer first in both call sites, no clear
  after the profile run, and ``clear_cache(self)`` (no ``profile``) that only drops the references.
- :class:`MTPProposerBase`: ``spec_decode/mtp.py`` ``MTPProposer.__init__`` (its FDConfig the deep copy
  :func:`~fastdeploy_config_standin.proposer_fd_config` makes) and ``update_mtp_block_num``.
- :class:`GpuWorkerBase` and :class:`PaddleDisWorkerProcBase`: ``worker/gpu_worker.py`` (``init_device``:
  ``max_chips_per_node = 8``, ``device_ids[local_rank % max_chips_per_node]`` names the tensors; the profile run
  measured by :meth:`GpuWorkerBase.measure_profile_run`, which stands for ``determine_available_memory``'s
  ``pynvml`` and Paddle peak readings around ``model_runner.profile_run()``, unchanged by the port) and
  ``worker/worker_process.py`` ``PaddleDisWorkerProc`` (``ranks``, ``local_rank``, ``max_chips_per_node``).
- :class:`CacheTransferManagerBase`: ``cache_manager/cache_transfer_manager.py`` ``CacheTransferManager.__init__``
  (the shapes and counts it parses, then ``_init_gpu_cache`` and, with swap space, ``_init_cpu_cache``) and
  ``check_cache_status``'s clear and restore steps (:meth:`~CacheTransferManagerBase.clear_step`,
  :meth:`~CacheTransferManagerBase.restore_step`).
- :func:`start_cache_messager`: what ``cache_manager/cache_messager.py`` ``main`` does after its cache exists
  (build ``CacheMessager`` over ``gpu_cache_kvs`` for ``num_layers + num_extra_layers`` layers).
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import struct
from dataclasses import dataclass
from typing import Any

from fastdeploy_config_standin import proposer_fd_config


class _Platform:
    """``fastdeploy/platforms/base.py`` ``Platform``: ``is_cuda()``, ``is_xpu()``, ... by its ``device_name``."""

    device_name = ""

    def is_cuda(self) -> bool:
        return self.device_name == "gpu"

    def is_xpu(self) -> bool:
        return self.device_name == "xpu"

    def is_maca(self) -> bool:
        return self.device_name == "metax_gpu"


class CPUPlatform(_Platform):
    """``fastdeploy/platforms/cpu.py``: the platform FastDeploy selects on Paddle's cpu build."""

    device_name = "cpu"


class CUDAPlatform(_Platform):
    """``fastdeploy/platforms/cuda.py``."""

    device_name = "gpu"


class MACAPlatform(_Platform):
    """``fastdeploy/platforms/maca.py`` (MetaX)."""

    device_name = "metax_gpu"


current_platform = CPUPlatform()


class SpecMethod(enum.Enum):
    """``fastdeploy/spec_decode/types.py``."""

    MTP = "mtp"


class ForwardMeta:
    """``model_executor/forward_meta.py``: the forward pass's view of the caches."""

    def __init__(self) -> None:
        self.caches: list[Any] | None = None

    def clear_caches(self) -> None:
        self.caches = None


class AppendAttentionBackend:
    def __init__(self, kv_num_heads: int, block_size: int, head_dim: int) -> None:
        self.kv_num_heads, self.block_size, self.head_dim = kv_num_heads, block_size, head_dim

    def get_kv_cache_shape(self, max_num_blocks: int, kv_cache_quant_type: str | None = None) -> tuple[list, list]:
        key = [max_num_blocks, self.kv_num_heads, self.block_size, self.head_dim]
        if kv_cache_quant_type == "int4_zp":
            key[-1] = self.head_dim // 2
        return key, key


class XPUAttentionBackend(AppendAttentionBackend):
    def get_kv_cache_shape(self, max_num_blocks: int, kv_cache_quant_type: str | None = None) -> tuple[list, list]:
        key = [max_num_blocks, self.kv_num_heads, self.block_size, self.head_dim]
        return key, key


class MLAAttentionBackend:
    def __init__(self, block_size: int, kv_lora_rank: int, qk_rope_head_dim: int) -> None:
        self.block_size, self.width = block_size, kv_lora_rank + qk_rope_head_dim

    def get_kv_cache_shape(self, max_num_blocks: int, kv_cache_quant_type: str | None = None) -> tuple[list, list]:
        return [max_num_blocks, 1, self.block_size, self.width], []


class DSAAttentionBackend:
    def __init__(self, block_size: int, kv_lora_rank: int, qk_rope_head_dim: int, index_head_dim: int) -> None:
        self.block_size = block_size
        self.key = kv_lora_rank + 4 * (kv_lora_rank // 128) + 2 * qk_rope_head_dim
        self.indexer = index_head_dim + index_head_dim // 128 * 4

    def get_kv_cache_shape(
        self, max_num_blocks: int, kv_cache_quant_type: str | None = None
    ) -> tuple[list, list, list]:
        return [max_num_blocks, 1, self.block_size, self.key], [], [max_num_blocks, self.block_size, self.indexer]


def attention_backend(fd_config: Any, xpu: bool = False) -> Any:
    """The runner's first attention backend, as ``_initialize_attn_backend`` builds it from its FDConfig."""
    model, block = fd_config.model_config, fd_config.cache_config.block_size
    backend = os.environ.get("FD_ATTENTION_BACKEND", "APPEND_ATTN")
    if backend == "MLA_ATTN":
        return MLAAttentionBackend(block, model.kv_lora_rank, model.qk_rope_head_dim)
    if backend == "DSA_ATTN":
        return DSAAttentionBackend(block, model.kv_lora_rank, model.qk_rope_head_dim, model.index_head_dim)
    heads = max(1, int(model.num_key_value_heads) // fd_config.parallel_config.tensor_parallel_size)
    return (XPUAttentionBackend if xpu else AppendAttentionBackend)(heads, block, model.head_dim)


MTP_PROPOSERS: dict[str, type] = {}
"""What ``create_mtp_proposer`` returns per platform kind (``gpu``: ``MTPProposerCUDA``); the guide registers its
ported classes here."""


class GPUModelRunnerBase:
    """``worker/gpu_model_runner.py`` ``GPUModelRunner``, less the KV-cache methods a port rewrites."""

    xpu = False

    def __init__(self, fd_config: Any, device: str, device_id: int, rank: int, local_rank: int) -> None:
        self.fd_config, self.device, self.device_id = fd_config, device, device_id
        self.rank, self.local_rank = rank, local_rank
        self.parallel_config, self.cache_config = fd_config.parallel_config, fd_config.cache_config
        self.model_config, self.quant_config = fd_config.model_config, fd_config.quant_config
        self.speculative_config = fd_config.speculative_config
        self.spec_method = SpecMethod.MTP if self.speculative_config.method == "mtp" else None
        self.share_inputs: dict[str, Any] = {}
        self.forward_meta: ForwardMeta | None = ForwardMeta()
        self.attn_backends = [attention_backend(fd_config, self.xpu)]
        self.num_gpu_blocks = 0
        self.proposer: Any = None
        self.cache_kvs_map: dict[str, Any] = {}
        self.enable_cache_manager_v1 = False  # envs.ENABLE_V1_KVCACHE_MANAGER (default 0)
        self.cache_controller: Any = None  # its cache_manager/v1 CacheController, made only with that flag

    def initialize_v1_cache(self) -> None:
        """``initialize_kv_cache``'s first branch, unchanged by a port: with ``ENABLE_V1_KVCACHE_MANAGER`` its
        ``cache_controller`` allocates the cache (not run here: the flag is off)."""
        raise NotImplementedError("FastDeploy's cache_manager/v1 path")

    def load_model(self) -> None:
        """``load_model`` step 4: ``_init_speculative_proposer``."""
        if self.spec_method is SpecMethod.MTP:
            proposer = MTP_PROPOSERS["xpu" if self.xpu else "gpu"]
            self.proposer = proposer(self.fd_config, None, self.local_rank, self.device_id, self.share_inputs)

    def profile_run(self) -> None:
        self.num_gpu_blocks = self.cache_config.total_block_num
        self.initialize_kv_cache(profile=True)
        if self.spec_method is SpecMethod.MTP:
            self.proposer.initialize_kv_cache(main_model_num_blocks=self.num_gpu_blocks, profile=True)
        # the dummy run: nothing to run here
        if self.spec_method is SpecMethod.MTP:
            self.proposer.clear_mtp_cache(profile=True)
        self.clear_cache(profile=True)

    def update_share_input_block_num(self, num_gpu_blocks: int) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.initialize_kv_cache()
        if self.spec_method is SpecMethod.MTP:
            self.proposer.update_mtp_block_num(num_gpu_blocks)

    def initialize_kv_cache(self, profile: bool = False) -> None:
        raise NotImplementedError("the port's")

    def clear_cache(self, profile: bool = False) -> None:
        raise NotImplementedError("the port's")


class XPUModelRunnerBase(GPUModelRunnerBase):
    """``worker/xpu_model_runner.py`` ``XPUModelRunner``, less the KV-cache methods a port rewrites."""

    xpu = True

    def profile_run(self) -> None:
        self.num_gpu_blocks = self.cache_config.total_block_num
        if self.spec_method is SpecMethod.MTP:
            self.proposer.initialize_kv_cache(main_model_num_blocks=self.num_gpu_blocks, profile=True)
        self.initialize_kv_cache(profile=True)

    def update_share_input_block_num(self, num_gpu_blocks: int) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        if self.spec_method is SpecMethod.MTP:
            self.proposer.initialize_kv_cache(main_model_num_blocks=self.num_gpu_blocks)
        self.initialize_kv_cache()

    def clear_cache(self) -> None:  # type: ignore[override]  # FastDeploy's XPU clear_cache takes no profile
        self.share_inputs.pop("caches", None)
        if self.forward_meta is not None:
            self.forward_meta.clear_caches()


class MTPProposerBase:
    """``spec_decode/mtp.py`` ``MTPProposer``, less the KV-cache methods a port rewrites."""

    def __init__(self, fd_config: Any, main_model: Any, local_rank: int, device_id: int, target_model_inputs: Any):
        self.fd_config = proposer_fd_config(fd_config)  # Proposer.__init__'s deepcopy, then _update_mtp_config
        self.num_main_model_layers = fd_config.model_config.num_hidden_layers
        self.model_config, self.speculative_config = self.fd_config.model_config, self.fd_config.speculative_config
        self.local_rank, self.device_id = local_rank, device_id
        self.target_model_inputs = target_model_inputs
        self.model_inputs: dict[str, Any] = {}
        self.forward_meta: ForwardMeta | None = None  # set by its first forward pass
        self.attn_backends = [attention_backend(self.fd_config)]
        self.num_gpu_blocks = 0

    def update_mtp_block_num(self, num_gpu_blocks: int) -> None:
        self.main_model_num_gpu_blocks = num_gpu_blocks
        self.initialize_kv_cache(main_model_num_blocks=self.main_model_num_gpu_blocks)

    def initialize_kv_cache(self, main_model_num_blocks: int, profile: bool = False) -> None:
        raise NotImplementedError("the port's")


@dataclass
class MemoryInfo:
    """``pynvml.nvmlDeviceGetMemoryInfo``'s answer: bytes."""

    total: int
    used: int
    free: int


class GpuWorkerBase:
    """``worker/gpu_worker.py`` ``GpuWorker``, less the lines of ``determine_available_memory`` a port rewrites.

    ``device_memory`` (a :class:`MemoryInfo` before the profile run) and ``activation_bytes`` (what the dummy run
    adds to Paddle's peak beside the profile cache) stand for the device."""

    runner_class: type = GPUModelRunnerBase

    def __init__(
        self, fd_config: Any, local_rank: int, rank: int, *, device_memory: MemoryInfo, activation_bytes: int
    ) -> None:
        self.fd_config, self.local_rank, self.rank = fd_config, local_rank, rank
        self.cache_config, self.parallel_config = fd_config.cache_config, fd_config.parallel_config
        self.device_memory, self.activation_bytes = device_memory, activation_bytes
        self.max_chips_per_node = 8  # init_device
        self.device_ids = self.parallel_config.device_ids.split(",")
        self.device = f"gpu:{self.local_rank % self.max_chips_per_node}"
        self.model_runner = self.runner_class(
            fd_config, self.device, int(self.device_ids[self.local_rank % self.max_chips_per_node]), rank, local_rank
        )

    def measure_profile_run(self) -> tuple[MemoryInfo, int]:
        """``determine_available_memory`` up to its budget: Paddle's peak reset and read, ``pynvml``'s reading,
        ``model_runner.profile_run()``, then both read again: ``(after_run_meminfo, paddle_peak_increase)``. The
        peak grows by the profile run's caches (the runner's and the proposer's, ``total_block_num`` blocks: their
        ``kv_cache.nbytes``) and the dummy run's activations; after the run FastDeploy empties Paddle's cache, so
        ``used`` is what it was."""
        runner = self.model_runner
        runner.profile_run()
        caches = sum(part.kv_cache.nbytes for part in (runner, runner.proposer) if part is not None)
        return MemoryInfo(**vars(self.device_memory)), caches + self.activation_bytes

    def initialize_cache(self, num_gpu_blocks: int) -> None:
        self.model_runner.update_share_input_block_num(num_gpu_blocks=num_gpu_blocks)


class PaddleDisWorkerProcBase:
    """``worker/worker_process.py`` ``PaddleDisWorkerProc``: one worker process, of global rank ``local_rank``."""

    def __init__(self, fd_config: Any, ranks: int = 1, local_rank: int = 0, *, worker: GpuWorkerBase) -> None:
        self.fd_config, self.ranks, self.local_rank = fd_config, ranks, local_rank
        self.parallel_config = fd_config.parallel_config
        self.worker = worker
        self.max_chips_per_node = 8  # 16 on Iluvatar

    def write_block_count(self, num_blocks_local: int) -> None:
        """``initialize_kv_cache``'s hand-off, unchanged by a port: local rank 0 of a node writes the count into
        ``get_profile_block_num.<engine_pid>`` (an ``IPCSignal`` its engine made, ``create=False``)."""
        if self.local_rank % self.max_chips_per_node == 0:  # IPCSignal: an int32 array in /dev/shm/<name>.<suffix>
            with open(f"/dev/shm/get_profile_block_num.{self.parallel_config.engine_pid}", "r+b") as segment:
                segment.write(struct.pack("=i", num_blocks_local))

    def min_across_ranks(self, num_blocks_local: int) -> int:
        """``initialize_kv_cache``'s agreement, unchanged by a port: with ``ranks > 1`` a ``paddle.full`` of the
        count and ``dist.all_reduce(..., op=MIN)``. A worker here is its deployment's only rank (one process
        cannot hold the collective of several)."""
        if self.ranks > 1:
            raise NotImplementedError("the stand-in runs one rank per deployment")
        return num_blocks_local


class CacheTransferManagerBase:
    """``cache_manager/cache_transfer_manager.py`` ``CacheTransferManager``, less the cache methods a port rewrites:
    ``__init__`` parses the shapes and counts, then makes the device cache and, with swap space, the host one."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.key_cache_shape = [int(i) for i in args.key_cache_shape.split(",")]
        self.value_cache_shape = [int(i) for i in args.value_cache_shape.split(",")] if args.value_cache_shape else []
        self.num_gpu_blocks, self.block_size = self.key_cache_shape[0], self.key_cache_shape[2]
        self.cache_dtype, self.rank, self.device = args.cache_dtype, args.rank, args.device_id
        self.num_layers, self.n_ranks, self.num_cpu_blocks = args.num_layers, args.mp_num, args.num_cpu_blocks
        self.create_cache_tensor = args.create_cache_tensor
        self._init_gpu_cache()
        if self.num_cpu_blocks > 0:
            self._init_cpu_cache()

    def clear_step(self, swap_space_clearing: bool) -> None:
        """``check_cache_status`` on CLEARING (after ``pause``)."""
        if self.num_cpu_blocks > 0 and swap_space_clearing:
            self._clear_cpu_cache()
        self._clear_gpu_cache()

    def restore_step(self, swap_space_clearing: bool) -> None:
        """``check_cache_status`` on UPDATING (before ``resume``)."""
        if self.num_cpu_blocks > 0 and swap_space_clearing:
            self._init_cpu_cache()
        self._init_gpu_cache()

    def _drop_gpu_views(self) -> None:
        """``_clear_gpu_cache``'s lines that empty ``gpu_cache_kvs`` and the per-role tensor lists, unchanged."""
        for views in (
            self.gpu_cache_kvs,
            self.gpu_cache_k_tensors,
            self.gpu_cache_v_tensors,
            self.gpu_cache_scales_k_tensors,
            self.gpu_cache_scales_v_tensors,
        ):
            views.clear()

    def _drop_cpu_views(self) -> None:
        """``_clear_cpu_cache``'s lines that empty ``cpu_cache_kvs`` and the address lists, unchanged."""
        for views in (self.cpu_cache_kvs, self.k_dst_ptrs, self.v_dst_ptrs, self.k_scales_ptrs, self.v_scales_ptrs):
            views.clear()

    def _init_gpu_cache(self) -> None:
        raise NotImplementedError("the port's")

    def _init_cpu_cache(self) -> None:
        raise NotImplementedError("the port's")

    def _clear_gpu_cache(self) -> None:
        raise NotImplementedError("the port's")

    def _clear_cpu_cache(self) -> None:
        raise NotImplementedError("the port's")


MESSAGERS: list[dict[str, Any]] = []
"""What :func:`start_cache_messager` was given, for the guide's checks."""


def set_device_and_dtype(args: argparse.Namespace) -> None:
    """``cache_messager.py`` ``main``'s first lines, unchanged by a port: ``set_device(device)`` and
    ``paddle.set_default_dtype(args.default_dtype)`` (the cpu platform here has one device and its default dtype)."""


def start_cache_messager(
    args: argparse.Namespace, gpu_cache_kvs: dict[str, Any], num_extra_layers: int, rank: int, device: int
) -> None:
    """``cache_messager.py`` ``main`` after its cache exists: ``CacheMessager(..., gpu_cache_kvs=gpu_cache_kvs,
    num_layers=args.num_layers + num_extra_layers, ...)``, which reads ``key_caches_{layer}_rank{rank}_device{id}``
    for every layer (``CacheMessager.__init__``); its transfer loop does not run here."""
    for layer in range(args.num_layers + num_extra_layers):
        gpu_cache_kvs[f"key_caches_{layer}_rank{rank}_device{device}"]  # KeyError if absent
    MESSAGERS.append({"gpu_cache_kvs": gpu_cache_kvs, "num_layers": args.num_layers + num_extra_layers})


def _common_flags(parser: argparse.ArgumentParser) -> None:
    """The flags both cache processes' ``parse_args`` have, with their types, defaults and choices."""
    parser.add_argument("--splitwise_role", type=str, default="mixed")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--device_id", type=int, default=0)
    parser.add_argument("--num_layers", type=int, default=1)
    parser.add_argument("--mp_num", type=int, default=1)
    parser.add_argument("--key_cache_shape", type=str, default="")
    parser.add_argument("--value_cache_shape", type=str, default="")
    parser.add_argument("--pod_ip", type=str, default="0.0.0.0")
    parser.add_argument("--engine_worker_queue_port", type=int, default=9923)
    parser.add_argument("--cache_dtype", type=str, default="bfloat16", choices=["uint8", "bfloat16", "block_wise_fp8"])
    parser.add_argument("--protocol", type=str, default="ipc")
    parser.add_argument("--local_data_parallel_id", type=int, default=0)
    parser.add_argument("--rdma_port", type=str, default="")
    parser.add_argument("--speculative_config", type=json.loads, default="{}")


def transfer_manager_parser() -> argparse.ArgumentParser:
    """``cache_transfer_manager.py`` ``parse_args``'s parser (every flag the cache reads, as it declares them)."""
    parser = argparse.ArgumentParser("Cache transfer manager")
    _common_flags(parser)
    parser.add_argument("--default_dtype", type=str, default="bfloat16", choices=["float16", "bfloat16", "uint8"])
    parser.add_argument("--cache_queue_port", type=int, default=9923)
    parser.add_argument("--num_cpu_blocks", type=int, default=4)
    parser.add_argument("--create_cache_tensor", action="store_true")
    parser.add_argument(
        "--kvcache_storage_backend", type=str, default=None, choices=["mooncake", "attention_store", "file"]
    )
    parser.add_argument("--model_path", type=str)
    return parser


def cache_messager_parser() -> argparse.ArgumentParser:
    """``cache_messager.py`` ``parse_args``'s parser.

    No ``--model_path``, no ``--num_cpu_blocks``, an ``--ipc_suffix``.
    """
    parser = argparse.ArgumentParser("Cache Messager")
    _common_flags(parser)
    parser.add_argument(
        "--default_dtype", type=str, default="bfloat16", choices=["float16", "bfloat16", "uint8", "int8"]
    )
    parser.add_argument("--cache_queue_port", type=int, default=9924)
    parser.add_argument("--ipc_suffix", type=str, default=None)
    return parser
