"""Every distribution this repository builds (the core, the eight plugins, the template) ships the license its
metadata names: the Apache License 2.0 text, the same file in each."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from run_helpers import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DISTRIBUTIONS = sorted(path.parent for path in [ROOT / "pyproject.toml", *ROOT.glob("plugins/*/pyproject.toml")])
DISTRIBUTIONS.append(ROOT / "examples" / "plugin-template")


@pytest.mark.parametrize("folder", DISTRIBUTIONS, ids=lambda folder: str(folder.relative_to(ROOT)) or "core")
def test_each_distribution_ships_the_license_its_metadata_names(folder: Path) -> None:
    project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    text = (folder / "LICENSE").read_text()
    assert text == (ROOT / "LICENSE").read_text(), "one license text for every distribution"
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text


@pytest.mark.slow
def test_a_built_wheel_holds_the_license(tmp_path: Path) -> None:
    folder = tmp_path / "plugin-template"  # a copy: a build in place leaves build/ and egg-info in the source
    shutil.copytree(ROOT / "examples" / "plugin-template", folder, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "wheels"),
            str(folder),
        ],
        check=True,
        capture_output=True,
    )
    [wheel] = (tmp_path / "wheels").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), names


def test_every_third_party_module_the_core_imports_is_a_declared_dependency() -> None:
    """numpy is imported (where a host view is made) by code a public call runs: it is in the core's requirements,
    so a core-only install does not fail later with ModuleNotFoundError. paddle is the platform's: an extra."""
    requires = " ".join(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    imported = {
        line.split()[1].split(".")[0]
        for path in (ROOT / "fd_platforms").rglob("*.py")
        for line in path.read_text().splitlines()
        if line.strip().startswith(("import numpy", "import pluggy", "import packaging", "from packaging"))
    }
    assert imported and all(name in requires for name in imported), (imported, requires)
