"""``kv_cache_shapes`` keeps the core's bytes, role by role, for every layer kind and quantization,
and the engine allocates the platform's shapes (a simulated allocation on the cpu device, where paddle is here)."""

from __future__ import annotations

from types import ModuleType

import pytest

from ...contract.types import CacheShapeRequest
from ...engine import allocate_kv_cache
from ...loading.platform import Platform
from ...rules.config.settings import CacheConfig
from ...rules.drift import shape_drift_error
from ...rules.shapes import shape_cases, shape_violations
from . import hooks, small_layout


@hooks("kv_cache_shapes")
@pytest.mark.parametrize("request_", shape_cases(), ids=lambda r: f"{r.attention}-{r.quant_type}-{r.cache_dtype}")
def test_every_role_keeps_the_core_bytes(fd_platform: Platform, request_: CacheShapeRequest) -> None:
    violations = shape_violations(request_, fd_platform.plugin_shapes(request_))
    assert not violations, str(shape_drift_error(fd_platform, violations, at_call=True))


@hooks("kv_cache_shapes")
@pytest.mark.parametrize(
    "cache",
    [CacheConfig(), CacheConfig(cache_dtype="fp8", kv_cache_quant_type="block_wise_fp8")],
    ids=["bf16", "block_wise_fp8"],
)
def test_the_shaped_layout_allocates_the_same_bytes(
    fd_platform: Platform, fd_paddle: ModuleType, cache: CacheConfig
) -> None:
    layout = small_layout(cache).on_device_type(fd_platform.identity.device_type)  # the core's platform facts
    shaped = fd_platform.cache_layout(layout, 2)
    assert shaped.bytes_per_block == layout.bytes_per_block
    kv = allocate_kv_cache(shaped, 2, "cpu", fd_paddle)
    try:
        assert [list(tensor.shape) for tensor in kv.tensors] == [list(spec.shape(2)) for spec in shaped.tensors]
        assert kv.nbytes == 2 * layout.bytes_per_block
    finally:
        kv.clear()
