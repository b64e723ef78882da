"""A stand-in of FastDeploy's configuration objects: the attribute names and defaults its classes have.

Read from ``fastdeploy/config.py`` (gongshaotian/FastDeploy at 09a8c42) and ``fastdeploy/scheduler/config.py``;
only what a KV-cache port reads is here, each attribute under FastDeploy's own name, with its default and the
way FastDeploy derives it. Nothing of fd-platforms is imported: the adapter must read this as it would read
FastDeploy's real ``FDConfig``.

- ``ModelConfig(args)``: ``model`` (the model folder) and ``dtype`` from ``args``; a ``text_config`` section of
  the folder's ``config.json`` is flattened first (its keys become attributes where the config has none yet, and
  ``text_config`` itself is no attribute: ``ModelConfig.__init__``, develop c1b7c083), then every top-level key
  as an attribute (``PretrainedConfig.get_config_dict``); absent keys of ``PRETRAINED_INIT_CONFIGURATION`` take its
  defaults (``num_key_value_heads`` ``-1``, ``start_layer_index`` 0), absent ``head_dim`` is
  ``hidden_size // num_attention_heads``; ``num_nextn_predict_layers`` defaults to 0.
- ``CacheConfig(args)``: ``block_size`` 64, ``gpu_memory_utilization`` 0.9, ``cache_dtype`` ``bfloat16`` (a
  quantized model's ``kv_cache_quant_type`` replaces it, and any int4/int8/float4/float8 name becomes
  ``uint8``), ``swap_space`` (GiB) turned into ``num_cpu_blocks`` with FastDeploy's own bytes per block (all
  KV heads, no tensor-parallel split), ``kvcache_storage_backend``, ``use_mla_cache`` from
  ``FD_ATTENTION_BACKEND == "MLA_ATTN"``.
- ``ParallelConfig(args)``: ``tensor_parallel_size``, ``data_parallel_size``, ``local_data_parallel_id``,
  ``engine_worker_queue_port`` (parsed to a list of ports), ``device_ids``, ``engine_pid``.
- ``SchedulerConfig``: ``splitwise_role`` (``mixed``, ``prefill``, ``decode``), ``name``.
- ``SpeculativeConfig(args)``: ``method`` (None or ``mtp``), ``num_gpu_block_expand_ratio`` 1, ``model`` None,
  ``model_type`` ``main`` (``_DEFAULTS``), ``num_extra_cache_layer`` computed after the args are applied: 1 with
  MTP, else 0 (``_convert_and_validate``).
- :func:`proposer_fd_config`: the MTP proposer's own FDConfig, a deep copy of its runner's
  (``spec_decode/base.py`` ``Proposer.__init__``) changed as ``spec_decode/mtp.py`` ``_update_mtp_config`` changes
  it: ``num_hidden_layers`` 1, ``start_layer_index`` the main model's layers, ``model`` the speculative model,
  ``speculative_config.model_type`` ``mtp``.
- ``QuantConfig``: FastDeploy's quantization configs carry ``kv_cache_quant_type`` (None when the cache is
  not quantized); ``FDConfig.quant_config`` is None for an unquantized model. It is built from the model's
  ``config.json`` ``quantization_config`` where it has one, else from the engine's ``--quantization``
  (``model_executor/layers/quantization/__init__.py`` ``parse_quant_config``; ``MixQuantConfig.from_config`` reads
  ``kv_cache_quant_type``), and ``CacheConfig`` reads both, ``quantization_config`` last.
- ``FDConfig``: holds the above; ``max_chips_per_node`` is 16 on Iluvatar, else 8, and a deployment of more ranks
  (``tensor_parallel_size * data_parallel_size``) than that runs ``max_chips_per_node`` workers a node
  (``worker_num_per_node``, over ``nnode`` nodes; ``FDConfig.__init__``, gongshaotian/FastDeploy e53f518
  ``fastdeploy/config.py`` lines 1991-1997); ``parallel_config.device_ids`` becomes ``CUDA_VISIBLE_DEVICES`` (or
  ``XPU_VISIBLE_DEVICES`` on XPU), else ``0,1,...`` for the node's workers; ``postprocess_devices_and_ports``
  picks this data-parallel rank's ``local_device_ids`` and ``local_engine_worker_queue_port`` (leaving them
  unset where that fails: it logs the error).

Two processes build an FDConfig, and they differ (gongshaotian/FastDeploy at e53f518):

- :func:`fd_config`, the WORKER's (``fastdeploy/worker/worker_process.py`` ``initialize_fd_config``, what a runner
  holds): ``quant_config`` from ``parse_quant_config``, ``engine_pid`` from its ``--engine_pid`` (the engine
  passes its first ``engine_worker_queue_port``: ``engine/engine.py`` ``_start_worker_service``), and from its
  GLOBAL ``local_rank`` (``fleet.worker_index()``: ``init_distributed_environment``) ``tensor_parallel_rank``
  (``local_rank % tp``), ``data_parallel_rank`` (``local_rank // tp``) and, with data parallelism,
  ``local_data_parallel_id`` (``data_parallel_rank % (max_chips_per_node // tensor_parallel_size)``).
- :func:`engine_fd_config`, the ENGINE's (``fastdeploy/engine/args_utils.py`` ``EngineArgs.create_engine_config``):
  no ``quant_config`` (None whatever the model), no ``engine_pid`` (EngineArgs has none), and the engine's own
  ``local_data_parallel_id`` (0 unless given).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any


def _apply(target: object, args: dict[str, Any]) -> None:
    """FastDeploy's config classes take only the keys they already have (``if hasattr(self, key)``)."""
    for key, value in args.items():
        if hasattr(target, key):
            setattr(target, key, value)


