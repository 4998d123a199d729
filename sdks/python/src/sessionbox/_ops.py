"""Requests of the sessionbox API, shared by the sync and async clients.

Each function builds an :class:`Op`: the HTTP request and how to parse its successful answer.
The clients only send them.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from dataclasses import dataclass, field
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Generic,
    Iterable,
    Iterator,
    Literal,
    Mapping,
    Sequence,
    TypeVar,
)
from urllib.parse import quote

import httpx

from ._errors import StreamError, error_from_code
from ._models import (
    BackgroundCommand,
    CommandEvent,
    CommandLogs,
    Conversation,
    ConversationPage,
    DirEntry,
    EgressVerdict,
    ExecEvent,
    ExecExit,
    ExecResult,
    FileStat,
    GrepMatch,
    NetworkPolicy,
    OpenedConversation,
    OutputChunk,
    PreviewLink,
    Restored,
    Skill,
    SkillSummary,
    Snapshot,
    Template,
    UploadedFile,
    WatchEvent,
)

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:7070"
"""The server's default address (``sessionbox serve`` listens there by default)."""

DEFAULT_TIMEOUT = 60.0
"""Default timeout in seconds of a request (exec and long polls get their own time on top)."""

# Margin added to a request's read timeout beyond the time the server may take by itself.
_MARGIN = 30.0


