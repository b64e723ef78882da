"""Every distribution this repository builds (the core, the eight plugins, the template) ships the license its
metadata names: the Apache License 2.0 text, the same file in each."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from pyproject_file import pyproject
from run_helpers import ROOT

DISTRIBUTIONS = sorted(path.parent for path in [ROOT / "pyproject.toml", *ROOT.glob("plugins/*/pyproject.toml")])
DISTRIBUTIONS.append(ROOT / "examples" / "plugin-template")


MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("folder", DISTRIBUTIONS, ids=lambda folder: str(folder.relative_to(ROOT)) or "core")
def test_each_index_page_links_only_what_an_index_can_follow(folder: Path) -> None:
    """The readme a distribution's metadata names is its page on the package index, where a link relative to the
    repository leads nowhere: its links are absolute URLs or anchors on the page itself."""
    readme = folder / pyproject(folder)["project"]["readme"]
    text = re.sub(r"^```.*?^```", "", readme.read_text(), flags=re.S | re.M)
    relative = [link for link in MARKDOWN_LINK.findall(text) if not re.match(r"(https?://|#)", link)]
    assert not relative, f"{readme.relative_to(ROOT)} links {relative}, which its index page cannot follow"


@pytest.mark.parametrize("folder", DISTRIBUTIONS, ids=lambda folder: str(folder.relative_to(ROOT)) or "core")
def test_each_distribution_ships_the_license_its_metadata_names(folder: Path) -> None:
    project = pyproject(folder)["project"]
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


SDIST_TOP = {"fd_platforms", "docs", "examples", "README.md", "PYPI.md", "CHANGELOG.md", "LICENSE", "MANIFEST.in"}
SDIST_BUILT = {"PKG-INFO", "pyproject.toml", "setup.cfg", "fd_platforms.egg-info"}  # what setuptools adds


@pytest.mark.slow  # builds the core's source archive (about 3 s)
def test_the_source_archive_holds_what_manifest_in_states(tmp_path: Path) -> None:
    """The package, the texts, the guides and the examples the README runs; no test, benchmark or plugin folder."""
    source = tmp_path / "source"  # a copy: a build in place leaves egg-info in the source
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout.split()
    for name in tracked:
        if not name.startswith(("plugins/", "tests/", "benchmarks/", "tools/")):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    (source / "tests").mkdir()
    (source / "tests" / "test_stray.py").write_text("")  # setuptools' default would ship tests/test*.py
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(source)],
        check=True,
        capture_output=True,
    )
    [archive] = (tmp_path / "dist").glob("fd_platforms-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = [name.split("/", 1)[1] for name in tar.getnames() if "/" in name]
    assert {name.split("/")[0] for name in names} == SDIST_TOP | SDIST_BUILT
    assert "examples/qwen3-30b-a3b/config.json" in names and "examples/engine_runner.py" in names
    assert "docs/engine-integration.md" in names
    assert not [name for name in names if "plugin-template" in name or "__pycache__" in name]


def test_every_third_party_module_the_core_imports_is_a_declared_dependency() -> None:
    """pluggy and packaging are the core's requirements; numpy, imported only where a host view is made
    (``HostBuffer.numpy()``, the cpu platform's cache views, which Paddle reads), is declared in the extras that need it
    (``numpy``, ``paddle``), so a core-only install stays small; a missing numpy is a typed error naming the extra."""
    project = pyproject()["project"]
    requires = " ".join(project["dependencies"])
    extras = {name: " ".join(reqs) for name, reqs in project["optional-dependencies"].items()}
    imported = {
        line.split()[1].split(".")[0]
        for path in (ROOT / "fd_platforms").rglob("*.py")
        for line in path.read_text().splitlines()
        if line.strip().startswith(("import numpy", "import pluggy", "import packaging", "from packaging"))
    }
    assert imported == {"numpy", "pluggy", "packaging"}, imported
    assert "pluggy" in requires and "packaging" in requires and "numpy" not in requires, requires
    assert "numpy" in extras["numpy"] and "numpy" in extras["paddle"], extras


def test_host_buffer_numpy_without_numpy_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from fd_platforms.contract.errors import ExtraNotInstalledError
    from fd_platforms.contract.types import HostBuffer

    freed: list[bool] = []
    raw = bytearray(16)
    buffer = HostBuffer(
        address=ctypes.addressof((ctypes.c_uint8 * 16).from_buffer(raw)),
        nbytes=16,
        pinned=False,
        kind="test",
        _free=lambda: freed.append(True),
    )
    monkeypatch.setitem(sys.modules, "numpy", None)  # import numpy raises ModuleNotFoundError, as where it is absent
    with pytest.raises(
        ExtraNotInstalledError, match=r"HostBuffer.numpy\(\) needs numpy.*pip install 'fd-platforms\[numpy\]'"
    ):
        buffer.numpy()
    buffer.release()
    assert freed == [True]
