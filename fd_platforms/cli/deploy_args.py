"""The deployment flags ``plan`` and ``run`` share, and the :class:`~fd_platforms.rules.config.deploy.DeployConfig` they
build.

Values come from ``--config deploy.toml`` with flags winning over the file. ``--device-memory``
and ``--non-cache-memory`` are sizes the commands read themselves (:func:`memory_sizes`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

from ..contract.errors import ConfigError
from ..rules.config.deploy import DeployConfig, deploy_config_from_overrides, load_deploy_config
from ..rules.config.limits import ATTENTION_KINDS
from ..rules.config.settings import PROTOCOLS, CacheConfig, ParallelConfig, SchedulerConfig
from ..rules.config.vocabulary import CACHE_DTYPE_WORDS, QUANT_WORDS
from ..rules.decision import DEFAULT_RULE, RULE_VERSIONS, SPLITWISE_ROLES, STORAGE_BACKENDS
from ..rules.sizes import parse_size

BARE_UNIT = "GiB"  #: what a size flag's number alone counts in: every size flag alike


def add_deploy_arguments(parser: argparse.ArgumentParser) -> tuple[argparse.Action, ...]:
    """Add the model, cache, scheduler, parallel and memory flags to ``parser``; the defaults shown
    are the config records' own (``--config`` values win over them, flags over both). Returns their
    actions (:func:`given_flags` repeats the ones a command line gave)."""
    cache, parallel, scheduler = CacheConfig(), ParallelConfig(), SchedulerConfig()
    added: list[argparse.Action] = []

    def add(*flags: str, **options: Any) -> None:
        added.append(parser.add_argument(*flags, **options))

    add("--config", metavar="FILE", help="deployment TOML ([model], [cache], [scheduler], [parallel])")
    add("--model", metavar="PATH", help="model folder holding a Hugging Face config.json, or the file")
    add("--attention", choices=ATTENTION_KINDS, help="attention variant (default: inferred from config.json)")
    add("--mtp", action="store_true", default=None, help="add the model's MTP layers to the cache")
    add("--tp", type=int, metavar="N", help=f"tensor-parallel size (default: {parallel.tensor_parallel_size})")
    add("--block-size", type=int, metavar="N", help=f"tokens per block (default: {cache.block_size})")
    add("--cache-dtype", choices=CACHE_DTYPE_WORDS, help=f"cache element type (default: {cache.cache_dtype})")
    add("--kv-cache-quant-type", choices=QUANT_WORDS, help=f"cache quantization (default: {cache.kv_cache_quant_type})")
    add(
        "--memory-utilization",
        type=float,
        metavar="F",
        help=f"fraction of device memory the process may use, weights and cache (default: {cache.memory_utilization})",
    )
    add(
        "--device-memory",
        metavar="SIZE",
        help="device memory per rank: 80GiB, 81920MiB, 80GB (powers of 1000), 85899345920B; a number alone is GiB "
        "(default: the device's live facts)",
    )
    add(
        "--non-cache-memory",
        metavar="SIZE",
        help="memory held outside the cache: weights + activation peak, a size as --device-memory's (default: what the "
        "process holds now, 0 before the model is loaded: weights are then not counted)",
    )
    add(
        "--swap-space",
        metavar="SIZE",
        help="host swap space per rank (vLLM's 'per GPU'; FastDeploy converts its swap_space for the instance): "
        "GiB as a bare number, as their swap_space is, or a size such as 512MiB (default: 0, none)",
    )
    add("--host-memory", metavar="SIZE", help="host memory the swap space must fit in (default: this host's total)")
    add("--num-gpu-blocks-override", type=int, metavar="N", help="use exactly N blocks (default: what memory allows)")
    add(
        "--num-gpu-block-expand-ratio",
        type=float,
        metavar="F",
        help="device blocks of the MTP layers per main-layer block, FastDeploy's int(num_blocks * F) "
        f"(default: {cache.num_gpu_block_expand_ratio:g}; with --mtp)",
    )
    add(
        "--rule",
        choices=tuple(RULE_VERSIONS),
        help=f"the create-or-attach rule's version the engine pins (default: {DEFAULT_RULE}; "
        "with --protocol fastdeploy it must be pinned where the versions disagree; fd-platforms rules shows them)",
    )
    add("--role", choices=SPLITWISE_ROLES, help=f"splitwise role (default: {scheduler.splitwise_role})")
    add(
        "--protocol",
        choices=PROTOCOLS,
        help=f"the processes' signals and tensor handles: ours, or FastDeploy's own (default: {scheduler.protocol})",
    )
    add("--storage-backend", choices=("none", *STORAGE_BACKENDS), help="KV cache storage backend (default: none)")
    return tuple(added)


def given_flags(args: argparse.Namespace, actions: Sequence[argparse.Action]) -> list[str]:
    """The flags of ``actions`` that ``args`` holds a value for, as a command line would repeat them."""
    flags: list[str] = []
    for action in actions:
        value = getattr(args, action.dest)
        if value is not None:
            flags += [action.option_strings[0]] if action.nargs == 0 else [action.option_strings[0], str(value)]
    return flags


#: Each deployment field a flag sets, and the flag (``attribute`` on the parsed arguments is the flag's dest).
FLAG_FIELDS = {
    ("model", "path"): "--model",
    ("model", "attention"): "--attention",
    ("model", "use_mtp"): "--mtp",
    ("cache", "block_size"): "--block-size",
    ("cache", "cache_dtype"): "--cache-dtype",
    ("cache", "kv_cache_quant_type"): "--kv-cache-quant-type",
    ("cache", "memory_utilization"): "--memory-utilization",
    ("cache", "swap_space"): "--swap-space",
    ("cache", "kvcache_storage_backend"): "--storage-backend",
    ("cache", "num_gpu_blocks_override"): "--num-gpu-blocks-override",
    ("cache", "num_gpu_block_expand_ratio"): "--num-gpu-block-expand-ratio",
    ("cache", "rule"): "--rule",
    ("scheduler", "splitwise_role"): "--role",
    ("scheduler", "protocol"): "--protocol",
    ("parallel", "tensor_parallel_size"): "--tp",
}


def deploy_config(args: argparse.Namespace) -> DeployConfig:
    """The deployment from ``--config`` (if given) with the flags as overrides. A refused value a flag gave is named
    by that flag (``--tp=0``), not by the field it sets (``parallel.tensor_parallel_size``)."""
    overrides: dict[str, dict[str, Any]] = {}
    given: dict[str, str] = {}
    for (section, key), flag in FLAG_FIELDS.items():
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        overrides.setdefault(section, {})[key] = value
        if value is not None:
            given[f"{section}.{key}"] = flag
    try:
        if args.config:
            return load_deploy_config(args.config, overrides)
        if args.model is None:
            raise ConfigError(
                "--model", None, "a config.json or a folder holding one", "pass --model PATH or --config FILE"
            )
        return deploy_config_from_overrides(overrides)
    except ConfigError as error:
        named = given.get(error.field)
        if named is None:
            raise
        key = error.field.rsplit(".", 1)[1]
        fix = re.sub(rf"\b{re.escape(key)}\b", named, error.fix)
        raise ConfigError(named, error.value, error.allowed, fix) from None


def memory_sizes(args: argparse.Namespace) -> tuple[int | None, int | None, int | None]:
    """``--device-memory``, ``--non-cache-memory`` and ``--host-memory`` in bytes, None where not given. A number
    alone counts in GiB in each, as in ``--swap-space`` (FastDeploy's and vLLM's ``swap_space``): one unit for every
    size flag (:data:`BARE_UNIT`)."""
    device = None if args.device_memory is None else parse_size(args.device_memory, "--device-memory", bare=BARE_UNIT)
    non_cache = (
        None
        if args.non_cache_memory is None
        else parse_size(args.non_cache_memory, "--non-cache-memory", bare=BARE_UNIT)
    )
    host = None if args.host_memory is None else parse_size(args.host_memory, "--host-memory", bare=BARE_UNIT)
    return device, non_cache, host
