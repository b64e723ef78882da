"""Typed, validated deployment configuration: cache, scheduler, parallelism and model.

Every record is a frozen dataclass that validates itself on construction; a bad value raises
:class:`~fd_platforms.errors.ConfigError` naming the field, the value, what is allowed and the
fix, plus the file it came from when it came from one.

A deployment is described by a TOML file (see ``examples/deploy.toml``)::

    [model]      path (relative to the TOML file's folder), attention, use_mtp
    [cache]      block_size, cache_dtype, kv_cache_quant_type, memory_utilization,
                 num_cpu_blocks, swap_space (per rank: GiB as a bare number, as FastDeploy's
                 and vLLM's swap_space, or a size such as "512MiB"),
                 kvcache_storage_backend, num_gpu_blocks_override
    [scheduler]  splitwise_role
    [parallel]   tensor_parallel_size, local_rank

Overrides (from command-line flags) have the same ``{section: {key: value}}`` shape, win over
the file, and a ``None`` value in them means "not given".
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from .decision import SPLITWISE_ROLES, STORAGE_BACKENDS
from .errors import ConfigError
from .sizes import parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python < 3.11
    import tomli as tomllib

CACHE_DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float8_e4m3fn", "int8")
MODEL_DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32")
EIGHT_BIT_DTYPES: tuple[str, ...] = ("float8_e4m3fn", "int8")
DTYPE_ALIASES: dict[str, str] = {"fp8": "float8_e4m3fn"}
QUANT_TYPES: tuple[str, ...] = ("none", "block_wise_fp8")
ATTENTION_KINDS: tuple[str, ...] = ("mha", "gqa", "mla", "dsa")

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
    ),
    "scheduler": ("splitwise_role",),
    "parallel": ("tensor_parallel_size", "local_rank"),
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


MAX_COUNT = 2**63 - 1  # blocks and bytes are int64 counts
MAX_LAYERS = 10_000  # the largest public models have fewer than 200 layers
MAX_WIDTH = 65_536  # heads, head dims, latent ranks, block sizes: every real one is far below
MAX_RANKS = 65_536  # tensor-parallel ranks
LIMITS: dict[str, int] = {
    "num_hidden_layers": MAX_LAYERS,
    "num_nextn_predict_layers": MAX_LAYERS,
    "num_attention_heads": MAX_WIDTH,
    "num_key_value_heads": MAX_WIDTH,
    "head_dim": MAX_WIDTH,
    "kv_lora_rank": MAX_WIDTH,
    "qk_rope_head_dim": MAX_WIDTH,
    "index_head_dim": MAX_WIDTH,
    "block_size": MAX_WIDTH,
    "tensor_parallel_size": MAX_RANKS,
    "local_rank": MAX_RANKS,
}
"""Upper bounds of the sizes a config may give: far above any real model, low enough that an absurd
value (``num_hidden_layers: 1e30``) is a ConfigError at once instead of a layout the size of memory."""


def _check_int(field: str, value: object, minimum: int) -> None:
    maximum = LIMITS.get(field, MAX_COUNT)
    if not _is_int(value) or not minimum <= cast(int, value) <= maximum:
        raise ConfigError(
            field, value, f"an integer from {minimum} to {maximum}", f"set {field} to a whole number in that range"
        )


def _check_optional_int(field: str, value: object, minimum: int) -> None:
    if value is not None:
        _check_int(field, value, minimum)


def tensor_parallel_sizes(model: ModelConfig, upto: int = 64) -> list[int]:
    """Tensor-parallel sizes up to ``upto`` that split ``model``'s heads (see :func:`check_tensor_parallel`)."""
    heads, kv_heads = model.num_attention_heads, model.num_key_value_heads
    return [tp for tp in range(1, upto + 1) if heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0)]


