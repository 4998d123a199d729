"""Typed results of the sessionbox API.

Each class mirrors one JSON object of the API, with the API's field names. Times are kept as the
RFC 3339 text the server sends (``created_at`` ...). Unknown fields are ignored, so a newer
server does not break an older SDK.
"""

from __future__ import annotations

import base64 as _b64
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Union

__all__ = [
    "ExitStatus",
    "Usage",
    "DiskUsage",
    "MemoryUsage",
    "Conversation",
    "OpenedConversation",
    "ConversationPage",
    "ExecResult",
    "ExecExit",
    "OutputChunk",
    "OutputText",
    "ExecEvent",
    "CommandError",
    "BackgroundCommand",
    "CommandLogs",
    "CommandEvent",
    "DirEntry",
    "FileStat",
    "GrepMatch",
    "UploadedFile",
    "NetworkPolicy",
    "EgressVerdict",
    "SkillSummary",
    "Skill",
    "Snapshot",
    "Restored",
    "Template",
    "PreviewLink",
    "WatchEvent",
]

Json = Mapping[str, Any]


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


@dataclass(frozen=True)
class ExitStatus:
    """How a command ended: ``{"code": N}`` or ``{"signal": N}`` (exactly one is set)."""

    code: int | None = None
    signal: int | None = None

    @classmethod
    def from_json(cls, d: Json) -> ExitStatus:
        """Parse the API's JSON object."""
        return cls(code=_opt_int(d.get("code")), signal=_opt_int(d.get("signal")))


def _opt_status(v: Any) -> ExitStatus | None:
    return None if v is None else ExitStatus.from_json(v)


@dataclass(frozen=True)
class Usage:
    """What a conversation has done since its creation (from the audit log)."""

    operations: int
    execs: int
    by_operation: dict[str, int]

    @classmethod
    def from_json(cls, d: Json) -> Usage:
        """Parse the API's JSON object."""
        return cls(
            operations=int(d["operations"]),
            execs=int(d["execs"]),
            by_operation={str(k): int(v) for k, v in d.get("by_operation", {}).items()},
        )


@dataclass(frozen=True)
class DiskUsage:
    """A workspace's disk usage against its quota (isolated runtime with a quota only)."""

    bytes_used: int
    bytes_limit: int
    inodes_used: int
    inodes_limit: int

    @classmethod
    def from_json(cls, d: Json) -> DiskUsage:
        """Parse the API's JSON object."""
        return cls(
            bytes_used=int(d["bytes_used"]),
            bytes_limit=int(d["bytes_limit"]),
            inodes_used=int(d["inodes_used"]),
            inodes_limit=int(d["inodes_limit"]),
        )


@dataclass(frozen=True)
class MemoryUsage:
    """A sandbox's memory use now.

    ``measured`` is ``cgroup`` (its memory cgroup's charge against ``bytes_limit``) or
    ``processes`` (the sum of its processes' resident memory; ``bytes_limit`` is then ``None``).
    """

    bytes_used: int
    bytes_limit: int | None
    measured: str

    @classmethod
    def from_json(cls, d: Json) -> MemoryUsage:
        """Parse the API's JSON object."""
        limit = d.get("bytes_limit")
        return cls(
            bytes_used=int(d["bytes_used"]),
            bytes_limit=int(limit) if limit is not None else None,
            measured=str(d["measured"]),
        )


@dataclass(frozen=True)
class Conversation:
    """A conversation's record.

    ``state`` is ``active``, ``expired`` or ``destroying``. ``usage``, ``disk`` and ``memory`` are
    set only by :meth:`Client.get_conversation` (``disk`` only where the runtime keeps a disk
    quota, ``memory`` only while its sandbox runs, and never on ``aio``).
    """

    id: str
    state: str
    runtime: str
    created_at: str
    last_used_at: str
    expires_at: str | None = None
    usage: Usage | None = None
    disk: DiskUsage | None = None
    memory: MemoryUsage | None = None

    @classmethod
    def from_json(cls, d: Json) -> Conversation:
        """Parse the API's JSON object."""
        return cls(
            id=str(d["id"]),
            state=str(d["state"]),
            runtime=str(d["runtime"]),
            created_at=str(d["created_at"]),
            last_used_at=str(d["last_used_at"]),
            expires_at=_opt_str(d.get("expires_at")),
            usage=Usage.from_json(d["usage"]) if d.get("usage") is not None else None,
            disk=DiskUsage.from_json(d["disk"]) if d.get("disk") is not None else None,
            memory=MemoryUsage.from_json(d["memory"]) if d.get("memory") is not None else None,
        )


