"""The conformance suite's modules and the small model they plan and allocate for.

``hooks("name", ...)`` marks which hooks a test exercises; fd-platforms' own tests check that
every hook spec has at least one.
"""

from __future__ import annotations

import pytest

from ...rules.config.model import ModelConfig
from ...rules.config.settings import CacheConfig, ParallelConfig
from ...rules.layout import CacheLayout, build_layout
from ..pytest_plugin import HOOKS_MARKER

hooks: pytest.MarkDecorator = getattr(pytest.mark, HOOKS_MARKER)

SMALL_MODEL = ModelConfig(
    name="conformance-gqa", num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=128
)
"""4 layers of GQA, 2 KV heads of 128: 2 * 2 * 64 * 128 * 2 bytes * 4 layers = 256 KiB per bf16 block."""


def small_layout(cache: CacheConfig | None = None, device_id: int = 0) -> CacheLayout:
    """The small model's cache layout for one rank of tensor parallelism 1."""
    return build_layout(SMALL_MODEL, cache or CacheConfig(), ParallelConfig(), device_id=device_id)
