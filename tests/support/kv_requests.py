"""The tests' way to build a rank's :class:`~fd_platforms.engine.CacheRequest`: the layout and the blocks first, then
any field by its name, a mixed instance without swap space unless told otherwise."""

from __future__ import annotations

from typing import Any

from fd_platforms.engine import CacheRequest
from fd_platforms.rules.layout import CacheLayout


def kv_request(layout: CacheLayout, num_blocks: int, **fields: Any) -> CacheRequest:
    """``CacheRequest(layout=layout, num_blocks=num_blocks, **fields)``, with ``num_cpu_blocks`` 0 and
    ``splitwise_role`` ``"mixed"`` where ``fields`` does not say."""
    return CacheRequest(
        layout=layout, num_blocks=num_blocks, **{"num_cpu_blocks": 0, "splitwise_role": "mixed", **fields}
    )
