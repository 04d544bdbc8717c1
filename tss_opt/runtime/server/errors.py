"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every refusal of the server is an :class:`APIError`; the app turns it into that body with
its HTTP status. Messages name the field, what was expected and the fix, and never echo a
credential.
"""

from __future__ import annotations

from typing import Any

__all__ = ["APIError", "error_body"]


class APIError(Exception):
    """A request the server refuses (4xx) or could not serve (5xx).

    Args:
        status: HTTP status.
        message: What was wrong and how to fix it.
        type: OpenAI's error ``type`` (``invalid_request_error``, ``authentication_error``...).
        param: The request field at fault (``None`` when no single field is).
        code: A short machine-readable code (``None`` when ``type`` says it all).
    """

    def __init__(
        self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)
