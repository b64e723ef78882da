"""The engine API: a model runner's whole KV-cache initialization, and the cache manager's side.

The layer above the :class:`~fd_platforms.loading.platform.Platform` facade: every call takes the
platform first, and the facade never imports the engine. Both calls take one :class:`CacheRequest` per rank (or the keywords of before 0.2). A runner calls :func:`initialize_kv_cache`
(decide with the rule, then create and publish, or wait and attach zero-copy by name); a cache
manager calls :func:`manage_kv_cache` (publish a rank's device cache, carve its host swap cache,
set the slot; or, where the rule in force lets the workers create, attach to the rank's published
cache and carve its host swap cache; :func:`hold_kv_cache`, which always attaches, is deprecated;
:func:`allocate_host_cache` carves a host swap cache alone). Both give back records whose ``clear()``
lets go, so the cache can be created again. An engine over several nodes joins them with
:meth:`Cluster.join <fd_platforms.engine.cluster.Cluster.join>` and agrees on the blocks with
:meth:`Cluster.agree <fd_platforms.engine.cluster.Cluster.agree>` (Paddle's collective runtime).
Beside FastDeploy's own processes, every call takes FastDeploy's protocol (``protocol=FASTDEPLOY``, or
``"fastdeploy"`` once :mod:`fd_platforms.fastdeploy` is imported) and its suffix as ``instance=``; everything else of
FastDeploy's (its clear/update, block-count hand-off, config) is :mod:`fd_platforms.fastdeploy`'s, which this
package never imports. See ``docs/engine-integration.md``.

Modules: :mod:`.initialize` (the two calls), :mod:`.request` (what they take: one rank's :class:`CacheRequest`), :mod:`.kv_cache` (the cache record; plain, exported and
attached tensors), :mod:`.host_cache` (host swap tensors in the layout's names), :mod:`.publication`
(where a rank's cache is published, by name), :mod:`.nodes` (where a rank stands among nodes),
:mod:`.rendezvous` (the nodes' handshake), :mod:`.cluster` (the process group and the agreement),
:mod:`.bounded` (Paddle's blocking calls, bounded), :mod:`.protocols` (the wire-protocol interface, ours,
and the registry), :mod:`.rank_parts` (a rank's slot set once its main and MTP draft parts are both published).
"""

from __future__ import annotations

from .. import aliases as _aliases
from .cluster import Agreement, Cluster, RankPlan, collective_backend
from .host_cache import HostCache, allocate_host_cache
from .initialize import ManagedCache, check_can_attach, hold_kv_cache, initialize_kv_cache, manage_kv_cache
from .kv_cache import KVCache, allocate_kv_cache
from .nodes import NodeSpec, free_master
from .publication import publication_name, published_tensor_name
from .request import CacheRequest

__all__ = [
    "Agreement",
    "CacheRequest",
    "Cluster",
    "HostCache",
    "KVCache",
    "ManagedCache",
    "NodeSpec",
    "RankPlan",
    "allocate_host_cache",
    "allocate_kv_cache",
    "check_can_attach",
    "collective_backend",
    "free_master",
    "hold_kv_cache",
    "initialize_kv_cache",
    "manage_kv_cache",
    "publication_name",
    "published_tensor_name",
]


def __getattr__(name: str) -> object:
    """FastDeploy's calls that lived here (``drive_kv_cache_clear``, ...), with a DeprecationWarning: they are
    :mod:`fd_platforms.fastdeploy`'s now."""
    return _aliases.moved_attribute(__name__, name)
