"""A pytest plugin for FastDeploy's own tests on a cpu-only host (``-p fastdeploy_cpu_ops``, ``tests/support`` on
``PYTHONPATH``): FastDeploy's compiled ops are not built there, so ``fastdeploy.model_executor.ops.gpu`` imports
empty and ``from fastdeploy.model_executor.ops.gpu import recover_decode_task, ...`` (``gpu_model_runner.py``)
fails at collection. Once that module has run, each name it lacks is a function that raises NotImplementedError
when called (the tests patch the ops they call). Nothing of FastDeploy is imported here."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

OPS = "fastdeploy.model_executor.ops.gpu"
STUBBED: list[str] = []


def _stub(name: str) -> Callable[..., Any]:
    def op(*args: object, **kwargs: object) -> Any:
        raise NotImplementedError(f"{OPS}.{name} is a compiled FastDeploy op, not built on this host")

    op.__name__ = op.__qualname__ = name
    return op


def _missing_names(module: ModuleType) -> None:
    def __getattr__(name: str) -> Callable[..., Any]:
        if name.startswith("__"):
            raise AttributeError(name)
        STUBBED.append(name)
        setattr(module, name, _stub(name))
        return getattr(module, name)  # type: ignore[no-any-return]

    module.__getattr__ = __getattr__  # type: ignore[method-assign]


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _missing_names(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != OPS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


sys.meta_path.insert(0, _Finder())


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if STUBBED:
        terminalreporter.write_line(
            f"fastdeploy_cpu_ops: {len(set(STUBBED))} ops stubbed: {', '.join(sorted(set(STUBBED)))}"
        )
