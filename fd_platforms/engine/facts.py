"""What every rank of a multi-node engine must agree on (its ``facts``: the model, tp, ...): read from another
rank and compared with this rank's, each failure a typed error naming the rank and both values."""

from __future__ import annotations

import json
from typing import Any

from ..contract.errors import ConfigError, NodeError, show_value

MAX_FACTS_BYTES = 64 << 10  # a node's facts are a few hundred bytes


def read_facts(raw: Any, who: str, me: str) -> dict[str, Any]:
    """The facts ``who`` (a node, a rank) published, or a NodeError when they are not a flat JSON object of plain
    values (the size is checked before anything is parsed; nesting is refused)."""
    try:
        data = bytes(raw)
        facts = json.loads(data.decode()) if len(data) <= MAX_FACTS_BYTES else None
    except (ValueError, TypeError, RecursionError):
        facts = None
    plain = (str, int, float, bool, type(None))
    if not isinstance(facts, dict) or not all(isinstance(value, plain) for value in facts.values()):
        raise NodeError(
            f"{me}: {who} published facts this node cannot read. Fix: run the same fd-platforms version on every node"
        )
    return facts


def compare_facts(ours: dict[str, object], theirs: dict[str, Any], who: str) -> None:
    """A ConfigError naming the first fact on which ``who`` (a node, a rank) differs from this node,
    with both values."""
    for key in sorted(ours.keys() | theirs.keys()):
        if ours.get(key) != theirs.get(key):
            raise ConfigError(
                key,
                ours.get(key),
                f"the same on every node; {who} was started with {key}={show_value(theirs.get(key))}",
                f"start every node of the engine with the same {key}",
            )
