"""The engine calls' arguments (``initialize_kv_cache``, ``manage_kv_cache``, ``allocate_kv_cache``) are typed and
named before any hook runs: one of the wrong type, or missing, is a ConfigError naming it, with a fix."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kv_requests import kv_request
from run_helpers import QWEN, ROOT

from fd_platforms.contract.errors import ConfigError
from fd_platforms.engine import allocate_kv_cache, initialize_kv_cache, manage_kv_cache
from fd_platforms.loading.platform import Platform
from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config
from fd_platforms.rules.layout import build_layout

SIGNAL = "fd_cache_ready.never-created"
MIXED = {"profile": False, "num_cpu_blocks": 0, "storage_backend": None, "splitwise_role": "mixed"}
LAYOUT = build_layout(load_model_config(ROOT / QWEN), CacheConfig(), ParallelConfig())

CALLS: dict[str, tuple[Callable[[Platform], object], str]] = {
    "initialize_kv_cache(None, ...)": (
        lambda cpu: initialize_kv_cache(None, kv_request(LAYOUT, 4, instance=SIGNAL, **MIXED)),
        "platform is not given; allowed: a Platform",
    ),
    "initialize_kv_cache(cpu, None, ...)": (
        lambda cpu: initialize_kv_cache(cpu, kv_request(None, 4, instance=SIGNAL, **MIXED)),
        "layout is not given; allowed: a CacheLayout",
    ),
    "initialize_kv_cache(cpu, layout, '4', ...)": (
        lambda cpu: initialize_kv_cache(cpu, kv_request(LAYOUT, "4", instance=SIGNAL, **MIXED)),
        "num_blocks='4' is not valid",
    ),
    "manage_kv_cache(None, ...)": (
        lambda cpu: manage_kv_cache(None, kv_request(LAYOUT, 4, num_cpu_blocks=0, instance=SIGNAL)),
        "platform is not given; allowed: a Platform",
    ),
    "manage_kv_cache(cpu, 'layout', ...)": (
        lambda cpu: manage_kv_cache(cpu, kv_request("layout", 4, num_cpu_blocks=0, instance=SIGNAL)),
        "layout='layout' is not valid; allowed: a CacheLayout",
    ),
    "manage_kv_cache(num_cpu_blocks=-1)": (
        lambda cpu: manage_kv_cache(cpu, kv_request(LAYOUT, 4, num_cpu_blocks=-1, instance=SIGNAL)),
        "num_cpu_blocks=-1 is not valid; allowed: an integer from 0",
    ),
    "allocate_kv_cache(None, ...)": (lambda cpu: allocate_kv_cache(None, 4, "cpu"), "layout is not given"),
    "allocate_kv_cache(device=None)": (lambda cpu: allocate_kv_cache(LAYOUT, 4, None), "device is not given"),
}


@pytest.mark.parametrize("case", list(CALLS))
def test_an_engine_argument_of_the_wrong_type_is_a_config_error_naming_it(cpu: Platform, case: str) -> None:
    call, says = CALLS[case]
    with pytest.raises(ConfigError) as info:
        call(cpu)
    assert says in str(info.value) and "Fix:" in str(info.value)
