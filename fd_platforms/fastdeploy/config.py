"""FastDeploy's configuration, taken as it is: from its ``FDConfig``, or from a cache process's command line.

A FastDeploy runner holds an ``FDConfig`` (``fastdeploy/config.py``): ``model_config``, ``cache_config``,
``parallel_config``, ``scheduler_config``, ``speculative_config`` and ``quant_config``. :func:`from_fd_config`
reads it duck-typed (nothing of FastDeploy is imported) into :class:`FastDeploySettings`: our model, cache and
parallel records, the rule's inputs and FastDeploy's protocol settings, so a runner restates nothing.
FastDeploy's cache transfer manager and cache messager get no ``FDConfig``, only a command line
(``cache_manager/prefix_cache_manager.py`` ``launch_cache_manager``); :func:`from_cache_manager_args` builds the
same settings from it and the model's ``config.json``.

Every value is FastDeploy's own: its vocabulary (``kv_cache_quant_type``, ``cache_dtype``) goes through
:mod:`.config.vocabulary`; ``num_cpu_blocks`` is the one FastDeploy's ``CacheConfig`` computed (what its transfer
manager allocates); the device id that names the tensors is the physical one from ``parallel_config.device_ids`` (its
``CUDA_VISIBLE_DEVICES``), the tensors live on the local device, as ``gpu_worker.py`` allocates them. FastDeploy's
``local_rank`` is the global rank (``worker_process.py`` ``init_distributed_environment``: ``fleet.worker_index()``);
on several nodes its device is ``local_rank % max_chips_per_node`` and its name's id ``device_ids`` at that index
(``gpu_worker.py``/``xpu_worker.py``/``metax_worker.py`` ``init_device``), ``max_chips_per_node`` as its ``FDConfig``
holds it (``config.py`` ``FDConfig.__init__``: 16 on Iluvatar, else 8).

Every value is checked here, each kind by one function of :mod:`fd_platforms.fastdeploy.values`, and the settings
returned as the engine calls check theirs (the layout, the stated shapes, the rule's inputs, the suffixes), so no engine
call refuses later what could be seen here: a :class:`~fd_platforms.contract.errors.ConfigError` names FastDeploy's
attribute (``fd_config.parallel_config.tensor_parallel_size``) or flag (``--mp_num``), never our field. A config
that cannot be read fully is refused naming what it lacks, never filled in: the ENGINE process's FDConfig
(``engine/args_utils.py`` ``EngineArgs.create_engine_config``) has no ``engine_pid``, no ``quant_config`` and data-
parallel rank 0's view; a runner's is the WORKER's (``worker/worker_process.py`` ``initialize_fd_config``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from ..contract.errors import ConfigError
from ..contract.integers import INT32_MAX, MAX_COUNT, check_int, is_int
from ..contract.types import CacheRoleShape
from ..engine.request import CacheRequest
from ..rules.config.files import read_config_file
from ..rules.config.limits import MAX_EXPAND_RATIO, MAX_LAYERS, MAX_RANKS, MAX_WIDTH, MODEL_DTYPES
from ..rules.config.model import ModelConfig, load_model_config
from ..rules.config.settings import CacheConfig, ParallelConfig
from ..rules.config.vocabulary import CACHE_DTYPE_WORDS, QUANT_WORDS, cache_settings_from_fastdeploy, fastdeploy_word
from ..rules.decision import (
    DEFAULT_RULE,
    SPLITWISE_ROLES,
    STORAGE_BACKENDS,
    DecisionInputs,
    check_pin,
    decisions_by_version,
)
from ..rules.layout import CacheLayout, build_layout
from ..rules.roles import TRANSFER_MANAGER, cache_roles
from ..rules.shapes import engine_shaped, shape_request
from .platforms import FASTDEPLOY_PLATFORMS
from .protocol import FASTDEPLOY
from .releases import line_on
from .rule import FASTDEPLOYS
from .values import device_ids, index, integer, one_of, optional_one_of, port, ports, positive, shape, suffix, text

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
        return build_layout(
            self.model, self.cache, self.parallel, device_id=self.device_id, local_device=self.local_device
        )

    def cache_request(
        self, layout: CacheLayout | None = None, num_blocks: int | None = None, *, profile: bool = False, **fields: Any
    ) -> CacheRequest:
        """The rank's :class:`~fd_platforms.engine.CacheRequest` beside FastDeploy, for ``initialize_kv_cache`` and
        ``manage_kv_cache`` alike: ``layout`` (default :meth:`layout`, the whole; a runner passes its ``main()``, a
        cache process the main part with ``draft=``; the proposer's is :class:`~.proposer.ProposerSettings`') and
        ``num_blocks`` (default: a cache process's own, its command line's) with the rule's inputs, FastDeploy's
        protocol, its suffix as the instance, the pin and ``tp`` (so every per-rank signal is checked to be
        FastDeploy's array of that many words), and the tensor specs a cache process's command line states;
        ``fields`` any other field of the record (``creator_pid``, ``timeout``, ``tensor_specs``, ``draft``,
        ``host_cache``)."""
        blocks = self.num_blocks if num_blocks is None else num_blocks
        if blocks is None:
            raise ConfigError(
                "num_blocks",
                None,
                "the blocks the ranks agreed on (a runner's plan; a cache process's --key_cache_shape)",
                "pass num_blocks=, the agreed plan's num_blocks",
            )
        given = {
            "profile": profile,
            "num_cpu_blocks": self.cache.num_cpu_blocks,
            "storage_backend": self.cache.kvcache_storage_backend,
            "splitwise_role": self.splitwise_role,
            "protocol": FASTDEPLOY,
            "instance": self.suffix,
            "rule": self.rule,
            "tp": self.parallel.tensor_parallel_size,
            "tensor_specs": self.tensor_specs,
            **fields,
        }
        return CacheRequest(layout=self.layout() if layout is None else layout, num_blocks=blocks, **given)


_FD = "fd_config"
_MODEL, _CACHE, _PARALLEL = f"{_FD}.model_config", f"{_FD}.cache_config", f"{_FD}.parallel_config"
_SPEC = f"{_FD}.speculative_config"
FD_FIX = "pass the FDConfig FastDeploy's worker process builds (worker_process.py initialize_fd_config) as it is"
CLI_FIX = "pass the command line FastDeploy's launch_cache_manager gives (cache_transfer_manager.py parse_args)"
_DEVICES_FIX = (
    "set CUDA_VISIBLE_DEVICES (FastDeploy copies it there) to this node's devices, by index, one per local rank"
)
_ENGINE_PROCESS = (
    "pass the FDConfig of FastDeploy's worker process (worker_process.py initialize_fd_config: it holds --engine_pid, "
    "the quantization and its data-parallel rank), not the engine process's (args_utils.py "
    "EngineArgs.create_engine_config builds none of them)"
)
_LATENT_KEYS = ("kv_lora_rank", "qk_rope_head_dim", "index_head_dim")
"""An MLA or DSA model's config.json keys (FastDeploy's ModelConfig holds them where the file has them)."""
SPEC_METHODS = ("naive", "mtp", "ngram", "suffix")
"""FastDeploy's speculative methods (``spec_decode/types.py`` ``SpecMethod``, matched case-insensitively)."""
CACHE_DTYPE_FLAG = ("uint8", "bfloat16", "block_wise_fp8")
"""``--cache_dtype`` as FastDeploy's cache processes allow it (``parse_args`` choices: its ``CacheConfig`` has turned
every 4- and 8-bit word into ``uint8`` before ``launch_cache_manager`` passes it)."""
DEFAULT_DTYPES = ("float16", "bfloat16", "uint8", "int8")
"""``--default_dtype`` as FastDeploy's cache processes allow it (``parse_args``; ``int8`` the messager's)."""
_ABSENT = object()
_T = TypeVar("_T")