@dataclass
class Op(Generic[T]):
    """One request and the parser of its successful answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, str] | None = None
    json: Any = None
    content: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    # Seconds the server may take beyond a plain request (added to the read timeout), or None
    # for no read timeout at all (event streams that follow something live).
    extra_read: float | None = 0.0


def seg(value: str) -> str:
    """Quote one path segment (a conversation id, a name)."""
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe="")


def wpath(path: str) -> str:
    """Quote a workspace path for ``.../files/{path}``, keeping its ``/`` separators."""
    parts = [seg(p) for p in path.split("/")]
    out = "/".join(parts)
    if out.startswith("/"):
        out = "%2F" + out[1:]
    return out


def conv(cid: str) -> str:
    """The URL path of a conversation."""
    return f"/v1/conversations/{seg(cid)}"


def _none(_: httpx.Response) -> None:
    return None


def _bytes(r: httpx.Response) -> bytes:
    return r.content


def _params(**kw: Any) -> dict[str, str] | None:
    out: dict[str, str] = {}
    for k, v in kw.items():
        if v is None:
            continue
        if isinstance(v, bool):
            out[k] = "true" if v else "false"
        else:
            out[k] = str(v)
    return out or None


def _body(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


# ---------------------------------------------------------------- health, metrics, openapi


def healthz() -> Op[dict[str, Any]]:
    return Op("GET", "/healthz", lambda r: dict(r.json()))


def readyz() -> Op[dict[str, Any]]:
    return Op("GET", "/readyz", lambda r: dict(r.json()))


def metrics() -> Op[str]:
    return Op("GET", "/metrics", lambda r: r.text)


def openapi() -> Op[dict[str, Any]]:
    return Op("GET", "/v1/openapi.json", lambda r: dict(r.json()))


# ---------------------------------------------------------------- conversations


def list_conversations(limit: int | None, cursor: str | None) -> Op[ConversationPage]:
    return Op(
        "GET",
        "/v1/conversations",
        lambda r: ConversationPage.from_json(r.json()),
        params=_params(limit=limit, cursor=cursor),
    )


def get_conversation(cid: str) -> Op[Conversation]:
    return Op("GET", conv(cid), lambda r: Conversation.from_json(r.json()))


def open_conversation(cid: str) -> Op[OpenedConversation]:
    return Op("POST", conv(cid), lambda r: OpenedConversation.from_json(r.json()))


def destroy_conversation(cid: str) -> Op[None]:
    return Op("DELETE", conv(cid), _none)


# ---------------------------------------------------------------- exec


def exec_body(
    command: str,
    *,
    cwd: str | None,
    env: Mapping[str, str] | None,
    timeout_ms: int | None,
    stdin: str | bytes | None,
    output_limit: int | None,
    background: bool = False,
    keep_stdin_open: bool = False,
) -> dict[str, Any]:
    body: dict[str, Any] = {"command": command}
    if cwd is not None:
        body["cwd"] = cwd
    if env is not None:
        body["env"] = dict(env)
    if timeout_ms is not None:
        body["timeout_ms"] = timeout_ms
    if output_limit is not None:
        body["output_limit"] = output_limit
    if isinstance(stdin, str):
        body["stdin"] = stdin
    elif stdin is not None:
        body["stdin_base64"] = base64.b64encode(bytes(stdin)).decode("ascii")
    if background:
        body["background"] = True
    if keep_stdin_open:
        body["keep_stdin_open"] = True
    return body


def _exec_wait(timeout_ms: int | None) -> float:
    return (timeout_ms if timeout_ms is not None else 120_000) / 1000.0 + _MARGIN


def exec_json(cid: str, body: dict[str, Any]) -> Op[ExecResult]:
    return Op(
        "POST",
        conv(cid) + "/exec",
        lambda r: ExecResult.from_json(r.json()),
        json=body,
        extra_read=_exec_wait(body.get("timeout_ms")),
    )


def exec_stream(cid: str, body: dict[str, Any]) -> Op[None]:
    return Op(
        "POST",
        conv(cid) + "/exec",
        _none,
        json=body,
        headers={"Accept": "text/event-stream"},
        extra_read=_exec_wait(body.get("timeout_ms")),
    )


def spawn(cid: str, body: dict[str, Any]) -> Op[BackgroundCommand]:
    return Op(
        "POST",
        conv(cid) + "/exec",
        lambda r: BackgroundCommand.from_json(r.json()),
        json=body,
    )


def list_commands(cid: str) -> Op[list[BackgroundCommand]]:
    return Op(
        "GET",
        conv(cid) + "/commands",
        lambda r: [BackgroundCommand.from_json(c) for c in r.json()["commands"]],
    )


def get_command(cid: str, cmd: str) -> Op[BackgroundCommand]:
    return Op(
        "GET",
        f"{conv(cid)}/commands/{seg(cmd)}",
        lambda r: BackgroundCommand.from_json(r.json()),
    )


def kill_command(cid: str, cmd: str) -> Op[BackgroundCommand]:
    return Op(
        "DELETE",
        f"{conv(cid)}/commands/{seg(cmd)}",
        lambda r: BackgroundCommand.from_json(r.json()),
    )


def command_logs(
    cid: str, cmd: str, stdout_offset: int, stderr_offset: int, wait_ms: int | None
) -> Op[CommandLogs]:
    return Op(
        "GET",
        f"{conv(cid)}/commands/{seg(cmd)}/logs",
        lambda r: CommandLogs.from_json(r.json()),
        params=_params(stdout_offset=stdout_offset, stderr_offset=stderr_offset, wait_ms=wait_ms),
        extra_read=(wait_ms or 0) / 1000.0,
    )


def follow_command(cid: str, cmd: str, stdout_offset: int, stderr_offset: int) -> Op[None]:
    return Op(
        "GET",
        f"{conv(cid)}/commands/{seg(cmd)}/logs",
        _none,
        params=_params(stdout_offset=stdout_offset, stderr_offset=stderr_offset),
        headers={"Accept": "text/event-stream"},
        extra_read=None,
    )


def write_stdin(cid: str, cmd: str, data: bytes, close: bool) -> Op[int]:
    return Op(
        "POST",
        f"{conv(cid)}/commands/{seg(cmd)}/stdin",
        lambda r: int(r.json()["written"]),
        params=_params(close=True) if close else None,
        content=data,
        headers={"Content-Type": "application/octet-stream"},
        extra_read=10.0,
    )


def close_stdin(cid: str, cmd: str) -> Op[None]:
    return Op("DELETE", f"{conv(cid)}/commands/{seg(cmd)}/stdin", _none)


# ---------------------------------------------------------------- files


def _range_header(start: int | None, end: int | None) -> dict[str, str]:
    if start is None and end is None:
        return {}
    if start is None:
        raise ValueError("a range needs its start")
    return {"Range": f"bytes={start}-{'' if end is None else end}"}


def read_file(
    cid: str, path: str, start: int | None = None, end: int | None = None
) -> Op[bytes]:
    return Op(
        "GET",
        f"{conv(cid)}/files/{wpath(path)}",
        _bytes,
        headers=_range_header(start, end),
    )


def stream_file(cid: str, path: str, download: bool = False) -> Op[None]:
    return Op(
        "GET",
        f"{conv(cid)}/files/{wpath(path)}",
        _none,
        params=_params(download=1) if download else None,
    )


def write_file(cid: str, path: str, content: Any) -> Op[None]:
    return Op(
        "PUT",
        f"{conv(cid)}/files/{wpath(path)}",
        _none,
        content=content,
        headers={"Content-Type": "application/octet-stream"},
    )


def upload_files(cid: str, body: bytes, boundary: str) -> Op[list[UploadedFile]]:
    return Op(
        "POST",
        f"{conv(cid)}/files",
        lambda r: [UploadedFile.from_json(f) for f in r.json()["files"]],
        content=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )


def remove(cid: str, path: str, recursive: bool) -> Op[None]:
    return Op(
        "DELETE",
        f"{conv(cid)}/files/{wpath(path)}",
        _none,
        params=_params(recursive=1) if recursive else None,
    )


def mkdir(cid: str, path: str) -> Op[None]:
    return Op("POST", conv(cid) + "/mkdir", _none, json={"path": path})


def edit(cid: str, path: str, old: str, new: str, replace_all: bool) -> Op[int]:
    body: dict[str, Any] = {"path": path, "old": old, "new": new}
    if replace_all:
        body["replace_all"] = True
    return Op("POST", conv(cid) + "/edit", lambda r: int(r.json()["replacements"]), json=body)


def ls(cid: str, path: str | None) -> Op[list[DirEntry]]:
    return Op(
        "GET",
        conv(cid) + "/ls",
        lambda r: [DirEntry.from_json(e) for e in r.json()["entries"]],
        params=_params(path=path),
    )


def stat(cid: str, path: str) -> Op[FileStat]:
    return Op(
        "GET", conv(cid) + "/stat", lambda r: FileStat.from_json(r.json()), params={"path": path}
    )


def glob(cid: str, pattern: str) -> Op[list[str]]:
    return Op(
        "GET",
        conv(cid) + "/glob",
        lambda r: [str(p) for p in r.json()["paths"]],
        params={"pattern": pattern},
    )


def grep(
    cid: str,
    pattern: str,
    path: str | None,
    glob: str | None,
    case_insensitive: bool | None,
    max_matches: int | None,
) -> Op[list[GrepMatch]]:
    return Op(
        "POST",
        conv(cid) + "/grep",
        lambda r: [GrepMatch.from_json(m) for m in r.json()["matches"]],
        json=_body(
            pattern=pattern,
            path=path,
            glob=glob,
            case_insensitive=case_insensitive,
            max_matches=max_matches,
        ),
    )


def watch(cid: str, path: str | None) -> Op[None]:
    return Op(
        "GET",
        conv(cid) + "/watch",
        _none,
        params=_params(path=path),
        headers={"Accept": "text/event-stream"},
        extra_read=None,
    )


# ---------------------------------------------------------------- previews


def create_preview_link(cid: str, port: int, ttl_secs: int | None) -> Op[PreviewLink]:
    return Op(
        "POST",
        conv(cid) + "/previews",
        lambda r: PreviewLink.from_json(r.json()),
        json=_body(port=port, ttl_secs=ttl_secs),
    )


def from_program(response: httpx.Response) -> bool:
    """True when a preview's answer comes from the program in the sandbox (the relay marks
    those with its ``Content-Security-Policy: sandbox allow-scripts ...``), not from the
    relay itself."""
    return "allow-scripts" in response.headers.get("content-security-policy", "")


def preview_path(cid: str, port: int, path: str) -> str:
    return f"{conv(cid)}/ports/{int(port)}/{path.lstrip('/')}"


# ---------------------------------------------------------------- policies and egress


def policy_body(profile: str, allow: Sequence[str] | None, deny: Sequence[str] | None) -> Any:
    body: dict[str, Any] = {"profile": profile}
    if allow is not None:
        body["allow"] = list(allow)
    if deny is not None:
        body["deny"] = list(deny)
    return body


def _policy(r: httpx.Response) -> NetworkPolicy:
    return NetworkPolicy.from_json(r.json())


def get_policy(cid: str | None) -> Op[NetworkPolicy]:
    return Op("GET", (conv(cid) if cid is not None else "/v1") + "/policy", _policy)


def set_policy(cid: str | None, body: Any) -> Op[NetworkPolicy]:
    return Op("PUT", (conv(cid) if cid is not None else "/v1") + "/policy", _policy, json=body)


def delete_policy(cid: str | None) -> Op[NetworkPolicy]:
    return Op("DELETE", (conv(cid) if cid is not None else "/v1") + "/policy", _policy)


def egress_log(cid: str | None, since: str | None, limit: int | None) -> Op[list[EgressVerdict]]:
    return Op(
        "GET",
        (conv(cid) if cid is not None else "/v1") + "/egress-log",
        lambda r: [EgressVerdict.from_json(e) for e in r.json()["entries"]],
        params=_params(since=since, limit=limit),
    )


# ---------------------------------------------------------------- skills


def list_skills() -> Op[list[SkillSummary]]:
    return Op(
        "GET", "/v1/skills", lambda r: [SkillSummary.from_json(s) for s in r.json()["skills"]]
    )


def load_skill(cid: str, name: str) -> Op[Skill]:
    return Op("GET", f"{conv(cid)}/skills/{seg(name)}", lambda r: Skill.from_json(r.json()))


# ---------------------------------------------------------------- snapshots, forks, templates


def _snapshot(r: httpx.Response) -> Snapshot:
    return Snapshot.from_json(r.json())


def _restored(r: httpx.Response) -> Restored:
    return Restored.from_json(r.json())


def create_snapshot(cid: str, name: str, keep_seconds: int | None) -> Op[Snapshot]:
    return Op(
        "POST",
        conv(cid) + "/snapshots",
        _snapshot,
        json=_body(name=name, keep_seconds=keep_seconds),
        extra_read=300.0,
    )


def list_snapshots() -> Op[list[Snapshot]]:
    return Op(
        "GET", "/v1/snapshots", lambda r: [Snapshot.from_json(s) for s in r.json()["snapshots"]]
    )


def get_snapshot(name: str) -> Op[Snapshot]:
    return Op("GET", f"/v1/snapshots/{seg(name)}", _snapshot)


def delete_snapshot(name: str) -> Op[None]:
    return Op("DELETE", f"/v1/snapshots/{seg(name)}", _none)


def restore(cid: str, snapshot: str) -> Op[Restored]:
    return Op(
        "POST", conv(cid) + "/restore", _restored, json={"snapshot": snapshot}, extra_read=300.0
    )


def fork_conversation(cid: str, to: str) -> Op[Restored]:
    return Op("POST", conv(cid) + "/fork", _restored, json={"to": to}, extra_read=300.0)


def fork_snapshot(name: str, to: str) -> Op[Restored]:
    return Op(
        "POST", f"/v1/snapshots/{seg(name)}/fork", _restored, json={"to": to}, extra_read=300.0
    )


def fork_template(name: str, to: str) -> Op[Restored]:
    return Op(
        "POST", f"/v1/templates/{seg(name)}/fork", _restored, json={"to": to}, extra_read=300.0
    )


def export_snapshot(name: str) -> Op[bytes]:
    return Op("GET", f"/v1/snapshots/{seg(name)}/archive", _bytes, extra_read=300.0)


def stream_export(name: str) -> Op[None]:
    return Op("GET", f"/v1/snapshots/{seg(name)}/archive", _none, extra_read=300.0)


def import_snapshot(name: str, content: Any, keep_seconds: int | None) -> Op[Snapshot]:
    return Op(
        "PUT",
        f"/v1/snapshots/{seg(name)}/archive",
        _snapshot,
        params=_params(keep_seconds=keep_seconds),
        content=content,
        headers={"Content-Type": "application/octet-stream"},
        extra_read=300.0,
    )


def list_templates() -> Op[list[Template]]:
    return Op(
        "GET", "/v1/templates", lambda r: [Template.from_json(t) for t in r.json()["templates"]]
    )


def set_template(name: str, snapshot: str) -> Op[Template]:
    return Op(
        "PUT",
        f"/v1/templates/{seg(name)}",
        lambda r: Template.from_json(r.json()),
        json={"snapshot": snapshot},
    )


def delete_template(name: str) -> Op[None]:
    return Op("DELETE", f"/v1/templates/{seg(name)}", _none)


# ---------------------------------------------------------------- multipart

UploadSource = bytes | str | os.PathLike[str]
"""What an upload takes per file: its contents (``bytes``, or ``str`` written as UTF-8), or a
local file to read (an ``os.PathLike`` such as ``pathlib.Path``)."""


def multipart(
    files: Mapping[str, UploadSource] | Iterable[tuple[str, UploadSource]],
) -> tuple[bytes, str]:
    """Build the ``multipart/form-data`` body of ``POST .../files``: a ``path`` field before
    each file part, in order. Returns the body and its boundary."""
    items = list(files.items()) if isinstance(files, Mapping) else list(files)
    if not items:
        raise ValueError("an upload needs at least one file")
    boundary = "sessionbox-" + secrets.token_hex(16)
    out: list[bytes] = []
    for dest, source in items:
        if isinstance(source, bytes):
            data = source
        elif isinstance(source, str):
            data = source.encode("utf-8")
        else:
            with open(os.fspath(source), "rb") as f:
                data = f.read()
        name = dest.rsplit("/", 1)[-1] or "file"
        out.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="path"\r\n\r\n'.encode()
            + dest.encode("utf-8")
            + b"\r\n"
        )
        quoted = name.replace("\\", "\\\\").replace('"', "%22").replace("\r", "").replace("\n", "")
        out.append(
            (
                f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                f'filename="{quoted}"\r\nContent-Type: application/octet-stream\r\n\r\n'
            ).encode("utf-8")
            + data
            + b"\r\n"
        )
    out.append(f"--{boundary}--\r\n".encode())
    return b"".join(out), boundary


# ---------------------------------------------------------------- event streams


class SSEDecoder:
    """An incremental decoder of ``text/event-stream`` lines into ``(event, data)`` pairs."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> tuple[str, str] | None:
        """Take one line (without its end); return an event when a blank line completes one."""
        line = line.rstrip("\r\n")
        if line == "":
            if not self._data and not self._event:
                return None
            ev = (self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return ev
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


def _chunk(event: str, data: str) -> OutputChunk:
    d = json.loads(data)
    stream: Literal["stdout", "stderr"] = "stdout" if event == "stdout" else "stderr"
    b64 = d.get("base64")
    return OutputChunk(stream, str(d.get("text", "")), None if b64 is None else str(b64))


def exec_event(event: str, data: str) -> ExecEvent | None:
    """Turn an exec stream event into a model (``None`` for events to skip); an ``error``
    event raises the matching :class:`SessionboxError`."""
    if event in ("stdout", "stderr"):
        return _chunk(event, data)
    if event == "exit":
        return ExecExit.from_json(json.loads(data))
    if event == "error":
        _raise_error_event(data)
    return None


def command_event(event: str, data: str) -> CommandEvent | None:
    """Turn a background command's stream event into a model (see :func:`exec_event`)."""
    if event in ("stdout", "stderr"):
        return _chunk(event, data)
    if event == "exit":
        return BackgroundCommand.from_json(json.loads(data))
    if event == "error":
        _raise_error_event(data)
    return None


def watch_event(event: str, data: str) -> WatchEvent | None:
    """Turn a watch stream event into a model; an ``error`` event raises."""
    if event == "error":
        _raise_error_event(data)
    try:
        d = json.loads(data) if data else {}
    except ValueError:
        d = {"raw": data}
    if not isinstance(d, dict):
        d = {"value": d}
    return WatchEvent(kind=str(d.get("kind", event)), data=d)


def _raise_error_event(data: str) -> None:
    try:
        d = json.loads(data)
        code, message = d.get("code"), str(d.get("message", data))
    except ValueError:
        code, message = None, data
    err = error_from_code(code, message)
    if type(err).__name__ == "SessionboxError":
        raise StreamError(message, code=code)
    raise err


def iter_chunks(f: Any, chunk_size: int) -> Iterator[bytes]:
    """Read a binary file object in chunks."""
    while True:
        chunk = f.read(chunk_size)
        if not chunk:
            return
        yield chunk


# ---------------------------------------------------------------- configuration


def resolve_base_url(base_url: str | None) -> str:
    """The base URL: the argument, else ``$SESSIONBOX_URL``, else :data:`DEFAULT_URL`."""
    url = base_url or os.environ.get("SESSIONBOX_URL") or DEFAULT_URL
    return url.rstrip("/")


def resolve_api_key(api_key: str | None) -> str | None:
    """The API key: the argument, else ``$SESSIONBOX_API_KEY``, else none (open mode)."""
    if api_key is not None:
        return api_key
    return os.environ.get("SESSIONBOX_API_KEY") or None


def default_headers(api_key: str | None, extra: Mapping[str, str] | None) -> dict[str, str]:
    """Headers sent with every request."""
    from . import __version__

    headers = {"User-Agent": f"sessionbox-python/{__version__}"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    if extra:
        headers.update(extra)
    return headers


def make_timeout(timeout: float | httpx.Timeout | None) -> httpx.Timeout:
    """Normalise a timeout argument."""
    if isinstance(timeout, httpx.Timeout):
        return timeout
    return httpx.Timeout(timeout)


def timeout_for(op: Op[Any], base: httpx.Timeout) -> httpx.Timeout:
    """The timeout of one request: the client's, with the read time the operation needs."""
    if op.extra_read is None:
        return httpx.Timeout(connect=base.connect, read=None, write=base.write, pool=base.pool)
    if not op.extra_read or base.read is None:
        return base
    return httpx.Timeout(
        connect=base.connect, read=base.read + op.extra_read, write=base.write, pool=base.pool
    )


async def aiter_sync(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    """Adapt a synchronous iterable of byte chunks for the async client."""
    for chunk in chunks:
        yield chunk
