"""The pickles FastDeploy's control path carries, read through an allow-list and written under FastDeploy's names.

FastDeploy's engine hands its transfer managers ``(CacheStatus.CTRL, ControlRequest)`` over its engine cache queue
(``fastdeploy/engine/common_engine.py`` L1497, L1594, L1774; a stdlib ``multiprocessing.managers`` list, pickled)
and reads their answers as a pickled FMQ ``Message`` whose payload is a ``ControlResponse``
(``fastdeploy/inter_communicator/fmq.py`` L158-171 ``ForkingPickler``; ``fastdeploy/engine/request.py``
L737-759 and L824-841). FastDeploy is not imported here: its classes are represented by our own small ones.

Trust boundary: unpickling runs whatever callable the pickle names, so bytes from a socket are read only by
:func:`restricted_loads`, whose ``find_class`` resolves exact (module, name) pairs from
:data:`ALLOWED` (FastDeploy's ``ControlRequest`` and ``CacheStatus`` as ours;
the builtin and ``threading`` exceptions a manager server answers with) and refuses every other with a
:class:`~fd_platforms.contract.errors.PickleRefusedError` naming it, before anything of it is called. A
``ControlRequest``'s state is checked (``request_id`` and ``method`` strings, ``args`` a dict) as it is set. Our answers
are written by :func:`fastdeploy_dumps`, which names our classes by FastDeploy's module and class (the pickle asks
FastDeploy's unpickler to import that module and take the class from it), so FastDeploy reads its own classes; it never
writes a callable of ours.
"""

from __future__ import annotations

import builtins
import enum
import importlib
import io
import pickle
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..contract.errors import PickleRefusedError, show_value

REQUEST_MODULE = "fastdeploy.engine.request"
CACHE_DATA_MODULE = "fastdeploy.cache_manager.cache_data"
FMQ_MODULE = "fastdeploy.inter_communicator.fmq"
PROTOCOL = 4  # ForkingPickler.dumps' default on Python 3.8-3.13; any Python 3 FastDeploy runs reads it


class CacheStatus(enum.Enum):
    """FastDeploy's ``CacheStatus`` (``fastdeploy/cache_manager/cache_data.py`` L24-35): a task's kind."""

    GPU = 0
    SWAP2CPU = 1
    SWAP2GPU = 2
    CPU = 3
    GPU2STORAGE = 4
    STORAGE2GPU = 5
    CTRL = -1


class ControlRequest:
    """FastDeploy's ``ControlRequest`` (``request.py`` L737-759): ``request_id``, ``method``, ``args``."""

    def __init__(self, request_id: str, method: str, args: dict[str, Any] | None = None) -> None:
        self.__setstate__({"request_id": request_id, "method": method, "args": args or {}})

    def __setstate__(self, state: object) -> None:
        """Set from FastDeploy's pickled ``__dict__``, checked: a request of another shape is refused."""
        if not isinstance(state, dict) or not {"request_id", "method", "args"} <= state.keys():
            raise PickleRefusedError(
                REQUEST_MODULE, "ControlRequest", f"a ControlRequest whose state is {show_value(state)}"
            )
        request_id, method, args = state["request_id"], state["method"], state["args"]
        if not isinstance(request_id, str) or not isinstance(method, str) or not isinstance(args, dict):
            raise PickleRefusedError(
                REQUEST_MODULE,
                "ControlRequest",
                f"a ControlRequest with request_id={show_value(request_id)}, method={show_value(method)}, "
                f"args={show_value(args)} (strings and a dict expected)",
            )
        self.request_id, self.method, self.args = request_id, method, dict(args)

    def __repr__(self) -> str:
        return f"ControlRequest(request_id={self.request_id!r}, method={self.method!r})"


class ControlResponse:
    """FastDeploy's ``ControlResponse`` (``request.py`` L824-841), the attributes its engine reads."""

    def __init__(self, request_id: str, error_code: int = 200, error_message: str | None = None) -> None:
        self.request_id, self.finished, self.error_message = request_id, True, error_message
        self.result: object = None
        self.error_code = error_code

    def __repr__(self) -> str:
        return f"ControlResponse(request_id={self.request_id!r}, error_code={self.error_code}, {self.error_message!r})"


class Message:
    """FastDeploy's FMQ ``Message`` (``fmq.py`` L157-162): a queue's unit; the descriptor is for shared memory only."""

    def __init__(self, payload: object, msg_id: int) -> None:
        self.payload, self.msg_id, self.timestamp = payload, msg_id, time.time()
        self.descriptor = None


# The builtin exceptions are what a multiprocessing manager server answers a failed call with ('#ERROR', the
# exception: multiprocessing/managers.py Server.serve_client); a barrier's wait that times out raises
# threading.BrokenBarrierError there.
_EXCEPTIONS = ("AttributeError", "EOFError", "IndexError", "KeyError", "RuntimeError", "TypeError", "ValueError")
#: (module, name) -> what it resolves to: every class a pickle on the control path may name.
ALLOWED: dict[tuple[str, str], object] = {
    (REQUEST_MODULE, "ControlRequest"): ControlRequest,
    (CACHE_DATA_MODULE, "CacheStatus"): CacheStatus,
    ("threading", "BrokenBarrierError"): threading.BrokenBarrierError,
    **{("builtins", name): getattr(builtins, name) for name in _EXCEPTIONS},
}


class _Restricted(pickle.Unpickler):
    def __init__(self, data: bytes, where: str) -> None:
        super().__init__(io.BytesIO(data))
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        found = ALLOWED.get((module, name))
        if found is None:
            raise PickleRefusedError(module, name, self.where)
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise PickleRefusedError("<persistent id>", show_value(pid), self.where)


def restricted_loads(data: bytes, where: str) -> Any:
    """``data`` unpickled through :data:`ALLOWED`;
    :class:`~fd_platforms.contract.errors.PickleRefusedError` naming any other class (``where`` says which queue it came
    from)."""
    return _Restricted(data, where).load()


@dataclass(frozen=True)
class _Module:
    name: str


_FASTDEPLOY_NAMES = {
    ControlRequest: (REQUEST_MODULE, "ControlRequest"),
    ControlResponse: (REQUEST_MODULE, "ControlResponse"),
    Message: (FMQ_MODULE, "Message"),
    CacheStatus: (CACHE_DATA_MODULE, "CacheStatus"),
}


class _FastDeployPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _Module):  # FastDeploy's unpickler imports the module ...
            return importlib.import_module, (obj.name,)
        if isinstance(obj, type) and obj in _FASTDEPLOY_NAMES:  # ... and takes its own class from it
            module, name = _FASTDEPLOY_NAMES[obj]
            return getattr, (_Module(module), name)
        return NotImplemented


def fastdeploy_dumps(obj: object) -> bytes:
    """``obj`` (of our classes above, builtins within) pickled so that FastDeploy's unpickler builds its classes."""
    out = io.BytesIO()
    _FastDeployPickler(out, protocol=PROTOCOL).dump(obj)
    return out.getvalue()
