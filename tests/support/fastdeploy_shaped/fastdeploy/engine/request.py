"""FastDeploy's ``ControlRequest`` and ``ControlResponse`` (``fastdeploy/engine/request.py`` L737-768, L824-851)."""

from __future__ import annotations

from typing import Any


class ControlRequest:
    def __init__(self, request_id: str, method: str, args: dict[str, Any] | None = None) -> None:
        self.request_id = request_id
        self.method = method
        self.args = args or {}

    def get_method(self) -> str:
        return self.method


class ControlResponse:
    def __init__(
        self,
        request_id: str,
        error_code: int = 200,
        error_message: str | None = None,
        result: dict | None = None,
        finished: bool = True,
    ) -> None:
        self.request_id = request_id
        self.finished = finished
        self.error_message = error_message
        self.result = result
        self.error_code = error_code
