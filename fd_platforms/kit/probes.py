"""Cheap detection helpers for platform plugins: installed distributions, device nodes, visibility.

Nothing here imports paddle or starts a device runtime. A plugin states its facts (which
distributions, which device nodes, which visibility variable) as a :class:`RuntimeFacts`.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata

from ..contract.hookspecs import hookimpl
from ..contract.types import Detection, PlatformIdentity, PlatformLimit


def installed_distribution(*names: str) -> tuple[str, str] | None:
    """The first of ``names`` that is installed, as ``(name, version)``; None when none is."""
    for name in names:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def device_nodes(pattern: str) -> list[str]:
    """Numbered device nodes matching ``pattern`` (``/dev/nvidia[0-9]*``), in numeric order."""
    numbered = [(int(match.group(1)), path) for path in glob.glob(pattern) if (match := re.search(r"(\d+)$", path))]
    return [path for _, path in sorted(numbered)]


def visible_count(physical: int, env_var: str, environ: Mapping[str, str]) -> int:
    """How many of ``physical`` devices the visibility variable leaves visible: every entry up to the
    first negative one, as CUDA reads ``CUDA_VISIBLE_DEVICES`` (``""`` and ``-1`` hide all)."""
    value = environ.get(env_var)
    if value is None:
        return physical
    entries = [entry.strip() for entry in value.split(",") if entry.strip()]
    negative = next((index for index, entry in enumerate(entries) if entry.startswith("-")), len(entries))
    return min(negative, physical)


def stated_fact(plugin: object, name: str) -> str | None:
    """The text a :class:`RuntimeFacts` record states in its field ``name`` (``device_glob``,
    ``install_hint``), read from the record's own fields so no plugin code runs (no property, no
    ``__getattr__``); None for another object, or a field that is not non-empty text."""
    value = vars(plugin).get(name) if isinstance(plugin, RuntimeFacts) else None
    return value if isinstance(value, str) and value.strip() else None


@dataclass(frozen=True)
class RuntimeFacts:
    """What a device platform plugin states about its runtime; the record answers the identity and
    detection hooks itself, so a plugin whose entry point names it (``cuda = "pkg:PLATFORM"``)
    needs no hook code of its own.

    ``distributions``: Paddle builds or runtime plugins providing the device (any one will do);
    ``device_glob``: numbered device nodes (``/dev/nvidia[0-9]*``), or None where the nodes are
    not a reliable count; ``install_hint``: what a user runs to get the runtime;
    ``custom_device_library``: for a Paddle custom device, a file pattern (``*iluvatar*.so``)
    that finds its runtime library in the folder ``CUSTOM_DEVICE_ROOT`` names, which counts as
    the runtime being installed; ``limits``: the KV-cache limits the platform declares;
    ``api_versions``: the plugin API versions the plugin supports (``">=1.0,<2"``), always stated
    by the plugin itself so a core with another API refuses it.
    """

    name: str
    device_type: str
    visible_devices_env: str
    distributions: tuple[str, ...]
    device_glob: str | None
    install_hint: str
    description: str = ""
    custom_device_library: str | None = None
    limits: tuple[PlatformLimit, ...] = ()
    api_versions: str = field(kw_only=True)

    @hookimpl
    def supported_api_versions(self) -> str:
        """The plugin API range the plugin declared."""
        return self.api_versions

    @hookimpl
    def platform_identity(self) -> PlatformIdentity:
        """The platform's identity record."""
        return PlatformIdentity(self.name, self.device_type, self.visible_devices_env, self.description)

    @hookimpl
    def detect_platform(self, environ: Mapping[str, str] | None = None) -> Detection:
        """Detect from the runtime distribution and device nodes; never imports paddle.

        Available when one of ``distributions`` is installed and, where ``device_glob`` is given,
        device nodes exist and the visibility variable leaves at least one visible. Without a
        ``device_glob`` the count is not known before paddle starts and is reported as 0.
        """
        env = os.environ if environ is None else environ
        found = installed_distribution(*self.distributions)
        if found is None:
            return self._detect_without_distribution(env)
        runtime = f"{found[0]} {found[1]} installed"
        if self.device_glob is None:
            return Detection(True, f"{runtime}; the device count is known once paddle starts", 0)
        nodes = device_nodes(self.device_glob)
        if not nodes:
            return Detection(False, f"{runtime}, but no device node matches {self.device_glob}: no device or driver")
        count = visible_count(len(nodes), self.visible_devices_env, env)
        if count == 0:
            return Detection(
                False,
                f"{runtime}, {len(nodes)} devices, but {self.visible_devices_env}="
                f"{env.get(self.visible_devices_env)!r} hides all. "
                f"Fix: unset {self.visible_devices_env} or list device ids in it",
            )
        return Detection(True, f"{runtime}, {count} of {len(nodes)} devices visible", count)

    @hookimpl
    def declared_limits(self) -> tuple[PlatformLimit, ...]:
        """The limits this platform declares, each with its reason."""
        return self.limits

    def _detect_without_distribution(self, env: Mapping[str, str]) -> Detection:
        """Available through a custom-device library in ``CUSTOM_DEVICE_ROOT``, else why not."""
        plain = installed_distribution("paddlepaddle")
        extra = f" (found {plain[0]} {plain[1]}, the CPU build)" if plain else ""
        root = env.get("CUSTOM_DEVICE_ROOT")
        if self.custom_device_library is not None and root:
            matches = sorted(glob.glob(os.path.join(glob.escape(root), self.custom_device_library)))
            if matches:
                return Detection(
                    True,
                    f"custom-device runtime {matches[0]} (CUSTOM_DEVICE_ROOT); the device count is known once paddle "
                    "starts",
                    0,
                )
            extra += f", and CUSTOM_DEVICE_ROOT={root} holds no {self.custom_device_library}"
        wanted = " or ".join(self.distributions)
        return Detection(False, f"{wanted} is not installed{extra}. Fix: {self.install_hint}")
