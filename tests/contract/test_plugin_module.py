"""The plugin API in one module (``fd_platforms.plugin``, API 1.5), and the module paths plugins used
before it: API 1.1's import again as deprecated aliases, so a plugin written against the 1.1 guide
loads, passes the version check and runs on a core that says it provides API 1.x."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from run_helpers import QWEN, ROOT, check_rank, clean_env, qwen_bytes_per_block, run_json

import fd_platforms.plugin
from fd_platforms import aliases
from fd_platforms.contract.api_version import DEPRECATED_PLUGIN_MODULES, PLUGIN_API_MODULES
from fd_platforms.contract.errors import PlatformUnavailableError
from fd_platforms.loading.selection import select_platform, survey

ALIAS_PATHS = sorted(path for path, kind in DEPRECATED_PLUGIN_MODULES.items() if kind == "alias")
GUIDE = (ROOT / "docs" / "writing-a-plugin.md").read_text()

# What each of API 1.1's modules held for plugins, as the 1.1 guide listed it (section 2's table,
# and sections 5 and 6 for the records and errors); every name still exists.
DOCUMENTED_IN_1_1 = {
    "fd_platforms.types": "PlatformIdentity Detection CacheDecision DeviceMemory PlatformLimit Plan HostBuffer "
    "SharedTensor",
    "fd_platforms.errors": "ConfigError HostAllocError DeviceFactsUnavailableError PluginHookError PluginContractError "
    "PluginVersionError PlatformDriftError PluginTimeoutError CacheSharingError RecordError",
    "fd_platforms.probes": "RuntimeFacts installed_distribution device_nodes visible_count",
    "fd_platforms.paddle_platform": "PaddlePlatform",
    "fd_platforms.device_facts": "DeviceFacts PinningUnavailable pinned_tensor_buffer import_paddle share_ipc_tensor "
    "open_ipc_tensor",
    "fd_platforms.custom_device": "CustomDeviceFacts",
    "fd_platforms.vendor_host": "VendorHostRuntime",
    "fd_platforms.host_memory": "allocate_host allocate_pageable",
    "fd_platforms.host_sharing": "export_host_tensor open_host_tensor",
}


@pytest.fixture
def fresh_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of the alias modules imported yet: an alias warns when it is first imported in a process."""
    for path in ALIAS_PATHS:
        monkeypatch.delitem(sys.modules, path, raising=False)


# --- fd_platforms.plugin -------------------------------------------------------------------------


def test_the_plugin_module_is_the_one_public_module() -> None:
    assert PLUGIN_API_MODULES == ("fd_platforms.plugin",)


def test_the_plugin_api_is_at_most_40_names_each_resolving() -> None:
    names = fd_platforms.plugin.__all__
    assert len(names) <= 40 and len(set(names)) == len(names)
    for name in names:
        assert getattr(fd_platforms.plugin, name) is not None, name
    star: dict[str, object] = {}
    exec("from fd_platforms.plugin import *", star)
    assert set(star) - {"__builtins__"} == set(names)


@pytest.mark.parametrize("name", fd_platforms.plugin.__all__)
def test_every_plugin_api_name_is_in_the_guide(name: str) -> None:
    assert f"`{name}`" in GUIDE or f"`{name}(" in GUIDE, f"docs/writing-a-plugin.md does not name {name}"