_FD_NAMES = {
    **{
        name: f"{_MODEL}.{name}"
        for name in (
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "kv_lora_rank",
            "qk_rope_head_dim",
            "index_head_dim",
            "num_nextn_predict_layers",
            "dtype",
        )
    },
    "attention": "FD_ATTENTION_BACKEND",
    "block_size": f"{_CACHE}.block_size",
    "memory_utilization": f"{_CACHE}.gpu_memory_utilization",
    "num_cpu_blocks": f"{_CACHE}.num_cpu_blocks",
    "kvcache_storage_backend": f"{_CACHE}.kvcache_storage_backend",
    "num_gpu_blocks_override": f"{_CACHE}.num_gpu_blocks_override",
    "num_gpu_block_expand_ratio": f"{_SPEC}.num_gpu_block_expand_ratio",
    "kv_cache_quant_type": f"{_FD}.quant_config.kv_cache_quant_type",
    "cache_dtype": f"{_MODEL}.dtype",
    "tensor_parallel_size": f"{_PARALLEL}.tensor_parallel_size",
    "device_id": f"{_PARALLEL}.device_ids",
}
"""Our record fields and the FastDeploy attributes they are read from, for an error a record raises."""

_QUANT_KEY = "quantization_config.kv_cache_quant_type"
"""Where a cache process's quantization is read: the model's config.json, its ``quantization_config``."""
_CLI_NAMES = {
    "tensor_parallel_size": "--mp_num",
    "local_rank": "--rank",
    "device_id": "--device_id",
    "local_device": "--device_id",
    "block_size": "--key_cache_shape",
    "num_cpu_blocks": "--num_cpu_blocks",
    "kvcache_storage_backend": "--kvcache_storage_backend",
    "cache_dtype": "--cache_dtype",
    "num_gpu_block_expand_ratio": "--speculative_config.num_gpu_block_expand_ratio",
}
"""Our record fields and the cache process's flags they are read from."""

_SPEC_FLAGS = {
    "key": "--key_cache_shape",
    "value": "--value_cache_shape",
    "key_scale": "--default_dtype",
    "value_scale": "--default_dtype",
}


