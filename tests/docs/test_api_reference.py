"""``docs/api.md`` lists the public API as the code has it, and ``dir(fd_platforms)`` shows the lazy names."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys

import pytest
from run_helpers import ROOT

import fd_platforms
from fd_platforms import engine
from fd_platforms.engine import Cluster
from fd_platforms.loading.platform import Platform

API = (ROOT / "docs" / "api.md").read_text()
PUBLIC_METHODS = sorted(name for name in vars(Platform) if not name.startswith("_"))


@pytest.mark.parametrize("name", PUBLIC_METHODS)
def test_every_public_platform_method_is_in_the_reference(name: str) -> None:
    assert f"`{name}(" in API or f"`{name}`" in API, f"docs/api.md does not list Platform.{name}"


@pytest.mark.parametrize("name", fd_platforms.__all__)
def test_every_exported_name_is_in_the_reference(name: str) -> None:
    assert f"`{name}(" in API or f"`{name}`" in API, f"docs/api.md does not list fd_platforms.{name}"


def test_the_lazy_names_are_exported_where_type_checkers_read_them() -> None:
    """A literal ``__all__``: a type checker runs no code (mypy --strict refused ``fd_platforms.current_platform``)."""
    tree = ast.parse(ROOT.joinpath("fd_platforms", "__init__.py").read_text())
    assigned = {ast.unparse(node.targets[0]): node.value for node in tree.body if isinstance(node, ast.Assign)}
    assert ast.literal_eval(assigned["__all__"]) == sorted(fd_platforms._LAZY)


def test_the_reference_names_the_api_version_the_code_has() -> None:
    assert f'the plugin API this core provides (`"{fd_platforms.API_VERSION}"`)' in API


@pytest.mark.parametrize("name", engine.__all__)
def test_every_engine_api_name_is_in_the_reference(name: str) -> None:
    assert f"`{name}`" in API or f"`{name}(" in API, f"docs/api.md does not list fd_platforms.engine.{name}"


@pytest.mark.parametrize("name", sorted(name for name in vars(Cluster) if not name.startswith("_")))
def test_every_cluster_method_is_in_the_reference(name: str) -> None:
    assert f"`{name}`" in API or f"`{name}(" in API, f"docs/api.md does not list Cluster.{name}"


def test_dir_lists_the_lazy_names_before_any_is_loaded() -> None:
    code = (
        "import sys, fd_platforms\n"
        "names = dir(fd_platforms)\n"
        "assert 'pluggy' not in sys.modules and 'paddle' not in sys.modules, 'dir() loaded nothing'\n"
        "print(sorted(set(fd_platforms.__all__) - set(names)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("module", sorted(set(re.findall(r"^\| `(fd_platforms[\w.]*)` \|", API, re.M))))
def test_every_module_the_reference_names_exists(module: str) -> None:
    importlib.import_module(module)
