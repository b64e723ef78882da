"""FastDeploy's words for the KV cache's dtype and quantization, mapped to ours in one table.

FastDeploy has one ``kv_cache_quant_type`` list and a ``cache_dtype``; we keep the element type
(``cache_dtype``) apart from the tensors a quantization adds (``kv_cache_quant_type``). Every value
FastDeploy's configuration allows is a row of :data:`FASTDEPLOY_WORDS`, read from FastDeploy
(develop, 2026-05; ``PaddlePaddle/FastDeploy`` and the fork ``gongshaotian/FastDeploy``):

- ``kv_cache_quant_type``: ``KvCacheQuantzationTypes`` in
  ``fastdeploy/model_executor/layers/quantization/kv_cache.py`` (``int8``, ``float8_e4m3fn``,
  ``float8_e4m3`` (``FP8_E4M3``, scaled to 240 where ``float8_e4m3fn`` is to 448: the same byte a
  value), ``block_wise_fp8``, ``int8_zp``, ``int4_zp``, ``float8_e4m3fn_zp``); None (no
  quantization) is ``none`` here. The ``_zp`` variants add zero points, which are weights, not cache.
- ``cache_dtype``: ``CacheConfig`` in ``fastdeploy/config.py`` defaults to ``bfloat16``, takes the
  model's ``kv_cache_quant_type`` as its value, then turns every 4- and 8-bit one into ``uint8``
  (``CacheConfig.__init__``); so a quantization word may arrive as ``cache_dtype`` too.
- What the runners allocate: ``worker/gpu_model_runner.py`` ``initialize_kv_cache`` allocates the
  model's dtype (``bfloat16``, ``float16``, ``float32``) unquantized and ``uint8`` whenever
  ``kv_cache_quant_type`` is set, with ``block_wise_fp8`` scales in Paddle's default dtype.
- What the cache transfer manager is passed: ``cache_manager/cache_transfer_manager.py``
  ``parse_args`` takes ``--cache_dtype`` from ``uint8``, ``bfloat16``, ``block_wise_fp8``
  (``cache_manager/prefix_cache_manager.py`` ``launch_cache_manager`` passes the cache config's).
- ``float8_e4m3`` is a quantization word (``FP8_E4M3``) and, as every quantization word, a
  ``cache_dtype`` word; FastDeploy's runner allocates it as ``uint8`` (``CacheConfig.__init__``
  turns it into ``uint8``: it holds ``float8``), so its transfer manager is passed ``uint8``.

A row gives our ``kv_cache_quant_type`` and ``cache_dtype`` (None: the word leaves the element
type to the other word), and the tensor dtype and packing FastDeploy's GPU runner allocates.
:func:`cache_settings_from_fastdeploy` is the entry point an adapter calls with FastDeploy's raw
strings; :class:`~fd_platforms.rules.config.settings.CacheConfig` normalises its own two fields
through :func:`resolve_cache_words`, so it takes FastDeploy's values as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...contract.errors import ConfigError


@dataclass(frozen=True)
class FastDeployWord:
    """One FastDeploy value: what it means here and where FastDeploy has it."""

    quant_type: str
    cache_dtype: str | None
    tensor_dtype: str
    packing: str
    source: str


_QUANT = "kv_cache.py KvCacheQuantzationTypes"
_RUNNER = "gpu_model_runner.py initialize_kv_cache"
_CONFIG = "config.py CacheConfig.__init__"
_TRANSFER = "cache_transfer_manager.py parse_args --cache_dtype"

FASTDEPLOY_WORDS: dict[str, FastDeployWord] = {
    # quantization words (kv_cache_quant_type; CacheConfig also takes them as cache_dtype)
    "none": FastDeployWord("none", None, "model dtype", "none", "kv_cache_quant_type None"),
    "int8": FastDeployWord("none", "int8", "uint8", "none", _QUANT),
    "int8_zp": FastDeployWord("none", "int8", "uint8", "none", _QUANT),
    "float8_e4m3fn": FastDeployWord("none", "float8_e4m3fn", "uint8", "none", _QUANT),
    "float8_e4m3fn_zp": FastDeployWord("none", "float8_e4m3fn", "uint8", "none", _QUANT),
    "float8_e4m3": FastDeployWord("none", "float8_e4m3fn", "uint8", "none", f"{_QUANT} FP8_E4M3"),
    "block_wise_fp8": FastDeployWord(
        "block_wise_fp8", "float8_e4m3fn", "uint8", "none (scales beside)", f"{_QUANT}; {_TRANSFER}"
    ),
    "int4_zp": FastDeployWord("int4_zp", None, "uint8", "two 4-bit values a byte (GPU)", _QUANT),
    # element-type words (cache_dtype)
    "bfloat16": FastDeployWord("none", "bfloat16", "bfloat16", "none", f"{_CONFIG} default; {_TRANSFER}"),
    "float16": FastDeployWord("none", "float16", "float16", "none", f"{_RUNNER} (model dtype)"),
    "float32": FastDeployWord("none", "float32", "float32", "none", f"{_RUNNER} (model dtype)"),
    "uint8": FastDeployWord("none", "uint8", "uint8", "none", f"{_CONFIG} (any 4/8-bit cache); {_TRANSFER}"),
    "fp8": FastDeployWord("none", "float8_e4m3fn", "uint8", "none", "fd-platforms' alias"),
}
"""Every value FastDeploy's ``kv_cache_quant_type`` and ``cache_dtype`` allow, mapped to ours."""

