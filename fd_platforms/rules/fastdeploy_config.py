"""FastDeploy's configuration, taken as it is: from its ``FDConfig``, or from a cache process's command line.

A FastDeploy runner holds an ``FDConfig`` (``fastdeploy/config.py``): ``model_config``, ``cache_config``,
``parallel_config``, ``scheduler_config``, ``speculative_config`` and ``quant_config``. :func:`from_fd_config`
reads it duck-typed (nothing of FastDeploy is imported) into :class:`FastDeploySettings`: our model, cache and
parallel records, the rule's inputs and FastDeploy's protocol settings, so a runner restates nothing.
FastDeploy's cache transfer manager and cache messager get no ``FDConfig``, only a command line
(``cache_manager/prefix_cache_manager.py`` ``launch_cache_manager``); :func:`from_cache_manager_args` builds the
same settings from it and the model's ``config.json``.

Every value is FastDeploy's own: its vocabulary (``kv_cache_quant_type``, ``cache_dtype``) goes through
:mod:`.config.vocabulary`; ``num_cpu_blocks`` is the one FastDeploy's ``CacheConfig`` computed (what its transfer manager
allocates); the device id that names the tensors is the physical one from ``parallel_config.device_ids`` (its
``CUDA_VISIBLE_DEVICES``), the tensors live on the local device, as ``gpu_worker.py`` allocates them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from ..contract.errors import ConfigError
from ..contract.integers import check_int
from ..contract.types import CacheRoleShape
from .config.model import ModelConfig, load_model_config
from .config.settings import CacheConfig, ParallelConfig
from .config.vocabulary import cache_settings_from_fastdeploy
from .decision import check_pin
from .devices import listed_device
from .layout import CacheLayout, build_layout

_ATTENTION_BACKENDS = {"MLA_ATTN": "mla", "DSA_ATTN": "dsa"}
"""FastDeploy's ``FD_ATTENTION_BACKEND`` values that change the cache's shape (its runners test these two)."""


@dataclass(frozen=True)
class FastDeploySettings:
    """What one rank of a FastDeploy deployment needs from fd-platforms, read from FastDeploy's config.

    ``device_id`` names the shared tensors (FastDeploy's physical id); ``local_device`` is where they live.
    ``suffix`` is FastDeploy's signal suffix (this data-parallel rank's ``engine_worker_queue_port``),
    ``block_count_suffix`` its engine's pid (``get_profile_block_num``). ``num_blocks`` and ``tensor_specs`` are
    known only to a cache process (its ``--key_cache_shape``, ``--value_cache_shape``, ``--cache_dtype``); a runner
    plans the blocks, and its attention backend states the shapes.
    """

    model: ModelConfig
    cache: CacheConfig
    parallel: ParallelConfig
    splitwise_role: str
    device_id: int
    local_device: int
    suffix: str
    block_count_suffix: str | None
    rule: str | None = None
    num_blocks: int | None = None
    tensor_specs: tuple[CacheRoleShape, ...] | None = None

    @property
    def rank(self) -> int:
        """The local tensor-parallel rank."""
        return self.parallel.local_rank

    def layout(self) -> CacheLayout:
        """The rank's whole layout (its MTP draft layers too, where FastDeploy's speculative method is ``mtp``):
        plan on it; a runner passes :meth:`~fd_platforms.rules.layout.CacheLayout.main`, its proposer
        :meth:`~fd_platforms.rules.layout.CacheLayout.draft`, a cache process both (``draft=``)."""
        return build_layout(self.model, self.cache, self.parallel, device_id=self.device_id,
                            local_device=self.local_device)  # fmt: skip

    def protocol_arguments(self) -> dict[str, Any]:
        """FastDeploy's protocol as every engine call takes it: ``protocol``, ``suffix``, ``rule``."""
        return {"protocol": "fastdeploy", "suffix": self.suffix, "rule": self.rule}

    def rule_inputs(self, *, profile: bool = False) -> dict[str, Any]:
        """The create-or-attach rule's inputs, as ``initialize_kv_cache`` takes them."""
        return {
            "profile": profile,
            "num_cpu_blocks": self.cache.num_cpu_blocks,
            "storage_backend": self.cache.kvcache_storage_backend,
            "splitwise_role": self.splitwise_role,
        }

    def runner_arguments(self, *, profile: bool = False) -> dict[str, Any]:
        """Every keyword ``initialize_kv_cache`` needs beside FastDeploy: the rule's inputs and its protocol."""
        return {**self.rule_inputs(profile=profile), **self.protocol_arguments()}

    def manager_arguments(self) -> dict[str, Any]:
        """Every keyword ``manage_kv_cache`` needs beside FastDeploy (a manager never profiles), with the
        shapes its command line states where it has them."""
        arguments = {**self.rule_inputs(), **self.protocol_arguments(), "tensor_specs": self.tensor_specs}
        del arguments["profile"]
        return arguments


