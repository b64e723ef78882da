"""Test-only plugins that answer the create-or-attach rule themselves.

They are the drift guard's cases (tests/rules/test_drift_guard.py).
"""

from __future__ import annotations

from pathlib import Path

ALWAYS_THERE = """
import dataclasses
from fd_platforms import hookimpl
from fd_platforms.contract.types import CacheDecision, Detection, DeviceMemory, PlatformIdentity, PlatformLimit
from fd_platforms.rules.decision import decide_cache_creation
from fd_platforms.rules.planner import plan_blocks

@hookimpl
def platform_identity():
    return PlatformIdentity({name!r}, {name!r}, None)

@hookimpl
def detect_platform():
    return Detection(True, "a device that is always there", 1)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"
"""
PLUGIN = (
    ALWAYS_THERE
    + """
@hookimpl
def should_create_cache_tensor(profile, num_cpu_blocks, storage_backend, splitwise_role, rule):
{body}
"""
)
OLD_XPU_RULE = """    # FastDeploy's old XPU runner: `profile or role == "mixed"`, blind to swap space and storage
    create = profile or splitwise_role == "mixed"
    term = "profile" if profile else ("none" if create else "splitwise_role")
    return CacheDecision(create, term, "the old XPU rule")
"""
SAME_AS_THE_RULE = """    return decide_cache_creation(profile=profile, num_cpu_blocks=num_cpu_blocks,
                                 storage_backend=storage_backend, splitwise_role=splitwise_role, rule=rule)
"""
RAISES_ON_DECODE = """    if splitwise_role == "decode":
        raise RuntimeError("decode is not supported")
    return decide_cache_creation(profile=profile, num_cpu_blocks=num_cpu_blocks,
                                 storage_backend=storage_backend, splitwise_role=splitwise_role, rule=rule)
"""


def drifting(make_plugin, name: str = "oldxpu", body: str = OLD_XPU_RULE) -> Path:
    return make_plugin(name, source=PLUGIN.format(name=name, body=body))
