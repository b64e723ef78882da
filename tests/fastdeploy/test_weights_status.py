"""``follow_model_weights_status``, our runners' side of FastDeploy's RL flow.

In ``fd_platforms.fastdeploy.weights_status``: its arguments are checked before any signal is touched.
"""

from __future__ import annotations

import pytest

from fd_platforms.contract.errors import ConfigError
from fd_platforms.fastdeploy import follow_model_weights_status


def nothing() -> None:
    return None


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"instance": "9923", "rank": -1}, "rank"),
        ({"instance": "9923", "rank": True}, "rank"),
        ({"instance": "9923", "rank": 0, "clear": "clear"}, "clear"),
        ({"instance": "9923", "rank": 0, "barrier": 3}, "barrier"),
        ({"instance": "9923", "rank": 0, "timeout": -1}, "timeout"),
        ({"instance": "9923", "rank": 0, "managers": "vllm"}, "managers"),
        ({"instance": "9923", "rank": 0, "tp": 0}, "tp"),
        ({"instance": "9923", "rank": 0, "creator_pid": 0}, "creator_pid"),
        ({"instance": "9923", "rank": 0, "creator_pid": 2**70}, "creator_pid"),  # beyond the kernel's pid range
        ({"instance": "../x", "rank": 0}, "instance"),
    ],
)
def test_follow_model_weights_status_checks_its_arguments_before_touching_a_signal(
    arguments: dict[str, object], field: str
) -> None:
    """No signal of suffix 9923 exists here: a check that came after the attach would be a CacheSignalError."""
    given = {"clear": nothing, "restore": nothing, "until": lambda: True, **arguments}
    with pytest.raises(ConfigError) as caught:
        follow_model_weights_status(**given)  # type: ignore[arg-type]
    assert field in str(caught.value) and "Fix:" in str(caught.value)
