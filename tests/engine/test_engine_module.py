"""``fd_platforms.engine`` is the engines' one module, as ``fd_platforms.plugin`` is the vendors': at most 35
names, each importable and documented, every other error in ``fd_platforms.engine.errors``, the names that
left it still working with a DeprecationWarning, and the engine docs and examples importing nothing of
``fd_platforms`` but ``fd_platforms``, ``fd_platforms.engine`` and ``fd_platforms.fastdeploy``."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from run_helpers import ROOT

import fd_platforms
import fd_platforms.engine
import fd_platforms.fastdeploy
import fd_platforms.plugin
from fd_platforms.engine import FdPlatformsError, errors

NAMES = fd_platforms.engine.__all__
API = (ROOT / "docs" / "api.md").read_text()
GUIDE = (ROOT / "docs" / "engine-integration.md").read_text()


# --- the module ----------------------------------------------------------------------------------


def test_the_engine_api_is_at_most_35_names_each_resolving() -> None:
    assert len(NAMES) <= 35 and len(set(NAMES)) == len(NAMES)
    for name in NAMES:
        assert getattr(fd_platforms.engine, name) is not None, name
    star: dict[str, object] = {}
    exec("from fd_platforms.engine import *", star)
    assert set(star) - {"__builtins__"} == set(NAMES)
    assert fd_platforms.engine.errors is errors  # the one module beside the names


def own_doc(value: object) -> str | None:
    """The docstring ``value`` itself states (a dataclass's generated ``Name(field, ...)`` is none)."""
    doc = vars(value).get("__doc__") if inspect.isclass(value) else getattr(value, "__doc__", None)
    if inspect.isclass(value) and doc and doc.startswith(f"{value.__name__}("):
        return None
    return doc


@pytest.mark.parametrize("name", NAMES)
def test_every_engine_api_name_is_documented_in_the_code_and_the_reference(name: str) -> None:
    value = getattr(fd_platforms.engine, name)
    assert own_doc(value), f"fd_platforms.engine.{name} has no docstring of its own"
    section = API.split("## `fd_platforms.engine`", 1)[1].split("\n## ", 1)[0]
    assert f"`{name}`" in section or f"`{name}(" in section, f"docs/api.md's fd_platforms.engine section lacks {name}"


def error_classes(package: str) -> set[type]:
    """Every FdPlatformsError subclass defined in ``package``'s modules."""
    root = importlib.import_module(package)
    modules = [root] + [
        importlib.import_module(info.name) for info in pkgutil.walk_packages(root.__path__, f"{package}.")
    ]
    return {
        value
        for module in modules
        for value in vars(module).values()
        if inspect.isclass(value) and issubclass(value, FdPlatformsError) and value.__module__ == module.__name__
    }


# Raised and caught inside the package: an entry in /dev/shm this process must not touch never reaches a caller.
NEVER_RAISED_TO_A_CALLER = {"SegmentUnusable"}


def test_the_errors_module_holds_every_error_the_engine_and_the_layers_below_it_raise() -> None:
    packages = ("contract", "rules", "ipc", "engine")
    below = set().union(*(error_classes(f"fd_platforms.{package}") for package in packages))
    expected = {error.__name__ for error in below} - NEVER_RAISED_TO_A_CALLER
    assert set(errors.__all__) == expected and len(errors.__all__) == len(expected)
    for name in errors.__all__:
        error = getattr(errors, name)
        assert issubclass(error, FdPlatformsError) and own_doc(error), name
    exported = [
        name
        for name in NAMES
        if inspect.isclass(getattr(fd_platforms.engine, name))
        and issubclass(getattr(fd_platforms.engine, name), BaseException)
    ]
    assert "FdPlatformsError" in exported and len(exported) <= 6, "the base class and a few a runner catches"
    for name in exported:  # the same classes: except clauses agree whichever module a runner took them from
        assert getattr(errors, name) is getattr(fd_platforms.engine, name)


def test_importing_the_engine_module_imports_neither_paddle_nor_numpy() -> None:
    code = (
        "import fd_platforms.engine, sys\n"
        "from fd_platforms.engine import errors\n"
        "assert not {'paddle', 'numpy'} & set(sys.modules), sorted({'paddle', 'numpy'} & set(sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'initialise_kv_cache'"):
        fd_platforms.engine.initialise_kv_cache  # noqa: B018


# --- what the engine docs and examples import -----------------------------------------------------

ENGINE_FACES = ("fd_platforms", "fd_platforms.engine", "fd_platforms.engine.errors", "fd_platforms.fastdeploy")
PLUGIN_FACES = ("fd_platforms", "fd_platforms.plugin")
SIGNATURES = re.compile(r"(\s*def \w+\(.*\) -> .+\n)+\s*")
PYTHON_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


def public_names(module: str) -> set[str]:
    """What ``module`` exports: its ``__all__`` (and, for the engine module, its errors module)."""
    names = set(getattr(importlib.import_module(module), "__all__", ()))
    return names | {"errors"} if module == "fd_platforms.engine" else names


def sources() -> list[tuple[str, int, str, tuple[str, ...]]]:
    """(file, the line its code starts on, the code, the modules it may import): every python block of the README
    and docs/ (docs/writing-a-plugin.md's are a plugin's: fd_platforms.plugin), and every example."""
    found = []
    for path in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        text = path.read_text(encoding="utf-8")
        faces = PLUGIN_FACES if path.name == "writing-a-plugin.md" else ENGINE_FACES
        for match in PYTHON_BLOCK.finditer(text):
            found.append((str(path.relative_to(ROOT)), text.count("\n", 0, match.start(1)) + 1, match.group(1), faces))
    for path in sorted((ROOT / "examples").rglob("*.py")):
        if "build" in path.relative_to(ROOT).parts:  # pip's in-tree build of the example plugin: a copy, not a sample
            continue
        faces = PLUGIN_FACES if "plugin-template" in path.parts else ENGINE_FACES
        found.append((str(path.relative_to(ROOT)), 1, path.read_text(encoding="utf-8"), faces))
    return found


def dotted(node: ast.AST) -> list[str] | None:
    """``["fd_platforms", "engine", "KVCache"]`` for the expression ``fd_platforms.engine.KVCache``, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def misuses(code: str, faces: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, what) for each use of an ``fd_platforms`` module other than ``faces``, or of a name one of them
    does not export: ``import``, ``from ... import`` and ``fd_platforms.x.y`` attribute paths alike."""
    found = []

    def use(line: int, path: list[str], imported: bool = False) -> None:
        """``path``: what an ``import`` names (``imported``: all of it a module), or a module's dotted name then
        the names taken from it; checked from ``fd_platforms`` down, through the public modules."""
        if path[0] != "fd_platforms":
            return
        if imported and ".".join(path) not in faces:
            found.append((line, ".".join(path)))
            return
        module = "fd_platforms"
        for part in path[1:]:
            if f"{module}.{part}" in faces:  # a public module, reached as an attribute or imported from its parent
                module = f"{module}.{part}"
                continue
            if module not in faces:
                found.append((line, module))
            elif part not in public_names(module):
                found.append((line, f"{module}.{part}"))
            return

    if SIGNATURES.fullmatch(code):  # a hook's signature, as the plugin guide shows each: no code
        return []
    tree = ast.parse(code)
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                use(node.lineno, alias.name.split("."), imported=True)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "fd_platforms" and node.module not in faces:
                found.append((node.lineno, node.module))
                continue
            for alias in node.names:
                if alias.name != "*":
                    use(node.lineno, [*node.module.split("."), alias.name])
        elif isinstance(node, ast.Attribute) and id(node) not in inner:
            path = dotted(node)
            if path:
                use(node.lineno, path)
    return found


SOURCES = sources()


@pytest.mark.parametrize(("path", "start", "code", "faces"), SOURCES, ids=[f"{s[0]}:{s[1]}" for s in SOURCES])
def test_engine_docs_and_examples_import_only_the_public_modules(
    path: str, start: int, code: str, faces: tuple[str, ...]
) -> None:
    wrong = [f"{path}:{start + line - 1}: {what}" for line, what in misuses(code, faces)]
    assert not wrong, f"import only from {', '.join(faces)} (and only what their __all__ lists): " + "; ".join(wrong)


@pytest.mark.parametrize(
    ("code", "named"),
    [
        ("from fd_platforms.rules.layout import build_layout", "fd_platforms.rules.layout"),
        ("import fd_platforms.ipc.cache_signal", "fd_platforms.ipc.cache_signal"),
        ("from fd_platforms import rules", "fd_platforms.rules"),
        ("from fd_platforms.engine import engine_name", "fd_platforms.engine.engine_name"),
        ("from fd_platforms.fastdeploy.signals import FastDeploySignal", "fd_platforms.fastdeploy.signals"),
        ("import fd_platforms\nfd_platforms.engine.kv_cache.KVCache", "fd_platforms.engine.kv_cache"),
    ],
)
def test_the_docs_check_names_an_import_past_the_public_modules(code: str, named: str) -> None:
    assert [what for _, what in misuses(code, ENGINE_FACES)] == [named]


def test_the_docs_check_passes_what_the_public_modules_export() -> None:
    code = (
        "import fd_platforms\nimport fd_platforms.engine\nfrom fd_platforms import engine, fastdeploy\n"
        "from fd_platforms.engine import KVCache, errors\nfrom fd_platforms.engine.errors import NodeError\n"
        "from fd_platforms.fastdeploy import FASTDEPLOY\nfd_platforms.current_platform()\n"
        "fd_platforms.engine.errors.NodeError\nfd_platforms.engine.KVCache.clear\n"
    )
    assert misuses(code, ENGINE_FACES) == []


def test_the_public_modules_import_clean() -> None:
    """What the docs may import does not warn."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for module in ENGINE_FACES + PLUGIN_FACES:
            for name in public_names(module):
                getattr(importlib.import_module(module), name)


def test_every_docs_sample_file_is_checked() -> None:
    checked = {path for path, *_ in SOURCES}
    assert {
        "README.md",
        "docs/engine-integration.md",
        "docs/api.md",
        "docs/porting-fastdeploy.md",
        "examples/engine_runner.py",
        "examples/launched_worker.py",
        "examples/multinode_runner.py",
    } <= checked
    assert all(Path(ROOT / path).exists() for path in checked)
