"""The Sphinx build of ``docs/`` (``docs/conf.py``) passes with warnings as errors, and what it must cover is listed.

The build itself (slow: about half a minute on two cores) runs as CI runs it; the lists it depends on are checked
without Sphinx: every module of the package is on a reference page, and no docstring outgrows
:data:`MOST_DOCSTRING_LINES` (a protocol's detail and FastDeploy's file and line citations live in ``docs/``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from run_helpers import ROOT

import fd_platforms
from fd_platforms.lifecycle.children import WARM_MODULE

REFERENCE = ROOT / "docs" / "reference"
#: The public faces, each documented on a page of its own (``fd_platforms.engine.errors`` on the engine's).
FACES = (
    "fd_platforms",
    "fd_platforms.plugin",
    "fd_platforms.engine",
    "fd_platforms.engine.errors",
    "fd_platforms.fastdeploy",
)
#: The most lines a docstring of fd_platforms has (module, class or function; ``ast.get_docstring``'s text).
MOST_DOCSTRING_LINES = 40


def build(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html", "docs", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def inventory(out: Path) -> set[str]:
    """The names of the Python objects the build documents, from its ``objects.inv`` (version 2: four header
    lines, then zlib-compressed lines ``name domain:role priority uri display``)."""
    data = (out / "objects.inv").read_bytes()
    body = zlib.decompress(data.split(b"\n", 4)[4]).decode()
    return {line.split(" ", 1)[0] for line in body.splitlines() if line.split(" ")[1].startswith("py:")}


@pytest.mark.slow
def test_the_docs_build_with_no_warning_and_document_every_public_name(tmp_path: Path) -> None:
    for module in ("sphinx", "myst_parser"):
        if importlib.util.find_spec(module) is None:
            if os.environ.get("CI"):
                pytest.fail(f"CI must install the docs dependency group (pip install --group docs): no {module}")
            pytest.skip(f"the docs build needs {module} (pip install --group docs)")
    result = build(tmp_path)
    assert result.returncode == 0, f"the docs build failed:\n{result.stdout}{result.stderr}"
    documented = inventory(tmp_path)
    missing = [
        f"{face}.{name}"
        for face in FACES
        for name in importlib.import_module(face).__all__
        if f"{face}.{name}" not in documented
    ]
    assert not missing, f"the API reference does not document {missing}"


def automodules() -> set[str]:
    return {
        match.group(1)
        for page in REFERENCE.rglob("*.rst")
        for match in re.finditer(r"^\.\. automodule:: (\S+)$", page.read_text(), re.MULTILINE)
    }


def test_every_module_is_on_a_reference_page() -> None:
    """A module left off would drop out of the reference unnoticed, until a docstring names one of its objects."""
    modules = {
        info.name
        for info in pkgutil.walk_packages(fd_platforms.__path__, "fd_platforms.")
        if not info.name.endswith("__main__")  # running the command is what importing it does
        and info.name != WARM_MODULE  # importing Paddle is: the fork server's, docs/lifecycle.md
    }
    on_pages = automodules()
    assert not (modules | {"fd_platforms"}) - on_pages, "add them to docs/reference/internals/<package>.rst"
    assert not on_pages - modules - {"fd_platforms"}, "docs/reference/ names modules that do not exist"


def test_each_face_has_its_page() -> None:
    for face in FACES:
        page = REFERENCE / f"{face.removesuffix('.errors')}.rst"
        assert f".. automodule:: {face}\n   :no-ignore-module-all:\n" in page.read_text(), f"{page} lists {face}"


def docstrings() -> list[tuple[int, str]]:
    found = []
    for path in sorted((ROOT / "fd_platforms").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                text = ast.get_docstring(node)
                if text:
                    where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)} {getattr(node, 'name', 'module')}"
                    found.append((len(text.splitlines()), where))
    return found


def test_no_docstring_outgrows_its_bound() -> None:
    """A docstring says what its object does; a protocol's steps and FastDeploy's forensics go to ``docs/``, linked
    from it ("See docs/<page>.md, <section>.")."""
    long = sorted(((lines, where) for lines, where in docstrings() if lines > MOST_DOCSTRING_LINES), reverse=True)
    assert not long, f"docstrings over {MOST_DOCSTRING_LINES} lines (move the detail to docs/): {long}"
