"""Which inter-process protocol an engine speaks: ours (the default), or one installed or registered beside it.

Each protocol is one object behind one interface (:class:`~.interface.WireProtocol`).
:data:`~fd_platforms.engine.protocols.ours.OURS` (:mod:`.ours`) is the engine's own; FastDeploy's
(``fd_platforms.fastdeploy.FASTDEPLOY``) lives with the rest of FastDeploy's code in :mod:`fd_platforms.fastdeploy`,
which the engine never imports: its name is found through the ``fd_platforms.protocols`` entry points
(:mod:`.registry`), so ``protocol="fastdeploy"`` resolves in any process, and an engine may as well pass the object.
:func:`~fd_platforms.engine.protocols.registry.protocol_named` turns either form into the object once, when an engine's
:class:`~fd_platforms.engine.CacheRequest` is made, and every step below asks the object. Nothing branches on the name.
"""

from __future__ import annotations

from .interface import Published, WireProtocol
from .ours import OURS
from .registry import installed_protocols, protocol_named, register_protocol

__all__ = ["OURS", "Published", "WireProtocol", "installed_protocols", "protocol_named", "register_protocol"]
