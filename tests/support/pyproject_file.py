"""A distribution's ``pyproject.toml``, parsed: the tests that hold the docs, the layers and the packages to it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from run_helpers import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def pyproject(folder: Path = ROOT) -> dict[str, Any]:
    """``folder/pyproject.toml`` (default: the core's) as a dict."""
    return tomllib.loads((folder / "pyproject.toml").read_text())
