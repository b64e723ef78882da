"""fd-platforms' failure words in FastDeploy's ``kv_cache_status``, beside its four values.

FastDeploy's ``KVCacheStatus`` (``fastdeploy/inter_communicator/ipc_signal_const.py``) has NORMAL 0, UPDATING 1,
CLEARING -1 and CLEARED -2, and no word for a failure: its transfer manager logs a failed clear and leaves the word,
so its engine client times out. A creator or driver of ours says a failure in words far below those
(:mod:`fd_platforms.fastdeploy.cache_status` says who writes which); FastDeploy's processes act only on its own four, so
none of them takes a failure word for NORMAL, and a signal's reader counts them as known words, not stray ones.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..ipc.shared_words import MAX_LOCAL_RANKS


class FaultKind(enum.IntEnum):
    """fd-platforms' failure words in ``kv_cache_status``, outside FastDeploy's values (see the module
    docstring); the first two less the rank they name."""

    NOT_CLEARED = -10000
    NOT_CREATED = -20000
    DRIVE_FAILED = -30000


@dataclass(frozen=True)
class KVCacheFault:
    """A failure said in ``kv_cache_status``: its kind and the local rank it names (None for DRIVE_FAILED)."""

    kind: FaultKind
    rank: int | None = None

    @property
    def word(self) -> int:
        return self.kind - (self.rank or 0)

    @property
    def kept(self) -> bool:
        """Whether every cache is kept or created again (a clear that failed), none lost."""
        return self.kind == FaultKind.NOT_CLEARED

    @classmethod
    def read(cls, word: int) -> KVCacheFault | None:
        """The failure ``word`` says, None where it is no failure word."""
        for kind in FaultKind:
            if kind == FaultKind.DRIVE_FAILED:
                if word == kind:
                    return cls(kind)
            elif kind - MAX_LOCAL_RANKS < word <= kind:
                return cls(kind, kind - word)
        return None

    def describe(self) -> str:
        said = {
            FaultKind.NOT_CLEARED: f"the cache creator could not clear rank {self.rank}'s KV cache; it kept the "
            "others and created again what it had freed",
            FaultKind.NOT_CREATED: f"the cache creator could not create rank {self.rank}'s KV cache again: that rank "
            "has none",
            FaultKind.DRIVE_FAILED: "a drive failed after a rank let go of its KV cache: the caches may be freed",
        }[self.kind]
        return f"{self.word} (fd-platforms' failure word: {said})"
