"""A Paddle tensor over foreign memory (:func:`fd_platforms.contract.dlpack.from_dlpack`): zero-copy, and no object left
behind per call (Paddle's own ``from_dlpack`` leaks a list per tensor through its keyword ``Tensor.__init__``)."""

from __future__ import annotations

import gc

import pytest

from fd_platforms.contract.dlpack import from_dlpack

paddle = pytest.importorskip("paddle")
np = pytest.importorskip("numpy")


def tracked_lists() -> int:
    gc.collect()
    return sum(isinstance(item, list) for item in gc.get_objects())


def test_the_tensor_is_the_arrays_memory() -> None:
    array = np.zeros((4, 8), dtype=np.uint8)
    tensor = from_dlpack(paddle, array)
    assert tuple(tensor.shape) == (4, 8) and str(tensor.dtype) == "paddle.uint8" and tensor.place.is_cpu_place()
    array[1, 2] = 7
    assert int(tensor[1, 2]) == 7, "zero-copy: a write to the array is the tensor's"


def test_making_tensors_leaves_no_object_behind() -> None:
    array = np.zeros(64, dtype=np.uint8)
    for _ in range(5):
        from_dlpack(paddle, array)
    before = tracked_lists()
    for _ in range(200):
        from_dlpack(paddle, array)
    assert tracked_lists() - before <= 2, "a list per tensor is Paddle's keyword-init leak"
