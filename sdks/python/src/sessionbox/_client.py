"""The synchronous client."""

from __future__ import annotations

import contextlib
import os
import time
from types import TracebackType
from typing import IO, Any, Generator, Iterable, Iterator, Mapping, Sequence, TypeVar

import httpx

from . import _ops as ops
from ._errors import StreamError, TransportError, error_from_response
from ._models import (
    BackgroundCommand,
    CommandEvent,
    CommandLogs,
    Conversation,
    ConversationPage,
    DirEntry,
    DiskUsage,
    EgressVerdict,
    ExecEvent,
    ExecExit,
    ExecResult,
    FileStat,
    GrepMatch,
    NetworkPolicy,
    OpenedConversation,
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

__all__ = ["Client"]

_CHUNK = 64 * 1024


class Client:
    """A synchronous client of a sessionbox server (``sessionbox serve``).

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:7070``; default ``$SESSIONBOX_URL``, else
            ``http://127.0.0.1:7070``.
        api_key: an API key (``sbk_...``); default ``$SESSIONBOX_API_KEY``. Without one, only a
            loopback server in open mode (no key ever created) answers.
        timeout: seconds (or an ``httpx.Timeout``) for a request; commands, long polls and
            snapshots get the time they need on top of it, and live event streams have no read
            timeout.
        headers: extra headers sent with every request.
        http_client: an ``httpx.Client`` to use instead of making one (its base URL, headers and
            timeout are left as they are; it is not closed by :meth:`close`).

    Use it as a context manager, or call :meth:`close`. Every method raises a subclass of
    :class:`SessionboxError` on failure: the server's error ``code``, ``message`` and HTTP
    ``status`` are on the exception.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout | None = ops.DEFAULT_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        self.base_url = ops.resolve_base_url(base_url)
        self._timeout = ops.make_timeout(timeout)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(
            base_url=self.base_url,
            headers=ops.default_headers(ops.resolve_api_key(api_key), headers),
            timeout=self._timeout,
        )

    # ------------------------------------------------------------ plumbing

    def close(self) -> None:
        """Close the connections (when this client made its ``httpx.Client``)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _request(self, op: ops.Op[Any]) -> httpx.Request:
        return self._http.build_request(
            op.method,
            op.path,
            params=op.params,
            json=op.json,
            content=op.content,
            headers=op.headers or None,
            timeout=ops.timeout_for(op, self._timeout),
        )

    def _call(self, op: ops.Op[T]) -> T:
        try:
            response = self._http.send(self._request(op))
        except httpx.TransportError as e:
            raise TransportError(f"{type(e).__name__}: {e}") from e
        if response.is_error:
            raise error_from_response(response)
        return op.parse(response)

    @contextlib.contextmanager
    def _stream(self, op: ops.Op[Any]) -> Iterator[httpx.Response]:
        try:
            response = self._http.send(self._request(op), stream=True)
        except httpx.TransportError as e:
            raise TransportError(f"{type(e).__name__}: {e}") from e
        try:
            if response.is_error:
                response.read()
                raise error_from_response(response)
            yield response
        except httpx.TransportError as e:
            raise TransportError(f"{type(e).__name__}: {e}") from e
        finally:
            response.close()

    def _events(self, op: ops.Op[Any]) -> Iterator[tuple[str, str]]:
        with self._stream(op) as response:
            decoder = ops.SSEDecoder()
            for line in response.iter_lines():
                ev = decoder.feed(line)
                if ev is not None:
                    yield ev
            ev = decoder.feed("")
            if ev is not None:
                yield ev

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send any request to the server (``path`` relative to the base URL) with the client's
        key and headers, and return the raw answer without checking its status."""
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise TransportError(f"{type(e).__name__}: {e}") from e

    # ------------------------------------------------------------ server

    def health(self) -> dict[str, Any]:
        """``GET /healthz``: liveness (``{"status": "ok"}``); needs no key."""
        return self._call(ops.healthz())

    def ready(self) -> dict[str, Any]:
        """``GET /readyz``: store and runtime reachable (``{"status": "ready", "runtime": ...}``);
        raises :class:`NotReady` when not."""
        return self._call(ops.readyz())

    def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text exposition."""
        return self._call(ops.metrics())

    def openapi(self) -> dict[str, Any]:
        """``GET /v1/openapi.json``: the server's OpenAPI 3.1 document."""
        return self._call(ops.openapi())

    # ------------------------------------------------------------ conversations

    def open_conversation(self, conversation_id: str) -> OpenedConversation:
        """Open a conversation, creating its workspace and sandbox when new (idempotent).

        Opening also renews its expiry (``last_used_at``). ``created`` says whether this call
        created it.
        """
        return self._call(ops.open_conversation(conversation_id))

    create_conversation = open_conversation

    def renew_conversation(self, conversation_id: str) -> Conversation:
        """Renew a conversation's expiry by using it (the API has no separate renew route:
        every use renews; this opens it, which creates it when it does not exist) and return
        its record."""
        return self._call(ops.open_conversation(conversation_id)).conversation

    def list_conversations(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> ConversationPage:
        """One page of this tenant's conversations by id (``limit`` 1-1000, default 100)."""
        return self._call(ops.list_conversations(limit, cursor))

    def iter_conversations(
        self, *, page_size: int | None = None
    ) -> Generator[Conversation, None, None]:
        """Every conversation of this tenant, following the pages."""
        cursor: str | None = None
        while True:
            page = self.list_conversations(limit=page_size, cursor=cursor)
            yield from page.conversations
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def get_conversation(self, conversation_id: str) -> Conversation:
        """One conversation with its ``usage`` (and ``disk`` where the runtime has a quota);
        :class:`NotFound` when absent. Does not create it."""
        return self._call(ops.get_conversation(conversation_id))

    def disk_usage(self, conversation_id: str) -> DiskUsage | None:
        """The workspace's disk usage against its quota; ``None`` where there is no quota
        (runtimes other than ``isolated`` as root)."""
        return self.get_conversation(conversation_id).disk

    def destroy_conversation(self, conversation_id: str) -> None:
        """Destroy a conversation: its processes, sandbox, workspace, record, own policy and
        egress log. Succeeds also when it does not exist."""
        self._call(ops.destroy_conversation(conversation_id))

    # ------------------------------------------------------------ exec

    def exec(
        self,
        conversation_id: str,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int | None = None,
        stdin: str | bytes | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        """Run ``/bin/sh -c command`` in the conversation's workspace (creating it) and wait for
        it. A command that fails or times out is still a result: check ``exit_code``.

        ``stdin`` as ``str`` is sent as text, as ``bytes`` exactly (base64). ``timeout_ms`` is
        1-600000 (default 120000); ``output_limit`` caps each of stdout and stderr.
        """
        body = ops.exec_body(
            command, cwd=cwd, env=env, timeout_ms=timeout_ms, stdin=stdin, output_limit=output_limit
        )
        return self._call(ops.exec_json(conversation_id, body))

    def exec_stream(
        self,
        conversation_id: str,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int | None = None,
        stdin: str | bytes | None = None,
        output_limit: int | None = None,
    ) -> Generator[ExecEvent, None, None]:
        """Run a command and yield its output live, as the server streams it: :class:`OutputChunk`
        events (``stdout``/``stderr``, in order), then one :class:`ExecExit`.

        Bad input raises before the first event; an ``error`` event (the command could not
        run) raises the matching :class:`SessionboxError`; a stream that ends without ``exit``
        raises :class:`StreamError`. Closing the generator early (``break``, or
        ``contextlib.closing``) closes the stream, which kills the command's process group.
        """
        body = ops.exec_body(
            command, cwd=cwd, env=env, timeout_ms=timeout_ms, stdin=stdin, output_limit=output_limit
        )
        ended = False
        for event, data in self._events(ops.exec_stream(conversation_id, body)):
            item = ops.exec_event(event, data)
            if item is not None:
                yield item
                if isinstance(item, ExecExit):
                    ended = True
        if not ended:
            raise StreamError("the exec stream ended before its exit event")

    def spawn(
        self,
        conversation_id: str,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int | None = None,
        stdin: str | bytes | None = None,
        output_limit: int | None = None,
        keep_stdin_open: bool = False,
    ) -> BackgroundCommand:
        """Start a command in the background (``"background": true``) and return its status at
        once (``id``, ``running``). It runs outside the conversation's queue.

        ``keep_stdin_open`` keeps its stdin a pipe for :meth:`write_stdin` (runtimes
        ``isolated`` and ``opensandbox``; others raise :class:`RuntimeUnavailable`).
        """
        body = ops.exec_body(
            command,
            cwd=cwd,
            env=env,
            timeout_ms=timeout_ms,
            stdin=stdin,
            output_limit=output_limit,
            background=True,
            keep_stdin_open=keep_stdin_open,
        )
        return self._call(ops.spawn(conversation_id, body))

    def list_commands(self, conversation_id: str) -> list[BackgroundCommand]:
        """The conversation's background commands, running and recently finished, oldest first."""
        return self._call(ops.list_commands(conversation_id))

    def get_command(self, conversation_id: str, command_id: str) -> BackgroundCommand:
        """A background command's status."""
        return self._call(ops.get_command(conversation_id, command_id))

    def command_logs(
        self,
        conversation_id: str,
        command_id: str,
        *,
        stdout_offset: int = 0,
        stderr_offset: int = 0,
        wait_ms: int | None = None,
    ) -> CommandLogs:
        """A background command's output after the given byte offsets (at most 1 MiB of each).

        With ``wait_ms`` (at most 30000) it long-polls: when there is nothing new and the
        command runs, the answer comes with output, the end, or after ``wait_ms``. An offset
        past the output raises :class:`InvalidRequest`.
        """
        return self._call(
            ops.command_logs(conversation_id, command_id, stdout_offset, stderr_offset, wait_ms)
        )

    def follow_command(
        self,
        conversation_id: str,
        command_id: str,
        *,
        stdout_offset: int = 0,
        stderr_offset: int = 0,
    ) -> Generator[CommandEvent, None, None]:
        """Follow a background command live from the offsets: :class:`OutputChunk` events, then
        its final :class:`BackgroundCommand` status. Closing the generator leaves the command
        running."""
        for event, data in self._events(
            ops.follow_command(conversation_id, command_id, stdout_offset, stderr_offset)
        ):
            item = ops.command_event(event, data)
            if item is not None:
                yield item
                if isinstance(item, BackgroundCommand):
                    return

    def wait_command(
        self, conversation_id: str, command_id: str, *, timeout: float | None = None
    ) -> BackgroundCommand:
        """Wait until a background command ends (long-polling its logs) and return its final
        status; raises :class:`TimeoutError` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out = err = 0
        while True:
            logs = self.command_logs(
                conversation_id, command_id, stdout_offset=out, stderr_offset=err, wait_ms=10_000
            )
            out, err = logs.stdout_next_offset, logs.stderr_next_offset
            if not logs.running:
                return self.get_command(conversation_id, command_id)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"command {command_id} still runs after {timeout} s")

    def kill_command(self, conversation_id: str, command_id: str) -> BackgroundCommand:
        """Kill a background command's process group, wait for it to end and return its final
        status (``killed`` true); a command that had ended is answered as it was."""
        return self._call(ops.kill_command(conversation_id, command_id))

    def write_stdin(
        self, conversation_id: str, command_id: str, data: bytes | str, *, close: bool = False
    ) -> int:
        """Write bytes (at most 1 MiB) to the stdin of a command started with
        ``keep_stdin_open``; ``close`` closes it after. Returns the bytes written."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        return self._call(ops.write_stdin(conversation_id, command_id, raw, close))

    def close_stdin(self, conversation_id: str, command_id: str) -> None:
        """Close a command's stdin (it reads end of file); nothing to do when already closed."""
        self._call(ops.close_stdin(conversation_id, command_id))

    # ------------------------------------------------------------ files

    def read_file(
        self,
        conversation_id: str,
        path: str,
        *,
        start: int | None = None,
        end: int | None = None,
    ) -> bytes:
        """A file's bytes; with ``start`` (and ``end``, inclusive) only that byte range
        (:class:`RangeNotSatisfiable` outside the file)."""
        return self._call(ops.read_file(conversation_id, path, start, end))

    def read_text(self, conversation_id: str, path: str, *, encoding: str = "utf-8") -> str:
        """A file's contents decoded as text."""
        return self.read_file(conversation_id, path).decode(encoding)

    def iter_file(
        self, conversation_id: str, path: str, *, chunk_size: int = _CHUNK
    ) -> Generator[bytes, None, None]:
        """A file's bytes as they arrive, in chunks (for large files)."""
        with self._stream(ops.stream_file(conversation_id, path)) as response:
            yield from response.iter_bytes(chunk_size)

    def download_file(
        self,
        conversation_id: str,
        path: str,
        destination: str | os.PathLike[str] | IO[bytes],
        *,
        chunk_size: int = _CHUNK,
    ) -> int:
        """Stream a file of the workspace into a local file (a path, written whole or not at
        all, or an open binary file object). Returns the number of bytes written."""
        if isinstance(destination, (str, os.PathLike)):
            target = os.fspath(destination)
            tmp = f"{target}.part-{os.getpid()}"
            try:
                with open(tmp, "wb") as f:
                    n = self.download_file(conversation_id, path, f, chunk_size=chunk_size)
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            return n
        n = 0
        for chunk in self.iter_file(conversation_id, path, chunk_size=chunk_size):
            destination.write(chunk)
            n += len(chunk)
        return n

    def write_file(
        self,
        conversation_id: str,
        path: str,
        data: bytes | str | Iterable[bytes] | IO[bytes],
    ) -> None:
        """Write a file atomically, parents created (creates the conversation).

        ``data`` is bytes, text (UTF-8), an iterable of byte chunks, or a binary file object;
        iterables and files are streamed.
        """
        content: Any
        if isinstance(data, str):
            content = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            content = bytes(data)
        elif hasattr(data, "read"):
            content = ops.iter_chunks(data, _CHUNK)
        else:
            content = data
        self._call(ops.write_file(conversation_id, path, content))

    def upload_file(
        self, conversation_id: str, path: str, source: str | os.PathLike[str]
    ) -> None:
        """Stream a local file to a workspace path (``PUT``, atomic)."""
        with open(os.fspath(source), "rb") as f:
            self._call(ops.write_file(conversation_id, path, ops.iter_chunks(f, _CHUNK)))

    def upload_files(
        self,
        conversation_id: str,
        files: Mapping[str, ops.UploadSource] | Iterable[tuple[str, ops.UploadSource]],
    ) -> list[UploadedFile]:
        """Upload several files in one multipart request (creates the conversation).

        ``files`` maps workspace paths to contents (``bytes`` or ``str``) or local files
        (``pathlib.Path``). Every path is checked before anything is written.
        """
        body, boundary = ops.multipart(files)
        return self._call(ops.upload_files(conversation_id, body, boundary))

    def edit(
        self,
        conversation_id: str,
        path: str,
        old: str,
        new: str,
        *,
        replace_all: bool = False,
    ) -> int:
        """Replace the exact text ``old`` by ``new``; ``old`` must occur once unless
        ``replace_all`` (else :class:`Conflict`). Returns the number of replacements."""
        return self._call(ops.edit(conversation_id, path, old, new, replace_all))

    def ls(self, conversation_id: str, path: str | None = None) -> list[DirEntry]:
        """List a directory (default the workspace root)."""
        return self._call(ops.ls(conversation_id, path))

    def stat(self, conversation_id: str, path: str) -> FileStat:
        """A path's metadata."""
        return self._call(ops.stat(conversation_id, path))

    def glob(self, conversation_id: str, pattern: str) -> list[str]:
        """Workspace-relative paths matching a glob such as ``src/**/*.py``."""
        return self._call(ops.glob(conversation_id, pattern))

    def grep(
        self,
        conversation_id: str,
        pattern: str,
        *,
        path: str | None = None,
        glob: str | None = None,
        case_insensitive: bool | None = None,
        max_matches: int | None = None,
    ) -> list[GrepMatch]:
        """Lines matching a regular expression (Rust ``regex`` syntax) in ``path`` (default the
        whole workspace), optionally only in files matching ``glob``."""
        return self._call(
            ops.grep(conversation_id, pattern, path, glob, case_insensitive, max_matches)
        )

    def remove(self, conversation_id: str, path: str, *, recursive: bool = False) -> None:
        """Remove a file, link or directory (a non-empty directory needs ``recursive``, else
        :class:`Conflict`)."""
        self._call(ops.remove(conversation_id, path, recursive))

    def mkdir(self, conversation_id: str, path: str) -> None:
        """Create a directory and its parents (creates the conversation)."""
        self._call(ops.mkdir(conversation_id, path))

    def watch(
        self, conversation_id: str, path: str | None = None
    ) -> Generator[WatchEvent, None, None]:
        """Watch a directory (default the root) and everything beneath it: a ``ready`` event,
        then one :class:`WatchEvent` per change, until the generator is closed or an ``ended``
        event. Does not create the conversation."""
        for event, data in self._events(ops.watch(conversation_id, path)):
            item = ops.watch_event(event, data)
            if item is not None:
                yield item
                if item.kind == "ended":
                    return

    # ------------------------------------------------------------ previews

    def create_preview_link(
        self, conversation_id: str, port: int, *, ttl_secs: int | None = None
    ) -> PreviewLink:
        """A signed link (valid ``ttl_secs``, default 900) to what the sandbox serves on
        ``port``; open ``base_url + link.path`` without a key."""
        return self._call(ops.create_preview_link(conversation_id, port, ttl_secs))

    def preview(
        self,
        conversation_id: str,
        port: int,
        path: str = "",
        *,
        method: str = "GET",
        **kwargs: Any,
    ) -> httpx.Response:
        """Send a request to ``127.0.0.1:{port}`` in the sandbox through the server's relay and
        return the program's answer as it is, whatever its status. Failures of the relay
        itself raise: :class:`BadGateway` when nothing listens, :class:`NotFound` for a
        conversation that does not exist, :class:`Busy` past the relay limit, ...

        ``path`` is relative to the program's root; ``kwargs`` go to ``httpx`` (``params``,
        ``content``, ``json``, ``headers``...)."""
        target = ops.preview_path(conversation_id, port, path)
        response = self.request(method, target, **kwargs)
        if response.is_error and not ops.from_program(response):
            raise error_from_response(response)
        return response

    # ------------------------------------------------------------ policies and egress

    def get_policy(self) -> NetworkPolicy:
        """The tenant's network policy (``source`` ``tenant``, or ``default``)."""
        return self._call(ops.get_policy(None))

    def set_policy(
        self,
        profile: str,
        *,
        allow: Sequence[str] | None = None,
        deny: Sequence[str] | None = None,
    ) -> NetworkPolicy:
        """Set the tenant's policy: ``profile`` ``none``, or ``allowlist`` with ``allow`` rules
        (and ``deny`` rules). A refused rule raises :class:`InvalidRequest` quoting it."""
        return self._call(ops.set_policy(None, ops.policy_body(profile, allow, deny)))

    def delete_policy(self) -> NetworkPolicy:
        """Remove the tenant's policy; returns the default now in force."""
        return self._call(ops.delete_policy(None))

    def get_conversation_policy(self, conversation_id: str) -> NetworkPolicy:
        """The policy in force for a conversation and its ``source``."""
        return self._call(ops.get_policy(conversation_id))

    def set_conversation_policy(
        self,
        conversation_id: str,
        profile: str,
        *,
        allow: Sequence[str] | None = None,
        deny: Sequence[str] | None = None,
    ) -> NetworkPolicy:
        """Set a conversation's own policy (wins over the tenant's; the conversation is not
        created). Returns the policy now in force."""
        body = ops.policy_body(profile, allow, deny)
        return self._call(ops.set_policy(conversation_id, body))

    def delete_conversation_policy(self, conversation_id: str) -> NetworkPolicy:
        """Remove a conversation's own policy; returns the policy now in force."""
        return self._call(ops.delete_policy(conversation_id))

    def egress_log(
        self, *, since: str | None = None, limit: int | None = None
    ) -> list[EgressVerdict]:
        """The egress gateway's verdicts for the tenant, newest first; ``since`` is RFC 3339 or
        an age (``15m``, ``2h``), ``limit`` 1-1000 (100)."""
        return self._call(ops.egress_log(None, since, limit))

    def conversation_egress_log(
        self, conversation_id: str, *, since: str | None = None, limit: int | None = None
    ) -> list[EgressVerdict]:
        """The egress verdicts of one conversation, newest first."""
        return self._call(ops.egress_log(conversation_id, since, limit))

    # ------------------------------------------------------------ skills

    def list_skills(self) -> list[SkillSummary]:
        """The tenant's Agent Skills (name and description)."""
        return self._call(ops.list_skills())

    def load_skill(self, conversation_id: str, name: str) -> Skill:
        """Load a skill for a conversation: its instructions and base path there."""
        return self._call(ops.load_skill(conversation_id, name))

    # ------------------------------------------------------------ snapshots, forks, templates

    def create_snapshot(
        self, conversation_id: str, name: str, *, keep_seconds: int | None = None
    ) -> Snapshot:
        """Snapshot the workspace as ``name`` (``keep_seconds`` 0 keeps it until deleted;
        default 30 days). A taken name raises :class:`AlreadyExists`."""
        return self._call(ops.create_snapshot(conversation_id, name, keep_seconds))

    def list_snapshots(self) -> list[Snapshot]:
        """The tenant's snapshots, oldest first."""
        return self._call(ops.list_snapshots())

    def get_snapshot(self, name: str) -> Snapshot:
        """One snapshot."""
        return self._call(ops.get_snapshot(name))

    def delete_snapshot(self, name: str) -> None:
        """Delete a snapshot (also when absent); :class:`Conflict` while a template names it."""
        self._call(ops.delete_snapshot(name))

    def restore_snapshot(self, conversation_id: str, snapshot: str) -> Restored:
        """Replace the conversation's workspace by a snapshot (kill background commands
        first)."""
        return self._call(ops.restore(conversation_id, snapshot))

    def fork_conversation(self, conversation_id: str, to: str) -> Restored:
        """A new conversation ``to``, a copy of this one as it is now."""
        return self._call(ops.fork_conversation(conversation_id, to))

    def fork_snapshot(self, name: str, to: str) -> Restored:
        """A new conversation ``to`` from a snapshot."""
        return self._call(ops.fork_snapshot(name, to))

    def fork_template(self, name: str, to: str) -> Restored:
        """A new conversation ``to`` from the snapshot a template names."""
        return self._call(ops.fork_template(name, to))

    def export_snapshot(self, name: str) -> bytes:
        """A snapshot's archive (a zstd-compressed POSIX tar) in memory."""
        return self._call(ops.export_snapshot(name))

    def export_snapshot_to(
        self,
        name: str,
        destination: str | os.PathLike[str] | IO[bytes],
        *,
        chunk_size: int = _CHUNK,
    ) -> int:
        """Stream a snapshot's archive into a local file (path or binary file object); returns
        the bytes written."""
        if isinstance(destination, (str, os.PathLike)):
            with open(os.fspath(destination), "wb") as f:
                return self.export_snapshot_to(name, f, chunk_size=chunk_size)
        n = 0
        with self._stream(ops.stream_export(name)) as response:
            for chunk in response.iter_bytes(chunk_size):
                destination.write(chunk)
                n += len(chunk)
        return n

    def import_snapshot(
        self,
        name: str,
        archive: bytes | str | os.PathLike[str] | IO[bytes] | Iterable[bytes],
        *,
        keep_seconds: int | None = None,
    ) -> Snapshot:
        """Import a tar (or a zstd-compressed tar) as snapshot ``name``. ``archive`` is the
        bytes, a local file's path (``str`` or ``Path``, streamed), a binary file object or an
        iterable of chunks. An archive that is not one, or breaks a rule, raises
        :class:`InvalidRequest`."""
        if isinstance(archive, (str, os.PathLike)):
            with open(os.fspath(archive), "rb") as f:
                return self._call(
                    ops.import_snapshot(name, ops.iter_chunks(f, _CHUNK), keep_seconds)
                )
        content: Any
        if isinstance(archive, (bytes, bytearray, memoryview)):
            content = bytes(archive)
        elif hasattr(archive, "read"):
            content = ops.iter_chunks(archive, _CHUNK)
        else:
            content = archive
        return self._call(ops.import_snapshot(name, content, keep_seconds))

    def list_templates(self) -> list[Template]:
        """The tenant's templates."""
        return self._call(ops.list_templates())

    def set_template(self, name: str, snapshot: str) -> Template:
        """Name a snapshot as template ``name`` (``default`` is restored into every new
        conversation of the tenant)."""
        return self._call(ops.set_template(name, snapshot))

    def delete_template(self, name: str) -> None:
        """Remove a template (its snapshot stays)."""
        self._call(ops.delete_template(name))

