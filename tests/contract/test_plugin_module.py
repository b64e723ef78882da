"""The plugin API in one module, ``fd_platforms.plugin``: every name a plugin may use, in the guide, cheap to
import; and ``import fd_platforms`` itself loads nothing and changes nothing of the importer's."""

from __future__ import annotations

import subprocess
import sys

import pytest
from run_helpers import ROOT

import fd_platforms.plugin
from fd_platforms.contract.api_version import PLUGIN_API_MODULES

GUIDE = (ROOT / "docs" / "writing-a-plugin.md").read_text()


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


def test_importing_fd_platforms_loads_no_submodule_and_leaves_the_import_system_as_it_was() -> None:
    code = (
        "import sys\nfinders = list(sys.meta_path)\nimport fd_platforms\n"
        "print(sorted(m for m in sys.modules if m.startswith('fd_platforms.')), 'pluggy' in sys.modules, "
        "sys.meta_path == finders)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] False True"