QUANT_WORDS: tuple[str, ...] = (
    "none",
    "int8",
    "int8_zp",
    "float8_e4m3fn",
    "float8_e4m3",
    "float8_e4m3fn_zp",
    "block_wise_fp8",
    "int4_zp",
)
"""The words ``kv_cache_quant_type`` accepts (FastDeploy's list, and ``none``)."""

CACHE_DTYPE_WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(("bfloat16", "float16", "float32", "uint8", "float8_e4m3", "fp8", *QUANT_WORDS[1:]))
)
"""The words ``cache_dtype`` accepts: element types, then the quantization words FastDeploy's config puts there."""

SIXTEEN_BIT_AND_WIDER: tuple[str, ...] = ("bfloat16", "float16", "float32")

INT4_ZP_PACKED: tuple[int, str] = (2, "uint8")
"""How ``int4_zp`` key and value are stored by default: two 4-bit values a byte, ``uint8``
``[N, kv_heads, block, head_dim // 2]`` (FastDeploy's ``append_attn_backend.py`` ``get_kv_cache_shape``)."""

INT4_ZP_STORAGE: dict[str, tuple[int, str]] = {"xpu": (1, "int8")}
"""Platforms, by the Paddle device type their plugin declares (``PlatformIdentity.device_type``), whose
``int4_zp`` cache holds one value a byte: FastDeploy's XPU attention backend states ``[N, kv_heads,
block, head_dim]`` whatever the quantization (``backends/xpu/attention.py`` ``get_kv_cache_shape``)
and its runner allocates that as ``int8`` (``worker/xpu_model_runner.py`` ``initialize_kv_cache``), so
the cache is twice the GPU's. The core applies it (:meth:`~fd_platforms.rules.layout.CacheLayout.on_device_type`),
so a plugin cannot drift the bytes: it can only be a device type this table names."""


BLOCK_WISE_FP8_WITHOUT_SCALES: frozenset[str] = frozenset({"xpu"})
"""Platforms, by the Paddle device type their plugin declares, whose runner allocates a ``block_wise_fp8`` cache
as key and value alone, no scales: FastDeploy's XPU runner allocates key and value, ``int8`` for any
``kv_cache_quant_type``, and no ``key_cache_scales``/``value_cache_scales`` (``worker/xpu_model_runner.py``
``initialize_kv_cache``, gongshaotian/FastDeploy e53f518 lines 1230-1283), so the cache is the GPU's less its scales.
The core applies it (:meth:`~fd_platforms.rules.layout.CacheLayout.on_device_type`), as :data:`INT4_ZP_STORAGE`."""