def from_fd_config(
    fd_config: object,
    *,
    local_rank: int,
    rule: str | None = None,
    fastdeploy: str | None = None,
    platform: str | None = None,
) -> FastDeploySettings:
    """The settings of the runner of ``local_rank`` (FastDeploy's ``local_rank``, as ``gpu_worker.py`` has it: the
    global rank, whose device on its node is ``local_rank % fd_config.max_chips_per_node``), read from the FDConfig
    of FastDeploy's worker process; ``rule`` pins the create-or-attach rule (FastDeploy's
    release). Or ``fastdeploy`` names the FastDeploy snapshot beside it (:data:`~.releases.SNAPSHOTS`) and
    ``platform`` our platform's name (``our_platform_name(current_platform)``): the rule that snapshot's runner
    follows there is pinned, and a snapshot that would allocate the rank's cache twice, leave it with no creator or
    free it under an attacher on this config is refused, named (:func:`~.releases.line_on`). Every attribute is checked
    as FastDeploy holds it, and the settings as the engine calls check them: a ConfigError names the attribute
    (``fd_config.parallel_config.tensor_parallel_size``). The engine process's FDConfig, which lacks what the worker's
    holds, is refused."""
    check_int("local_rank", local_rank, 0, INT32_MAX, fix="pass the runner's local_rank")
    check_pin(rule)
    _check_line(fastdeploy, platform, rule)
    parallel_config = _read(fd_config, "parallel_config")
    block_count_suffix = _engine_pid(parallel_config)
    tp = _checked(integer, parallel_config, _PARALLEL, "tensor_parallel_size", 1, MAX_RANKS)
    local_device = local_rank % _checked(integer, fd_config, _FD, "max_chips_per_node", 1, MAX_RANKS)
    device_id = _physical_device(parallel_config, local_device, local_rank)
    suffix = _local_port(parallel_config)
    scheduler_config = _read(fd_config, "scheduler_config")
    role = _checked(one_of, scheduler_config, f"{_FD}.scheduler_config", "splitwise_role", SPLITWISE_ROLES)
    spec = _speculative_object(fd_config)
    _not_the_proposers(spec)
    draft_layers, ratio = _speculative(spec, _SPEC, FD_FIX, defaults=None)
    model_config = _read(fd_config, "model_config")
    with _named(_FD_NAMES):
        model = _model(model_config, draft_layers=draft_layers)
        cache = _cache(fd_config, rule, ratio, model.dtype)
        parallel = ParallelConfig(tensor_parallel_size=tp, local_rank=local_rank % tp)
        settings = FastDeploySettings(
            model=model,
            cache=cache,
            parallel=parallel,
            splitwise_role=role,
            device_id=device_id,
            local_device=local_device,
            suffix=str(suffix),
            block_count_suffix=block_count_suffix,
            rule=rule,
        )
        settings.layout()  # the tensor-parallel split, as every engine call's layout has it
    if fastdeploy is not None:
        inputs = DecisionInputs(False, cache.num_cpu_blocks, cache.kvcache_storage_backend, role)
        pinned = line_on(fastdeploy, platform or "", inputs).worker_rule
        settings = replace(settings, rule=pinned, cache=replace(cache, rule=pinned))
    return settings


def _check_line(fastdeploy: object, platform: object, rule: object) -> None:
    """``fastdeploy`` (a snapshot's name) with ``platform`` (our platform's name) and no ``rule`` beside them; a
    ConfigError naming the argument otherwise."""
    if fastdeploy is None:
        if platform is not None:
            raise ConfigError(
                "platform", platform, "None without fastdeploy=", "pass fastdeploy= beside it, or drop it"
            )
        return
    if not isinstance(fastdeploy, str):
        raise ConfigError("fastdeploy", fastdeploy, "a snapshot's name, e.g. '2.6@8045'", "pass a str")
    if rule is not None:
        raise ConfigError(
            "rule", rule, "None beside fastdeploy=: the snapshot decides the rule", "pass one of rule= or fastdeploy="
        )
    if platform not in FASTDEPLOY_PLATFORMS.values():
        raise ConfigError(
            "platform",
            platform,
            f"our platform's name, one of {', '.join(FASTDEPLOY_PLATFORMS.values())}",
            "pass our_platform_name(current_platform) (fastdeploy.platforms.current_platform)",
        )