PRETRAINED_INIT_CONFIGURATION = {"num_key_value_heads": -1, "start_layer_index": 0}
"""The defaults of ``fastdeploy/config.py`` ``PRETRAINED_INIT_CONFIGURATION`` a KV-cache port reads."""


class ModelConfig:
    def __init__(self, args: dict[str, Any]) -> None:
        self.model = ""
        self.dtype = "bfloat16"
        self.quantization: dict[str, Any] | None = None  # the engine's --quantization, parsed
        self.quantization_config: dict[str, Any] | None = None  # PRETRAINED_INIT_CONFIGURATION; config.json's
        self.num_nextn_predict_layers = 0
        _apply(self, args)
        pretrained = json.loads((Path(self.model) / "config.json").read_text())
        text_config = pretrained.pop("text_config", None)
        if isinstance(text_config, dict):  # flattened where the config has no such attribute yet
            for key, value in text_config.items():
                if not hasattr(self, key):
                    setattr(self, key, value)
        for key, value in pretrained.items():
            setattr(self, key, value)
        for key, value in PRETRAINED_INIT_CONFIGURATION.items():
            if not hasattr(self, key):
                setattr(self, key, value)
        if not hasattr(self, "head_dim"):
            self.head_dim = self.hidden_size // self.num_attention_heads


class CacheConfig:
    def __init__(self, args: dict[str, Any]) -> None:
        self.block_size = 64
        self.gpu_memory_utilization = 0.9
        self.num_gpu_blocks_override: int | None = None
        self.cache_dtype = "bfloat16"
        self.model_cfg: ModelConfig | None = None
        self.enable_prefix_caching = False
        self.swap_space: float | None = None
        self.kvcache_storage_backend: str | None = None
        self.num_cpu_blocks: int | None = None
        self.use_mla_cache = os.environ.get("FD_ATTENTION_BACKEND") == "MLA_ATTN"
        _apply(self, args)
        if self.model_cfg is not None:
            for quantization in (self.model_cfg.quantization, self.model_cfg.quantization_config):  # config.json last
                self.cache_dtype = (quantization or {}).get("kv_cache_quant_type", self.cache_dtype)
            if any(kind in self.cache_dtype.lower() for kind in ("int4", "int8", "float4", "float8")):
                self.cache_dtype = "uint8"
            heads = self.model_cfg.num_key_value_heads
            heads = heads if heads and heads > 0 else self.model_cfg.num_attention_heads
            byte_size = {"float32": 4, "uint8": 1}.get(self.cache_dtype, 2)
            per_token = heads * self.model_cfg.head_dim * byte_size * (1 if self.use_mla_cache else 2)
            self.bytes_per_block = per_token * self.block_size * self.model_cfg.num_hidden_layers
        if self.num_cpu_blocks is None:
            swap = self.swap_space
            self.num_cpu_blocks = 0 if swap is None else int(swap * 1024**3 / self.bytes_per_block)


