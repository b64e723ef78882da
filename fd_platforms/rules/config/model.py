"""The model facts the KV cache depends on, read from a Hugging Face ``config.json``, and the
tensor-parallel sizes a model allows."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...contract.errors import ConfigError, first_line
from ...contract.integers import check_int, is_int
from .files import read_config_file
from .limits import ATTENTION_KINDS, MAX_LAYERS, MAX_WIDTH, MODEL_DTYPES, choice


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
        object.__setattr__(self, "dtype", choice("dtype", self.dtype, MODEL_DTYPES))
        check_int("num_hidden_layers", self.num_hidden_layers, 1, MAX_LAYERS)
        for field in ("num_attention_heads", "num_key_value_heads", "head_dim"):
            check_int(field, getattr(self, field), 1, MAX_WIDTH)
        for field in ("kv_lora_rank", "qk_rope_head_dim", "index_head_dim"):
            if getattr(self, field) is not None:
                check_int(field, getattr(self, field), 1, MAX_WIDTH)
        check_int("num_nextn_predict_layers", self.num_nextn_predict_layers, 0, MAX_LAYERS)
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
        kind = self._inferred() if self.attention is None else choice("attention", self.attention, ATTENTION_KINDS)
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


def _repair(file: Path) -> str:
    """The fix for a model config that cannot be read as one: a config.json is repaired; another file was named
    by mistake."""
    if file.name == "config.json":
        return "fix or re-download config.json"
    return f"{file.name} is no model config: name the model's folder or its config.json"


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
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError("path", path, "a model folder or its config.json, as a str or path", "pass the model's path")
    file = _config_file(Path(path))
    source = str(file)
    data = read_config_file(file, "path", "a readable config.json")
    try:
        raw = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, an integer too long, nesting too deep
        raise ConfigError(
            "json", first_line(exc), "a Hugging Face model config: a JSON object", _repair(file), source=source
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError("json", type(raw).__name__, "a JSON object at the top level", _repair(file), source=source)
    top = {key: value for key, value in raw.items() if value is not None}
    nested = top.get("text_config")
    scope, prefix = (
        (nested, "text_config.") if isinstance(nested, dict) and "num_hidden_layers" not in top else (top, "")
    )
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
        if not (is_int(hidden) and is_int(heads) and heads > 0):
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
    dtype = next(
        (where[key] for where in (values, top) for key in ("torch_dtype", "dtype") if key in where), "bfloat16"
    )
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
        file = given / "config.json"  # what is there is judged when it is read
        if not file.exists():
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