def from_cache_manager_args(
    args: object, *, model_path: str | None = None, rule: str | None = None
) -> FastDeploySettings:
    """The settings of FastDeploy's cache transfer manager or cache messager for one rank, from its parsed command
    line (``--rank``, ``--device_id``, ``--mp_num``, ``--cache_dtype``, ``--key_cache_shape``,
    ``--engine_worker_queue_port``, ...; ``cache_transfer_manager.py`` and ``cache_messager.py`` ``parse_args``) and
    the model's ``config.json`` (``model_path``, default ``args.model_path``, which only the transfer manager gets).
    Its ``--device_id`` is the physical id and it sees every device, so the tensors live on that device too.
    Its ``--cache_dtype`` says ``uint8`` for every 4- and 8-bit cache (FastDeploy's ``CacheConfig``), hiding which
    one: the quantization is read where FastDeploy reads it, the model's ``config.json`` ``quantization_config``
    (``kv_cache_quant_type``). An engine quantized through its ``--quantization`` states none there (the transfer
    manager gets no such flag), and then the command line's own ``--key_cache_shape`` says what the tensors hold: a
    key as wide as a ``uint8`` cache's is one byte a value (every 8-bit quantization alike: the cache is
    FastDeploy's ``uint8`` tensors of those shapes), one half as wide is ``int4_zp``'s two values a byte
    (``_width_quant()``); FastDeploy passes nothing more. A flag only the transfer manager has
    (``--num_cpu_blocks``, ``--kvcache_storage_backend``) is off for the messager. Every flag is checked as
    FastDeploy's ``parse_args`` gives it, and the settings (the stated shapes too) as the engine calls check them:
    a ConfigError names the flag."""
    check_pin(rule)
    path = _model_path(args, model_path)
    with _named({"path": "model_path" if model_path is not None else "--model_path"}):
        model = load_model_config(path)
    draft_layers, ratio = _speculative(
        _speculative_dict(args),
        "--speculative_config",
        CLI_FIX,
        defaults={"method": None, "num_gpu_block_expand_ratio": 1.0},
    )
    if draft_layers:  # as the runner's: the transfer manager's num_extra_layers
        model = replace(model, num_nextn_predict_layers=draft_layers, use_mtp=True)
    _check_num_layers(args, model)
    key_shape = shape("--key_cache_shape", _flag(args, "key_cache_shape"), CLI_FIX)
    cache_dtype = one_of("--cache_dtype", _flag(args, "cache_dtype"), CACHE_DTYPE_FLAG, CLI_FIX)
    quant, config_json = _model_quant_type(path, cache_dtype)
    if quant is None and cache_dtype == "uint8":
        quant = _width_quant(model, key_shape)
    tp = integer("--mp_num", _flag(args, "mp_num"), 1, MAX_RANKS, CLI_FIX)
    with _named({**_CLI_NAMES, "kv_cache_quant_type": _QUANT_KEY}, source=config_json):
        cache = CacheConfig(
            block_size=key_shape[2],
            num_cpu_blocks=_num_cpu_blocks(args),
            kvcache_storage_backend=_backend(args),
            num_gpu_block_expand_ratio=ratio,
            rule=rule,
            **cache_settings_from_fastdeploy(
                kv_cache_quant_type=quant,  # the flag was made of it: as the runner's
                cache_dtype=cache_dtype if quant is None else model.dtype,
            ),
        )
        device = integer("--device_id", _flag(args, "device_id"), 0, INT32_MAX, CLI_FIX)
        settings = FastDeploySettings(
            model=model,
            cache=cache,
            parallel=ParallelConfig(
                tensor_parallel_size=tp,
                local_rank=integer("--rank", _flag(args, "rank"), 0, tp - 1, CLI_FIX, note=f"--mp_num={tp}"),
            ),
            splitwise_role=one_of("--splitwise_role", _flag(args, "splitwise_role"), SPLITWISE_ROLES, CLI_FIX),
            device_id=device,
            local_device=device,
            suffix=str(port("--engine_worker_queue_port", _flag(args, "engine_worker_queue_port"), CLI_FIX)),
            block_count_suffix=_ipc_suffix(args),
            rule=rule,
            num_blocks=key_shape[0],
            tensor_specs=_command_line_specs(args, key_shape, cache_dtype),
        )
        _check_stated_shapes(args, settings)
    _check_create_flag(args, settings)
    return settings


def _check_create_flag(args: object, settings: FastDeploySettings) -> None:
    """``--create_cache_tensor`` (FastDeploy's launch says its transfer manager creates: a storage backend in a mixed
    instance before PR #8046) beside a rule under which the worker creates there (``2026-06``): the rank's cache would
    be allocated twice, a ConfigError naming the flag. Without the flag nothing is said (FastDeploy's launches before
    PR #7471 had none), and a rule nobody pinned where FastDeploy's versions disagree is refused by the request."""
    if not _flag(args, "create_cache_tensor", optional=True) or settings.splitwise_role != "mixed":
        return
    cache = settings.cache
    inputs = DecisionInputs(False, cache.num_cpu_blocks, cache.kvcache_storage_backend, "mixed")
    if settings.rule is None and decisions_by_version(inputs, *FASTDEPLOYS) is not None:
        return
    pinned = replace(inputs, rule=settings.rule or DEFAULT_RULE)
    if cache_roles(pinned).creator != TRANSFER_MANAGER:
        raise ConfigError(
            "--create_cache_tensor",
            True,
            f"absent under rule {pinned.rule}, where {cache_roles(pinned)} (the cache would be allocated twice)",
            "pin the rule of the FastDeploy that launched this process: 2026-04 for one that passes "
            "--create_cache_tensor with a storage backend (before PR #8046)",
        )


def _model_quant_type(path: str, cache_dtype: str) -> tuple[object, str]:
    """``(kv_cache_quant_type, config.json path)``: the quantization the model's ``config.json`` states
    (``quantization_config.kv_cache_quant_type``, which FastDeploy's ``CacheConfig.__init__`` and
    ``parse_quant_config`` read before its engine's ``--quantization``), checked against ``--cache_dtype``, which
    FastDeploy's ``CacheConfig`` made of it (``uint8`` for a 4- or 8-bit word, else the word). Where config.json
    states none, ``--cache_dtype`` speaks for itself (``uint8``: the stated key width decides, ``_width_quant()``)."""
    folder = Path(path)
    file = folder / "config.json" if folder.is_dir() else folder
    raw = json.loads(read_config_file(file, "model_path", "a readable config.json"))  # load_model_config read it
    stated = raw.get("quantization_config") if isinstance(raw, dict) else None
    quant = stated.get("kv_cache_quant_type") if isinstance(stated, Mapping) else None
    if quant is None:
        return None, str(file)
    with _named({_QUANT_KEY: _QUANT_KEY}, source=str(file)):
        fastdeploy_word(_QUANT_KEY, quant, QUANT_WORDS)
    word = quant.lower()
    made = "uint8" if any(kind in word for kind in ("int4", "int8", "float4", "float8")) else word
    if made != cache_dtype:
        raise ConfigError(
            "--cache_dtype",
            cache_dtype,
            f"{made}, what FastDeploy's CacheConfig makes of the model's {_QUANT_KEY}={quant!r}",
            f"pass the model_path of the model the engine serves; {CLI_FIX}",
        )
    return quant, str(file)


