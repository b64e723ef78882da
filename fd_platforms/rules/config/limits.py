"""What a configuration value may be: the vocabularies, the bounds, and the check of a choice.

Every record in :mod:`fd_platforms.rules.config` validates itself with these on construction (its
integers with :func:`fd_platforms.contract.integers.check_int`); a bad value raises
:class:`~fd_platforms.contract.errors.ConfigError` naming the field, the value, what is allowed and the fix.
"""

from __future__ import annotations

from ...contract.errors import ConfigError

CACHE_DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32", "float8_e4m3fn", "int8", "uint8")
"""Our cache element types; ``uint8`` is an 8-bit cache whose kind its kernels know (FastDeploy's word for any)."""
MODEL_DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32")
EIGHT_BIT_DTYPES: tuple[str, ...] = ("float8_e4m3fn", "int8", "uint8")
QUANT_TYPES: tuple[str, ...] = ("none", "block_wise_fp8", "int4_zp")
ATTENTION_KINDS: tuple[str, ...] = ("mha", "gqa", "mla", "dsa")


# Upper bounds of the sizes a config may give (counts of blocks and bytes go to
# fd_platforms.contract.integers.MAX_COUNT): far above any real model, low enough that an absurd value
# (``num_hidden_layers: 1e30``) is a ConfigError at once instead of a layout the size of memory.
MAX_LAYERS = 10_000  # the largest public models have fewer than 200 layers
MAX_WIDTH = 65_536  # heads, head dims, latent ranks, block sizes: every real one is far below
MAX_RANKS = 65_536  # tensor-parallel ranks
MAX_EXPAND_RATIO = 64.0  # MTP layers' device blocks per main-layer block (FastDeploy's default: 1.0)


def choice(field: str, value: object, choices: tuple[str, ...]) -> str:
    """``value`` lower-cased if it is one of ``choices``, else ConfigError."""
    normal = value.lower() if isinstance(value, str) else None
    if normal not in choices:
        names = ", ".join(choices)
        raise ConfigError(field, value, f"one of {names}", f"set {field} to one of {names}")
    return normal
