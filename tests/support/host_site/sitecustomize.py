"""Start-up of a test child that plays another host (on ``PYTHONPATH`` by :mod:`tests.accelerator_host`).

- ``FD_TEST_HIDE_PADDLE=1``: this Python has no Paddle. ``import paddle`` raises
  ``ModuleNotFoundError`` as it does where no wheel is installed, and ``importlib.metadata`` finds
  no ``paddlepaddle*`` or ``paddle-*`` distribution.
- ``FD_TEST_PLUGGY_GETATTR=1``: pluggy registers a plugin as 1.5 and 1.6 do, reading every attribute
  of ``dir(plugin)`` with ``getattr`` (pluggy 1.7 reads them with ``inspect.getattr_static``), so a
  property that imports runs at registration.

Both settings reach every process the child starts (they are environment variables, and this
folder stays on ``PYTHONPATH``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

HIDDEN_DISTRIBUTIONS = ("paddlepaddle", "paddle-", "paddle_")


class NoPaddle(importlib.abc.MetaPathFinder):
    """Finds ``paddle`` nowhere, and no distribution that would install it."""

    def __init__(self, path_finder: Any) -> None:
        self.path_finder = path_finder

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: object = None) -> None:
        if fullname == "paddle" or fullname.startswith("paddle."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return

    def find_distributions(self, *args: Any, **kwargs: Any) -> Iterable[Any]:
        for dist in self.path_finder.find_distributions(*args, **kwargs):
            name = (dist.metadata["Name"] or "").lower()
            if not name.startswith(HIDDEN_DISTRIBUTIONS):
                yield dist


def hide_paddle() -> None:
    """Put :class:`NoPaddle` first and take the path finder's distributions through it."""
    path_finder = importlib.machinery.PathFinder
    sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not path_finder]
    sys.meta_path.insert(0, NoPaddle(path_finder))
    sys.meta_path.append(_PathFinderWithoutDistributions())


class _PathFinderWithoutDistributions(importlib.abc.MetaPathFinder):
    """The path finder's modules, but not its distributions (:class:`NoPaddle` answers for those)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: object = None) -> Any:
        return importlib.machinery.PathFinder.find_spec(fullname, path, target)  # type: ignore[arg-type]

    def invalidate_caches(self) -> None:
        importlib.machinery.PathFinder.invalidate_caches()


def register_as_pluggy_1_6() -> None:
    """pluggy 1.5/1.6's ``parse_hookimpl_opts``: ``getattr`` on each name, running any property."""
    import pluggy

    def parse_hookimpl_opts(self: pluggy.PluginManager, plugin: object, name: str) -> Any:
        method = getattr(plugin, name)
        if not inspect.isroutine(method):
            return None
        opts = getattr(method, self.project_name + "_impl", None)
        return opts if isinstance(opts, dict) else None

    pluggy.PluginManager.parse_hookimpl_opts = parse_hookimpl_opts  # type: ignore[method-assign]


if os.environ.get("FD_TEST_HIDE_PADDLE") == "1":
    hide_paddle()
if os.environ.get("FD_TEST_PLUGGY_GETATTR") == "1":
    register_as_pluggy_1_6()