def check_tensor_parallel(model: ModelConfig, tp: int) -> None:
    """A tensor-parallel split needs ``num_attention_heads % tp == 0`` and KV heads either divisible
    by ``tp`` or dividing it (then each KV head is replicated on ``tp // kv_heads`` ranks)."""
    heads, kv_heads = model.num_attention_heads, model.num_key_value_heads
    if heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0):
        return
    why = (
        f"num_attention_heads={heads} is not divisible by {tp}"
        if heads % tp
        else f"num_key_value_heads={kv_heads} neither is divisible by {tp} nor divides it"
    )
    works = ", ".join(map(str, tensor_parallel_sizes(model)))
    raise ConfigError(
        "tensor_parallel_size",
        tp,
        f"a size that splits the model's heads evenly ({why}); for {model.name}: {works}",
        "choose one of those tensor-parallel sizes",
    )


def _choice(field: str, value: object, choices: tuple[str, ...], aliases: Mapping[str, str] | None = None) -> str:
    """``value`` lower-cased and de-aliased if it is one of ``choices``, else ConfigError."""
    normal = value.lower() if isinstance(value, str) else None
    if normal is not None:
        normal = (aliases or {}).get(normal, normal)
    if normal not in choices:
        names = ", ".join(choices) + (f" (aliases: {', '.join(aliases)})" if aliases else "")
        raise ConfigError(field, value, f"one of {names}", f"set {field} to one of {', '.join(choices)}")
    return normal


@dataclass(frozen=True)
class CacheConfig:
    """How the KV cache is sized and stored.

    ``cache_dtype`` accepts the alias ``fp8`` (stored as ``float8_e4m3fn``);
    ``kvcache_storage_backend`` accepts ``"none"`` (stored as None). Host swap space is given
    either as ``num_cpu_blocks`` or as ``swap_space_bytes``, not both.
    """

    block_size: int = 64
    cache_dtype: str = "bfloat16"
    kv_cache_quant_type: str = "none"
    memory_utilization: float = 0.9
    num_cpu_blocks: int = 0
    swap_space_bytes: int = 0
    kvcache_storage_backend: str | None = None
    num_gpu_blocks_override: int | None = None

    def __post_init__(self) -> None:
        _check_int("block_size", self.block_size, 1)
        dtype = _choice("cache_dtype", self.cache_dtype, CACHE_DTYPES, DTYPE_ALIASES)
        object.__setattr__(self, "cache_dtype", dtype)
        quant = _choice("kv_cache_quant_type", self.kv_cache_quant_type, QUANT_TYPES)
        object.__setattr__(self, "kv_cache_quant_type", quant)
        if quant == "block_wise_fp8" and dtype not in EIGHT_BIT_DTYPES:
            raise ConfigError(
                "kv_cache_quant_type",
                quant,
                f"block_wise_fp8 only with an 8-bit cache_dtype ({', '.join(EIGHT_BIT_DTYPES)}), not {dtype}",
                "set cache_dtype to float8_e4m3fn (fp8) or kv_cache_quant_type to none",
            )
        utilization = self.memory_utilization
        if not isinstance(utilization, (int, float)) or isinstance(utilization, bool) or not 0 < utilization <= 1:
            raise ConfigError(
                "memory_utilization",
                utilization,
                "a number greater than 0 and at most 1",
                "give the fraction of device memory to use, e.g. 0.9",
            )
        _check_int("num_cpu_blocks", self.num_cpu_blocks, 0)
        _check_int("swap_space_bytes", self.swap_space_bytes, 0)
        if self.num_cpu_blocks and self.swap_space_bytes:
            raise ConfigError(
                "swap_space_bytes",
                self.swap_space_bytes,
                f"0 when num_cpu_blocks is set (num_cpu_blocks={self.num_cpu_blocks})",
                "give host swap space either as num_cpu_blocks or as swap_space, not both",
            )
        if self.kvcache_storage_backend is not None:
            backend = _choice("kvcache_storage_backend", self.kvcache_storage_backend, ("none", *STORAGE_BACKENDS))
            object.__setattr__(self, "kvcache_storage_backend", None if backend == "none" else backend)
        _check_optional_int("num_gpu_blocks_override", self.num_gpu_blocks_override, 1)