@dataclass(frozen=True)
class OpenedConversation:
    """The answer of opening a conversation (``POST /v1/conversations/{id}``).

    ``created`` is true when this call created it; ``workspace_root`` is the root as its
    commands see it; ``key`` the conversation key; ``previous_expired_at`` is set when it was
    created because the last conversation of this id expired (whose files are gone).
    """

    created: bool
    workspace_root: str
    key: str
    conversation: Conversation
    previous_expired_at: str | None = None

    @classmethod
    def from_json(cls, d: Json) -> OpenedConversation:
        """Parse the API's JSON object."""
        return cls(
            created=bool(d["created"]),
            workspace_root=str(d["workspace_root"]),
            key=str(d["key"]),
            conversation=Conversation.from_json(d["conversation"]),
            previous_expired_at=_opt_str(d.get("previous_expired_at")),
        )


@dataclass(frozen=True)
class ConversationPage:
    """A page of conversations; pass ``next_cursor`` as ``cursor`` for the next (``None``: last)."""

    conversations: list[Conversation]
    next_cursor: str | None = None

    @classmethod
    def from_json(cls, d: Json) -> ConversationPage:
        """Parse the API's JSON object."""
        return cls(
            conversations=[Conversation.from_json(c) for c in d["conversations"]],
            next_cursor=_opt_str(d.get("next_cursor")),
        )


@dataclass(frozen=True)
class ExecResult:
    """What a command run with :meth:`Client.exec` did (a failing command is still a result).

    ``stdout``/``stderr`` are text (invalid UTF-8 replaced by U+FFFD); ``stdout_base64`` /
    ``stderr_base64`` hold the exact bytes when they were not UTF-8. :attr:`stdout_bytes` and
    :attr:`stderr_bytes` give the exact bytes either way.
    """

    exit_code: int
    status: ExitStatus
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    duration_ms: int
    stdout_base64: str | None = None
    stderr_base64: str | None = None
    previous_expired_at: str | None = None

    @property
    def stdout_bytes(self) -> bytes:
        """stdout exactly as the command wrote it."""
        if self.stdout_base64 is not None:
            return _b64.b64decode(self.stdout_base64)
        return self.stdout.encode("utf-8")

    @property
    def stderr_bytes(self) -> bytes:
        """stderr exactly as the command wrote it."""
        if self.stderr_base64 is not None:
            return _b64.b64decode(self.stderr_base64)
        return self.stderr.encode("utf-8")

    @property
    def ok(self) -> bool:
        """True when the command exited with code 0."""
        return self.exit_code == 0

    @classmethod
    def from_json(cls, d: Json) -> ExecResult:
        """Parse the API's JSON object."""
        return cls(
            exit_code=int(d["exit_code"]),
            status=ExitStatus.from_json(d["status"]),
            stdout=str(d["stdout"]),
            stderr=str(d["stderr"]),
            stdout_truncated=bool(d["stdout_truncated"]),
            stderr_truncated=bool(d["stderr_truncated"]),
            timed_out=bool(d["timed_out"]),
            duration_ms=int(d["duration_ms"]),
            stdout_base64=_opt_str(d.get("stdout_base64")),
            stderr_base64=_opt_str(d.get("stderr_base64")),
            previous_expired_at=_opt_str(d.get("previous_expired_at")),
        )


