"""The facts a node publishes for the others to compare (``read_facts``) are bounded and flat before they are
compared: anything else is a NodeError naming the node."""

from __future__ import annotations

import pytest

from fd_platforms.contract.errors import NodeError
from fd_platforms.engine.facts import read_facts


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 200_000 + b"]" * 200_000,
        b'{"--model": {"nested": [1, 2]}}',
        b'{"--model": "' + b"x" * (70 << 10) + b'"}',
        b"\xff\xfe",
        b"[1, 2]",
    ],
    ids=["200000-deep", "nested-value", "70-KiB", "not-utf8", "not-an-object"],
)
def test_a_rogue_facts_entry_is_a_node_error_naming_the_node(raw: bytes) -> None:
    with pytest.raises(NodeError, match="node 1 published facts this node cannot read"):
        read_facts(raw, "node 1", "node 0 rank 0")