@dataclass(frozen=True)
class SchedulerConfig:
    """Whether this instance does prefill and decode (``mixed``) or one of them (disaggregated)."""

    splitwise_role: str = "mixed"

    def __post_init__(self) -> None:
        object.__setattr__(self, "splitwise_role", _choice("splitwise_role", self.splitwise_role, SPLITWISE_ROLES))


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallelism: how many ranks split the KV heads, and which one this process is."""

    tensor_parallel_size: int = 1
    local_rank: int = 0

    def __post_init__(self) -> None:
        _check_int("tensor_parallel_size", self.tensor_parallel_size, 1)
        size = self.tensor_parallel_size
        if not _is_int(self.local_rank) or not 0 <= self.local_rank < size:
            raise ConfigError(
                "local_rank",
                self.local_rank,
                f"an integer from 0 to {size - 1} (tensor_parallel_size={size})",
                "set local_rank below tensor_parallel_size",
            )


_NEEDED_FIELDS: dict[str, tuple[str, ...]] = {
    "mla": ("kv_lora_rank", "qk_rope_head_dim"),
    "dsa": ("kv_lora_rank", "qk_rope_head_dim", "index_head_dim"),
}


@dataclass(frozen=True)
class ModelConfig:
    """The model facts the KV cache depends on.

    ``attention`` None means inferred: ``index_head_dim`` set → ``dsa``; ``kv_lora_rank`` set →
    ``mla``; fewer KV heads than attention heads → ``gqa``; else ``mha``. With ``use_mtp`` the
    cache holds ``num_nextn_predict_layers`` extra layers (see :attr:`num_cache_layers`).
    ``dtype`` is the model's own dtype (``torch_dtype``/``dtype`` in config.json): FastDeploy's
    workers make it Paddle's default dtype, which block-wise fp8 scale tensors are allocated in.
    """

    name: str
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    index_head_dim: int | None = None
    num_nextn_predict_layers: int = 0
    use_mtp: bool = False
    attention: str | None = None
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _choice("dtype", self.dtype, MODEL_DTYPES))
        for field in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim"):
            _check_int(field, getattr(self, field), 1)
        for field in ("kv_lora_rank", "qk_rope_head_dim", "index_head_dim"):
            _check_optional_int(field, getattr(self, field), 1)
        _check_int("num_nextn_predict_layers", self.num_nextn_predict_layers, 0)
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        if kv_heads > heads or heads % kv_heads:
            raise ConfigError(
                "num_key_value_heads",
                kv_heads,
                f"a divisor of num_attention_heads={heads}",
                "check num_key_value_heads and num_attention_heads in the model config",
            )
        if not isinstance(self.use_mtp, bool):
            raise ConfigError("use_mtp", self.use_mtp, "true or false", "set use_mtp to true or false")
        if self.use_mtp and not self.num_nextn_predict_layers:
            raise ConfigError(
                "use_mtp",
                True,
                "true only for models with num_nextn_predict_layers > 0",
                "set use_mtp to false, or use a model whose config.json has num_nextn_predict_layers",
            )
        kind = self._inferred() if self.attention is None else _choice("attention", self.attention, ATTENTION_KINDS)
        for needed in _NEEDED_FIELDS.get(kind, ()):
            if getattr(self, needed) is None:
                raise ConfigError(
                    "attention",
                    kind,
                    f"{kind} only for models with {', '.join(_NEEDED_FIELDS[kind])}; {needed} is missing",
                    f"add {needed} to the model config or choose another attention",
                )
        object.__setattr__(self, "attention", kind)

    def _inferred(self) -> str:
        if self.index_head_dim is not None:
            return "dsa"
        if self.kv_lora_rank is not None:
            return "mla"
        return "gqa" if self.num_key_value_heads < self.num_attention_heads else "mha"

    @property
    def num_cache_layers(self) -> int:
        """Layers that hold KV cache: the hidden layers, plus the MTP layers when ``use_mtp``."""
        return self.num_hidden_layers + (self.num_nextn_predict_layers if self.use_mtp else 0)


def load_model_config(path: str | Path, *, attention: str | None = None, use_mtp: bool = False) -> ModelConfig:
    """Read a Hugging Face ``config.json`` (the file, or a folder holding one) into a ModelConfig.

    Multimodal and newer models keep the language model under ``text_config`` (Gemma-3, Llama-4,
    Qwen2.5-VL in newer transformers, Mistral-3): when the top level has no
    ``num_hidden_layers`` and a ``text_config`` does, the facts are read there, and errors name
    the key as ``text_config.<key>``. Absent ``num_key_value_heads`` means MHA
    (= ``num_attention_heads``); absent ``head_dim`` means ``hidden_size // num_attention_heads``;
    the model dtype is ``torch_dtype`` or ``dtype`` (newer transformers), else bfloat16; JSON
    ``null`` counts as absent. ``attention`` and ``use_mtp`` come from the caller; errors about
    them carry no file.
    """
    file = _config_file(Path(path))
    source = str(file)
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError("path", source, "a readable config.json", f"check the file ({exc.strerror})") from None
    except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, an integer too long, nesting too deep
        raise ConfigError(
            "json", _first_line(exc), "a valid JSON object of plain numbers", "fix or re-download config.json",
            source=source,
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(
            "json",
            type(raw).__name__,
            "a JSON object at the top level",
            "fix or re-download config.json",
            source=source,
        )
    top = {key: value for key, value in raw.items() if value is not None}
    nested = top.get("text_config")
    scope, prefix = (nested, "text_config.") if isinstance(nested, dict) and "num_hidden_layers" not in top else (top, "")
    values = {key: value for key, value in scope.items() if value is not None}

    def required(key: str) -> Any:
        if key not in values:
            raise ConfigError(
                f"{prefix}{key}", None, "a positive integer", f"add {prefix}{key} to config.json", source=source
            )
        return values[key]

    layers, heads = required("num_hidden_layers"), required("num_attention_heads")
    head_dim = values.get("head_dim")
    if head_dim is None:
        hidden = required("hidden_size")
        if not (_is_int(hidden) and _is_int(heads) and heads > 0):
            raise ConfigError(
                f"{prefix}hidden_size",
                hidden,
                "a positive integer",
                "fix hidden_size and num_attention_heads in config.json",
                source=source,
            )
        head_dim = hidden // heads
    name = top.get("_name_or_path") or (file.parent.name if file.name == "config.json" else file.stem)
    name = name or top.get("model_type", "model")
    dtype = next((where[key] for where in (values, top) for key in ("torch_dtype", "dtype") if key in where), "bfloat16")
    try:
        return ModelConfig(
            name=str(name),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=values.get("num_key_value_heads", heads),
            head_dim=head_dim,
            kv_lora_rank=values.get("kv_lora_rank"),
            qk_rope_head_dim=values.get("qk_rope_head_dim"),
            index_head_dim=values.get("index_head_dim"),
            num_nextn_predict_layers=values.get("num_nextn_predict_layers", 0),
            use_mtp=use_mtp,
            attention=attention,
            dtype=dtype,
        )
    except ConfigError as exc:
        if exc.field in ("attention", "use_mtp"):
            raise
        field = exc.field if exc.field == "dtype" else f"{prefix}{exc.field}"
        raise ConfigError(field, exc.value, exc.allowed, exc.fix, source=source) from None


def _config_file(given: Path) -> Path:
    """The config.json a model path names, or a ConfigError saying which of two things is wrong."""
    if given.is_dir():
        file = given / "config.json"
        if not file.is_file():
            raise ConfigError(
                "path",
                str(given),
                "a model folder holding config.json (this folder has none)",
                "point the model path at the folder of the model's Hugging Face files, or at its config.json",
            )
        return file
    if not given.exists():
        raise ConfigError(
            "path",
            str(given),
            "an existing model folder or config.json (nothing is at this path)",
            "check the path; relative paths start from the working folder (or the deploy TOML's folder)",
        )
    return given


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


def _first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line and 200 characters, for an error of ours."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text if len(text) <= 200 else text[:197] + "..."


def _did_you_mean(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1)
    return f"did you mean {close[0]!r}?" if close else "remove it or use one of the allowed names"


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
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("config", source, "a readable TOML file", f"check the path ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            "config", source, "a UTF-8 text file in TOML", f"this is not text ({_first_line(exc)}); pass the deploy TOML"
        ) from None
    try:
        sections = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError is a ValueError
        if not isinstance(exc, tomllib.TOMLDecodeError):
            raise ConfigError("toml", _first_line(exc), "valid TOML", "correct the file", source=source) from None
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