@dataclass(frozen=True)
class OutputText:
    """A piece of output: ``text`` always, ``base64`` only when the bytes were not UTF-8."""

    text: str
    base64: str | None = None

    @property
    def data(self) -> bytes:
        """The exact bytes."""
        if self.base64 is not None:
            return _b64.b64decode(self.base64)
        return self.text.encode("utf-8")

    @classmethod
    def from_json(cls, d: Json) -> OutputText:
        """Parse the API's JSON object."""
        return cls(text=str(d.get("text", "")), base64=_opt_str(d.get("base64")))


@dataclass(frozen=True)
class OutputChunk:
    """A ``stdout`` or ``stderr`` event of an event stream, in the order the server sent it."""

    stream: Literal["stdout", "stderr"]
    text: str
    base64: str | None = None

    @property
    def data(self) -> bytes:
        """The exact bytes of this chunk."""
        if self.base64 is not None:
            return _b64.b64decode(self.base64)
        return self.text.encode("utf-8")


@dataclass(frozen=True)
class ExecExit:
    """The ``exit`` event of a streamed exec: how the command ended."""

    exit_code: int
    status: ExitStatus
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    duration_ms: int

    @classmethod
    def from_json(cls, d: Json) -> ExecExit:
        """Parse the API's JSON object."""
        return cls(
            exit_code=int(d["exit_code"]),
            status=ExitStatus.from_json(d["status"]),
            stdout_truncated=bool(d["stdout_truncated"]),
            stderr_truncated=bool(d["stderr_truncated"]),
            timed_out=bool(d["timed_out"]),
            duration_ms=int(d["duration_ms"]),
        )


ExecEvent = Union[OutputChunk, ExecExit]
"""An event of :meth:`Client.exec_stream`: output chunks, then one :class:`ExecExit`."""


@dataclass(frozen=True)
class CommandError:
    """Why a background command could not run (``{"code", "message"}``)."""

    code: str
    message: str


@dataclass(frozen=True)
class BackgroundCommand:
    """A background command's status.

    ``exit_code`` and ``status`` are ``None`` while it runs (or when it could not run; then
    ``error`` says why). ``killed`` is true when it was killed through the API.
    """

    id: str
    command: str
    running: bool
    timed_out: bool
    killed: bool
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    started_at: str
    duration_ms: int
    exit_code: int | None = None
    status: ExitStatus | None = None
    finished_at: str | None = None
    error: CommandError | None = None

    @classmethod
    def from_json(cls, d: Json) -> BackgroundCommand:
        """Parse the API's JSON object."""
        err = d.get("error")
        return cls(
            id=str(d["id"]),
            command=str(d["command"]),
            running=bool(d["running"]),
            timed_out=bool(d["timed_out"]),
            killed=bool(d["killed"]),
            stdout_bytes=int(d["stdout_bytes"]),
            stderr_bytes=int(d["stderr_bytes"]),
            stdout_truncated=bool(d["stdout_truncated"]),
            stderr_truncated=bool(d["stderr_truncated"]),
            started_at=str(d["started_at"]),
            duration_ms=int(d["duration_ms"]),
            exit_code=_opt_int(d.get("exit_code")),
            status=_opt_status(d.get("status")),
            finished_at=_opt_str(d.get("finished_at")),
            error=CommandError(str(err.get("code")), str(err.get("message"))) if err else None,
        )


CommandEvent = Union[OutputChunk, BackgroundCommand]
"""An event of :meth:`Client.follow_command`: output chunks, then the final status."""


@dataclass(frozen=True)
class CommandLogs:
    """A background command's output from the requested byte offsets on.

    Pass ``stdout_next_offset``/``stderr_next_offset`` as the offsets of the next read.
    """

    stdout: OutputText
    stderr: OutputText
    stdout_next_offset: int
    stderr_next_offset: int
    running: bool
    stdout_truncated: bool
    stderr_truncated: bool
    exit_code: int | None = None

    @classmethod
    def from_json(cls, d: Json) -> CommandLogs:
        """Parse the API's JSON object."""
        return cls(
            stdout=OutputText.from_json(d["stdout"]),
            stderr=OutputText.from_json(d["stderr"]),
            stdout_next_offset=int(d["stdout_next_offset"]),
            stderr_next_offset=int(d["stderr_next_offset"]),
            running=bool(d["running"]),
            stdout_truncated=bool(d["stdout_truncated"]),
            stderr_truncated=bool(d["stderr_truncated"]),
            exit_code=_opt_int(d.get("exit_code")),
        )


