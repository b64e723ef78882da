"""An engine states its own rule version: one call, validated, refused on a name clash, held to the drift guard
like the built-in ones, and used wherever a version is (the decision, who attaches, the CLI)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from drift_plugins import drifting
from engine_processes import qwen_layout
from kv_requests import kv_request
from run_helpers import main_in_process

from fd_platforms.contract.errors import ConfigError, PlatformDriftError
from fd_platforms.engine import register_rule_version
from fd_platforms.loading.selection import select_platform
from fd_platforms.rules.decision import RULE_VERSIONS, DecisionInputs, decide_cache_creation
from fd_platforms.rules.roles import TRANSFER_MANAGER, WORKER, cache_roles

#: Knows the built-in versions only: for any other it creates (a plugin written before the engine's version).
BUILTIN_ONLY = """    if rule not in ("2026-01", "2026-04", "2026-06"):
        return CacheDecision(True, "profile" if profile else "none", "a version this plugin does not know: it creates")
    return decide_cache_creation(profile=profile, num_cpu_blocks=num_cpu_blocks,
                                 storage_backend=storage_backend, splitwise_role=splitwise_role, rule=rule)
"""


@pytest.fixture(autouse=True)
def versions_restored() -> Iterator[None]:
    """The versions this process knows, as they were before the test."""
    before = dict(RULE_VERSIONS)
    yield
    RULE_VERSIONS.clear()
    RULE_VERSIONS.update(before)


def engine_version(name: str = "engine-1", **kwargs: object) -> None:
    register_rule_version(name, ("storage_backend", "splitwise_role"), origin="the test engine's", **kwargs)


def test_a_registered_version_decides_and_places_the_cache_like_a_built_in_one() -> None:
    engine_version(transfer_terms=("num_cpu_blocks",))  # a storage backend alone starts no transfer manager
    swap = DecisionInputs(False, 64, None, "mixed", "engine-1")
    assert decide_cache_creation(**swap.kwargs()).create
    assert (cache_roles(swap).creator, cache_roles(swap).attachers) == (WORKER, (TRANSFER_MANAGER,))
    storage = DecisionInputs(False, 0, "file", "decode", "engine-1")
    assert cache_roles(storage).attachers == (WORKER,)
    request = kv_request(qwen_layout(), 4, rule="engine-1", num_cpu_blocks=64, instance="9923", protocol="fastdeploy")
    assert request.inputs.rule == "engine-1"


def test_the_cli_lists_it_beside_the_built_in_ones() -> None:
    engine_version()
    listed = json.loads(main_in_process("rules", "--json").stdout)["versions"]
    assert [v["name"] for v in listed] == ["2026-01", "2026-04", "2026-06", "engine-1"]
    assert listed[-1]["origin"] == "the test engine's"


@pytest.mark.parametrize(
    ("arguments", "field", "fragment"),
    [
        ({"name": "2026-06"}, "name", "2026-01, 2026-04, 2026-06 are taken"),
        ({"name": "has space"}, "name", "letters, digits"),
        ({"name": 7}, "name", "letters, digits"),
        ({"attach_terms": ()}, "attach_terms", "at least one"),
        ({"attach_terms": ("splitwise_role", "splitwise_role")}, "attach_terms", "distinct"),
        ({"attach_terms": ("gpu_count", "splitwise_role")}, "attach_terms", "distinct terms of"),
        ({"attach_terms": "splitwise_role"}, "attach_terms", "a tuple"),
        ({"attach_terms": ("num_cpu_blocks",)}, "attach_terms", "allocate it twice"),
        ({"transfer_terms": ("splitwise_role",)}, "transfer_terms", "num_cpu_blocks, storage_backend"),
        ({"origin": " "}, "origin", "a sentence"),
    ],
)
def test_a_bad_version_is_refused_naming_the_argument(arguments: dict[str, object], field: str, fragment: str) -> None:
    given: dict[str, object] = {
        "name": "engine-2",
        "attach_terms": ("splitwise_role",),
        "origin": "the test's",
        **arguments,
    }
    name, terms = given.pop("name"), given.pop("attach_terms")
    with pytest.raises(ConfigError) as caught:
        register_rule_version(name, terms, **given)  # type: ignore[arg-type]
    assert caught.value.field == field and fragment in str(caught.value), str(caught.value)
    assert list(RULE_VERSIONS) == ["2026-01", "2026-04", "2026-06"], "nothing was registered"


def test_a_plugin_loaded_before_the_version_is_held_to_it_at_its_first_decision(make_plugin) -> None:
    drifting(make_plugin, "oldplugin", BUILTIN_ONLY)
    platform = select_platform({"FD_PLATFORM": "oldplugin"}).platform  # faithful to every built-in version
    engine_version()
    with pytest.raises(PlatformDriftError) as caught:
        platform.should_create_cache_tensor(
            profile=False, num_cpu_blocks=0, storage_backend=None, splitwise_role="mixed", rule="engine-1"
        )
    assert "(version engine-1) in 22 of 48 cases" in str(caught.value)  # P/D, and storage in mixed, unprofiled


def test_a_plugin_loaded_after_the_version_is_refused_at_load(make_plugin) -> None:
    engine_version()
    drifting(make_plugin, "oldplugin", BUILTIN_ONLY)
    with pytest.raises(PlatformDriftError, match=r"version engine-1"):
        select_platform({"FD_PLATFORM": "oldplugin"})
