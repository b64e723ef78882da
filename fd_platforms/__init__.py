"""fd-platforms: one set of KV-cache rules for every accelerator, selected with ``FD_PLATFORM``.

Importing this package is cheap: it never imports paddle, and pluggy and the plugin machinery load
on first use of a name below (PEP 562). The platform is resolved on the first call to
:func:`current_platform`. A plugin imports :mod:`fd_platforms.plugin`, an engine :mod:`fd_platforms.engine`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .contract.api_version import API_VERSION
    from .contract.hookspecs import hookimpl
    from .loading.current import current_platform, current_selection, reset_platform

_LAZY = {
    "API_VERSION": "contract.api_version",
    "current_platform": "loading.current",
    "current_selection": "loading.current",
    "reset_platform": "loading.current",
    "hookimpl": "contract.hookspecs",
}

__all__ = ["API_VERSION", "current_platform", "current_selection", "hookimpl", "reset_platform"]  # _LAZY's names
__version__: str  # the distribution's version (importlib.metadata), read on first use


def __getattr__(name: str) -> Any:
    if name == "__version__":  # the installed distribution's, read once it is asked for
        from importlib.metadata import version

        globals()[name] = version("fd-platforms")
        return globals()[name]
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fd_platforms' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names with the lazy public ones, before any is loaded (for ``dir()`` and completion)."""
    return sorted({*globals(), *__all__, "__version__"})