def from_fd_config(fd_config: object, *, local_rank: int, rule: str | None = None) -> FastDeploySettings:
    """The settings of the runner of ``local_rank`` (FastDeploy's ``local_rank``, as ``gpu_worker.py`` has it),
    read from a FastDeploy ``FDConfig``; ``rule`` pins the create-or-attach rule (FastDeploy's release)."""
    check_int("local_rank", local_rank, 0, fix="pass the runner's local_rank")
    check_pin(rule)
    model_config = _read(fd_config, "model_config")
    parallel_config = _read(fd_config, "parallel_config")
    tp = _read(parallel_config, "tensor_parallel_size", "fd_config.parallel_config")
    speculative = getattr(fd_config, "speculative_config", None)
    draft_layers = getattr(speculative, "num_extra_cache_layer", 0) if getattr(speculative, "method", None) == "mtp" else 0
    model = _model(model_config, draft_layers=draft_layers)
    cache = _cache(fd_config, rule)
    parallel = ParallelConfig(tensor_parallel_size=tp, local_rank=local_rank % tp)
    return FastDeploySettings(
        model=model,
        cache=cache,
        parallel=parallel,
        splitwise_role=_read(_read(fd_config, "scheduler_config"), "splitwise_role", "fd_config.scheduler_config"),
        device_id=_physical_device(parallel_config, local_rank),
        local_device=local_rank,
        suffix=str(_local_port(parallel_config)),
        block_count_suffix=_optional_text(getattr(parallel_config, "engine_pid", None)),
        rule=rule,
    )


def from_cache_manager_args(args: object, *, model_path: str | None = None, rule: str | None = None) -> FastDeploySettings:
    """The settings of FastDeploy's cache transfer manager or cache messager for one rank, from its parsed command
    line (``--rank``, ``--device_id``, ``--mp_num``, ``--cache_dtype``, ``--key_cache_shape``,
    ``--engine_worker_queue_port``, ...; ``cache_transfer_manager.py`` and ``cache_messager.py`` ``parse_args``) and
    the model's ``config.json`` (``model_path``, default ``args.model_path``, which only the transfer manager gets).
    Its ``--device_id`` is the physical id and it sees every device, so the tensors live on that device too.
    Its ``--cache_dtype`` says ``uint8`` for every 4- and 8-bit cache (FastDeploy's ``CacheConfig``); a key whose
    head dim is half the model's is ``int4_zp``'s two values a byte."""
    check_pin(rule)
    path = model_path if model_path is not None else getattr(args, "model_path", None)
    if path is None:
        raise ConfigError("model_path", None, "the model folder FastDeploy serves", "pass model_path=")
    speculative = getattr(args, "speculative_config", None) or {}
    model = load_model_config(path)
    if speculative.get("method") == "mtp":  # as the runner's: the transfer manager's num_extra_layers
        model = replace(model, num_nextn_predict_layers=int(speculative.get("num_extra_cache_layer") or 1), use_mtp=True)
    key_shape = _shape(getattr(args, "key_cache_shape", None), "--key_cache_shape")
    cache_dtype = _read(args, "cache_dtype", "args")
    packed = cache_dtype == "uint8" and model.attention in ("mha", "gqa") and key_shape[3] * 2 == model.head_dim
    cache_fields = cache_settings_from_fastdeploy(kv_cache_quant_type="int4_zp" if packed else None,
                                                  cache_dtype=cache_dtype)  # fmt: skip
    cache = CacheConfig(
        block_size=key_shape[2],
        num_cpu_blocks=getattr(args, "num_cpu_blocks", 0) or 0,
        kvcache_storage_backend=getattr(args, "kvcache_storage_backend", None),
        num_gpu_block_expand_ratio=float(speculative.get("num_gpu_block_expand_ratio", 1) or 1),
        rule=rule,
        **cache_fields,
    )
    device = _read(args, "device_id", "args")
    tp = _read(args, "mp_num", "args")
    return FastDeploySettings(
        model=model,
        cache=cache,
        parallel=ParallelConfig(tensor_parallel_size=tp, local_rank=_read(args, "rank", "args")),
        splitwise_role=getattr(args, "splitwise_role", "mixed"),
        device_id=device,
        local_device=device,
        suffix=str(_read(args, "engine_worker_queue_port", "args")),
        block_count_suffix=_optional_text(getattr(args, "engine_pid", None) or getattr(args, "ipc_suffix", None)),
        rule=rule,
        num_blocks=key_shape[0],
        tensor_specs=_command_line_specs(args, key_shape, cache_dtype),
    )