@dataclass(frozen=True)
class DirEntry:
    """One directory entry; ``kind`` is ``file``, ``directory``, ``symlink`` or ``other``."""

    name: str
    kind: str
    size: int
    modified_unix: int

    @classmethod
    def from_json(cls, d: Json) -> DirEntry:
        """Parse the API's JSON object."""
        return cls(
            name=str(d["name"]),
            kind=str(d["kind"]),
            size=int(d["size"]),
            modified_unix=int(d["modified_unix"]),
        )


@dataclass(frozen=True)
class FileStat:
    """A path's metadata; ``mode`` is octal text such as ``"0644"``."""

    path: str
    kind: str
    size: int
    mode: str
    modified_unix: int

    @property
    def mode_bits(self) -> int:
        """``mode`` as an integer (``0o644``)."""
        return int(self.mode, 8)

    @classmethod
    def from_json(cls, d: Json) -> FileStat:
        """Parse the API's JSON object."""
        return cls(
            path=str(d["path"]),
            kind=str(d["kind"]),
            size=int(d["size"]),
            mode=str(d["mode"]),
            modified_unix=int(d["modified_unix"]),
        )


@dataclass(frozen=True)
class GrepMatch:
    """One matching line of :meth:`Client.grep`."""

    path: str
    line_number: int
    line: str

    @classmethod
    def from_json(cls, d: Json) -> GrepMatch:
        """Parse the API's JSON object."""
        return cls(path=str(d["path"]), line_number=int(d["line_number"]), line=str(d["line"]))


@dataclass(frozen=True)
class UploadedFile:
    """One file an upload wrote."""

    path: str
    bytes: int

    @classmethod
    def from_json(cls, d: Json) -> UploadedFile:
        """Parse the API's JSON object."""
        return cls(path=str(d["path"]), bytes=int(d["bytes"]))


@dataclass(frozen=True)
class NetworkPolicy:
    """A network policy: ``source`` (``conversation``, ``tenant``, ``default``), ``profile``
    (``none`` or ``allowlist``), rules, the policy's ``hash`` and ``updated_at``."""

    source: str
    profile: str
    allow: list[str]
    deny: list[str]
    hash: str
    updated_at: str | None = None

    @classmethod
    def from_json(cls, d: Json) -> NetworkPolicy:
        """Parse the API's JSON object."""
        return cls(
            source=str(d["source"]),
            profile=str(d["profile"]),
            allow=[str(x) for x in d.get("allow", [])],
            deny=[str(x) for x in d.get("deny", [])],
            hash=str(d["hash"]),
            updated_at=_opt_str(d.get("updated_at")),
        )


@dataclass(frozen=True)
class EgressVerdict:
    """One verdict of the egress gateway (``verdict`` is ``allowed`` or ``denied``)."""

    id: int
    at: str
    conversation_key: str
    verdict: str
    method: str
    target: str
    rule: str
    bytes_up: int
    bytes_down: int
    duration_ms: int
    count: int = 1
    conversation_id: str | None = None
    address: str | None = None
    end: str | None = None

    @classmethod
    def from_json(cls, d: Json) -> EgressVerdict:
        """Parse the API's JSON object."""
        return cls(
            id=int(d["id"]),
            at=str(d["at"]),
            conversation_key=str(d["conversation_key"]),
            verdict=str(d["verdict"]),
            method=str(d["method"]),
            target=str(d["target"]),
            rule=str(d["rule"]),
            bytes_up=int(d["bytes_up"]),
            bytes_down=int(d["bytes_down"]),
            duration_ms=int(d["duration_ms"]),
            count=int(d.get("count", 1)),
            conversation_id=_opt_str(d.get("conversation_id")),
            address=_opt_str(d.get("address")),
            end=_opt_str(d.get("end")),
        )