class ParallelConfig:
    def __init__(self, args: dict[str, Any]) -> None:
        self.tensor_parallel_rank = 0
        self.data_parallel_rank = 0
        self.tensor_parallel_size = 1
        self.data_parallel_size = 1
        self.local_data_parallel_id = 0
        self.engine_worker_queue_port: Any = None
        self.local_engine_worker_queue_port: int | None = None
        self.device_ids = "0"
        self.engine_pid: int | None = None
        self.do_profile = False
        _apply(self, args)
        port = self.engine_worker_queue_port  # parse_ports: "8002,8003", 8002 or a list
        self.engine_worker_queue_port = (
            [int(p) for p in port.split(",")] if isinstance(port, str) else [port] if isinstance(port, int) else port
        )


class SchedulerConfig:
    def __init__(self, args: dict[str, Any]) -> None:
        self.name = "local"
        self.splitwise_role = "mixed"
        self.max_num_seqs = 34
        _apply(self, args)


class SpeculativeConfig:
    def __init__(self, args: dict[str, Any]) -> None:
        self.method: str | None = None
        self.num_gpu_block_expand_ratio: float = 1
        self.model: str | None = None
        self.model_type = "main"
        _apply(self, args)
        self.num_extra_cache_layer = 1 if self.method == "mtp" else 0  # computed after the args: never taken from them


class QuantConfig:
    def __init__(self, kv_cache_quant_type: str | None) -> None:
        self.kv_cache_quant_type = kv_cache_quant_type