def int4_zp_storage(device_type: str | None) -> tuple[int, str]:
    """``(values a byte, tensor dtype)`` of an ``int4_zp`` cache on a platform of ``device_type``."""
    return INT4_ZP_STORAGE.get(device_type or "", INT4_ZP_PACKED)


def fastdeploy_word(field: str, value: object, accepted: tuple[str, ...]) -> FastDeployWord:
    """The row of ``value`` (lower-cased; None is ``none``), else a ConfigError listing every accepted value."""
    normal = "none" if value is None else value.lower() if isinstance(value, str) else None
    if normal not in accepted:
        raise ConfigError(
            field,
            value,
            f"one of {', '.join(accepted)}",
            f"set {field} to one of FastDeploy's values ({', '.join(accepted)})",
        )
    return FASTDEPLOY_WORDS[normal]


def resolve_cache_words(cache_dtype: object, kv_cache_quant_type: object, *, quant_decides: bool) -> tuple[str, str]:
    """Our ``(cache_dtype, kv_cache_quant_type)`` for two FastDeploy words.

    The quantization is the one either word names (two different ones are a ConfigError). The
    element type is the quantization word's where it names one; with ``quant_decides`` (FastDeploy's
    runner: ``uint8`` whenever a quantization is set) it wins over a 16-bit ``cache_dtype``, otherwise
    that pair is a ConfigError. A ``cache_dtype`` of None leaves it to the quantization, else ``bfloat16``.
    """
    quant = fastdeploy_word("kv_cache_quant_type", kv_cache_quant_type, QUANT_WORDS)
    given = None if cache_dtype is None else fastdeploy_word("cache_dtype", cache_dtype, CACHE_DTYPE_WORDS)
    quant_type = quant.quant_type
    if given is not None and given.quant_type != "none":
        if quant_type not in ("none", given.quant_type):
            raise ConfigError(
                "cache_dtype",
                cache_dtype,
                f"a word of kv_cache_quant_type={kv_cache_quant_type!r} or an element type",
                "give the quantization once, as kv_cache_quant_type",
            )
        quant_type = given.quant_type
    implied = quant.cache_dtype or (given.cache_dtype if given is not None and given.quant_type != "none" else None)
    element = given.cache_dtype if given is not None else None
    if implied is not None and element in SIXTEEN_BIT_AND_WIDER and not quant_decides:
        raise ConfigError(
            "kv_cache_quant_type",
            kv_cache_quant_type,
            f"a quantization that keeps a {element} cache (none, int4_zp), or an 8-bit cache_dtype with it",
            f"set cache_dtype to {implied} (or uint8), or kv_cache_quant_type to none",
        )
    if implied is not None and (element is None or element in SIXTEEN_BIT_AND_WIDER or element == "uint8"):
        element = implied
    return element or "bfloat16", quant_type


def cache_settings_from_fastdeploy(*, kv_cache_quant_type: object, cache_dtype: object) -> dict[str, Any]:
    """The :class:`~fd_platforms.rules.config.settings.CacheConfig` fields for FastDeploy's raw strings.

    ``kv_cache_quant_type`` is FastDeploy's ``quant_config.kv_cache_quant_type`` (None without one),
    ``cache_dtype`` its ``cache_config.cache_dtype`` or the transfer manager's ``--cache_dtype``. As
    FastDeploy's runner does, a quantization decides the element type over a 16-bit ``cache_dtype``.
    Returns ``{"cache_dtype": ..., "kv_cache_quant_type": ...}``; an unknown value is a ConfigError
    listing every accepted value.
    """
    dtype, quant = resolve_cache_words(cache_dtype, kv_cache_quant_type, quant_decides=True)
    return {"cache_dtype": dtype, "kv_cache_quant_type": quant}
