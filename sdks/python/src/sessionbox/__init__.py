"""The official Python SDK of sessionbox: isolated, resumable workspaces for AI-agent
conversations, served over HTTP by ``sessionbox serve``.

Quick start::

    from sessionbox import Client

    with Client("http://127.0.0.1:7070", api_key="sbk_...") as sb:
        sb.open_conversation("chat-42")
        sb.write_file("chat-42", "hello.txt", b"hi\\n")
        print(sb.exec("chat-42", "cat hello.txt").stdout)

:class:`Client` is synchronous, :class:`AsyncClient` the same API with ``async``/``await``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._async_client import AsyncClient
from ._client import Client
from ._ops import UploadSource
from ._errors import (
    AlreadyExists,
    BackendError,
    BadGateway,
    Busy,
    Conflict,
    Forbidden,
    InvalidId,
    InvalidPath,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    NotReady,
    OutsideWorkspace,
    RangeNotSatisfiable,
    RuntimeUnavailable,
    ServerError,
    SessionboxError,
    StreamError,
    TimedOut,
    TooLarge,
    TransportError,
    Unauthorized,
    Unavailable,
    UpgradeRequired,
)
from ._models import (
    BackgroundCommand,
    CommandError,
    CommandEvent,
    CommandLogs,
    Conversation,
    ConversationPage,
    DirEntry,
    DiskUsage,
    MemoryUsage,
    EgressVerdict,
    ExecEvent,
    ExecExit,
    ExecResult,
    ExitStatus,
    FileStat,
    GrepMatch,
    NetworkPolicy,
    OpenedConversation,
    OutputChunk,
    OutputText,
    PreviewLink,
    Restored,
    Skill,
    SkillSummary,
    Snapshot,
    Template,
    UploadedFile,
    Usage,
    WatchEvent,
)

__all__ = [
    "__version__",
    "Client",
    "AsyncClient",
    "UploadSource",
    # errors
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
    # models
    "BackgroundCommand",
    "CommandError",
    "CommandEvent",
    "CommandLogs",
    "Conversation",
    "ConversationPage",
    "DirEntry",
    "DiskUsage",
    "MemoryUsage",
    "EgressVerdict",
    "ExecEvent",
    "ExecExit",
    "ExecResult",
    "ExitStatus",
    "FileStat",
    "GrepMatch",
    "NetworkPolicy",
    "OpenedConversation",
    "OutputChunk",
    "OutputText",
    "PreviewLink",
    "Restored",
    "Skill",
    "SkillSummary",
    "Snapshot",
    "Template",
    "UploadedFile",
    "Usage",
    "WatchEvent",
]
