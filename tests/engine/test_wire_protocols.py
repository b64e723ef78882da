"""The two inter-process protocols are two objects behind one interface (fd_platforms.engine.protocols)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from run_helpers import ROOT

from fd_platforms.contract.errors import ConfigError
from fd_platforms.engine.protocols import OURS, WireProtocol, protocol_named, register_protocol
from fd_platforms.engine.publication import published_tensor_name
from fd_platforms.fastdeploy import FASTDEPLOY
from fd_platforms.rules.config.settings import PROTOCOLS

BOTH = (OURS, FASTDEPLOY)
OPERATIONS = sorted(WireProtocol.__abstractmethods__)


def parameters(function: object) -> list[tuple[str, object]]:
    return [(parameter.name, parameter.kind) for parameter in inspect.signature(function).parameters.values()]


def test_every_public_method_of_the_interface_is_an_operation_both_must_have() -> None:
    # what a protocol is called, the keyword its engine calls name the instance by, and the old ones it still takes
    attributes = ("name", "name_argument", "old_keywords", "check_signal_name")  # the last: deprecated, check_instance
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
        "is not valid; allowed: one of fastdeploy, fd-platforms. Fix: pass protocol='fastdeploy' beside FastDeploy's "
        "own processes (import fd_platforms.fastdeploy first), else leave the default"
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


def test_fastdeploys_protocol_resolves_by_name_only_once_its_package_registered_it() -> None:
    """The engine never imports fd_platforms.fastdeploy: in a process that has not imported it, the name is a
    ConfigError naming the import (or the object) as the fix; importing the package registers it."""
    code = (
        "import sys\n"
        "from fd_platforms.contract.errors import ConfigError\n"
        "from fd_platforms.engine.protocols import protocol_named\n"
        "import fd_platforms.engine\n"
        "assert 'fd_platforms.fastdeploy' not in sys.modules, 'the engine imported FastDeploy\\'s package'\n"
        "try:\n"
        "    protocol_named('fastdeploy')\n"
        "except ConfigError as error:\n"
        "    print('refused:', error)\n"
        "from fd_platforms.fastdeploy import FASTDEPLOY\n"
        "print('registered:', protocol_named('fastdeploy') is FASTDEPLOY is protocol_named(FASTDEPLOY))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    refused, registered = done.stdout.splitlines()
    assert "protocol='fastdeploy' is not valid" in refused
    assert "Fix: import fd_platforms.fastdeploy before naming it" in refused
    assert "from fd_platforms.fastdeploy import FASTDEPLOY" in refused
    assert registered == "registered: True"


def test_a_second_protocol_of_a_registered_name_is_refused() -> None:
    class Impostor(type(FASTDEPLOY)):  # type: ignore[misc]
        pass

    with pytest.raises(ValueError, match="a protocol named 'fastdeploy' is registered already"):
        register_protocol(Impostor())
    with pytest.raises(TypeError, match="register_protocol takes a WireProtocol"):
        register_protocol("fastdeploy")  # type: ignore[arg-type]


MOVED_PATHS = [
    ("fd_platforms.rules.fastdeploy_config", "from_fd_config", "fd_platforms.fastdeploy.config"),
    ("fd_platforms.ipc.fastdeploy_signals", "FastDeploySignal", "fd_platforms.fastdeploy.signals"),
    ("fd_platforms.engine.cache_status", "drive_kv_cache_clear", "fd_platforms.fastdeploy.cache_status"),
    ("fd_platforms.engine.fastdeploy_handles", "FastDeployHandles", "fd_platforms.fastdeploy.handles"),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED_PATHS)
def test_a_moved_module_imports_from_its_old_path_with_a_warning_at_the_importer(old: str, name: str, new: str) -> None:
    code = (
        "import warnings\nwarnings.simplefilter('error', DeprecationWarning)\n"
        f"import importlib\ntry:\n    from {old} import {name}\n"
        "except DeprecationWarning as w:\n    print('warned:', w)\n"
        f"warnings.simplefilter('ignore')\nfrom {old} import {name} as old\nfrom {new} import {name} as new\n"
        "print('same:', old is new)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    warned, same = done.stdout.splitlines()
    assert f"warned: {old} is deprecated: it moved to {new} in fd-platforms 0.2" in warned and "goes in 0.3" in warned
    assert same == "same: True"


@pytest.mark.parametrize(
    "name", ["drive_kv_cache_clear", "serve_kv_cache_status", "hand_off_block_count", "UpdateReport"]
)
def test_fastdeploys_names_on_the_engine_module_warn_and_are_the_same_objects(name: str) -> None:
    import fd_platforms.engine
    import fd_platforms.fastdeploy

    with pytest.warns(
        DeprecationWarning, match=f"fd_platforms.engine.{name} is deprecated: it moved to fd_platforms.fastdeploy"
    ) as caught:
        found = getattr(fd_platforms.engine, name)
    assert found is getattr(fd_platforms.fastdeploy, name)
    assert caught[0].filename == __file__, "the warning names the user's line"
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        fd_platforms.engine.no_such_name  # noqa: B018
