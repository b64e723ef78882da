"""The one decision rule: all 24 input combinations, the deciding term, and bad values."""

from __future__ import annotations

import itertools

import pytest

from fd_platforms.contract.errors import ConfigError
from fd_platforms.rules.decision import decide_cache_creation

ROLES = ("mixed", "prefill", "decode")

# Only two kinds of case create the cache: every profiling run, and the plain mixed instance.
CREATORS = {(True, cpu, backend, role) for cpu in (0, 64) for backend in (None, "mooncake") for role in ROLES}
CREATORS.add((False, 0, None, "mixed"))


@pytest.mark.parametrize(
    ("profile", "num_cpu_blocks", "backend", "role"),
    list(itertools.product((False, True), (0, 64), (None, "mooncake"), ROLES)),
)
def test_truth_table(profile: bool, num_cpu_blocks: int, backend: str | None, role: str) -> None:
    decision = decide_cache_creation(
        profile=profile, num_cpu_blocks=num_cpu_blocks, storage_backend=backend, splitwise_role=role
    )
    assert decision.create is ((profile, num_cpu_blocks, backend, role) in CREATORS)


def test_truth_table_size() -> None:
    assert len(CREATORS) == 13  # 12 profiling cases + 1 mixed instance, out of 24


@pytest.mark.parametrize(
    ("kwargs", "term", "words"),
    [
        (
            {"profile": True, "num_cpu_blocks": 8, "storage_backend": "file", "splitwise_role": "decode"},
            "profile",
            "profiling",
        ),
        (
            {"profile": False, "num_cpu_blocks": 8, "storage_backend": "file", "splitwise_role": "decode"},
            "num_cpu_blocks",
            "8 CPU blocks",
        ),
        (
            {"profile": False, "num_cpu_blocks": 0, "storage_backend": "attention_store", "splitwise_role": "mixed"},
            "storage_backend",
            "attention_store",
        ),
        (
            {"profile": False, "num_cpu_blocks": 0, "storage_backend": None, "splitwise_role": "prefill"},
            "splitwise_role",
            "prefill",
        ),
        (
            {"profile": False, "num_cpu_blocks": 0, "storage_backend": None, "splitwise_role": "mixed"},
            "none",
            "worker creates",
        ),
    ],
)
def test_the_deciding_term_is_named(kwargs: dict, term: str, words: str) -> None:
    decision = decide_cache_creation(**kwargs)
    assert decision.deciding_term == term and words in decision.reason


@pytest.mark.parametrize(
    ("field", "value"),
    [("splitwise_role", "both"), ("storage_backend", "redis"), ("num_cpu_blocks", -1), ("profile", "yes")],
)
def test_bad_values_name_the_field(field: str, value: object) -> None:
    kwargs = {"profile": False, "num_cpu_blocks": 0, "storage_backend": None, "splitwise_role": "mixed", field: value}
    with pytest.raises(ConfigError) as info:
        decide_cache_creation(**kwargs)
    assert repr(value) in str(info.value) and "Fix:" in str(info.value)
    assert info.value.field in {field, "kvcache_storage_backend"}
