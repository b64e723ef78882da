"""A whole deployment from a TOML file and command-line overrides: model, cache, scheduler, parallelism.

A bad value raises :class:`~fd_platforms.contract.errors.ConfigError` naming ``section.key``, the
value, what is allowed and the fix, plus the file it came from when it came from one.

A deployment is described by a TOML file (see ``examples/deploy.toml``)::

    [model]      path (relative to the TOML file's folder), attention, use_mtp
    [cache]      block_size, cache_dtype, kv_cache_quant_type, memory_utilization,
                 num_cpu_blocks, swap_space (per rank: GiB as a bare number, as FastDeploy's
                 and vLLM's swap_space, or a size such as "512MiB"),
                 kvcache_storage_backend, num_gpu_blocks_override, num_gpu_block_expand_ratio,
                 rule (the create-or-attach rule's version)
    [scheduler]  splitwise_role, protocol (fd-platforms, or fastdeploy beside FastDeploy's own processes)
    [parallel]   tensor_parallel_size, local_rank

Overrides (from command-line flags) have the same ``{section: {key: value}}`` shape, win over
the file, and a ``None`` value in them means "not given".
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...contract.errors import ConfigError, closest_name, first_line
from ..sizes import parse_size
from .files import read_config_file
from .model import ModelConfig, check_tensor_parallel, load_model_config
from .settings import CacheConfig, ParallelConfig, SchedulerConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python < 3.11
    import tomli as tomllib

SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "model": ("path", "attention", "use_mtp"),
    "cache": (
        "block_size",
        "cache_dtype",
        "kv_cache_quant_type",
        "memory_utilization",
        "num_cpu_blocks",
        "swap_space",
        "kvcache_storage_backend",
        "num_gpu_blocks_override",
        "num_gpu_block_expand_ratio",
        "rule",
    ),
    "scheduler": ("splitwise_role", "protocol"),
    "parallel": ("tensor_parallel_size", "local_rank"),
}


@dataclass(frozen=True)
class DeployConfig:
    """A whole deployment: where the model is, the model facts, and the cache/scheduler/parallel settings."""

    model_path: Path
    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    parallel: ParallelConfig


Origin = dict[tuple[str, str], str | None]


def _check_shape(sections: Mapping[str, object], source: str | None) -> None:
    """Unknown sections or keys → ConfigError with a did-you-mean hint."""
    for section, table in sections.items():
        if section not in SECTION_KEYS:
            raise ConfigError(
                f"[{section}]",
                section,
                f"sections {', '.join(SECTION_KEYS)}",
                _did_you_mean(section, SECTION_KEYS),
                source=source,
            )
        if not isinstance(table, Mapping):
            raise ConfigError(
                f"[{section}]", table, "a table of keys", f"write the keys under a [{section}] header", source=source
            )
        for key in table:
            keys = SECTION_KEYS[section]
            if key not in keys:
                raise ConfigError(
                    f"{section}.{key}",
                    table[key],
                    f"keys of [{section}]: {', '.join(keys)}",
                    _did_you_mean(key, keys),
                    source=source,
                )


def _did_you_mean(word: str, known: Iterable[str]) -> str:
    close = closest_name(word, known)
    return f"did you mean {close!r}?" if close else "remove it or use one of the allowed names"


@contextmanager
def _section(name: str, origin: Origin, renamed: Mapping[str, str] | None = None) -> Iterator[None]:
    """Re-raise a record's ConfigError as ``section.key``, with the file the key came from."""
    try:
        yield
    except ConfigError as exc:
        if exc.source is not None:
            raise
        key = (renamed or {}).get(exc.field, exc.field)
        raise ConfigError(f"{name}.{key}", exc.value, exc.allowed, exc.fix, source=origin.get((name, key))) from None


def _build(sections: Mapping[str, Mapping[str, Any]], origin: Origin, source: str | None) -> DeployConfig:
    model_keys, cache_keys = dict(sections.get("model", {})), dict(sections.get("cache", {}))
    if "path" not in model_keys:
        raise ConfigError(
            "model.path",
            None,
            "a folder with a Hugging Face config.json, or the file itself",
            "set path under [model] in the TOML file, or pass the model path on the command line",
            source=source,
        )
    raw_path = model_keys.pop("path")
    with _section("model", origin):
        if not isinstance(raw_path, (str, Path)):
            raise ConfigError("path", raw_path, "a path string", "quote the path")
    model_path = Path(raw_path)
    with _section("cache", origin, {"swap_space_bytes": "swap_space"}):
        if "swap_space" in cache_keys:
            cache_keys["swap_space_bytes"] = parse_size(cache_keys.pop("swap_space"), "swap_space", bare="GiB")
        cache = CacheConfig(**cache_keys)
    with _section("scheduler", origin):
        scheduler = SchedulerConfig(**sections.get("scheduler", {}))
    with _section("parallel", origin):
        parallel = ParallelConfig(**sections.get("parallel", {}))
    with _section("model", origin):
        model = load_model_config(model_path, **model_keys)
    with _section("parallel", origin):
        check_tensor_parallel(model, parallel.tensor_parallel_size)
    return DeployConfig(model_path=model_path, model=model, cache=cache, scheduler=scheduler, parallel=parallel)


def _merge(
    file_sections: Mapping[str, Mapping[str, object]],
    source: str | None,
    overrides: Mapping[str, Mapping[str, object]] | None,
) -> tuple[dict[str, dict[str, Any]], Origin]:
    _check_shape(overrides or {}, None)
    merged: dict[str, dict[str, Any]] = {}
    origin: Origin = {}
    for sections, where in ((file_sections, source), (overrides or {}, None)):
        for section, table in sections.items():
            for key, value in table.items():
                if value is not None:
                    merged.setdefault(section, {})[key] = value
                    origin[(section, key)] = where
    return merged, origin


def load_deploy_config(path: str | Path, overrides: Mapping[str, Mapping[str, object]] | None = None) -> DeployConfig:
    """Read a deployment TOML file; ``overrides`` (same shape) win over its values."""
    file = Path(path)
    source = str(file)
    data = read_config_file(file, "config", "a readable TOML file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            "config", source, "a UTF-8 text file in TOML", f"this is not text ({first_line(exc)}); pass the deploy TOML"
        ) from None
    try:
        sections = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError is a ValueError
        if not isinstance(exc, tomllib.TOMLDecodeError):
            raise ConfigError("toml", first_line(exc), "valid TOML", "correct the file", source=source) from None
        line = re.search(r"line (\d+)", str(exc))
        where = f"line {line.group(1)}" if line else "the reported position"
        raise ConfigError("toml", str(exc), "valid TOML", f"correct the syntax at {where}", source=source) from None
    _check_shape(sections, source)
    model = sections.get("model", {})
    if isinstance(model.get("path"), str):
        model["path"] = str(file.parent / model["path"])  # relative to the TOML file's folder
    merged, origin = _merge(sections, source, overrides)
    return _build(merged, origin, source)


def deploy_config_from_overrides(overrides: Mapping[str, Mapping[str, object]]) -> DeployConfig:
    """A DeployConfig from overrides alone (no file); a relative model path is taken from the working folder."""
    merged, origin = _merge({}, None, overrides)
    return _build(merged, origin, None)
