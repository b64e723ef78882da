"""The engine API: everything an engine (a model runner, its cache manager) uses, in one module.

An engine imports from here, from :mod:`fd_platforms` (``current_platform()``) and, beside FastDeploy's own
processes, from :mod:`fd_platforms.fastdeploy`, and nowhere else in ``fd_platforms``::

    from fd_platforms.engine import CacheConfig, CacheRequest, build_layout, initialize_kv_cache, load_model_config

``__all__`` is the whole API (at most 35 names): the calls, the record they take, the records they give back,
the configs, the layout and the plan, a cache-ready signal, the nodes of a multi-node engine, the wire-protocol type,
and the errors a runner catches; every other error is in :mod:`fd_platforms.engine.errors`
(``from fd_platforms.engine import errors``). The other modules of the package are its own, and so is
every submodule here; ``lifecycle/`` and ``cli/`` (``fd-platforms run``) use this module as any engine
does (an import contract in ``pyproject.toml`` holds it).

Every call takes the platform first (the :class:`~fd_platforms.loading.platform.Platform` facade never
imports the engine), and both calls take one :class:`CacheRequest` per rank, checked when it is made. A runner
calls :func:`initialize_kv_cache` (decide with the rule, then create and publish, or wait and attach zero-copy by
name); a cache manager calls :func:`manage_kv_cache` (publish a rank's device cache, carve its host swap cache, set
the slot; or, where the rule in force lets the workers create, attach to the rank's published cache and carve its
host swap cache; :func:`allocate_host_cache` carves a host swap cache alone). Both give back records whose
``clear()`` lets go, so the cache can be created again. The workers of an engine over several nodes, started by
Paddle's launcher, take its process group with :meth:`Cluster.current <fd_platforms.engine.cluster.Cluster.current>`
and agree on the blocks with :meth:`Cluster.agree <fd_platforms.engine.cluster.Cluster.agree>`. Beside FastDeploy's
own processes the request names FastDeploy's protocol (``protocol="fastdeploy"``, found through the
``fd_platforms.protocols`` entry points as a platform is: :func:`protocol_named`; an engine's own protocol object is
registered by name with :func:`register_protocol`) and its suffix as ``instance``;
everything else of FastDeploy's is :mod:`fd_platforms.fastdeploy`'s, which this package never imports. See
``docs/engine-integration.md``.

Modules: :mod:`.initialize` (the two calls), :mod:`.request` (what they take: one rank's :class:`CacheRequest`),
:mod:`.kv_cache` (the cache record; plain, exported and attached tensors), :mod:`.host_cache` (host swap tensors in the
layout's names), :mod:`.publication` (where a rank's cache is published, by name), :mod:`.cluster` (the process group
and the agreement), :mod:`.launched_group` (the group Paddle's launcher made), :mod:`.facts` (what every rank must agree
on), :mod:`.bounded` (Paddle's blocking calls, bounded), :mod:`.protocols` (the wire-protocol interface, ours, and
where a protocol's name is found), :mod:`.rank_parts` (a rank's slot set once its main and MTP draft parts are both
published), :mod:`.errors` (every error).
"""

from __future__ import annotations

from ..contract.errors import BufferInUseError, CacheInUseError, CacheNotReadyError, ConfigError, FdPlatformsError
from ..contract.types import CacheRoleShape, DeviceMemory, Plan, PlatformIdentity
from ..ipc.cache_signal import CacheReadySignal
from ..rules.config import CacheConfig, ParallelConfig, load_model_config
from ..rules.decision import register_rule_version
from ..rules.layout import CacheLayout, build_layout
from ..rules.planner import min_across_ranks, plan_blocks
from . import errors  # noqa: F401 - public beside __all__: from fd_platforms.engine import errors
from .cluster import Agreement, Cluster
from .host_cache import HostCache, allocate_host_cache
from .initialize import ManagedCache, check_can_attach, initialize_kv_cache, manage_kv_cache
from .kv_cache import KVCache, allocate_kv_cache
from .protocols import WireProtocol, protocol_named, register_protocol
from .publication import publication_name, published_tensor_name, reclaim_stale_publications
from .request import CacheRequest

__all__ = [
    # the calls: a runner's, a cache manager's, and their parts; what each takes for a rank
    "CacheRequest",
    "initialize_kv_cache",
    "manage_kv_cache",
    "allocate_kv_cache",
    "allocate_host_cache",
    "check_can_attach",
    "reclaim_stale_publications",
    # what they give back, and the engine's cache-ready signal
    "KVCache",
    "ManagedCache",
    "HostCache",
    "CacheReadySignal",
    # configs, and the engine's own version of the create-or-attach rule
    "CacheConfig",
    "register_rule_version",
    "ParallelConfig",
    "load_model_config",
    # the layout: tensor names, shapes and dtypes; an attention backend's own tensor specs
    "build_layout",
    "CacheLayout",
    "CacheRoleShape",
    # planning: the blocks a rank's memory holds, the fewest across ranks
    "plan_blocks",
    "min_across_ranks",
    "Plan",
    "DeviceMemory",
    # who the platform is (platform.identity): its name, Paddle device type and visible-devices variable
    "PlatformIdentity",
    # several nodes
    "Cluster",
    "Agreement",
    # the wire protocol an engine speaks, and where a rank's cache is published under it
    "WireProtocol",
    "protocol_named",
    "register_protocol",
    "publication_name",
    "published_tensor_name",
    # the errors a runner catches (every other one: fd_platforms.engine.errors)
    "FdPlatformsError",
    "ConfigError",
    "CacheNotReadyError",
    "CacheInUseError",
    "BufferInUseError",
]
