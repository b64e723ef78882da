"""Find platform plugins: the built-in ones and the ``fd_platforms`` entry-point group.

Discovery reads installed metadata only; no plugin module is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import metadata
from typing import TypeVar

from ..contract.errors import PluginError

PluginErrorT = TypeVar("PluginErrorT", bound=PluginError)

ENTRY_POINT_GROUP = "fd_platforms"
CORE_DISTRIBUTION = "fd-platforms"
BUILTIN_PLATFORMS = {"cpu": "fd_platforms.builtin.cpu"}


@dataclass(frozen=True)
class Candidate:
    """A platform plugin found in metadata, not yet imported."""

    name: str
    entry_point: metadata.EntryPoint
    distribution: str
    version: str
    builtin: bool

    def load(self) -> object:
        """Import the plugin object the entry point names."""
        return self.entry_point.load()

    def error(self, kind: type[PluginErrorT], message: str) -> PluginErrorT:
        """A ``kind`` of plugin error about this plugin, naming it and its distribution before ``message``."""
        return kind(self.name, self.distribution, message)


@cache  # once a process: each read parses the METADATA file (2 ms), and every plugin loaded is checked against it
def core_version() -> str:
    """Version of the installed core distribution (``0+unknown`` when run from a source tree)."""
    try:
        return metadata.version(CORE_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def discover() -> dict[str, list[Candidate]]:
    """Every platform name with the candidates registering it, built-ins first, then by name."""
    found: dict[str, list[Candidate]] = {}
    for name, module in BUILTIN_PLATFORMS.items():
        entry_point = metadata.EntryPoint(name=name, value=module, group=ENTRY_POINT_GROUP)
        found[name] = [Candidate(name, entry_point, CORE_DISTRIBUTION, core_version(), builtin=True)]
    external: dict[str, list[Candidate]] = {}
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = entry_point.dist
        dist_name = dist.metadata["Name"] if dist is not None else "<unknown distribution>"
        version = dist.version if dist is not None else "unknown"
        candidates = found.get(entry_point.name) or external.setdefault(entry_point.name, [])
        if all(existing.distribution != dist_name for existing in candidates):
            candidates.append(Candidate(entry_point.name, entry_point, dist_name, version, builtin=False))
    return found | dict(sorted(external.items()))
