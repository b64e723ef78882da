"""The two inter-process protocols are two objects behind one interface (fd_platforms.engine.protocols)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from run_helpers import ROOT

from fd_platforms.contract.errors import ConfigError, PluginContractError, PluginLoadError
from fd_platforms.engine.protocols import (
    OURS,
    WireProtocol,
    installed_protocols,
    protocol_named,
    register_protocol,
    registry,
)
from fd_platforms.engine.publication import published_tensor_name
from fd_platforms.fastdeploy import FASTDEPLOY
from fd_platforms.rules.config.settings import PROTOCOLS

BOTH = (OURS, FASTDEPLOY)
OPERATIONS = sorted(WireProtocol.__abstractmethods__)


def parameters(function: object) -> list[tuple[str, object]]:
    return [(parameter.name, parameter.kind) for parameter in inspect.signature(function).parameters.values()]


def test_every_public_method_of_the_interface_is_an_operation_both_must_have() -> None:
    public = sorted(name for name in vars(WireProtocol) if not name.startswith("_") and name != "name")
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
def test_the_lookup_refuses_any_other_name_naming_the_installed_ones_and_the_fix(bad: object) -> None:
    with pytest.raises(ConfigError) as caught:
        protocol_named(bad)
    assert str(caught.value).endswith(
        "is not valid; allowed: one of fastdeploy, fd-platforms. Fix: pass protocol='fastdeploy' beside FastDeploy's "
        "own processes, else leave the default; an engine's own protocol object is passed as it is, or registered by "
        "name first (register_protocol)"
    )
    assert caught.value.field == "protocol" and caught.value.value == bad


def test_each_protocol_checks_its_own_signal_names() -> None:
    OURS.check_instance("fd_cache_ready.engine-8188")
    FASTDEPLOY.check_instance("9923")
    FASTDEPLOY.check_instance(9923)  # FastDeploy's suffix is its engine's port
    with pytest.raises(ConfigError, match=r"^instance="):
        OURS.check_instance("../x")
    with pytest.raises(ConfigError, match=r"^instance="):
        FASTDEPLOY.check_instance("fd_cache_ready.engine-8188")


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


def test_fastdeploys_protocol_resolves_by_name_in_a_process_that_never_imported_its_package() -> None:
    """The engine never imports fd_platforms.fastdeploy; the package's own metadata registers its protocol in the
    ``fd_platforms.protocols`` entry points, imported only when the name is asked for."""
    code = (
        "import sys\n"
        "from fd_platforms.engine.protocols import installed_protocols, protocol_named\n"
        "import fd_platforms.engine\n"
        "print(installed_protocols(), 'fd_platforms.fastdeploy' in sys.modules)\n"
        "found = protocol_named('fastdeploy')\n"
        "from fd_platforms.fastdeploy import FASTDEPLOY\n"
        "print(found is FASTDEPLOY is protocol_named('fastdeploy') is protocol_named(FASTDEPLOY))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['fastdeploy', 'fd-platforms'] False", "True"]


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry as a process starts with it, given back after the test (a loaded protocol stays otherwise)."""
    monkeypatch.setattr(registry, "_known", {OURS.name: OURS})


ACME = """
from fd_platforms.engine.protocols.ours import FdPlatformsProtocol

class AcmeProtocol(FdPlatformsProtocol):
    name = "acme"

PROTOCOL = AcmeProtocol()
"""


def test_a_third_partys_protocol_is_found_by_its_entry_point_and_imported_only_when_asked_for(
    make_plugin, fresh_registry: None
) -> None:
    make_plugin("acme", source=ACME, group=registry.ENTRY_POINT_GROUP, attribute="PROTOCOL", module="fd_test_acme")
    assert installed_protocols() == ["acme", "fastdeploy", "fd-platforms"]
    with pytest.raises(ConfigError) as caught:
        protocol_named("acne")
    assert "allowed: one of acme, fastdeploy, fd-platforms" in str(caught.value)
    assert "fd_test_acme" not in sys.modules, "naming the installed protocols imports none of them"
    found = protocol_named("acme")
    assert found.name == "acme" and protocol_named("acme") is found is sys.modules["fd_test_acme"].PROTOCOL


