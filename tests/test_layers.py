"""The layering contract in ``pyproject.toml`` holds, and it is not a contract that cannot fail:
an upward import, an import circle inside a package, a package left out of the layers, or a plugin
importing the core past ``fd_platforms.plugin`` each break it, naming what broke."""

from __future__ import annotations

import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pyproject_file import pyproject
from run_helpers import ROOT

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACTS = pyproject()["tool"]["importlinter"]["contracts"]


def lint(root: Path = ROOT, package: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the repository's contracts; ``package`` (a folder of copied packages, or
    one copied package) replaces the installed ones of the same names."""
    env = dict(os.environ)
    if package is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package.parent), env.get("PYTHONPATH")]))
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        timeout=120,
    )


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_every_contract_is_kept() -> None:
    done = lint()
    assert done.returncode == 0, done.stdout + done.stderr
    contracts = len(pyproject()["tool"]["importlinter"]["contracts"])
    assert f"{contracts} kept, 0 broken" in done.stdout


def append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


BREAKS = {
    "an upward import": (
        "rules/decision.py",
        "from ..loading import platform",
        "fd_platforms.rules.decision -> fd_platforms.loading.platform",
    ),
    "the facade importing the engine": (
        "loading/platform.py",
        "from ..engine import initialize",
        "fd_platforms.loading.platform -> fd_platforms.engine.initialize",
    ),
    "siblings of one layer importing each other": (
        "kit/host_sharing.py",
        "from ..ipc import shm",
        "fd_platforms.kit.host_sharing -> fd_platforms.ipc.shm",
    ),
    "the engine importing FastDeploy's package": (  # the engine is given FastDeploy's protocol object, never imports it
        "engine/initialize.py",
        "from ..fastdeploy import FASTDEPLOY",
        "fd_platforms.engine is not allowed to import fd_platforms.fastdeploy",
    ),
    "the rules reaching FastDeploy's package through another one": (  # no indirect path either
        "rules/sizes.py",
        "from ..lifecycle import spec",
        "fd_platforms.rules is not allowed to import fd_platforms.fastdeploy",
    ),
    "fd-platforms run's processes importing an engine module past fd_platforms.engine": (  # as any engine: the API
        "lifecycle/worker.py",
        "from ..engine.kv_cache import KVCache",
        "fd_platforms.lifecycle is not allowed to import fd_platforms.engine.kv_cache",
    ),
    "the CLI importing an engine module past fd_platforms.engine": (
        "cli/plan_command.py",
        "from ..engine.protocols import OURS",
        "fd_platforms.cli is not allowed to import fd_platforms.engine.protocols",
    ),
    "a circle inside a package": (  # the planner imports the decision through the config
        "rules/decision.py",
        "from . import planner",
        "No cycles are allowed in fd_platforms.rules.",
    ),
}


ALONE = "the rules reaching FastDeploy's package through another one"
"""The break linted on its own: the others together make an indirect path of the same kind (rules -> loading ->
engine -> fastdeploy), which would name it without it. Each of the others is named only where it is made."""


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    """For each of :data:`BREAKS` and ``"extras"`` (a package no layer names), ``lint-imports`` over a copy of the
    fd_platforms package holding it: two runs in all (each costs a Python start and the graph), :data:`ALONE` in
    one and every other break in the other."""

    def run(breaks: list[str], extras: bool) -> subprocess.CompletedProcess[str]:
        copy = tmp_path_factory.mktemp("broken") / "site" / "fd_platforms"
        shutil.copytree(ROOT / "fd_platforms", copy, ignore=shutil.ignore_patterns("__pycache__"))
        for case in breaks:
            module, line, _ = BREAKS[case]
            append(copy / module, line)
        if extras:
            (copy / "extras").mkdir()
            (copy / "extras" / "__init__.py").write_text('"""A package no layer names."""\n')
        return lint(copy.parent, copy)

    others = [case for case in BREAKS if case != ALONE]
    together = run(others, extras=True)
    return {ALONE: run([ALONE], extras=False), "extras": together, **dict.fromkeys(others, together)}


@pytest.mark.parametrize(("case", "named"), [(case, named) for case, (_, _, named) in BREAKS.items()], ids=BREAKS)
@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_forbidden_import_breaks_a_contract_naming_it(
    broken: dict[str, subprocess.CompletedProcess[str]], case: str, named: str
) -> None:
    done = broken[case]
    assert done.returncode == 1
    assert "BROKEN" in done.stdout and named in done.stdout, done.stdout


def test_a_package_outside_the_layers_breaks_the_contract(broken: dict[str, subprocess.CompletedProcess[str]]) -> None:
    assert broken["extras"].returncode == 1
    assert "fd_platforms.extras" in broken["extras"].stdout


def contract(name_start: str) -> dict[str, object]:
    """The contract of ``pyproject.toml`` whose name starts so."""
    [found] = [c for c in CONTRACTS if str(c["name"]).startswith(name_start)]
    return found


def test_the_plugins_are_held_off_every_package_of_the_core_but_the_plugin_module() -> None:
    """The forbidden list names every package the layers contract places (it is exhaustive), save
    ``fd_platforms.plugin``: a package added to the core is off limits to plugins once it is placed."""
    layers: list[str] = contract("Layers")["layers"]  # type: ignore[assignment]
    packages = {name.strip() for layer in layers for name in layer.split("|")}
    forbidden = contract("Vendor plugins import fd_platforms.plugin")
    plugins = contract("Vendor plugins are independent")["modules"]
    expected = {f"fd_platforms.{name}" for name in packages - {"plugin"}}
    assert set(forbidden["forbidden_modules"]) == expected  # type: ignore[arg-type]
    assert set(forbidden["source_modules"]) == set(plugins)  # type: ignore[arg-type]


def test_lifecycle_and_the_cli_are_held_off_every_engine_module_but_its_errors() -> None:
    """The forbidden list is every module of ``fd_platforms.engine`` but ``errors`` (public, as the engine module
    is): a module added to the engine is off limits to ``lifecycle/`` and ``cli/`` once it exists."""
    held = contract("lifecycle/ and cli/ take the engine's names from fd_platforms.engine")
    modules = {info.name for info in pkgutil.iter_modules([str(ROOT / "fd_platforms" / "engine")])}
    expected = {f"fd_platforms.engine.{name}" for name in modules - {"errors"}}
    assert set(held["forbidden_modules"]) == expected  # type: ignore[arg-type]
    assert set(held["source_modules"]) == {"fd_platforms.lifecycle", "fd_platforms.cli"}  # type: ignore[arg-type]
    assert held["allow_indirect_imports"] is True  # fd_platforms.engine itself imports its modules


PLUGIN_BREAKS = {
    "the kit": ("from fd_platforms.kit.probes import device_nodes", "fd_platforms.kit.probes"),
    "the contract": ("from fd_platforms.contract import types", "fd_platforms.contract.types"),
}


@pytest.fixture(scope="module")
def broken_plugin(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over a copy of the template plugin with both of :data:`PLUGIN_BREAKS` in it (one run;
    each names only its own import)."""
    target = tmp_path_factory.mktemp("broken-plugin") / "site" / "fd_platforms_nimbus"
    shutil.copytree(
        ROOT / "examples" / "plugin-template" / "src" / "fd_platforms_nimbus",
        target,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for line, _ in PLUGIN_BREAKS.values():
        append(target / "__init__.py", line)
    return lint(target.parent, target)


@pytest.mark.parametrize("named", [named for _, named in PLUGIN_BREAKS.values()], ids=PLUGIN_BREAKS)
def test_a_plugin_importing_the_core_past_the_plugin_module_breaks_the_contract(
    broken_plugin: subprocess.CompletedProcess[str], named: str
) -> None:
    assert broken_plugin.returncode == 1
    assert "BROKEN" in broken_plugin.stdout and "fd_platforms_nimbus is not allowed to import" in broken_plugin.stdout
    assert f"fd_platforms_nimbus -> {named}" in broken_plugin.stdout, broken_plugin.stdout


def test_the_readmes_layout_table_lists_the_contracts_layers_top_down() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Layout", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    stated = [line.split("  ", 1)[0].strip() for line in block.splitlines() if line.strip()]
    assert stated == contract("Layers")["layers"]
    words = {4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten", 11: "eleven"}
    assert f"The package is {words[len(stated)]} layers" in readme
