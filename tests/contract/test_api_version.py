"""The plugin API version contract: a plugin declares the range it supports; others are refused."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fd_platforms
from fd_platforms.contract.api_version import (
    API_VERSION,
    PLUGIN_API_MODULES,
    release_range_contains,
)
from fd_platforms.contract.errors import PluginContractError, PluginHookError, PluginVersionError
from fd_platforms.loading.discovery import core_version
from fd_platforms.loading.selection import select_platform, survey

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = """
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity("future", "future_npu", None)

@hookimpl
def detect_platform():
    return Detection(True, "future device present", 1)
"""


def versioned(make_plugin, declared: object) -> None:
    make_plugin("future", source=PLUGIN + f"\n@hookimpl\ndef supported_api_versions():\n    return {declared!r}\n")


def test_the_api_version_is_exported_lazily() -> None:
    assert fd_platforms.API_VERSION == API_VERSION == "1.0"


@pytest.mark.parametrize("declared", [">=1.0,<2", ">=0.9", "==1.*", "~=1.0"])
def test_a_range_holding_the_core_api_is_accepted(make_plugin, declared: str) -> None:
    versioned(make_plugin, declared)
    assert select_platform({"FD_PLATFORM": "future"}).platform.name == "future"


def test_an_incompatible_plugin_is_refused_naming_both_versions_and_the_fix(make_plugin) -> None:
    versioned(make_plugin, ">=2.0,<3")
    with pytest.raises(PluginVersionError) as info:
        select_platform({"FD_PLATFORM": "future"})
    message = str(info.value)
    assert info.value.exit_code == 2 and "fd-test-future" in message
    assert "supports fd-platforms plugin API >=2.0,<3" in message
    assert f"the installed fd-platforms {core_version()} provides plugin API {API_VERSION}" in message
    assert "Fix: install a release of fd-test-future that supports API 1.0" in message


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_an_incompatible_plugin_is_listed_as_broken_and_not_detected(make_plugin) -> None:
    versioned(make_plugin, "<1.0")
    assert select_platform({}).platform.name == "cpu"
    report = {r.name: r for r in survey({}).reports}["future"]
    assert report.status == "broken" and "provides plugin API 1.0" in report.reason


@pytest.mark.parametrize("declared", ["1.x", "", 1.0, None])
def test_a_declaration_that_is_not_a_specifier_is_a_contract_error(make_plugin, declared: object) -> None:
    versioned(make_plugin, declared)
    with pytest.raises(PluginContractError, match=r"supported_api_versions returned .*Fix: return"):
        select_platform({"FD_PLATFORM": "future"})


def test_a_plugin_without_a_declaration_is_refused(make_plugin) -> None:
    make_plugin("future", source=PLUGIN)
    with pytest.raises(PluginHookError, match=r"required hook.*supported_api_versions not implemented"):
        select_platform({"FD_PLATFORM": "future"})


def _imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


@pytest.mark.parametrize(
    "package",
    [
        "examples/plugin-template/src/fd_platforms_nimbus",
        *(
            f"plugins/{name}/fd_platforms_{name}"
            for name in ("cuda", "xpu", "iluvatar", "metax", "dcu", "gcu", "intel_hpu", "npu")
        ),
    ],
)
def test_plugins_import_only_the_public_plugin_api(package: str) -> None:
    for source in (ROOT / package).rglob("*.py"):
        core = {m for m in _imported_modules(source) if m.split(".")[0] == "fd_platforms"}
        assert core <= set(PLUGIN_API_MODULES), f"{source} imports non-public {sorted(core - set(PLUGIN_API_MODULES))}"


@pytest.mark.parametrize(
    "module",
    [
        "fd_platforms_nimbus",
        "fd_platforms_cuda",
        "fd_platforms_xpu",
        "fd_platforms_iluvatar",
        "fd_platforms_metax",
        "fd_platforms_dcu",
        "fd_platforms_gcu",
        "fd_platforms_intel_hpu",
        "fd_platforms_npu",
    ],
)
def test_every_in_repo_plugin_loads_under_plugin_api_1_0_and_every_later_1_x(module: str) -> None:
    """The first release's plugin API is 1.0: each plugin's range holds it and every 1.x after it, and no 2.x."""
    declared = importlib.import_module(module).PLATFORM.api_versions
    holds = {version: release_range_contains(declared, version) for version in ("0.9", "1.0", "1.7", "2.0")}
    assert holds == {"0.9": False, "1.0": True, "1.7": True, "2.0": False}, declared


VERSIONS = st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=4).map(
    lambda parts: ".".join(map(str, parts))
)
CLAUSES = st.tuples(st.sampled_from([">=", "<=", "==", "!=", "<", ">"]), VERSIONS, st.sampled_from(["", " "])).map(
    lambda c: f"{c[2]}{c[0]}{c[2]}{c[1]}{c[2]}"
)


@given(st.lists(CLAUSES, min_size=1, max_size=3).map(",".join), VERSIONS)
def test_the_fast_range_check_is_packagings_answer(declared: str, version: str) -> None:
    from packaging.specifiers import SpecifierSet

    assert release_range_contains(declared, version) == SpecifierSet(declared).contains(version, prereleases=True)


@pytest.mark.parametrize("declared", ["~=1.0", "==1.*", "===1.1", ">=1.0,", ">=1.0.dev1", ">=1.0rc1,<2", "", ">=x"])
def test_any_other_form_is_left_to_packaging(declared: str) -> None:
    assert release_range_contains(declared, "1.1") is None


GUIDE = (ROOT / "docs" / "writing-a-plugin.md").read_text()
GUIDE_API = GUIDE[GUIDE.index("## 2. The public plugin API") : GUIDE.index("## 3. The hooks")]


@pytest.mark.parametrize("module", PLUGIN_API_MODULES)
def test_every_plugin_api_module_is_in_the_guide(module: str) -> None:
    """The module a plugin imports is in section 2 of the guide."""
    assert f"| `{module}` |" in GUIDE_API, f"section 2 of docs/writing-a-plugin.md does not list {module}"


def test_every_plugin_api_module_imports_without_paddle() -> None:
    """One fresh process imports them one after another: the first whose import brings paddle in is named."""
    modules = list(PLUGIN_API_MODULES)
    code = (
        "import importlib, sys\n"
        f"for module in {modules!r}:\n"
        "    importlib.import_module(module)\n"
        "    assert 'paddle' not in sys.modules, f'importing {module} imported paddle'\n"
        "    print(module)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.split()) == (0, modules), done.stderr
