"""Where a protocol's name is found: ours built in, every other one through the ``fd_platforms.protocols``
entry points, as a platform's is found through ``fd_platforms``'.

The package's own metadata registers FastDeploy's (``fastdeploy = "fd_platforms.fastdeploy.protocol:FASTDEPLOY"``),
so ``protocol="fastdeploy"`` works in any process while the engine never imports :mod:`fd_platforms.fastdeploy`;
another distribution registers its own the same way. An entry point is imported only when its name is asked for,
once a process: the core's own directly, a third party's as untrusted code, as a platform plugin is
(:func:`~fd_platforms.loading.isolation.call_plugin`: whatever its import raises, ``SystemExit`` included, is a
:class:`~fd_platforms.contract.errors.PluginLoadError` naming it), and what it names must be a
:class:`~.interface.WireProtocol` of that name. An unknown name lists the installed names, from metadata, loading
none of them. An engine's own protocol object needs no metadata: :func:`register_protocol`.
"""

from __future__ import annotations

import inspect

from ...contract.errors import ConfigError, PluginContractError, show_value
from ...loading.discovery import CORE_DISTRIBUTION, Candidate, discover
from ...loading.isolation import import_plugin
from .interface import WireProtocol
from .ours import OURS

ENTRY_POINT_GROUP = "fd_platforms.protocols"
KIND = "protocol plugin"

_known: dict[str, WireProtocol] = {OURS.name: OURS}
"""Every protocol this process has: ours, those loaded from their entry points, and those an engine registered."""


def protocol_named(name: object) -> WireProtocol:
    """The protocol ``name`` (an installed protocol's name, or a
    :class:`~fd_platforms.engine.protocols.interface.WireProtocol`, taken as it is); a ConfigError listing the installed
    names otherwise."""
    if isinstance(name, WireProtocol):
        return name
    if isinstance(name, str) and name in _known:
        return _known[name]
    installed = _installed()  # metadata read once, for the load or for the refusal
    if isinstance(name, str) and installed.get(name):
        return _known.setdefault(name, _load(name, installed[name]))
    raise ConfigError(
        "protocol",
        name,
        f"one of {', '.join(_listed(installed))}",
        "pass protocol='fastdeploy' beside FastDeploy's own processes, else leave the default; an engine's own "
        "protocol object is passed as it is, or registered by name first (register_protocol)",
    )


def installed_protocols() -> list[str]:
    """Every protocol name this process can resolve, from metadata and registrations: none of them is loaded."""
    return _listed(_installed())


def _listed(installed: dict[str, list[Candidate]]) -> list[str]:
    """The names of this process's protocols and of ``installed``, sorted."""
    return sorted({*_known, *installed})


def register_protocol(protocol: object) -> None:
    """Make an engine's own ``protocol`` resolvable by its name in this process. A ConfigError where it is no
    :class:`~fd_platforms.engine.protocols.interface.WireProtocol`, where its ``name`` is no plain non-empty text
    without spaces (looked up statically: a property or other code does not run), or where the name is another
    protocol's (ours, an installed one, a registered one)."""
    if not isinstance(protocol, WireProtocol):
        raise ConfigError(
            "protocol",
            protocol,
            "a WireProtocol (an instance of a subclass that implements every operation)",
            "pass the engine's protocol object",
        )
    name = inspect.getattr_static(protocol, "name", None)
    if type(name) is not str or not name or name != name.strip() or any(char.isspace() for char in name):
        raise ConfigError(
            "protocol.name",
            name,
            "plain text without spaces, set on the protocol's class or instance (protocol='<name>' finds it)",
            "give the protocol's class a name such as name = 'my-engine'",
        )
    known = _known.get(name)
    if known is protocol:
        return
    holders = [f"{c.distribution} {c.version}" for c in _installed().get(name, [])]
    if known is not None or holders:
        held = f"installed by {' and '.join(holders)}" if holders else f"registered already ({show_value(known)})"
        raise ConfigError(
            "protocol.name",
            name,
            f"a name no other protocol has ({held})",
            "name the engine's protocol otherwise",
        )
    _known[name] = protocol


def _installed() -> dict[str, list[Candidate]]:
    """The protocols installed distributions register, by name, not yet imported."""
    return discover(ENTRY_POINT_GROUP, {}, KIND)


def _load(name: str, candidates: list[Candidate]) -> WireProtocol:
    """Import the one entry point registering ``name``; the protocol it names, checked."""
    if len(candidates) > 1:
        dists = " and ".join(f"{c.distribution} {c.version}" for c in candidates)
        raise ConfigError(
            "protocol",
            name,
            f"a protocol one installed distribution registers ({len(candidates)} do: {dists})",
            "uninstall all but one of them (pip uninstall <distribution>)",
        )
    [candidate] = candidates
    # the core's own code directly (its errors are its own), a third party's as plugin code
    loaded = candidate.load() if candidate.distribution == CORE_DISTRIBUTION else import_plugin(candidate)
    if not isinstance(loaded, WireProtocol) or inspect.getattr_static(loaded, "name", None) != name:
        raise candidate.error(  # its name looked up statically: no code of the plugin runs here
            PluginContractError,
            f"entry point {candidate.entry_point.value!r} names {show_value(loaded)}, not a WireProtocol named "
            f"{name!r}. "
            f"Fix: point the {ENTRY_POINT_GROUP} entry point {name!r} at an instance of a WireProtocol subclass "
            f"whose name is {name!r}",
        )
    return loaded
