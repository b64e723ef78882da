"""Which inter-process protocol an engine speaks: ours (the default), or one registered beside it.

Each protocol is one object behind one interface (:class:`~.interface.WireProtocol`). :data:`OURS`
(:mod:`.ours`) is the engine's own; FastDeploy's (``fd_platforms.fastdeploy.FASTDEPLOY``) lives with the rest
of FastDeploy's code in :mod:`fd_platforms.fastdeploy`, which the engine never imports: importing that package
registers it here (:func:`register_protocol`), so ``protocol="fastdeploy"`` resolves once it is imported,
and an engine may as well pass the object. :func:`protocol_named` turns either form into the object once,
at the entry point, and every step below asks the object. Nothing branches on the name.
"""

from __future__ import annotations

from ...contract.errors import ConfigError
from .interface import Published, WireProtocol
from .ours import OURS

__all__ = ["OURS", "Published", "WireProtocol", "protocol_named", "register_protocol"]

_REGISTERED: dict[str, WireProtocol] = {OURS.name: OURS}
#: Protocols this package knows the home of, for the message when one is named before it is imported.
_HOMES = {"fastdeploy": "fd_platforms.fastdeploy"}


def register_protocol(protocol: WireProtocol) -> None:
    """Make ``protocol`` resolvable by its name (a package of protocol code does it when imported)."""
    if not isinstance(protocol, WireProtocol):
        raise TypeError(f"register_protocol takes a WireProtocol, not {type(protocol).__name__}")
    known = _REGISTERED.setdefault(protocol.name, protocol)
    if known is not protocol:
        raise ValueError(f"a protocol named {protocol.name!r} is registered already: {known!r}")


def protocol_named(name: object) -> WireProtocol:
    """The protocol ``name`` (a registered name, or a :class:`WireProtocol`); a ConfigError naming the choices."""
    if isinstance(name, WireProtocol):
        return name
    protocol = _REGISTERED.get(name) if isinstance(name, str) else None
    if protocol is not None:
        return protocol
    home = _HOMES.get(name) if isinstance(name, str) else None
    fix = (
        f"import {home} before naming it (importing it registers protocol {name!r}), or pass its object: "
        f"from {home} import {str(name).upper()}"
        if home
        else "pass protocol='fastdeploy' beside FastDeploy's own processes (import fd_platforms.fastdeploy "
        "first), else leave the default"
    )
    raise ConfigError("protocol", name, f"one of {', '.join(sorted({*_REGISTERED, *_HOMES}))}", fix)


def __getattr__(name: str) -> object:
    """``FASTDEPLOY``, which lived here, with a DeprecationWarning: it is :mod:`fd_platforms.fastdeploy`'s now."""
    from ... import aliases

    return aliases.moved_attribute(__name__, name)
