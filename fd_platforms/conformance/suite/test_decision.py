"""``should_create_cache_tensor`` answers exactly as the core rule on all 24 cases."""

from __future__ import annotations

import pytest

from ...contract.errors import ConfigError
from ...contract.types import CacheDecision
from ...loading.platform import Platform
from ...rules.decision import RULE, TRUTH_TABLE, DecisionInputs, decide_cache_creation
from ...rules.drift import decision_drift, drift_error
from . import hooks


@hooks("should_create_cache_tensor")
@pytest.mark.parametrize("inputs", TRUTH_TABLE, ids=str)
def test_answers_as_the_rule(fd_platform: Platform, inputs: DecisionInputs) -> None:
    expected = decide_cache_creation(**inputs.kwargs())
    got = fd_platform.should_create_cache_tensor(**inputs.kwargs())
    assert isinstance(got, CacheDecision)
    assert (got.create, got.deciding_term) == (expected.create, expected.deciding_term), (
        f"{inputs}: the rule `{RULE}` gives create={expected.create} ({expected.deciding_term}), "
        f"the platform create={got.create} ({got.deciding_term})"
    )


@hooks("should_create_cache_tensor")
def test_the_drift_guard_would_accept_it(fd_platform: Platform) -> None:
    drifts = decision_drift(fd_platform)
    assert not drifts, str(drift_error(fd_platform, drifts))


@hooks("should_create_cache_tensor")
@pytest.mark.parametrize(
    ("field", "value"), [("splitwise_role", "both"), ("storage_backend", "redis"), ("num_cpu_blocks", -1)]
)
def test_bad_inputs_are_config_errors(fd_platform: Platform, field: str, value: object) -> None:
    inputs = {"profile": False, "num_cpu_blocks": 0, "storage_backend": None, "splitwise_role": "mixed", field: value}
    with pytest.raises(ConfigError, match="Fix:"):
        fd_platform.should_create_cache_tensor(**inputs)
