"""Typed exceptions for the errors the sessionbox server answers.

Every error the server sends is a JSON body ``{"code": "...", "message": "..."}`` with an HTTP
status. :func:`error_from_response` maps it to the most specific exception class below; every
class derives from :class:`SessionboxError`, which carries ``code``, ``message`` and ``status``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

__all__ = [
    "SessionboxError",
    "TransportError",
    "StreamError",
    "InvalidRequest",
    "InvalidId",
    "InvalidPath",
    "Unauthorized",
    "Forbidden",
    "OutsideWorkspace",
    "NotFound",
    "MethodNotAllowed",
    "Conflict",
    "AlreadyExists",
    "TooLarge",
    "RangeNotSatisfiable",
    "UpgradeRequired",
    "Busy",
    "ServerError",
    "BackendError",
    "BadGateway",
    "RuntimeUnavailable",
    "NotReady",
    "Unavailable",
    "TimedOut",
    "error_from_code",
    "error_from_response",
]


class SessionboxError(Exception):
    """Base class of every error this SDK raises.

    Attributes:
        message: the server's message for people (or a description of a client-side failure).
        code: the server's stable error code (``not_found``, ``invalid_id``, ...), or ``None``
            when the failure did not come from a server error body.
        status: the HTTP status of the answer, or ``None`` (transport failures, errors
            reported inside an event stream).
        headers: the answer's headers, when there was an answer.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        headers: httpx.Headers | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.headers = headers

    def __str__(self) -> str:
        parts = []
        if self.status is not None:
            parts.append(str(self.status))
        if self.code is not None:
            parts.append(self.code)
        prefix = " ".join(parts)
        return f"{prefix}: {self.message}" if prefix else self.message

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(message={self.message!r}, code={self.code!r}, "
            f"status={self.status!r})"
        )


class TransportError(SessionboxError):
    """The server could not be reached or the connection failed (wraps an ``httpx`` error)."""


class StreamError(SessionboxError):
    """An event stream ended with an ``error`` event, or ended before its final event."""


class InvalidRequest(SessionboxError):
    """400 or 422 ``invalid_request``: malformed or wrongly shaped input."""


class InvalidId(InvalidRequest):
    """400 ``invalid_id``: a conversation id that is not 1-128 ASCII letters, digits, ``.``,
    ``_``, ``-`` starting with a letter or digit."""


class InvalidPath(InvalidRequest):
    """400 ``invalid_path``: a workspace path that cannot be used."""


class Unauthorized(SessionboxError):
    """401 ``unauthorized``: a missing, unknown or revoked API key (or a bad preview link)."""


class Forbidden(SessionboxError):
    """403 ``forbidden``: the API key's scope does not allow the request (another conversation,
    a tenant-wide route, a change with a read-only key; the message names the rule), or a
    non-loopback host in open mode. (``outside_workspace`` is also 403.)"""


class OutsideWorkspace(Forbidden):
    """403 ``outside_workspace``: a path that leaves the conversation's workspace."""


class NotFound(SessionboxError):
    """404 ``not_found``: no such route, conversation, file, command, snapshot or skill."""


class MethodNotAllowed(SessionboxError):
    """405 ``method_not_allowed``."""


class Conflict(SessionboxError):
    """409 ``conflict``: the request conflicts with the current state (e.g. an edit's text is
    not unique, a non-empty directory removed without ``recursive``)."""


class AlreadyExists(Conflict):
    """409 ``already_exists``: a snapshot name or fork target that is taken."""


class TooLarge(SessionboxError):
    """413 ``too_large``: a body or a value past a server limit (the message names it)."""


class RangeNotSatisfiable(SessionboxError):
    """416 ``range_not_satisfiable``: a byte range outside the file."""


class UpgradeRequired(SessionboxError):
    """426 ``upgrade_required``: a WebSocket route called without an upgrade."""


class Busy(SessionboxError):
    """429 ``busy``: a queue, budget or concurrency limit is reached (the message names it)."""


class ServerError(SessionboxError):
    """A 5xx answer."""


class BackendError(ServerError):
    """500 ``backend_error``."""


class BadGateway(ServerError):
    """502: nothing answered a relayed request (a preview with nothing listening)."""


class RuntimeUnavailable(ServerError):
    """503 ``runtime_unavailable``: the runtime cannot do this (or is down)."""


class Unavailable(ServerError):
    """503 ``unavailable``: the server's store cannot be reached or its disk is full; the same
    request may succeed later (the answer carries ``Retry-After``)."""


class NotReady(ServerError):
    """503 ``not_ready`` from ``/readyz``."""


class TimedOut(ServerError):
    """504 ``timed_out``."""


_BY_CODE: dict[str, type[SessionboxError]] = {
    "invalid_request": InvalidRequest,
    "invalid_id": InvalidId,
    "invalid_path": InvalidPath,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "outside_workspace": OutsideWorkspace,
    "not_found": NotFound,
    "method_not_allowed": MethodNotAllowed,
    "conflict": Conflict,
    "already_exists": AlreadyExists,
    "too_large": TooLarge,
    "range_not_satisfiable": RangeNotSatisfiable,
    "upgrade_required": UpgradeRequired,
    "busy": Busy,
    "backend_error": BackendError,
    "runtime_unavailable": RuntimeUnavailable,
    "not_ready": NotReady,
    "unavailable": Unavailable,
    "timed_out": TimedOut,
}

_BY_STATUS: dict[int, type[SessionboxError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: TooLarge,
    416: RangeNotSatisfiable,
    422: InvalidRequest,
    426: UpgradeRequired,
    429: Busy,
    500: BackendError,
    502: BadGateway,
    503: RuntimeUnavailable,
    504: TimedOut,
}


def error_from_code(
    code: str | None,
    message: str,
    status: int | None = None,
    headers: httpx.Headers | None = None,
) -> SessionboxError:
    """Build the exception for a server error ``code`` (falling back on the HTTP ``status``)."""
    cls: type[SessionboxError] | None = _BY_CODE.get(code) if code else None
    if cls is None and status is not None:
        cls = _BY_STATUS.get(status)
        if cls is None and status >= 500:
            cls = ServerError
    if cls is None:
        cls = SessionboxError
    return cls(message, code=code, status=status, headers=headers)


def error_from_response(response: httpx.Response) -> SessionboxError:
    """Build the exception for an error answer whose body has already been read."""
    code: str | None = None
    message = ""
    try:
        body: Any = json.loads(response.content) if response.content else None
    except ValueError:
        body = None
    if isinstance(body, dict):
        if isinstance(body.get("code"), str):
            code = body["code"]
        if isinstance(body.get("message"), str):
            message = body["message"]
    if not message:
        text = response.content[:500].decode("utf-8", "replace")
        message = text or response.reason_phrase or f"HTTP {response.status_code}"
    return error_from_code(code, message, response.status_code, response.headers)