BROKEN = {
    "raises": ("raise OSError('no wire here')", PluginLoadError, "failed: OSError: no wire here"),
    "exits": ("raise SystemExit(3)", PluginLoadError, "failed: SystemExit(3)"),
    "names no protocol": ("PROTOCOL = 'acme'", PluginContractError, "names 'acme', not a WireProtocol named 'acme'"),
    "names another": (ACME.replace('name = "acme"', 'name = "zeta"'), PluginContractError, "not a WireProtocol"),
    "hides its name in code": (
        ACME.replace('name = "acme"', "name = property(lambda self: 1 / 0)\n    __repr__ = lambda self: 1 / 0"),
        PluginContractError,
        "names <AcmeProtocol whose repr raised ZeroDivisionError>, not a WireProtocol named 'acme'",
    ),
}


@pytest.mark.parametrize(("source", "kind", "says"), BROKEN.values(), ids=BROKEN)
def test_a_broken_third_party_protocol_is_a_plugin_error_naming_it_and_its_distribution(
    make_plugin, fresh_registry: None, source: str, kind: type[Exception], says: str
) -> None:
    make_plugin("acme", source=source, group=registry.ENTRY_POINT_GROUP, attribute="PROTOCOL")
    with pytest.raises(kind) as caught:
        protocol_named("acme")
    message = str(caught.value)
    assert message.startswith("protocol plugin 'acme' (distribution fd-test-acme): ") and says in message, message
    assert "acme" not in registry._known


def test_a_protocol_name_two_distributions_register_is_refused_naming_both(make_plugin, fresh_registry: None) -> None:
    for dist in ("fd-test-acme", "fd-test-acme-fork"):
        make_plugin("acme", source=ACME, group=registry.ENTRY_POINT_GROUP, attribute="PROTOCOL", dist=dist)
    with pytest.raises(ConfigError) as caught:
        protocol_named("acme")
    assert "2 do: fd-test-acme 1.0 and fd-test-acme-fork 1.0" in str(caught.value)


def test_an_engines_own_protocol_is_registered_by_name_unless_the_name_is_taken(fresh_registry: None) -> None:
    class Ours2(type(OURS)):  # type: ignore[misc]
        name = "engine-own"

    own = Ours2()
    register_protocol(own)
    register_protocol(own)  # the same object again: nothing changes
    assert protocol_named("engine-own") is own and "engine-own" in installed_protocols()

    class Impostor(type(FASTDEPLOY)):  # type: ignore[misc]
        pass

    with pytest.raises(ConfigError) as caught:
        register_protocol(Impostor())
    assert caught.value.field == "protocol.name" and "installed by fd-platforms" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        register_protocol(Ours2())
    assert caught.value.field == "protocol.name" and "registered already" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        register_protocol("fastdeploy")
    assert caught.value.field == "protocol" and "Fix: pass the engine's protocol object" in str(caught.value)


class _Raising:
    def __get__(self, obj: object, owner: object) -> str:
        raise RuntimeError("a name that runs code")


class _Text(str):
    pass


@pytest.mark.parametrize("name", [5, None, "", " padded", "two words", _Text("subclass"), _Raising()])
def test_a_protocol_whose_name_is_no_plain_text_is_refused_and_later_refusals_stay_typed(
    fresh_registry: None, name: object
) -> None:
    class Named(type(OURS)):  # type: ignore[misc]
        pass

    Named.name = name  # type: ignore[attr-defined]
    with pytest.raises(ConfigError) as caught:
        register_protocol(Named())
    assert caught.value.field == "protocol.name" and "plain text without spaces" in str(caught.value)
    with pytest.raises(ConfigError, match="protocol='no-such' is not valid"):
        protocol_named("no-such")  # the refused one left nothing that breaks the list of names