def _width_quant(model: ModelConfig, key_shape: tuple[int, ...]) -> str | None:
    """The quantization a ``uint8`` cache's stated key width says, where the model's config.json states none: None
    (a byte a value, as every 8-bit quantization stores it) where the key is as wide as a ``uint8`` layout's, else
    ``int4_zp`` where it is half as wide (two values a byte); None otherwise, for the stated shapes' own check to
    refuse naming ``--key_cache_shape``."""
    width = build_layout(model, CacheConfig(cache_dtype="uint8"), ParallelConfig()).roles[0].block_shape[-1]
    return "int4_zp" if width != key_shape[-1] and width == 2 * key_shape[-1] else None


def _command_line_specs(args: object, key_shape: tuple[int, ...], cache_dtype: str) -> tuple[CacheRoleShape, ...]:
    """One layer's tensors as a cache process's command line states them: key ``--key_cache_shape`` and, unless
    MLA leaves it empty, value ``--value_cache_shape``, in ``uint8`` for a quantized cache (``--cache_dtype`` uint8
    or block_wise_fp8) else the cache dtype; with block_wise_fp8 the key and value scales ``[blocks, heads,
    block_size]`` in ``--default_dtype`` (Paddle's default dtype, which its ``CacheTransferManager.__init__``
    sets and sizes the scales in)."""
    value_text = _flag(args, "value_cache_shape", optional=True)
    dtype = "uint8" if cache_dtype in ("uint8", "block_wise_fp8") else cache_dtype
    specs = [CacheRoleShape("key", key_shape, dtype)]
    if value_text:
        specs.append(CacheRoleShape("value", shape("--value_cache_shape", value_text, CLI_FIX), dtype))
    if cache_dtype == "block_wise_fp8":
        scale = (key_shape[0], key_shape[1], key_shape[2])
        default = one_of("--default_dtype", _flag(args, "default_dtype"), DEFAULT_DTYPES, CLI_FIX)
        specs += [CacheRoleShape(role, scale, default) for role in ("key_scale", "value_scale")][: len(specs)]
    return tuple(specs)


def _check_stated_shapes(args: object, settings: FastDeploySettings) -> None:
    """The shapes the command line states, checked as the engine calls check ``tensor_specs`` against the layout
    (:func:`~fd_platforms.rules.shapes.engine_shaped`), the error naming the flag of the first tensor that differs."""
    layout, specs, blocks = settings.layout(), settings.tensor_specs or (), settings.num_blocks or 0
    layout.check_mtp_blocks(blocks)  # the ratio's own error (named by its flag), before the shapes it makes
    try:
        engine_shaped(layout, specs, blocks)
    except ConfigError as error:
        flag = _SPEC_FLAGS[_first_differing_role(specs, shape_request(layout, blocks).default)]
        raise ConfigError(flag, _flag(args, flag[2:], optional=True), error.allowed, error.fix) from None


def _first_differing_role(stated: tuple[CacheRoleShape, ...], expected: tuple[CacheRoleShape, ...]) -> str:
    """The role of the first stated tensor that is not the expected one (its role, blocks or bytes), or of the
    first tensor one list has and the other lacks."""
    for got, core in zip(stated, expected, strict=False):  # the shorter list's tensors, then the rest
        if got.role != core.role or got.shape[0] != core.shape[0] or got.nbytes != core.nbytes:
            return got.role
    longer = stated if len(stated) > len(expected) else expected
    return longer[min(len(stated), len(expected))].role if len(stated) != len(expected) else "key"


def _model(model_config: object, *, draft_layers: int) -> ModelConfig:
    """FastDeploy's ``ModelConfig`` holds every key of the model's ``config.json`` as an attribute. With MTP the
    cache holds ``draft_layers`` more: FastDeploy's ``SpeculativeConfig.num_extra_cache_layer`` (1 for ``mtp``),
    what its transfer manager allocates after the main layers (``cache_transfer_manager.py``
    ``num_extra_layers``), whatever ``num_nextn_predict_layers`` the model's config.json has."""
    heads = _checked(integer, model_config, _MODEL, "num_attention_heads", 1, MAX_WIDTH)
    latent = {name: _optional_int(model_config, name, 1, MAX_WIDTH) for name in _LATENT_KEYS}
    backend = os.environ.get("FD_ATTENTION_BACKEND", "")
    needed = "FD_ATTENTION_BACKEND" if backend in _ATTENTION_BACKENDS else f"{_MODEL}.{_first_missing(latent)}"
    with _named({"attention": needed}):  # the backend asks for a latent cache, or the model's keys half state one
        return ModelConfig(
            name=_model_name(model_config),
            num_hidden_layers=_checked(integer, model_config, _MODEL, "num_hidden_layers", 1, MAX_LAYERS),
            num_attention_heads=heads,
            num_key_value_heads=_kv_heads(model_config, heads),
            head_dim=_checked(integer, model_config, _MODEL, "head_dim", 1, MAX_WIDTH),
            **latent,
            num_nextn_predict_layers=draft_layers
            or _optional_int(model_config, "num_nextn_predict_layers", 0, MAX_LAYERS)
            or 0,
            use_mtp=draft_layers > 0,
            attention=_ATTENTION_BACKENDS.get(backend),
            dtype=_checked(one_of, model_config, _MODEL, "dtype", MODEL_DTYPES),
        )


