"""``should_create_cache_tensor`` answers exactly as the core rule, in the pinned version
(``--fd-platform-rule``), on every case of the truth table."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ...contract.errors import ConfigError
from ...contract.types import CacheDecision
from ...loading.platform import Platform
from ...rules.decision import RULE_VERSIONS, TRUTH_TABLE, DecisionInputs, decide_cache_creation
from ...rules.drift import decision_drift, drift_error
from . import hooks


@hooks("should_create_cache_tensor")
@pytest.mark.parametrize("inputs", TRUTH_TABLE, ids=str)
def test_answers_as_the_rule(fd_platform: Platform, fd_platform_rule: str, inputs: DecisionInputs) -> None:
    inputs = replace(inputs, rule=fd_platform_rule)
    expected = decide_cache_creation(**inputs.kwargs())
    got = fd_platform.should_create_cache_tensor(**inputs.kwargs())
    assert isinstance(got, CacheDecision)
    assert (got.create, got.deciding_term) == (expected.create, expected.deciding_term), (
        f"{inputs}: the rule `{RULE_VERSIONS[fd_platform_rule].text}` (version {fd_platform_rule}) gives "
        f"create={expected.create} ({expected.deciding_term}), the platform create={got.create} ({got.deciding_term})"
    )


@hooks("should_create_cache_tensor")
def test_the_drift_guard_would_accept_it(fd_platform: Platform, fd_platform_rule: str) -> None:
    drifts = decision_drift(fd_platform, fd_platform_rule)
    assert not drifts, str(drift_error(fd_platform, drifts))


@hooks("should_create_cache_tensor")
@pytest.mark.parametrize(
    ("field", "value"), [("splitwise_role", "both"), ("storage_backend", "redis"), ("num_cpu_blocks", -1)]
)
def test_bad_inputs_are_config_errors(fd_platform: Platform, field: str, value: Any) -> None:
    inputs = {"profile": False, "num_cpu_blocks": 0, "storage_backend": None, "splitwise_role": "mixed", field: value}
    with pytest.raises(ConfigError, match="Fix:"):
        fd_platform.should_create_cache_tensor(**inputs)
