"""A rank's publication (``fd_platforms.engine.publication``) is trusted only as far as it is proven: a forged one is
a typed refusal the sweep leaves in place, an attacher refuses one it cannot trace to the process that set the
rank's slot, and a creator's clear removes its own even when it was damaged since."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from kv_requests import kv_request
from run_helpers import QWEN, ROOT

from fd_platforms.contract.errors import CacheSharingError
from fd_platforms.engine import ManagedCache, initialize_kv_cache, manage_kv_cache
from fd_platforms.engine.publication import (
    Publication,
    PublishedTensor,
    publication_name,
    reclaim_instance,
    reclaim_stale_publications,
)
from fd_platforms.ipc.cache_signal import CacheReadySignal, new_signal_name
from fd_platforms.loading.platform import Platform
from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config
from fd_platforms.rules.layout import build_layout

MIXED = {"profile": False, "num_cpu_blocks": 0, "storage_backend": None, "splitwise_role": "mixed"}
LAYOUT = build_layout(load_model_config(ROOT / QWEN), CacheConfig(), ParallelConfig())


@contextlib.contextmanager
def forged(name: str, payload: bytes) -> Iterator[Path]:
    """A publication-like entry in /dev/shm, held (a shared flock) while it exists, so a test suite
    running beside this one sees it in use, never left behind."""
    path = Path("/dev/shm") / name
    path.write_bytes(struct.pack("=4sI", b"FDKV", len(payload)) + payload)
    with open(path, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        try:
            yield path
        finally:
            path.unlink()


@pytest.mark.parametrize(
    "payload",
    [
        b"[" * 200_000 + b"]" * 200_000,
        b'{"format": 1, "rank": 0, "creator_pid": "x", "device": 5, "tensors": [{"name": 1}]}',
        (
            b'{"format": 1, "rank": 0, "creator_pid": 1, "device": "cpu", "tensors": [{"name": "a", "shape": [true],'
            b' "dtype": "uint8", "handle": "h"}]}'
        ),
    ],
    ids=["nested-200000-deep", "wrong-types", "bool-extent"],
)
def test_a_forged_publication_is_a_typed_refusal_and_the_sweep_leaves_it(payload: bytes) -> None:
    with forged("fd_kv_cache.test-forged.rank0", payload) as path:
        with pytest.raises(CacheSharingError, match="is not a complete fd-platforms KV cache publication"):
            Publication.open(path.name, 0)
        reclaimed = reclaim_stale_publications()  # no crash (another suite's dead engine's may be swept too)
        assert path.name not in reclaimed and path.exists()  # and the forged one not deleted


@pytest.mark.parametrize("entry", ["a directory", "a short file"])
def test_an_entry_under_the_instances_names_that_is_not_its_publication_is_named_when_it_ends(
    entry: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The end of a run leaves nothing under its names without a word: what it cannot prove its own (not a
    publication of ours) is named in a WARNING and left in place, as a publication held from outside is."""
    instance = new_signal_name()
    path = Path("/dev/shm") / publication_name(instance, 0)
    if entry == "a directory":
        path.mkdir()
    else:
        path.write_bytes(b"FD")  # shorter than a publication's header
    try:
        with caplog.at_level(logging.WARNING, logger="fd_platforms.engine.publication"):
            assert reclaim_instance(instance) == []
        assert path.exists()
        warning = f"left an entry under this engine instance's names in place: /dev/shm/{path.name}"
        assert warning in caplog.text and "remove it by hand" in caplog.text
    finally:
        if entry == "a directory":
            path.rmdir()
        else:
            path.unlink()


def published_by_us(cpu: Platform, signal_name: str, *, handle_of: int | None = None) -> ManagedCache:
    """Publish rank 0 of the layout from this process (one 1-block tensor per layout entry)."""
    managed = manage_kv_cache(cpu, kv_request(LAYOUT, 1, num_cpu_blocks=0, instance=signal_name))
    if handle_of is not None:  # rewrite the manifest: the same tensors, the handles of another process
        publication = managed.kv_cache._publication
        entries = [PublishedTensor(t.name, t.shape, t.dtype, f"memfd:{handle_of}:3") for t in publication.tensors]
        publication._segment.close()
        Path(f"/dev/shm/{publication.name}").unlink()
        managed.kv_cache._publication = Publication.create(publication_name(signal_name, 0), 0, "cpu", entries)
    return managed


@pytest.mark.parametrize("forgery", ["creator-is-not-the-setter", "handle-of-another-process"])
def test_an_attacher_refuses_a_publication_it_cannot_trace_to_the_setter(cpu: Platform, forgery: str) -> None:
    decode = {**MIXED, "splitwise_role": "decode"}
    other = os.getppid()  # a living process that published nothing
    with CacheReadySignal.create(num_ranks=1) as signal:
        handle_of = other if forgery == "handle-of-another-process" else None
        managed = published_by_us(cpu, signal.name, handle_of=handle_of)
        setter = other if forgery == "creator-is-not-the-setter" else os.getpid()
        try:
            with pytest.raises(CacheSharingError) as info:
                initialize_kv_cache(
                    cpu, kv_request(LAYOUT, 1, instance=signal.name, creator_pid=setter, timeout=10, **decode)
                )
            says = {
                "creator-is-not-the-setter": f"names creator pid {os.getpid()}, but pid {other} sets this rank's slot",
                "handle-of-another-process": f"with a handle of pid {other}, not of its creator",
            }[forgery]
            assert says in str(info.value)
        finally:
            managed.clear(1)


@pytest.mark.parametrize("size", [0, 5])
def test_a_creators_clear_removes_its_publication_even_truncated_since(cpu: Platform, size: int) -> None:
    """The creator holds its manifest's inode: damaged (truncated below its header) while published, it is
    still the creator's own, and its clear removes it."""
    with CacheReadySignal.create(num_ranks=1) as signal:
        cache = initialize_kv_cache(cpu, kv_request(LAYOUT, 1, instance=signal.name, **MIXED))
        path = Path("/dev/shm") / publication_name(signal.name, 0)
        os.truncate(path, size)
        try:
            cache.clear(1)
            assert not path.exists(), "the creator's damaged publication stays after its clear"
        finally:
            path.unlink(missing_ok=True)
