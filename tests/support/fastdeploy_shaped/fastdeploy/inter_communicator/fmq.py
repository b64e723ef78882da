"""FastDeploy's FMQ ``Message`` and ``Descriptor`` (``fastdeploy/inter_communicator/fmq.py`` L126-171)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import Any


@dataclass
class Descriptor:
    shm_name: str
    size: int


@dataclass
class Message:
    payload: Any
    msg_id: int | None = None
    timestamp: float = field(default_factory=time.time)
    descriptor: Descriptor | None = None

    def serialize(self) -> bytes:
        return ForkingPickler.dumps(self)

    @staticmethod
    def deserialize(data: bytes) -> Message:
        return ForkingPickler.loads(data)
