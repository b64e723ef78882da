"""Who creates a rank's cache and who attaches to it: one answer, under every version, for every caller."""

from __future__ import annotations

import pytest

from fd_platforms.rules.decision import BUILTIN_VERSIONS, TRUTH_TABLE, DecisionInputs, decide_cache_creation
from fd_platforms.rules.roles import MESSAGER, TRANSFER_MANAGER, WORKER, cache_roles

VERSIONS = [version.name for version in BUILTIN_VERSIONS]


def roles(rule: str, num_cpu_blocks: int, backend: str | None, role: str = "mixed") -> tuple[str, tuple[str, ...]]:
    answer = cache_roles(DecisionInputs(False, num_cpu_blocks, backend, role, rule))
    return answer.creator, answer.attachers


def test_a_mixed_instance_puts_the_cache_where_each_version_says() -> None:
    assert roles("2026-01", 64, None) == (TRANSFER_MANAGER, (WORKER,))
    assert roles("2026-04", 64, None) == (WORKER, (TRANSFER_MANAGER,))  # PR #7471
    assert roles("2026-04", 0, "file") == (TRANSFER_MANAGER, (WORKER,))
    assert roles("2026-06", 0, "file") == (WORKER, (TRANSFER_MANAGER,))  # PR #8046: no swap space needed
    assert roles("2026-06", 64, "mooncake") == (WORKER, (TRANSFER_MANAGER,))
    for rule in VERSIONS:
        assert roles(rule, 0, None) == (WORKER, ()), "no swap space nor storage: no transfer manager runs"


@pytest.mark.parametrize("rule", VERSIONS)
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_in_pd_the_messager_creates_and_a_transfer_manager_attaches_beside_the_worker(rule: str, role: str) -> None:
    """prefix_cache_manager.py launch_cache_manager (c1b7c083 ~L297-304): started with swap space or a storage
    backend, never with --create_cache_tensor in P/D."""
    assert roles(rule, 0, None, role) == (MESSAGER, (WORKER,))
    for swap, backend in ((64, None), (0, "file"), (64, "attention_store")):
        assert roles(rule, swap, backend, role) == (MESSAGER, (WORKER, TRANSFER_MANAGER))


@pytest.mark.parametrize("rule", VERSIONS)
def test_over_the_table_the_creator_never_attaches_and_the_worker_attaches_as_the_rule_decides(rule: str) -> None:
    for case in TRUTH_TABLE:
        inputs = DecisionInputs(case.profile, case.num_cpu_blocks, case.storage_backend, case.splitwise_role, rule)
        answer = cache_roles(inputs)
        assert answer.creator not in answer.attachers, inputs
        assert (WORKER in answer.attachers) == (not decide_cache_creation(**inputs.kwargs()).create), inputs
        if inputs.profile:
            assert (answer.creator, answer.attachers) == (WORKER, ())


def test_the_roles_read_as_a_sentence() -> None:
    assert str(cache_roles(DecisionInputs(False, 64, None, "decode"))) == (
        "the cache messager creates; the worker and the cache transfer manager attach"
    )
    assert str(cache_roles(DecisionInputs(False, 0, None, "mixed"))) == "the worker creates; nobody attaches"