def _kv_heads(model_config: object, heads: int) -> int:
    """``num_key_value_heads``: FastDeploy's -1 (or None) where config.json lacks it, which is MHA: ``heads``."""
    kv_heads = _read(model_config, "num_key_value_heads", _MODEL, optional=True)
    if kv_heads is None or (is_int(kv_heads) and kv_heads == -1):
        return heads
    return integer(f"{_MODEL}.num_key_value_heads", kv_heads, 1, MAX_WIDTH, FD_FIX)


def _first_missing(latent: dict[str, int | None]) -> str:
    """The first of the latent keys (MLA's two, then DSA's) a model lacks."""
    return next((name for name, value in latent.items() if value is None), "kv_lora_rank")


def _model_name(model_config: object) -> str:
    """The model's ``_name_or_path`` (where its config.json has one), else its folder's name."""
    folder = _checked(text, model_config, _MODEL, "model")
    name = getattr(model_config, "_name_or_path", None)
    return os.path.basename(folder.rstrip("/")) if name is None else text(f"{_MODEL}._name_or_path", name, FD_FIX)


def _optional_int(source: object, name: str, minimum: int, maximum: int) -> int | None:
    """A key the model's config.json may lack (None), else an integer."""
    value = getattr(source, name, None)
    return None if value is None else integer(f"{_MODEL}.{name}", value, minimum, maximum, FD_FIX)


def _cache(fd_config: object, rule: str | None, ratio: float, model_dtype: str) -> CacheConfig:
    cache_config = _read(fd_config, "cache_config")
    override = _read(cache_config, "num_gpu_blocks_override", _CACHE, optional=True)
    return CacheConfig(
        block_size=_checked(integer, cache_config, _CACHE, "block_size", 1, MAX_WIDTH),
        memory_utilization=_checked(positive, cache_config, _CACHE, "gpu_memory_utilization", 1.0),
        num_cpu_blocks=_checked(integer, cache_config, _CACHE, "num_cpu_blocks", 0, MAX_COUNT),
        kvcache_storage_backend=_checked(
            optional_one_of, cache_config, _CACHE, "kvcache_storage_backend", STORAGE_BACKENDS, optional=True
        ),
        num_gpu_blocks_override=None
        if override is None
        else integer(f"{_CACHE}.num_gpu_blocks_override", override, 1, MAX_COUNT, FD_FIX),
        num_gpu_block_expand_ratio=ratio,
        rule=rule,
        **cache_settings_from_fastdeploy(
            kv_cache_quant_type=_kv_cache_quant_type(fd_config, cache_config), cache_dtype=model_dtype
        ),
    )


def _kv_cache_quant_type(fd_config: object, cache_config: object) -> object:
    """``quant_config.kv_cache_quant_type`` (None: the cache is not quantized; FastDeploy's runner reads it where the
    quant config has it, ``gpu_model_runner.py`` ``initialize_kv_cache``). Where ``cache_config.cache_dtype`` says
    the cache is quantized (FastDeploy's ``CacheConfig`` turns a 4- or 8-bit ``kv_cache_quant_type`` into ``uint8``)
    but no quantization is stated, which one decides the tensors cannot be read: a ConfigError (the engine process's
    FDConfig has no ``quant_config``)."""
    quant_config = _read(fd_config, "quant_config", _FD, optional=True)
    quant = None if quant_config is None else getattr(quant_config, "kv_cache_quant_type", None)
    stated = _read(cache_config, "cache_dtype", _CACHE)
    if quant is None and fastdeploy_word(f"{_CACHE}.cache_dtype", stated, CACHE_DTYPE_WORDS).tensor_dtype == "uint8":
        raise ConfigError(
            f"{_FD}.quant_config",
            quant_config,
            f"a quant config with kv_cache_quant_type: cache_config.cache_dtype={stated!r} says the cache is "
            "quantized, and the quantization (int8, float8_e4m3fn, int4_zp, block_wise_fp8, ...) decides its tensors",
            _ENGINE_PROCESS,
        )
    return quant


def _speculative_object(fd_config: object) -> object:
    """``fd_config.speculative_config``: FastDeploy's ``SpeculativeConfig`` object (``FDConfig`` holds one, built from
    the ``--speculative_config`` dict: ``worker_process.py`` ``initialize_fd_config``), read by attribute."""
    spec = _read(fd_config, "speculative_config")
    if isinstance(spec, (str, bytes, int, float, Mapping, list, tuple, set)):
        raise ConfigError(
            _SPEC,
            spec,
            "FastDeploy's SpeculativeConfig object, whose attributes (method, num_extra_cache_layer, "
            "num_gpu_block_expand_ratio) its runner reads",
            "pass the FDConfig's SpeculativeConfig(args) as it is",
        )
    return spec


