"""Proof that two processes map the same KV cache memory, not copies: tokens written by one, read by the other.

The creator writes a token byte into the first byte of every tensor; an attacher checks each one
and writes its own token into the last byte; the creator checks those. A copy would miss either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..contract.paddle_import import import_paddle
from ..kit.device_facts import write_element


def _byte(token: int, index: int) -> int:
    """The byte tensor ``index`` carries for ``token``: never 0, so a zero-filled cache never passes."""
    return (token + 31 * index) % 255 + 1


def _raw(tensor: Any) -> Any:
    """The tensor's own bytes, as a zero-copy uint8 view."""
    paddle = import_paddle()
    return tensor if tensor.dtype == paddle.uint8 else tensor.view(paddle.uint8)


def _position(raw: Any, last: bool) -> tuple[int, ...]:
    return tuple(extent - 1 for extent in raw.shape) if last else (0,) * len(raw.shape)


def write_tokens(tensors: Sequence[Any], token: int, *, last: bool = True) -> None:
    """Write ``token``'s byte into every tensor: its last byte (an attacher) or its first (the creator),
    into the tensor's own memory on every device (:func:`~fd_platforms.kit.device_facts.write_element`)."""
    for index, tensor in enumerate(tensors):
        raw = _raw(tensor)
        write_element(raw, _position(raw, last), _byte(token, index))


def verify_attached(tensors: Sequence[Any], creators: int, ours: int) -> bool:
    """An attacher proves it maps the creator's memory: it reads the creator's tokens, writes its own."""
    seen = read_tokens(tensors, creators)
    write_tokens(tensors, ours)
    return seen


def read_tokens(tensors: Sequence[Any], token: int, *, last: bool = False) -> bool:
    """Whether every tensor carries ``token``'s byte: in its first byte (the creator's) or its last."""
    for index, tensor in enumerate(tensors):
        raw = _raw(tensor)
        # .item() reads the one element; int(tensor) would make Paddle read (and fault in) all of it
        if raw[_position(raw, last)].item() != _byte(token, index):
            return False
    return True