def _command_line_specs(args: object, key_shape: tuple[int, ...], cache_dtype: str) -> tuple[CacheRoleShape, ...]:
    """One layer's tensors as a cache process's command line states them: key ``--key_cache_shape`` and, unless
    MLA leaves it empty, value ``--value_cache_shape``, in ``uint8`` for a quantized cache (``--cache_dtype`` uint8
    or block_wise_fp8) else the cache dtype; with block_wise_fp8 the key and value scales ``[blocks, heads,
    block_size]`` in ``--default_dtype`` (Paddle's default dtype, which its ``CacheTransferManager.__init__``
    sets and sizes the scales in)."""
    value_text = getattr(args, "value_cache_shape", None)
    dtype = "uint8" if cache_dtype in ("uint8", "block_wise_fp8") else cache_dtype
    specs = [CacheRoleShape("key", key_shape, dtype)]
    if value_text:
        specs.append(CacheRoleShape("value", _shape(value_text, "--value_cache_shape"), dtype))
    if cache_dtype == "block_wise_fp8":
        scale = (key_shape[0], key_shape[1], key_shape[2])
        default = str(getattr(args, "default_dtype", "bfloat16"))
        specs += [CacheRoleShape(role, scale, default) for role in ("key_scale", "value_scale")[: len(specs)]]
    return tuple(specs)


def _model(model_config: object, *, draft_layers: int) -> ModelConfig:
    """FastDeploy's ``ModelConfig`` holds every key of the model's ``config.json`` as an attribute. With MTP the
    cache holds ``draft_layers`` more: FastDeploy's ``SpeculativeConfig.num_extra_cache_layer`` (1 for ``mtp``),
    what its transfer manager allocates after the main layers (``cache_transfer_manager.py``
    ``num_extra_layers``), whatever ``num_nextn_predict_layers`` the model's config.json has."""
    where = "fd_config.model_config"
    heads = _read(model_config, "num_attention_heads", where)
    kv_heads = getattr(model_config, "num_key_value_heads", -1)
    backend = os.environ.get("FD_ATTENTION_BACKEND", "")
    return ModelConfig(
        name=str(getattr(model_config, "_name_or_path", None) or os.path.basename(str(_read(model_config, "model", where)).rstrip("/"))),
        num_hidden_layers=_read(model_config, "num_hidden_layers", where),
        num_attention_heads=heads,
        num_key_value_heads=heads if kv_heads in (None, -1) else kv_heads,  # FastDeploy's -1: not in config.json
        head_dim=_read(model_config, "head_dim", where),
        kv_lora_rank=getattr(model_config, "kv_lora_rank", None),
        qk_rope_head_dim=getattr(model_config, "qk_rope_head_dim", None),
        index_head_dim=getattr(model_config, "index_head_dim", None),
        num_nextn_predict_layers=draft_layers or getattr(model_config, "num_nextn_predict_layers", 0) or 0,
        use_mtp=draft_layers > 0,
        attention=_ATTENTION_BACKENDS.get(backend),
        dtype=str(getattr(model_config, "dtype", "bfloat16")),
    )