def _not_the_proposers(spec: object) -> None:
    """The MTP proposer's FDConfig is a deep copy of its runner's in which ``_update_mtp_config`` sets
    ``speculative_config.model_type = "mtp"`` and ``num_hidden_layers = 1`` (``spec_decode/mtp.py``): read as a
    model it is a one-layer one, so it is refused, naming the call that reads the runner's instead."""
    if getattr(spec, "model_type", "main") == "mtp":
        raise ConfigError(
            f"{_SPEC}.model_type",
            "mtp",
            "main: this is the MTP proposer's copy of its runner's FDConfig (spec_decode/base.py deepcopy; mtp.py "
            "_update_mtp_config sets num_hidden_layers = 1), which plans a one-layer model",
            "read the runner's FDConfig (the fd_config the proposer is given) with from_fd_config, and take the "
            "proposer's settings from it with proposer_settings(runner_settings, proposer.fd_config)",
        )


def _speculative_dict(args: object) -> Mapping[str, object]:
    """``--speculative_config`` as ``parse_args`` gives it: the dict ``json.loads`` makes of the flag's JSON. Its text
    is refused, not parsed: FastDeploy's ``SpeculativeConfig`` takes the dict alone (``args.items()``), so a cache
    process given the text would fail there; a Namespace holding it was not built by ``parse_args``."""
    spec = _flag(args, "speculative_config")
    if not isinstance(spec, Mapping):
        raise ConfigError(
            "--speculative_config",
            spec,
            "the dict parse_args makes of the flag's JSON (type=json.loads), e.g. {'method': 'mtp'}",
            "parse the flag's JSON with json.loads, as cache_transfer_manager.py parse_args does",
        )
    return spec


def _speculative(spec: object, field: str, fix: str, *, defaults: dict[str, object] | None) -> tuple[int, float]:
    """``(draft layers, num_gpu_block_expand_ratio)`` from a speculative config: FastDeploy's ``SpeculativeConfig``
    object (``defaults`` None: every attribute it has must be there) or the command line's dict (keys it lacks take
    ``defaults``, FastDeploy's ``SpeculativeConfig._DEFAULTS``). Runner and cache process read it alike: the draft
    layers are what FastDeploy's ``SpeculativeConfig`` computes from ``method`` (1 for ``mtp``, else 0;
    ``config.py`` ``_convert_and_validate``), which its transfer manager and messager allocate whatever
    ``num_extra_cache_layer`` they are given; a config stating another count is refused, never followed by one
    side alone."""

    def given(name: str) -> object:
        value = spec.get(name, _ABSENT) if isinstance(spec, Mapping) else getattr(spec, name, _ABSENT)
        if value is _ABSENT and defaults is None:
            raise ConfigError(f"{field}.{name}", None, "the value FastDeploy's SpeculativeConfig holds there", fix)
        return defaults.get(name, _ABSENT) if value is _ABSENT and defaults is not None else value

    raw = given("method")
    method = optional_one_of(f"{field}.method", raw.lower() if isinstance(raw, str) else raw, SPEC_METHODS, fix)
    layers = 1 if method == "mtp" else 0
    stated = given("num_extra_cache_layer")
    if stated is not _ABSENT and not (is_int(stated) and stated == layers):
        raise ConfigError(
            f"{field}.num_extra_cache_layer",
            stated,
            f"{layers} with method {method!r}: FastDeploy's SpeculativeConfig computes it (1 for mtp, else 0) and its "
            "cache transfer manager allocates that many draft layers",
            f"leave num_extra_cache_layer as FastDeploy's SpeculativeConfig sets it; {fix}",
        )
    ratio = positive(f"{field}.num_gpu_block_expand_ratio", given("num_gpu_block_expand_ratio"), MAX_EXPAND_RATIO, fix)
    return layers, ratio


def _engine_pid(parallel_config: object) -> str:
    """``engine_pid``, the suffix of FastDeploy's ``get_profile_block_num`` signal: the worker's FDConfig holds what
    its engine passes (``--engine_pid``, ``engine.py`` ``_start_worker_service``); the engine's holds None."""
    pid = _read(parallel_config, "engine_pid", _PARALLEL, optional=True)
    if pid is None:
        raise ConfigError(
            f"{_PARALLEL}.engine_pid", None, "the --engine_pid the worker's FDConfig holds", _ENGINE_PROCESS
        )
    return str(integer(f"{_PARALLEL}.engine_pid", pid, 1, INT32_MAX, FD_FIX))


def _physical_device(parallel_config: object, local_device: int, local_rank: int) -> int:
    """The physical id FastDeploy names this rank's tensors with: ``device_ids[local_rank % max_chips_per_node]``
    (``gpu_worker.py`` ``init_device``; ``local_device`` here), ``device_ids`` being this node's
    ``CUDA_VISIBLE_DEVICES`` (``FDConfig.__init__``)."""
    field = f"{_PARALLEL}.device_ids"
    value = _read(parallel_config, "device_ids", _PARALLEL)
    devices = device_ids(field, value, _DEVICES_FIX)
    if local_device >= len(devices):
        where = (
            f"local rank {local_rank}"
            if local_device == local_rank
            else (
                f"local rank {local_rank} is local device {local_device} of its node (local_rank % max_chips_per_node)"
            )
        )
        raise ConfigError(field, value, f"at least {local_device + 1} device(s): {where} must be listed", _DEVICES_FIX)
    return devices[local_device]


