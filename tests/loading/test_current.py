"""Lazy, cached, resettable resolution; spawned children agree; imports stay cheap."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest

import fd_platforms


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("FD_PLATFORM", "FD_PLATFORM_PLUGINS")}
    environ.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=120)


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_resolution_is_cached_until_reset(monkeypatch: pytest.MonkeyPatch, make_plugin) -> None:
    first = fd_platforms.current_platform()
    assert first is fd_platforms.current_platform()
    assert first.name == "cpu"
    make_plugin("acme")
    assert fd_platforms.current_platform() is first  # cached: a new plugin changes nothing until reset
    fd_platforms.reset_platform()
    assert fd_platforms.current_platform().name == "acme"
    monkeypatch.setenv("FD_PLATFORM", "cpu")
    fd_platforms.reset_platform()
    assert fd_platforms.current_selection().how == "env"


def test_errors_are_raised_again_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FD_PLATFORM", "nosuch")
    for _ in range(2):
        with pytest.raises(fd_platforms.contract.errors.UnknownPlatformError):
            fd_platforms.current_platform()
    monkeypatch.setenv("FD_PLATFORM", "cpu")
    assert fd_platforms.current_platform().name == "cpu"


def _child_platform(queue: multiprocessing.Queue) -> None:
    selection = fd_platforms.current_selection()
    queue.put((selection.platform.name, selection.how))


@pytest.mark.slow
def test_spawned_child_resolves_the_same_platform(monkeypatch: pytest.MonkeyPatch, make_plugin) -> None:
    site = make_plugin("acme")
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    parent = fd_platforms.current_selection()
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    children = [context.Process(target=_child_platform, args=(queue,)) for _ in range(2)]
    for child in children:
        child.start()
    results = [queue.get(timeout=60) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert results == [(parent.platform.name, parent.how)] * 2 == [("acme", "detected")] * 2


def test_import_never_imports_paddle() -> None:
    result = run_python("import fd_platforms, sys; assert 'paddle' not in sys.modules; print('ok')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_selecting_by_name_imports_only_that_plugin() -> None:
    code = (
        "import sys, fd_platforms\n"
        "p = fd_platforms.current_platform()\n"
        "print(p.name, sorted(m for m in sys.modules if m.startswith('fd_platforms_')), 'paddle' in sys.modules)\n"
    )
    assert run_python(code, FD_PLATFORM="cpu").stdout.split() == ["cpu", "[]", "False"]
    unavailable = run_python(code, FD_PLATFORM="xpu")
    assert "PlatformUnavailableError" in unavailable.stderr
    check = (
        "import sys, fd_platforms\ntry:\n    fd_platforms.current_platform()\nexcept Exception:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('fd_platforms_')))\n"
    )
    assert run_python(check, FD_PLATFORM="xpu").stdout.strip() == "['fd_platforms_xpu']"


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_detection_of_every_plugin_never_imports_paddle() -> None:
    code = "import sys, fd_platforms\nfd_platforms.current_platform()\nprint('paddle' in sys.modules)\n"
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_selection_loads_nothing_only_later_steps_need() -> None:
    """Every worker pays for selection: the cache signal, the engine API and packaging (a plugin
    declaring the usual ``>=1.0,<2``) load when used, not when the platform is chosen."""
    code = (
        "import sys, fd_platforms\nfd_platforms.current_platform()\n"
        "print(sorted(m for m in ('fd_platforms.ipc.cache_signal', 'fd_platforms.engine', 'packaging', "
        "'secrets', 'paddle')"
        " if m in sys.modules))\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
