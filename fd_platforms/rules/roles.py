"""Who creates a rank's KV cache and who attaches to it, under the rule version in force: one answer for every caller.

The processes of a rank are FastDeploy's: the worker (the model runner), the cache transfer manager (started where
one of the version's :attr:`~.decision.RuleVersion.transfer_terms` holds) and, in P/D (``splitwise_role`` prefill or
decode), the cache messager. Where the rule makes the worker attach, the transfer manager creates in a mixed
instance and the messager in P/D; where the worker creates, a transfer manager that runs attaches to its cache. In
P/D the messager creates under every version, and the worker and a running transfer manager both attach
(``cache_manager/prefix_cache_manager.py`` ``launch_cache_manager``, develop c1b7c083 ~L297-304: no
``--create_cache_tensor`` in a split deployment). A creator's clear waits for its attachers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .decision import RULE_VERSIONS, DecisionInputs, decide_cache_creation

Process = Literal["worker", "cache transfer manager", "cache messager"]
WORKER: Process = "worker"
TRANSFER_MANAGER: Process = "cache transfer manager"
MESSAGER: Process = "cache messager"


@dataclass(frozen=True)
class CacheRoles:
    """The process that creates a rank's cache and those that attach to it."""

    creator: Process
    attachers: tuple[Process, ...]

    def others(self, caller: Process) -> tuple[Process, ...]:
        """The attachers beside ``caller`` (an attacher counts the others; a creator all of them)."""
        return tuple(process for process in self.attachers if process != caller)

    def __str__(self) -> str:
        if not self.attachers:
            return f"the {self.creator} creates; nobody attaches"
        verb = "attaches" if len(self.attachers) == 1 else "attach"
        return f"the {self.creator} creates; the {' and the '.join(self.attachers)} {verb}"


def cache_roles(inputs: DecisionInputs) -> CacheRoles:
    """Who creates a rank's cache and who attaches to it on ``inputs`` (their rule version); a profiling run's cache
    is its worker's alone."""
    if inputs.profile:
        return CacheRoles(WORKER, ())
    transfer = (TRANSFER_MANAGER,) if inputs.holds(*RULE_VERSIONS[inputs.rule].transfer_terms) else ()
    if inputs.splitwise_role != "mixed":
        return CacheRoles(MESSAGER, (WORKER, *transfer))
    if decide_cache_creation(**inputs.kwargs()).create:
        return CacheRoles(WORKER, transfer)
    return CacheRoles(TRANSFER_MANAGER, (WORKER,))
