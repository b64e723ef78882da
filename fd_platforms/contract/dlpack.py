"""A Paddle tensor over memory that is not Paddle's, without a copy, and without Paddle's leak.

``paddle.from_dlpack`` wraps the ``DenseTensor`` Paddle's C++ makes from the capsule in ``paddle.Tensor(out,
place=...)``, and Paddle's eager ``Tensor.__init__`` leaks one list (its keyword names) on every call made with
keywords (paddlepaddle 3.3.1; ``paddle/__init__.py``'s ``new_init`` passes ``**kwargs`` even when there are none).
A cache of 96 tensors made and cleared 200 times leaked 8.4 KiB a cycle so. The eager type's own ``__init__``
(the slot wrapper Paddle keeps as ``paddle.original_init``) called with positional arguments does not; where a
Paddle has no such name, ``paddle.from_dlpack`` as it is.
"""

from __future__ import annotations

from typing import Any


def from_dlpack(paddle: Any, array: Any) -> Any:
    """``paddle.from_dlpack(array)`` in dygraph mode: a tensor on ``array``'s memory, zero-copy."""
    init = getattr(paddle, "original_init", None)
    eager = getattr(getattr(getattr(paddle, "base", None), "core", None), "eager", None)
    if init is None or eager is None or not paddle.in_dynamic_mode():
        return paddle.from_dlpack(array)
    dense = paddle.base.core.from_dlpack(array.__dlpack__())
    tensor = eager.Tensor.__new__(eager.Tensor)
    init(tensor, dense, dense._place())  # positional: no keyword list for Paddle to leak
    return tensor