def _local_port(parallel_config: object) -> int:
    """This data-parallel rank's ``engine_worker_queue_port``, which suffixes FastDeploy's cache signals:
    ``engine_worker_queue_port[local_data_parallel_id]``, which ``FDConfig.postprocess_devices_and_ports`` stores as
    ``local_engine_worker_queue_port`` (None where that failed)."""
    listed = _checked(ports, parallel_config, _PARALLEL, "engine_worker_queue_port")
    rank = _checked(index, parallel_config, _PARALLEL, "local_data_parallel_id", listed, "engine_worker_queue_port")
    local = _read(parallel_config, "local_engine_worker_queue_port", _PARALLEL, optional=True)
    if local is not None and port(f"{_PARALLEL}.local_engine_worker_queue_port", local, FD_FIX) != listed[rank]:
        raise ConfigError(
            f"{_PARALLEL}.local_engine_worker_queue_port",
            local,
            f"engine_worker_queue_port[local_data_parallel_id] = {listed[rank]}, as "
            "FDConfig.postprocess_devices_and_ports sets it",
            FD_FIX,
        )
    return listed[rank]


def _model_path(args: object, model_path: object) -> str:
    """The model folder: ``model_path``, else the transfer manager's ``--model_path`` (the messager has none)."""
    if model_path is not None:
        return text("model_path", model_path, "pass the model folder FastDeploy serves")
    given = getattr(args, "model_path", None)
    if given is None:
        raise ConfigError(
            "model_path",
            None,
            "the model folder FastDeploy serves, as the transfer manager's --model_path (the messager has none)",
            "pass model_path=",
        )
    return text("--model_path", given, CLI_FIX)


def _check_num_layers(args: object, model: ModelConfig) -> None:
    """``--num_layers`` (the model's ``num_hidden_layers``, which FastDeploy's cache processes allocate) where the
    command line has it, against the model's ``config.json``."""
    layers = getattr(args, "num_layers", None)
    if layers is not None and integer("--num_layers", layers, 1, MAX_LAYERS, CLI_FIX) != model.num_hidden_layers:
        raise ConfigError(
            "--num_layers",
            layers,
            f"{model.num_hidden_layers}, the model's num_hidden_layers",
            "pass the model_path of the model the engine serves",
        )


def _num_cpu_blocks(args: object) -> int:
    """``--num_cpu_blocks``: the transfer manager's host swap blocks (0 for the messager, which has none)."""
    value = getattr(args, "num_cpu_blocks", _ABSENT)
    return 0 if value is _ABSENT else integer("--num_cpu_blocks", value, 0, MAX_COUNT, CLI_FIX)


def _backend(args: object) -> str | None:
    """``--kvcache_storage_backend`` (None: off, and the messager has none)."""
    value = getattr(args, "kvcache_storage_backend", None)
    return optional_one_of("--kvcache_storage_backend", value, STORAGE_BACKENDS, CLI_FIX)


def _ipc_suffix(args: object) -> str | None:
    """The suffix of the engine's block-count signal: ``--engine_pid`` or the messager's ``--ipc_suffix``."""
    pid = getattr(args, "engine_pid", None)
    if pid is not None:
        return str(integer("--engine_pid", pid, 1, INT32_MAX, CLI_FIX))
    given = getattr(args, "ipc_suffix", None)
    return None if given is None else suffix("--ipc_suffix", given, CLI_FIX)


def _flag(args: object, name: str, *, optional: bool = False) -> Any:
    """``args.name`` as ``parse_args`` gives it, or a ConfigError naming ``--name`` (None allowed where
    ``optional``)."""
    value = getattr(args, name, None)
    if value is None and not optional:
        raise ConfigError(f"--{name}", None, "the value FastDeploy's parse_args gives it", CLI_FIX)
    return value


def _read(source: object, name: str, where: str = _FD, *, optional: bool = False) -> Any:
    """``source.name``, or a ConfigError naming ``where.name``: where FastDeploy's config class lacks it, or it is
    None and not ``optional``."""
    value = getattr(source, name, _ABSENT)
    if value is _ABSENT or (value is None and not optional):
        raise ConfigError(
            f"{where}.{name}",
            None,
            "the value FastDeploy's config holds there",
            "pass FastDeploy's FDConfig (or an object with its attribute names) as it is",
        )
    return value


def _checked(
    check: Callable[..., _T], source: object, where: str, name: str, *bounds: object, optional: bool = False
) -> _T:
    """``source.name`` (:func:`_read`, None allowed where ``optional``), checked by ``check`` (a function of
    :mod:`.values`) as FastDeploy's attribute ``where.name``, with ``bounds`` (its arguments between the value and
    the fix)."""
    return check(f"{where}.{name}", _read(source, name, where, optional=optional), *bounds, FD_FIX)


@contextmanager
def _named(names: Mapping[str, str], *, source: str | None = None) -> Iterator[None]:
    """A ConfigError a record raises about one of its fields, re-raised naming the FastDeploy attribute or flag
    ``names`` reads it from (and ``source``, the file, for a field read from ``config.json``)."""
    try:
        yield
    except ConfigError as error:
        if error.field not in names:
            raise
        field = names[error.field]
        where = source if field == _QUANT_KEY else error.source
        raise ConfigError(field, error.value, error.allowed, error.fix, source=where) from None


__all__ = ["FastDeploySettings", "from_cache_manager_args", "from_fd_config"]
