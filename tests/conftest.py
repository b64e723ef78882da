"""Shared fixtures: a clean selection environment and test-only plugins exposed through real entry points."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import fd_platforms

SELECTION_VARS = ("FD_PLATFORM", "FD_PLATFORM_PLUGINS")

PLUGIN_TEMPLATE = '''
from fd_platforms import hookimpl
from fd_platforms.types import Detection, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity({name!r}, {name!r} + "_dev", {name!r}.upper() + "_VISIBLE_DEVICES")

@hookimpl
def detect_platform():
    return Detection({available!r}, {reason!r}, {count!r})
'''


@pytest.fixture(autouse=True)
def clean_selection(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No selection variables from the outer environment, and no cached platform, in any test."""
    for name in SELECTION_VARS:
        monkeypatch.delenv(name, raising=False)
    fd_platforms.reset_platform()
    yield
    fd_platforms.reset_platform()


PluginFactory = Callable[..., Path]


@pytest.fixture
def make_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PluginFactory]:
    """Install a throwaway plugin distribution: a module plus a ``*.dist-info`` with entry points.

    ``make_plugin("acme", available=True)`` registers platform ``acme`` from distribution
    ``fd-test-acme``; ``source=`` replaces the module body; ``dist=`` and ``module=`` rename them.
    The folder is put on ``sys.path`` (and returned, for subprocesses' ``PYTHONPATH``).
    """
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    modules: list[str] = []

    def make(
        name: str,
        *,
        available: bool = True,
        reason: str = "fake device present",
        count: int = 2,
        source: str | None = None,
        dist: str | None = None,
        module: str | None = None,
    ) -> Path:
        dist = dist or f"fd-test-{name}"
        module = module or f"fd_test_plugin_{dist.replace('-', '_')}"
        body = source if source is not None else PLUGIN_TEMPLATE.format(
            name=name, available=available, reason=reason, count=count
        )
        (root / f"{module}.py").write_text(textwrap.dedent(body))
        info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[fd_platforms]\n{name} = {module}\n")
        modules.append(module)
        importlib.invalidate_caches()
        return root

    yield make
    for module in modules:
        sys.modules.pop(module, None)