def _cache(fd_config: object, rule: str | None) -> CacheConfig:
    cache_config = _read(fd_config, "cache_config")
    where = "fd_config.cache_config"
    quant_config = getattr(fd_config, "quant_config", None)
    quant = getattr(quant_config, "kv_cache_quant_type", None) if quant_config is not None else None
    speculative = getattr(fd_config, "speculative_config", None)
    return CacheConfig(
        block_size=_read(cache_config, "block_size", where),
        memory_utilization=_read(cache_config, "gpu_memory_utilization", where),
        num_cpu_blocks=getattr(cache_config, "num_cpu_blocks", 0) or 0,
        kvcache_storage_backend=getattr(cache_config, "kvcache_storage_backend", None),
        num_gpu_blocks_override=getattr(cache_config, "num_gpu_blocks_override", None),
        num_gpu_block_expand_ratio=float(getattr(speculative, "num_gpu_block_expand_ratio", 1) or 1),
        rule=rule,
        **cache_settings_from_fastdeploy(
            kv_cache_quant_type=quant, cache_dtype=str(getattr(_read(fd_config, "model_config"), "dtype", "bfloat16"))
        ),
    )


def _physical_device(parallel_config: object, local_rank: int) -> int:
    """The physical id FastDeploy names this rank's tensors with: ``device_ids[local_rank]`` (``gpu_worker.py``),
    ``device_ids`` being its ``CUDA_VISIBLE_DEVICES`` (``FDConfig.__init__``)."""
    text = str(_read(parallel_config, "device_ids", "fd_config.parallel_config"))
    fix = "set CUDA_VISIBLE_DEVICES (FastDeploy copies it there) to this node's devices, by index, one per local rank"
    return listed_device("fd_config.parallel_config.device_ids", text, local_rank, (fix, fix))


def _local_port(parallel_config: object) -> int:
    """This data-parallel rank's ``engine_worker_queue_port``, which suffixes FastDeploy's cache signals."""
    port = getattr(parallel_config, "local_engine_worker_queue_port", None)
    if port is None:
        ports = _read(parallel_config, "engine_worker_queue_port", "fd_config.parallel_config")
        index = getattr(parallel_config, "local_data_parallel_id", 0) or 0
        port = ports[index] if isinstance(ports, (list, tuple)) else ports
    return int(port)


def _shape(text: object, flag: str) -> tuple[int, ...]:
    """A ``--key_cache_shape`` as FastDeploy writes it: ``blocks,heads,block_size,head_dim``."""
    parts = str(text).split(",") if text else []
    if len(parts) != 4 or not all(part.strip().isdigit() and int(part) > 0 for part in parts):
        raise ConfigError(
            flag, text, "four positive integers: blocks,kv_heads,block_size,head_dim",
            "pass the command line FastDeploy's launch_cache_manager gives",
        )  # fmt: skip
    return tuple(int(part) for part in parts)


def _read(source: object, name: str, where: str = "fd_config") -> Any:
    """``source.name``, or a ConfigError naming ``where.name``."""
    value = getattr(source, name, None)
    if value is None:
        raise ConfigError(
            f"{where}.{name}", None, "the value FastDeploy's config holds there",
            "pass FastDeploy's FDConfig (or an object with its attribute names) as it is",
        )  # fmt: skip
    return value


def _optional_text(value: object) -> str | None:
    return None if value is None else str(value)


__all__ = ["FastDeploySettings", "from_cache_manager_args", "from_fd_config"]
