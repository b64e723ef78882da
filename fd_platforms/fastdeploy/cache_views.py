"""A managed rank's cache in the shapes FastDeploy's cache processes keep it.

FastDeploy's cache transfer manager keeps one list of device tensors per role, layer by layer, main then MTP
layers (``gpu_cache_k_tensors``, ``gpu_cache_v_tensors``, ``gpu_cache_scales_k_tensors``,
``gpu_cache_scales_v_tensors``), a dict of them by name (``gpu_cache_kvs``), and the host swap space as one
address list per role (``k_dst_ptrs``, ``v_dst_ptrs``, ``k_scales_ptrs``, ``v_scales_ptrs``), which its swap
kernels take (``fastdeploy/cache_manager/cache_transfer_manager.py`` ``_init_gpu_cache``, ``_init_cpu_cache``,
``_transfer_data``, develop c1b7c083). Its cache messager keeps a dict keyed ``key_caches_{layer}_rank{rank}_device
{id}`` (an underscore where the IPC name has a dot: ``cache_messager.py`` ``main``, ``CacheMessager.__init__``).
:func:`transfer_manager_views` and :func:`messager_cache_kvs` give those views of a
:class:`~fd_platforms.engine.initialize.ManagedCache`, so the ported processes' transfer code stays as it is.
"""

from __future__ import annotations

from typing import Any

from ..contract.errors import ConfigError
from ..engine import KVCache, ManagedCache
from ..rules.layout import NAME_PREFIX

_DEVICE_LISTS = {
    "key": "gpu_cache_k_tensors",
    "value": "gpu_cache_v_tensors",
    "key_scale": "gpu_cache_scales_k_tensors",
    "value_scale": "gpu_cache_scales_v_tensors",
}
_HOST_LISTS = {"key": "k_dst_ptrs", "value": "v_dst_ptrs", "key_scale": "k_scales_ptrs", "value_scale": "v_scales_ptrs"}


def transfer_manager_views(managed: object) -> dict[str, Any]:
    """``managed`` (what ``manage_kv_cache`` returned) under the transfer manager's attribute names: ``gpu_cache_kvs``
    (device tensors by name), ``gpu_cache_k_tensors``, ``gpu_cache_v_tensors``, ``gpu_cache_scales_k_tensors``,
    ``gpu_cache_scales_v_tensors`` (per role, layer order, the draft layers after the main), ``cpu_cache_kvs`` (host
    swap tensors by name) and ``k_dst_ptrs``, ``v_dst_ptrs``, ``k_scales_ptrs``, ``v_scales_ptrs`` (their addresses
    per role; empty without swap space). A port sets them on its manager: ``vars(self).update(...)``."""
    if not isinstance(managed, ManagedCache):
        raise ConfigError("managed", managed, "the ManagedCache manage_kv_cache returned", "pass it as it is")
    views: dict[str, Any] = {name: [] for name in (*_DEVICE_LISTS.values(), *_HOST_LISTS.values())}
    views["gpu_cache_kvs"], views["cpu_cache_kvs"] = _device_by_name(managed), {}
    for name, tensor in views["gpu_cache_kvs"].items():
        if _role(name) in _DEVICE_LISTS:
            views[_DEVICE_LISTS[_role(name)]].append(tensor)
    host = managed.host_cache
    for name, tensor in zip(host.names, host.tensors, strict=True) if host is not None else ():
        views["cpu_cache_kvs"][name] = tensor
        if _role(name) in _HOST_LISTS:
            views[_HOST_LISTS[_role(name)]].append(tensor.data_ptr())
    return views


def messager_cache_kvs(cache: object) -> dict[str, Any]:
    """The device tensors of ``cache`` (a ``ManagedCache`` or a ``KVCache``) keyed as FastDeploy's cache messager
    keys them: the IPC name with ``_device`` for ``.device``."""
    if isinstance(cache, ManagedCache):
        named = _device_by_name(cache)
    elif isinstance(cache, KVCache):
        named = dict(zip(cache.names, cache.tensors, strict=True))
    else:
        raise ConfigError("cache", cache, "a ManagedCache or a KVCache", "pass what manage_kv_cache returned")
    return {name.replace(".device", "_device"): tensor for name, tensor in named.items()}


def _device_by_name(managed: ManagedCache) -> dict[str, Any]:
    """The device tensors of ``managed`` by name: the main part's, then the draft's."""
    return {
        name: tensor
        for cache in (managed.kv_cache, managed.draft)
        if cache is not None
        for name, tensor in zip(cache.names, cache.tensors, strict=True)
    }


def _role(name: str) -> str:
    return next(role for role, prefix in NAME_PREFIX.items() if name.startswith(f"{prefix}_"))


__all__ = ["messager_cache_kvs", "transfer_manager_views"]