class FDConfig:
    def __init__(
        self,
        model_config: ModelConfig,
        cache_config: CacheConfig,
        parallel_config: ParallelConfig,
        scheduler_config: SchedulerConfig,
        speculative_config: SpeculativeConfig,
        quant_config: QuantConfig | None = None,
        platform: str = "cuda",
    ) -> None:
        self.model_config = model_config
        self.cache_config = cache_config
        self.parallel_config = parallel_config
        self.scheduler_config = scheduler_config
        self.speculative_config = speculative_config
        self.quant_config = quant_config
        ranks = parallel_config.tensor_parallel_size * parallel_config.data_parallel_size
        self.max_chips_per_node = 16 if platform == "iluvatar" else 8  # current_platform.is_iluvatar()
        self.worker_num_per_node = min(ranks, self.max_chips_per_node)
        self.nnode = -(-ranks // self.worker_num_per_node)  # FastDeploy asserts its --ips give this many nodes
        visible = "XPU_VISIBLE_DEVICES" if platform == "xpu" else "CUDA_VISIBLE_DEVICES"
        default = os.getenv("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(self.worker_num_per_node)))
        parallel_config.device_ids = os.getenv(visible, default)
        dp, tp = parallel_config.local_data_parallel_id, parallel_config.tensor_parallel_size
        self.local_device_ids = parallel_config.device_ids.split(",")[dp * tp : (dp + 1) * tp]
        try:
            parallel_config.local_engine_worker_queue_port = parallel_config.engine_worker_queue_port[dp]
        except (IndexError, TypeError):  # postprocess_devices_and_ports logs it and goes on
            parallel_config.local_engine_worker_queue_port = None


def fd_config(
    model: str,
    *,
    tp: int = 1,
    dp: int = 1,
    local_data_parallel_id: int = 0,
    splitwise_role: str = "mixed",
    swap_space: float | None = None,
    kv_cache_quant_type: str | None = None,
    mtp: bool = False,
    port: str = "8002",
    engine_pid: int | None = 4242,
    local_rank: int | None = None,
    platform: str = "cuda",
    **cache: Any,
) -> FDConfig:
    """The FDConfig FastDeploy's WORKER process builds (``worker_process.py`` ``initialize_fd_config``) on
    ``platform`` (FastDeploy's ``current_platform``: ``cuda``, ``xpu``, ``iluvatar``, ...): what a runner of
    data-parallel rank ``local_data_parallel_id`` holds; given the worker's global ``local_rank``, its ranks are
    derived from it as ``initialize_fd_config`` derives them (``max_chips_per_node``: 8, 16 on Iluvatar)."""
    if local_rank is not None and dp > 1:
        max_chips_per_node = 16 if platform == "iluvatar" else 8
        local_data_parallel_id = local_rank // tp % (max_chips_per_node // tp)
    config = _build(
        model,
        tp,
        dp,
        local_data_parallel_id,
        splitwise_role,
        swap_space,
        kv_cache_quant_type,
        mtp,
        port,
        engine_pid,
        worker=True,
        cache=cache,
        platform=platform,
    )
    if local_rank is not None:
        config.parallel_config.tensor_parallel_rank = local_rank % tp
        config.parallel_config.data_parallel_rank = local_rank // tp
    return config


def proposer_fd_config(runner_fd_config: FDConfig) -> FDConfig:
    """The MTP proposer's own FDConfig: a deep copy of its runner's (``spec_decode/base.py`` ``Proposer.__init__``:
    ``self.fd_config = deepcopy(fd_config)``), changed as ``spec_decode/mtp.py`` ``_update_mtp_config`` changes it."""
    proposer = copy.deepcopy(runner_fd_config)
    main_layers = proposer.model_config.num_hidden_layers
    proposer.model_config.num_hidden_layers = 1  # "The number of MTP layers should be read from model config"
    proposer.model_config.model = proposer.speculative_config.model
    proposer.model_config.start_layer_index = main_layers
    proposer.speculative_config.model_type = "mtp"
    return proposer


def engine_fd_config(
    model: str,
    *,
    tp: int = 1,
    dp: int = 1,
    splitwise_role: str = "mixed",
    swap_space: float | None = None,
    kv_cache_quant_type: str | None = None,
    mtp: bool = False,
    port: str = "8002",
    platform: str = "cuda",
    **cache: Any,
) -> FDConfig:
    """The FDConfig FastDeploy's ENGINE process builds for the same deployment (``args_utils.py``
    ``EngineArgs.create_engine_config``): no ``quant_config``, no ``engine_pid``, data-parallel rank 0's view."""
    return _build(
        model,
        tp,
        dp,
        0,
        splitwise_role,
        swap_space,
        kv_cache_quant_type,
        mtp,
        port,
        None,
        worker=False,
        cache=cache,
        platform=platform,
    )


def _build(
    model: str,
    tp: int,
    dp: int,
    local_data_parallel_id: int,
    splitwise_role: str,
    swap_space: float | None,
    kv_cache_quant_type: str | None,
    mtp: bool,
    port: str,
    engine_pid: int | None,
    *,
    worker: bool,
    cache: dict[str, Any],
    platform: str,
) -> FDConfig:
    quantization = {"kv_cache_quant_type": kv_cache_quant_type} if kv_cache_quant_type else None
    model_config = ModelConfig({"model": model, "quantization": quantization})
    cache_config = CacheConfig({"model_cfg": model_config, "swap_space": swap_space, **cache})
    parallel = ParallelConfig(
        {
            "tensor_parallel_size": tp,
            "data_parallel_size": dp,
            "local_data_parallel_id": local_data_parallel_id,
            "engine_worker_queue_port": port,
            "engine_pid": engine_pid,
        }
    )
    speculative = SpeculativeConfig({"method": "mtp" if mtp else None})
    # parse_quant_config: config.json's quantization_config first, else the engine's --quantization (simplified: a
    # config.json stating no kv_cache_quant_type, e.g. DeepSeek's torch-format fp8, leaves the engine's here)
    kv = (model_config.quantization_config or {}).get("kv_cache_quant_type") or (quantization or {}).get(
        "kv_cache_quant_type"
    )
    quant = QuantConfig(kv) if kv and worker else None
    return FDConfig(
        model_config,
        cache_config,
        parallel,
        SchedulerConfig({"splitwise_role": splitwise_role}),
        speculative,
        quant,
        platform,
    )
