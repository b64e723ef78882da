"""The two inter-process protocols are two objects behind one interface (fd_platforms.engine.protocols)."""

from __future__ import annotations

import inspect

import pytest

from fd_platforms.contract.errors import ConfigError
from fd_platforms.engine.protocols import FASTDEPLOY, OURS, WireProtocol, protocol_named
from fd_platforms.engine.publication import published_tensor_name
from fd_platforms.rules.config.settings import PROTOCOLS

BOTH = (OURS, FASTDEPLOY)
OPERATIONS = sorted(WireProtocol.__abstractmethods__)


def parameters(function: object) -> list[tuple[str, object]]:
    return [(parameter.name, parameter.kind) for parameter in inspect.signature(function).parameters.values()]


def test_every_public_method_of_the_interface_is_an_operation_both_must_have() -> None:
    attributes = ("name", "name_argument")  # what each protocol states, not an operation
    public = sorted(name for name in vars(WireProtocol) if not name.startswith("_") and name not in attributes)
    assert public == OPERATIONS


@pytest.mark.parametrize("protocol", BOTH, ids=lambda protocol: protocol.name)
@pytest.mark.parametrize("operation", OPERATIONS)
def test_both_protocols_implement_every_operation_as_the_interface_spells_it(
    protocol: WireProtocol, operation: str
) -> None:
    assert isinstance(protocol, WireProtocol)
    implemented = getattr(type(protocol), operation)
    assert not getattr(implemented, "__isabstractmethod__", False)
    assert parameters(implemented) == parameters(getattr(WireProtocol, operation))


def test_the_objects_are_the_config_vocabulary_in_its_order_and_the_lookup_finds_each() -> None:
    assert tuple(protocol.name for protocol in BOTH) == PROTOCOLS
    assert all(protocol_named(protocol.name) is protocol for protocol in BOTH)


@pytest.mark.parametrize("bad", ["FastDeploy", "", 3, ["fastdeploy"]])
def test_the_lookup_refuses_any_other_name_naming_the_choices_and_the_fix(bad: object) -> None:
    with pytest.raises(ConfigError) as caught:
        protocol_named(bad)
    assert str(caught.value).endswith(
        "is not valid; allowed: one of fd-platforms, fastdeploy. "
        "Fix: pass protocol='fastdeploy' beside FastDeploy's own processes, else leave the default"
    )
    assert caught.value.field == "protocol" and caught.value.value == bad


def test_each_protocol_checks_its_own_signal_names() -> None:
    OURS.check_signal_name("fd_cache_ready.engine-8188")
    FASTDEPLOY.check_signal_name("9923")
    FASTDEPLOY.check_signal_name(9923)  # FastDeploy's suffix is its engine's port
    with pytest.raises(ConfigError, match="^signal_name="):
        OURS.check_signal_name("../x")
    with pytest.raises(ConfigError, match="^suffix="):
        FASTDEPLOY.check_signal_name("fd_cache_ready.engine-8188")


def test_tensors_are_named_by_our_instance_or_as_fastdeploys_layout_names_them() -> None:
    layout_name = "key_caches_0_rank0.device0"
    assert OURS.tensor_name("fd_cache_ready.e1", layout_name) == published_tensor_name("fd_cache_ready.e1", layout_name)
    assert FASTDEPLOY.tensor_name("9923", layout_name) == layout_name


def test_the_steps_only_fastdeploy_has_are_no_ops_under_ours() -> None:
    missing = "fd_cache_ready.nobody-made-this"  # any shared memory touched would be a CacheSignalError
    OURS.manager_up(missing, 0, swap=True)
    OURS.manager_swap_freed(missing, 0)
    nobody = {"block_count_suffix": "nobody", "platform": None, "ranks": 2}
    assert OURS.hand_off_block_count(missing, 8, **nobody) is None  # type: ignore[arg-type]
    FASTDEPLOY.reclaim("nobody-made-this")