def test_importing_the_plugin_module_imports_neither_paddle_nor_numpy() -> None:
    code = "import fd_platforms.plugin, sys; assert not {'paddle', 'numpy'} & set(sys.modules), sys.modules.keys()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_importing_fd_platforms_installs_the_aliases_and_nothing_else() -> None:
    code = (
        "import sys, fd_platforms\n"
        "print(sorted(m for m in sys.modules if m.startswith('fd_platforms.')), 'pluggy' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['fd_platforms.aliases'] False"


# --- API 1.1's module paths ----------------------------------------------------------------------


def test_the_alias_table_is_the_deprecated_list() -> None:
    assert sorted(f"fd_platforms.{name}" for name in aliases.ALIASES) == ALIAS_PATHS
    assert sorted(DOCUMENTED_IN_1_1) == ALIAS_PATHS


@pytest.mark.parametrize("path", ALIAS_PATHS)
def test_a_1_1_module_path_imports_warning_and_naming_fd_platforms_plugin(fresh_aliases: None, path: str) -> None:
    with pytest.warns(DeprecationWarning, match=r"from fd_platforms\.plugin import ") as caught:
        module = importlib.import_module(path)
    [warning] = caught
    assert warning.filename == __file__, "the warning points at the importer, past importlib"
    assert f"{path} is deprecated" in str(warning.message) and "plugin API 2.0" in str(warning.message)
    instead = aliases.ALIASES[path.rpartition(".")[2]][0].split()
    for name in (*DOCUMENTED_IN_1_1[path].split(), *instead):
        assert hasattr(module, name), f"{path} lacks {name}"
    for name in instead:  # the warning's replacement holds the same object
        assert getattr(fd_platforms.plugin, name) is getattr(module, name)
    for name in module.__all__:
        assert getattr(module, name) is not None


@pytest.mark.parametrize("path", ALIAS_PATHS)
def test_from_a_1_1_path_import_names_warns_at_the_importing_line(fresh_aliases: None, path: str) -> None:
    name = DOCUMENTED_IN_1_1[path].split()[0]
    namespace: dict[str, object] = {"__name__": "old_plugin"}
    with pytest.warns(DeprecationWarning, match=r"fd_platforms\.plugin") as caught:
        exec(compile(f"\n\nfrom {path} import {name}\n", "old_plugin.py", "exec"), namespace)
    assert [(w.filename, w.lineno) for w in caught] == [("old_plugin.py", 3)]
    assert namespace[name] is getattr(importlib.import_module(path), name)


def test_the_aliases_hold_the_same_objects_as_the_new_modules(fresh_aliases: None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import fd_platforms.device_facts as old
        from fd_platforms.types import Detection
    from fd_platforms.contract.types import Detection as NewDetection
    from fd_platforms.kit.host_memory import PinningUnavailable

    assert Detection is NewDetection and old.PinningUnavailable is PinningUnavailable
    assert old.import_paddle is fd_platforms.plugin.import_paddle


def test_under_w_error_an_alias_import_fails_with_the_deprecation(tmp_path: Path) -> None:
    (tmp_path / "old_plugin.py").write_text('"""Written for API 1.1."""\nfrom fd_platforms.types import Detection\n')
    run = lambda flag: subprocess.run(  # noqa: E731
        [sys.executable, "-W", flag, "-c", "import old_plugin"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    failed = run("error::DeprecationWarning")
    assert failed.returncode == 1
    assert "DeprecationWarning: fd_platforms.types is deprecated" in failed.stderr
    assert "from fd_platforms.plugin import PlatformIdentity, Detection," in failed.stderr
    shown = run("always::DeprecationWarning")
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr.startswith(f"{tmp_path / 'old_plugin.py'}:2: DeprecationWarning: fd_platforms.types")


def test_a_path_that_was_never_public_is_still_missing() -> None:
    with pytest.raises(ModuleNotFoundError, match=re.escape("fd_platforms.hostsharing")):
        importlib.import_module("fd_platforms.hostsharing")


# --- plugins written against the 1.1 guide, as they were --------------------------------------

# docs/writing-a-plugin.md at c0fb517 (plugin API 1.1), section 1: the Nimbus record, verbatim.
NIMBUS_1_1 = """from fd_platforms.custom_device import CustomDeviceFacts
from fd_platforms.paddle_platform import PaddlePlatform
from fd_platforms.types import PlatformLimit
from fd_platforms.vendor_host import VendorHostRuntime

PLATFORM = PaddlePlatform(
    name="nimbus",                         # = the entry-point name
    device_type="nimbus_npu",              # Paddle's device type: tensors on "nimbus_npu:<id>"
    visible_devices_env="NIMBUS_VISIBLE_DEVICES",
    distributions=("paddle-nimbus-npu",),  # installing any of these counts as the runtime present
    device_glob=None,                      # or "/dev/nimbus[0-9]*" where device nodes count devices
    install_hint="pip install paddle-nimbus-npu beside paddlepaddle on a machine with Nimbus NPUs",
    api_versions=">=1.0,<2",               # the plugin API versions this plugin supports
    description="Nimbus NPUs",
    custom_device_library="*nimbus*.so",   # a runtime in CUSTOM_DEVICE_ROOT also counts
    limits=(PlatformLimit("max_num_blocks", 65536,
                          "the Nimbus paged-attention kernel's block table holds 65536 entries per rank"),),
    facts=CustomDeviceFacts,               # how Paddle reports the device (see section 4)
    host_runtime=VendorHostRuntime(library="libnimbusrt.so", alloc="nimbusHostAlloc", free="nimbusFreeHost"),
)
"""

# The same guide, section 4: hooks written by hand in a module, verbatim.
HAND_WRITTEN_1_1 = """from fd_platforms import hookimpl
from fd_platforms.types import Detection, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity("nimbus", "nimbus_npu", "NIMBUS_VISIBLE_DEVICES")

@hookimpl
def detect_platform():
    return Detection(False, "no Nimbus runtime. Fix: pip install paddle-nimbus-npu")

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"
"""


def test_the_1_1_samples_here_are_the_1_1_guide_s() -> None:
    done = subprocess.run(
        ["git", "show", "c0fb517:docs/writing-a-plugin.md"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    if done.returncode != 0:
        pytest.skip(f"this checkout has no commit c0fb517 (plugin API 1.1): {done.stderr.strip()}")
    assert f"```python\n{NIMBUS_1_1}```" in done.stdout
    assert f"```python\n{HAND_WRITTEN_1_1}```" in done.stdout


# Both register platform "nimbus", as the example does; installed as an older release of the
# distribution fd-platforms-nimbus, whose metadata comes first on sys.path and so stands for it.
SAMPLES = {"record": (NIMBUS_1_1, "PLATFORM"), "module": (HAND_WRITTEN_1_1, None)}


@pytest.mark.parametrize("sample", SAMPLES)
def test_a_plugin_written_against_the_1_1_guide_loads_and_passes_the_version_check(
    make_plugin, fresh_aliases: None, sample: str
) -> None:
    source, attribute = SAMPLES[sample]
    module = f"fd_platforms_nimbus_api11_{sample}"
    make_plugin("nimbus", source=source, dist="fd-platforms-nimbus", module=module, attribute=attribute)
    with (
        pytest.warns(DeprecationWarning, match=r"from fd_platforms\.plugin import") as caught,
        pytest.raises(PlatformUnavailableError, match="Nimbus") as refused,  # loaded here, in a plugin thread
    ):
        select_platform({"FD_PLATFORM": "nimbus"})
    assert "plugin API" not in str(refused.value), "the version check passed: only detection said no"
    assert {Path(w.filename).name for w in caught} == {f"{module}.py"}, "each warning names the plugin's line"
    [report] = [r for r in survey({"FD_PLATFORM_PLUGINS": "nimbus"}).reports if r.name == "nimbus"]
    assert report.entry_point.split(":")[0] == module, "the 1.1 plugin, not the installed example"
    assert report.status == "unavailable", report.reason  # loaded in the screening child, version accepted
    assert "paddle-nimbus-npu" in report.reason


# A plugin whose cache lives in host memory, shared like cpu's, written with API 1.1's paths (as
# run_helpers.HOST_SHARING_PLUGIN is with today's).
HOST_SHARING_1_1 = """
from fd_platforms import hookimpl
from fd_platforms.errors import DeviceAllocError
from fd_platforms.host_memory import system_memory
from fd_platforms.host_sharing import export_host_tensor, open_host_tensor
from fd_platforms.types import Detection, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity("oldshare", "cpu", None)

@hookimpl
def detect_platform():
    return Detection(True, "host memory, like cpu", 1)

@hookimpl
def supported_api_versions():
    return ">=1.1,<2"

@hookimpl
def device_memory(device_id):
    return system_memory()

@hookimpl
def cache_sharing():
    return "memfds, like cpu"

@hookimpl
def export_cache_tensor(name, shape, dtype):
    return export_host_tensor(name, shape, dtype)

@hookimpl
def open_cache_tensor(name, handle, shape, dtype):
    return open_host_tensor(name, handle, shape, dtype)
"""


@pytest.mark.slow
def test_a_plugin_sharing_its_cache_through_1_1_paths_runs_on_the_cpu_sharing_path(make_plugin) -> None:
    site = make_plugin("oldshare", source=HOST_SHARING_1_1)
    report = run_json(
        "--model",
        QWEN,
        "--tp",
        "1",
        "--device-memory",
        "64MiB",
        "--role",
        "decode",
        env=clean_env(FD_PLATFORM="oldshare", PYTHONPATH=str(site)),
    )
    assert report["platform"] == "oldshare"
    [rank] = report["ranks"]
    check_rank(rank, qwen_bytes_per_block(1), False, "splitwise_role")  # attached to the manager's memfds
    assert report["manager_pid"] is not None
