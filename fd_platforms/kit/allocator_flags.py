"""Paddle's allocator flags that change what a device IPC handle can cover, as data, and how one is read.

Each :class:`AllocatorFlag` names one generation of Paddle's virtual-memory (VMM) allocator. What was seen of
Paddle (PR numbers of PaddlePaddle/Paddle unless said otherwise):

- ``FLAGS_use_virtual_memory_auto_growth`` (V1, off by default in every build seen, 3.3.1 included): its memory is
  shared through ``_share_cuda``'s 5-field VMM metadata, whose blob names the exporter's pid and the chunks'
  file descriptors (taken with ``pidfd_getfd``) — #76555 "support vmm ipc", #76730 (it needs pidfd).
- ``FLAGS_use_vmm_auto_growth_best_fit_allocator_v2`` (V2): the allocator of #78317/#78344; its IPC came with
  #79427 ("Add VMM V2 remap and IPC support", whose review shows the flag defined ``true`` and exclusive with V1)
  and exports file descriptors (``cuMemExportToShareableHandle``, #79479's review); #79605 (2026-08-03, develop)
  turns it on by default. FastDeploy pinned its Paddle for it (PaddlePaddle/FastDeploy#8108, 2026-08-10: its
  ``set_data_ipc`` uses ``cudaIpcGetMemHandle``). Not seen: which Paddle release first has it on by default, and
  what ``_share_cuda`` gives for V2 memory, so no fd-platforms protocol is known to carry it.

A :class:`FlagReading` is one flag as this process's Paddle has it: on or off, and whether that is the build's
default (:func:`read_flag` says how that is known, and where it cannot be).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

#: Where a flag's value comes from: the build's default, the environment variable of its name, set in this process
#: some other way (``paddle.set_flags``), or not knowable on this build.
Origin = Literal["default", "environment", "in_process", "unknown"]


@dataclass(frozen=True)
class AllocatorFlag:
    """One Paddle allocator flag: ``name`` (``FLAGS_...``), its ``generation`` (``"VMM V1"``), what IPC its memory
    gets (``ipc``), whether Paddle's ``_share_*``/``_new_shared_*`` metadata is known to carry that memory
    (``paddle_ipc_covers``: the fd-platforms protocol shares it then), and the ``prs`` that say so."""

    name: str
    generation: str
    ipc: str
    paddle_ipc_covers: bool
    prs: tuple[str, ...]


VMM_V1 = AllocatorFlag(
    name="FLAGS_use_virtual_memory_auto_growth",
    generation="VMM V1",
    ipc="Paddle's VMM metadata (5 fields: a blob naming the exporter's pid and its chunks' file descriptors)",
    paddle_ipc_covers=True,
    prs=("Paddle#76555", "Paddle#76730"),
)
VMM_V2 = AllocatorFlag(
    name="FLAGS_use_vmm_auto_growth_best_fit_allocator_v2",
    generation="VMM V2",
    ipc="file descriptors of its VMM chunks (cuMemExportToShareableHandle), in a form fd-platforms has not seen",
    paddle_ipc_covers=False,
    prs=("Paddle#79427", "Paddle#79479", "Paddle#79605", "FastDeploy#8108"),
)
#: Every flag the kit knows, by name: what a facts class's ``allocator_flags`` may name.
PADDLE_ALLOCATOR_FLAGS = {flag.name: flag for flag in (VMM_V1, VMM_V2)}


@dataclass(frozen=True)
class FlagReading:
    """``flag`` as this process's Paddle has it: ``on``, and where that comes from (``origin``)."""

    flag: AllocatorFlag
    on: bool
    origin: Origin

    def said(self) -> str:
        """``FLAGS_x is on (this Paddle build's default)``, with where the value comes from."""
        where = {
            "default": "this Paddle build's default",
            "environment": f"set by the environment variable {self.flag.name}",
            "in_process": "set in this process (paddle.set_flags): neither the build's default nor the environment's",
            "unknown": "not set by the environment; whether it is the build's default this Paddle cannot say",
        }[self.origin]
        return f"{self.flag.name} is {'on' if self.on else 'off'} ({where})"

    def fix(self) -> str:
        """How to turn the flag off in every process of the engine."""
        return f"set {self.flag.name}=0 in every process of the engine, before paddle is imported"


def read_flag(paddle: Any, flag: AllocatorFlag, environ: Mapping[str, str] | None = None) -> FlagReading | None:
    """``flag`` as ``paddle`` has it, or None where the build lacks it (``paddle.get_flags`` refuses the name).

    Whether the value is the build's default: an environment variable ``flag.name`` (Paddle reads ``FLAGS_*`` from
    the environment when it is imported) makes it ``"environment"``; else ``paddle.base.core.globals().get_default``
    (the flag registry's compiled default, in Paddle 2.x and 3.x) decides ``"default"`` or ``"in_process"``; a build
    without it is ``"unknown"``. Limits: ``environ`` (default ``os.environ``) is this process's environment now, not
    at Paddle's import, and an environment variable that sets the default value still reads as ``"environment"``.
    """
    try:
        on = bool(paddle.get_flags([flag.name])[flag.name])
    except (ValueError, KeyError):
        return None
    env = os.environ if environ is None else environ
    if flag.name in env:
        return FlagReading(flag, on, "environment")
    default = _default_of(paddle, flag.name)
    if default is None:
        return FlagReading(flag, on, "unknown")
    return FlagReading(flag, on, "default" if bool(default) == on else "in_process")


def _default_of(paddle: Any, name: str) -> object:
    """The build's default of flag ``name`` from Paddle's flag registry, None where this build cannot say."""
    registry = getattr(getattr(getattr(paddle, "base", None), "core", None), "globals", None)
    get_default = getattr(registry() if callable(registry) else None, "get_default", None)
    return get_default(name) if callable(get_default) else None
