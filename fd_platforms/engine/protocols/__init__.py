"""Which inter-process protocol an engine speaks: ours (the default) or FastDeploy's own.

Each protocol is one object behind one interface (:class:`~.interface.WireProtocol`):
:data:`OURS` (:mod:`.ours`) and :data:`FASTDEPLOY` (:mod:`.fastdeploy`). The engine API takes the
protocol's name, as ``protocol=``; :func:`protocol_named` turns it into the object once, at the
entry point, and every step below asks the object. Nothing branches on the name.
"""

from __future__ import annotations

from ...contract.errors import ConfigError
from .fastdeploy import FASTDEPLOY
from .interface import Published, WireProtocol
from .ours import OURS

__all__ = ["FASTDEPLOY", "OURS", "Published", "WireProtocol", "protocol_named"]

_BY_NAME = {protocol.name: protocol for protocol in (OURS, FASTDEPLOY)}


def protocol_named(name: object) -> WireProtocol:
    """The protocol called ``name``; a ConfigError naming the choices otherwise."""
    protocol = _BY_NAME.get(name) if isinstance(name, str) else None
    if protocol is None:
        raise ConfigError(
            "protocol", name, f"one of {', '.join(_BY_NAME)}",
            "pass protocol='fastdeploy' beside FastDeploy's own processes, else leave the default",
        )  # fmt: skip
    return protocol

