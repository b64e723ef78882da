"""Find plugins: the built-in platforms and the ``fd_platforms`` entry-point group, or the wire protocols of
``fd_platforms.protocols`` (:mod:`fd_platforms.engine.protocols.registry`).

Discovery reads installed metadata only; no plugin module is imported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from typing import TypeVar

from ..contract.errors import PluginError

PluginErrorT = TypeVar("PluginErrorT", bound=PluginError)  #: the error class asked for, and made

ENTRY_POINT_GROUP = "fd_platforms"
CORE_DISTRIBUTION = "fd-platforms"
BUILTIN_PLATFORMS = {"cpu": "fd_platforms.builtin.cpu"}


@dataclass(frozen=True)
class Candidate:
    """A plugin found in metadata, not yet imported; ``kind`` says what it plugs in, in its errors."""

    name: str
    entry_point: metadata.EntryPoint
    distribution: str
    version: str
    builtin: bool
    kind: str = "platform plugin"

    def load(self) -> object:
        """Import the plugin object the entry point names."""
        return self.entry_point.load()

    def error(self, error: type[PluginErrorT], message: str) -> PluginErrorT:
        """A plugin error of type ``error`` about this plugin, naming it and its distribution before ``message``."""
        return error(self.name, self.distribution, message, kind=self.kind)


@cache  # once a process: each read parses the METADATA file (2 ms), and every plugin loaded is checked against it
def core_version() -> str:
    """Version of the installed core distribution (``0+unknown`` when run from a source tree)."""
    try:
        return metadata.version(CORE_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def discover(
    group: str = ENTRY_POINT_GROUP, builtins: Mapping[str, str] = BUILTIN_PLATFORMS, kind: str = "platform plugin"
) -> dict[str, list[Candidate]]:
    """Every name of entry-point ``group`` (default: the platforms) with the candidates registering it, ``builtins``
    (name: the core's module) first, then by name."""
    found: dict[str, list[Candidate]] = {}
    for name, module in builtins.items():
        entry_point = metadata.EntryPoint(name=name, value=module, group=group)
        found[name] = [Candidate(name, entry_point, CORE_DISTRIBUTION, core_version(), builtin=True, kind=kind)]
    external: dict[str, list[Candidate]] = {}
    for entry_point in metadata.entry_points(group=group):
        dist = entry_point.dist
        dist_name = dist.metadata["Name"] if dist is not None else "<unknown distribution>"
        version = dist.version if dist is not None else "unknown"
        candidates = found.get(entry_point.name) or external.setdefault(entry_point.name, [])
        if all(existing.distribution != dist_name for existing in candidates):
            candidates.append(Candidate(entry_point.name, entry_point, dist_name, version, builtin=False, kind=kind))
    return found | dict(sorted(external.items()))