@dataclass(frozen=True)
class SkillSummary:
    """A skill as listed by :meth:`Client.list_skills`."""

    name: str
    description: str

    @classmethod
    def from_json(cls, d: Json) -> SkillSummary:
        """Parse the API's JSON object."""
        return cls(name=str(d["name"]), description=str(d["description"]))


@dataclass(frozen=True)
class Skill:
    """A skill loaded for a conversation: its SKILL.md ``body`` (after the front matter) and
    ``base_path``, its directory as the conversation's commands see it."""

    name: str
    description: str
    body: str
    base_path: str

    @classmethod
    def from_json(cls, d: Json) -> Skill:
        """Parse the API's JSON object."""
        return cls(
            name=str(d["name"]),
            description=str(d["description"]),
            body=str(d["body"]),
            base_path=str(d["base_path"]),
        )


@dataclass(frozen=True)
class Snapshot:
    """A snapshot of a workspace (``origin`` ``None`` and ``runtime`` ``import`` when imported;
    ``expires_at`` ``None`` when kept until deleted)."""

    name: str
    runtime: str
    bytes: int
    files: int
    directories: int
    links: int
    stored_bytes: int
    created_at: str
    origin: str | None = None
    expires_at: str | None = None

    @classmethod
    def from_json(cls, d: Json) -> Snapshot:
        """Parse the API's JSON object."""
        return cls(
            name=str(d["name"]),
            runtime=str(d["runtime"]),
            bytes=int(d["bytes"]),
            files=int(d["files"]),
            directories=int(d["directories"]),
            links=int(d["links"]),
            stored_bytes=int(d["stored_bytes"]),
            created_at=str(d["created_at"]),
            origin=_opt_str(d.get("origin")),
            expires_at=_opt_str(d.get("expires_at")),
        )


@dataclass(frozen=True)
class Restored:
    """What a restore or fork put into the workspace of ``conversation``."""

    conversation: str
    bytes: int
    files: int
    directories: int
    links: int

    @classmethod
    def from_json(cls, d: Json) -> Restored:
        """Parse the API's JSON object."""
        return cls(
            conversation=str(d["conversation"]),
            bytes=int(d["bytes"]),
            files=int(d["files"]),
            directories=int(d["directories"]),
            links=int(d["links"]),
        )


@dataclass(frozen=True)
class Template:
    """A template: a name for a snapshot (``default`` is restored into every new conversation)."""

    name: str
    snapshot: str

    @classmethod
    def from_json(cls, d: Json) -> Template:
        """Parse the API's JSON object."""
        return cls(name=str(d.get("name", "")), snapshot=str(d["snapshot"]))


@dataclass(frozen=True)
class PreviewLink:
    """A signed preview link: ``path`` on the server (open it without a key) until
    ``expires_at``."""

    path: str
    port: int
    expires_at: str

    @classmethod
    def from_json(cls, d: Json) -> PreviewLink:
        """Parse the API's JSON object."""
        return cls(path=str(d["path"]), port=int(d["port"]), expires_at=str(d["expires_at"]))


@dataclass(frozen=True)
class WatchEvent:
    """One event of :meth:`Client.watch`.

    ``kind`` is ``ready``, ``created``, ``modified``, ``deleted``, ``moved``, ``overflow``,
    ``limit`` or ``ended``; ``data`` is the event's whole JSON object. ``path``, ``from_``, ``to``
    and ``dir`` are filled from it when present.
    """

    kind: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str | None:
        """The path concerned (``created``, ``modified``, ``deleted``, ``ready``, ``limit``)."""
        return _opt_str(self.data.get("path"))

    @property
    def from_(self) -> str | None:
        """Where a ``moved`` path came from."""
        return _opt_str(self.data.get("from"))

    @property
    def to(self) -> str | None:
        """Where a ``moved`` path went."""
        return _opt_str(self.data.get("to"))

    @property
    def dir(self) -> bool:
        """True when the path is a directory."""
        return bool(self.data.get("dir", False))
