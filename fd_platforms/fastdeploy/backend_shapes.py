"""FastDeploy's attention backend states the cache's shapes; here they become our tensor specs.

A FastDeploy runner asks its first attention backend for one layer's shapes, ``get_kv_cache_shape(max_num_blocks=,
kv_cache_quant_type=)`` (``fastdeploy/worker/gpu_model_runner.py`` ``initialize_kv_cache``, develop c1b7c083),
and allocates them: key and value, or MLA's key alone (its value shape is ``[]``:
``mla_attention_backend.py``), or DSA's key and indexer (three shapes, ``dsa_attention_backend.py``; the runner
asks with the quantization ``"uint8"``); both in ``uint8`` whenever the model's cache is quantized, else in the
model's dtype; with ``block_wise_fp8`` a scale tensor per key (and value) of the key's first three axes in
Paddle's default dtype, which its workers set to the model's (``gpu_worker.py`` ``init_device``). With ``int4_zp``
the GPU backend halves the key's last axis (``append_attn_backend.py``); the XPU backend does not, and the XPU
runner allocates ``int8`` (``xpu_model_runner.py`` ``initialize_kv_cache``): its ``cache_type``.

:func:`tensor_specs_from_shapes` turns those shapes into ``CacheRoleShape`` records in that order (key, value,
key_scale, value_scale, indexer: our layout's contract order), as ``initialize_kv_cache(tensor_specs=...)`` takes
them; the engine call then checks them against the plan's bytes. :func:`backend_tensor_specs` asks the backend
as FastDeploy's runner does and converts its answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..contract.errors import ConfigError
from ..contract.integers import MAX_COUNT, is_int
from ..contract.types import DTYPE_BYTES, CacheRoleShape
from .config import FastDeploySettings

_FIELD = "get_kv_cache_shape"
_FIX = "pass what FastDeploy's attention backend's get_kv_cache_shape returned, as it returned it"


def tensor_specs_from_shapes(
    shapes: object, settings: FastDeploySettings, *, cache_type: str | None = None
) -> tuple[CacheRoleShape, ...]:
    """One layer's tensor specs from ``shapes``, what ``get_kv_cache_shape`` returned (key and value shapes, and
    DSA's indexer shape), for the rank ``settings`` describe. ``cache_type`` is the dtype FastDeploy's runner
    allocates key and value in (default: ``uint8`` for a quantized cache, else the model's dtype; the XPU runner
    passes ``int8``). A ConfigError naming ``get_kv_cache_shape`` for an answer that is not two or three shapes of
    positive integers, the first non-empty."""
    key, value, indexer = _shapes(shapes)
    model, quant = settings.model, settings.cache.kv_cache_quant_type
    quantized = quant != "none" or settings.cache.cache_dtype != model.dtype
    dtype = "uint8" if model.attention == "dsa" else cache_type or ("uint8" if quantized else model.dtype)
    if dtype not in DTYPE_BYTES:
        raise ConfigError(
            "cache_type",
            cache_type,
            "one of " + ", ".join(DTYPE_BYTES),
            "pass the dtype FastDeploy's runner allocates the cache in",
        )
    specs = [CacheRoleShape("key", key, dtype)]
    if value:
        specs.append(CacheRoleShape("value", value, dtype))
    if quant == "block_wise_fp8" and model.attention != "dsa":
        specs += [CacheRoleShape(role, key[:3], model.dtype) for role in ("key_scale", "value_scale")][: len(specs)]
    if indexer:
        specs.append(CacheRoleShape("indexer", indexer, "uint8"))
    return tuple(specs)


def backend_tensor_specs(
    backend: object, num_blocks: int, settings: FastDeploySettings, *, cache_type: str | None = None
) -> tuple[CacheRoleShape, ...]:
    """Ask FastDeploy's attention ``backend`` for ``num_blocks`` blocks as its runner asks it
    (``get_kv_cache_shape(max_num_blocks=num_blocks, kv_cache_quant_type=...)``: the model's quantization word,
    ``"uint8"`` for DSA, None unquantized) and return its answer as tensor specs (:func:`tensor_specs_from_shapes`)."""
    ask = getattr(backend, "get_kv_cache_shape", None)
    if not callable(ask):
        raise ConfigError(
            "backend",
            type(backend).__name__,
            "FastDeploy's attention backend (it has get_kv_cache_shape)",
            "pass the runner's attn_backends[0]",
        )
    return tensor_specs_from_shapes(
        ask(max_num_blocks=num_blocks, kv_cache_quant_type=quant_word(settings)), settings, cache_type=cache_type
    )


def quant_word(settings: FastDeploySettings) -> str | None:
    """The ``kv_cache_quant_type`` FastDeploy's runner passes its backend: ``"uint8"`` for DSA, our quantization
    where it adds tensors or packs them (``block_wise_fp8``, ``int4_zp``), the 8-bit element type for a plain
    8-bit cache, None for an unquantized one (the backends test only ``int4_zp``)."""
    cache, model = settings.cache, settings.model
    if model.attention == "dsa":
        return "uint8"
    if cache.kv_cache_quant_type != "none":
        return cache.kv_cache_quant_type
    return None if cache.cache_dtype == model.dtype else cache.cache_dtype


def _shapes(shapes: object) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(key, value, indexer) from the backend's answer; an empty value or indexer is ``()``."""
    if not isinstance(shapes, (tuple, list)) or len(shapes) not in (2, 3):
        raise ConfigError(
            _FIELD, shapes, "(key_shape, value_shape) or, for DSA, (key_shape, value_shape, indexer_shape)", _FIX
        )
    found = []
    for index, one in enumerate(shapes):
        if (
            not isinstance(one, Sequence)
            or isinstance(one, str)
            or not all(is_int(axis) and 0 < axis <= MAX_COUNT for axis in one)
            or (index == 0 and not one)
        ):
            raise ConfigError(
                f"{_FIELD}[{index}]", one, "a list of positive integers, the blocks first (the key's non-empty)", _FIX
            )
        found.append(tuple(one))
    return found[0], found[1], found[2] if len(found) == 3 else ()


__all__ = ["backend_tensor_specs", "quant_word", "tensor_specs_from_shapes"]
