#!/usr/bin/env python3
"""A test server for the AIO Sandbox `/v1` API, built from the published spec.

It implements the subset sessionbox's `aio` runtime uses, faithfully to
`shared/specs/aio/openapi.json` (AIO Sandbox 1.9.4): `/v1/sandbox`, `/v1/bash/*` and
`/v1/file/*`. Commands really run (`bash -c`, each in its own process group) and files are real
files. Responses use the `{success, message, data, hint}` envelope; file failures are HTTP 200
with `success: false` and a `FileOperationError` in `data`; request validation failures are
FastAPI's 422 `{"detail": [...]}`, and semantic rejections of a valid request (bad base64) are
422 `{"detail": "..."}`.

Authentication (off unless a token is configured): `Authorization: Bearer TOKEN` or
`X-AIO-API-Key: TOKEN`; anything else is 401.

Not part of AIO: `GET /__test__/requests` (and `POST /__test__/reset`) report how many API
requests the server has answered, so tests can prove that a refused path made no HTTP call.

This server runs commands as whoever starts it. Point it only at temporary directories.

Usage: server.py [--listen HOST:PORT] [--token-env NAME] [--home DIR]
The first line on stdout is `aio-test-server listening on http://HOST:PORT`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import errno as errno_mod
import fnmatch
import os
import re
import signal
import socket
import stat
import sys
import uuid
from typing import Any, Dict, List, Literal, Optional

import uvicorn
from fastapi import FastAPI, File, Form, HTTPException, Request, UploadFile
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, Field

VERSION = "1.9.4"

app = FastAPI(title="aio-test-server", version=VERSION)
STATE: Dict[str, Any] = {"token": None, "requests": 0, "home": os.getcwd()}


def envelope(data: Any = None, message: str = "Operation successful", success: bool = True,
             hint: Optional[str] = None) -> Dict[str, Any]:
    return {"success": success, "message": message, "data": data, "hint": hint}


def file_error(path: str, operation: str, exc: BaseException) -> Dict[str, Any]:
    """The HTTP-200 failure shape of every /v1/file route."""
    err_no = getattr(exc, "errno", None)
    kinds = {
        errno_mod.ENOENT: "not_found",
        errno_mod.EACCES: "permission_denied",
        errno_mod.EPERM: "permission_denied",
        errno_mod.EISDIR: "is_directory",
        errno_mod.ENOTDIR: "not_directory",
        errno_mod.EEXIST: "already_exists",
        errno_mod.ENOTEMPTY: "directory_not_empty",
    }
    error_type = kinds.get(err_no, "invalid_argument" if isinstance(exc, ValueError) else "io_error")
    message = f"{operation} failed: {getattr(exc, 'strerror', None) or exc}"
    data = {
        "path": path,
        "operation": operation,
        "message": message,
        "error_type": error_type,
        "retryable": False,
        "errno": err_no,
        "errno_name": errno_mod.errorcode.get(err_no) if err_no else None,
        "exception_type": type(exc).__name__,
    }
    return envelope(data, message=message, success=False)


@app.middleware("http")
async def auth_and_count(request: Request, call_next):
    if request.url.path.startswith("/__test__/"):
        return await call_next(request)
    STATE["requests"] += 1
    token = STATE["token"]
    if token:
        given = request.headers.get("x-aio-api-key")
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = given or auth[7:].strip()
        if given != token:
            return JSONResponse({"detail": "Unauthorized"}, status_code=401)
    return await call_next(request)


@app.get("/__test__/requests")
async def test_requests():
    return {"requests": STATE["requests"]}


@app.post("/__test__/reset")
async def test_reset():
    STATE["requests"] = 0
    return {"requests": 0}


# ---------------------------------------------------------------------------------------------
# /v1/sandbox


@app.get("/v1/sandbox")
async def sandbox_context():
    return {
        "success": True,
        "message": "Operation successful",
        "data": None,
        "hint": None,
        "home_dir": STATE["home"],
        "workspace": STATE["home"],
        "version": VERSION,
        "detail": {
            "system": {"os": "linux", "os_version": os.uname().release, "arch": os.uname().machine,
                       "user": os.environ.get("USER", ""), "home_dir": STATE["home"],
                       "workspace": STATE["home"], "timezone": "UTC", "occupied_ports": []},
            "runtime": {"python": [{"ver": sys.version.split()[0], "bin": sys.executable, "alias": ["python3"]}],
                        "nodejs": []},
            "utils": [{"category": "shell", "tools": [{"name": "bash", "description": "GNU bash"}]}],
        },
    }


# ---------------------------------------------------------------------------------------------
# /v1/bash

CommandStatus = Literal["pending", "running", "completed", "timed_out", "killed"]


class Command:
    def __init__(self, command: str) -> None:
        self.command_id = uuid.uuid4().hex
        self.command = command
        self.status: str = "pending"
        self.exit_code: Optional[int] = None
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.done = asyncio.Event()
        self.changed = asyncio.Event()

    def info(self) -> Dict[str, Any]:
        return {"command_id": self.command_id, "command": self.command, "status": self.status,
                "exit_code": self.exit_code}

    def signal_group(self, sig: int) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass


class Session:
    def __init__(self, session_id: str, working_dir: str) -> None:
        self.session_id = session_id
        self.working_dir = working_dir
        self.status = "ready"
        self.created_at = dt.datetime.now(dt.timezone.utc)
        self.last_used_at = self.created_at
        self.commands: Dict[str, Command] = {}
        self.last: Optional[Command] = None

    def info(self) -> Dict[str, Any]:
        running = self.last.command if self.last and self.last.status == "running" else None
        return {"session_id": self.session_id, "status": self.status, "working_dir": self.working_dir,
                "created_at": self.created_at.isoformat(), "last_used_at": self.last_used_at.isoformat(),
                "current_command": running, "command_count": len(self.commands)}


SESSIONS: Dict[str, Session] = {}


class BashExecRequest(BaseModel):
    command: str
    session_id: Optional[str] = None
    exec_dir: Optional[str] = None
    env: Optional[Dict[str, str]] = None
    async_mode: bool = False
    timeout: Optional[float] = None
    hard_timeout: Optional[float] = None
    max_output_length: int = 50000


class BashOutputRequest(BaseModel):
    session_id: str
    command_id: Optional[str] = None
    offset: int = 0
    stderr_offset: int = 0
    wait: bool = False
    wait_timeout: float = 30


class BashKillRequest(BaseModel):
    session_id: str
    signal: str = "SIGTERM"


class BashSessionCreateRequest(BaseModel):
    session_id: Optional[str] = None
    exec_dir: Optional[str] = None
    snapshot_path: Optional[str] = None


def _session(session_id: Optional[str], exec_dir: Optional[str]) -> Session:
    sid = session_id or uuid.uuid4().hex
    s = SESSIONS.get(sid)
    if s is None or s.status == "closed":
        s = Session(sid, exec_dir or STATE["home"])
        SESSIONS[sid] = s
    if exec_dir:
        s.working_dir = exec_dir
    s.last_used_at = dt.datetime.now(dt.timezone.utc)
    return s


def _truncate(text: str, limit: int) -> str:
    if limit <= 0 or len(text) <= limit:
        return text
    marker = f"\n... [{len(text) - limit} characters truncated] ...\n"
    head = limit // 2
    return text[:head] + marker + text[len(text) - (limit - head):]


async def _pump(stream: asyncio.StreamReader, buf: bytearray, cmd: Command) -> None:
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        buf.extend(chunk)
        cmd.changed.set()


async def _run(cmd: Command, cwd: str, env: Dict[str, str], hard_timeout: Optional[float]) -> None:
    try:
        cmd.proc = await asyncio.create_subprocess_exec(
            "bash", "-c", cmd.command, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        cmd.stderr.extend(f"cannot start bash: {exc}\n".encode())
        cmd.status = "killed"
        cmd.done.set()
        cmd.changed.set()
        return
    cmd.status = "running"
    pumps = asyncio.gather(_pump(cmd.proc.stdout, cmd.stdout, cmd), _pump(cmd.proc.stderr, cmd.stderr, cmd))
    timed_out = False
    try:
        await asyncio.wait_for(cmd.proc.wait(), timeout=hard_timeout)
    except asyncio.TimeoutError:
        timed_out = True
        cmd.signal_group(signal.SIGKILL)
        await cmd.proc.wait()
    # The shell is gone: end whatever it left in its process group, then drain the pipes.
    cmd.signal_group(signal.SIGKILL)
    try:
        await asyncio.wait_for(pumps, timeout=5)
    except asyncio.TimeoutError:
        pass
    rc = cmd.proc.returncode
    if timed_out:
        cmd.status = "timed_out"
    elif cmd.status == "killed" or (rc is not None and rc < 0):
        cmd.status = "killed"
        cmd.exit_code = 128 - rc if rc is not None and rc < 0 else rc
    else:
        cmd.status = "completed"
        cmd.exit_code = rc
    cmd.done.set()
    cmd.changed.set()


def _exec_result(s: Session, cmd: Command, limit: int) -> Dict[str, Any]:
    out = cmd.stdout.decode("utf-8", "replace")
    err = cmd.stderr.decode("utf-8", "replace")
    return {"session_id": s.session_id, "command_id": cmd.command_id, "command": cmd.command,
            "status": cmd.status, "stdout": _truncate(out, limit), "stderr": _truncate(err, limit),
            "exit_code": cmd.exit_code, "offset": len(cmd.stdout), "stderr_offset": len(cmd.stderr)}


@app.post("/v1/bash/exec")
async def bash_exec(req: BashExecRequest):
    if req.exec_dir is not None and not os.path.isabs(req.exec_dir):
        return envelope(None, message=f"exec_dir must be an absolute path: {req.exec_dir}", success=False)
    if req.exec_dir is not None and not os.path.isdir(req.exec_dir):
        return envelope(None, message=f"exec_dir does not exist: {req.exec_dir}", success=False)
    s = _session(req.session_id, req.exec_dir)
    if s.last is not None and s.last.status == "running":
        return envelope(None, message=f"session {s.session_id} is busy running a command", success=False)
    cmd = Command(req.command)
    s.commands[cmd.command_id] = cmd
    s.last = cmd
    env = dict(os.environ)
    env.update(req.env or {})
    asyncio.get_running_loop().create_task(_run(cmd, s.working_dir, env, req.hard_timeout))
    if not req.async_mode:
        try:
            await asyncio.wait_for(cmd.done.wait(), timeout=req.timeout)
        except asyncio.TimeoutError:
            pass
    else:
        await asyncio.sleep(0)
    if cmd.status == "pending":
        cmd.status = "running"
    limit = 0 if req.async_mode else req.max_output_length
    return envelope(_exec_result(s, cmd, limit))


@app.post("/v1/bash/output")
async def bash_output(req: BashOutputRequest):
    s = SESSIONS.get(req.session_id)
    if s is None:
        return envelope(None, message=f"Session not found: {req.session_id}", success=False)
    cmd = s.commands.get(req.command_id) if req.command_id else s.last
    if req.command_id and cmd is None:
        return envelope(None, message=f"Command not found: {req.command_id}", success=False)
    if cmd is not None and req.wait and not cmd.done.is_set() \
            and len(cmd.stdout) <= req.offset and len(cmd.stderr) <= req.stderr_offset:
        cmd.changed.clear()
        try:
            await asyncio.wait_for(cmd.changed.wait(), timeout=max(0.0, req.wait_timeout))
        except asyncio.TimeoutError:
            pass
    if cmd is None:
        return envelope({"session_id": s.session_id, "stdout": "", "stderr": "", "offset": req.offset,
                         "stderr_offset": req.stderr_offset, "command": None})
    out, err = bytes(cmd.stdout), bytes(cmd.stderr)
    return envelope({
        "session_id": s.session_id,
        "stdout": out[req.offset:].decode("utf-8", "replace"),
        "stderr": err[req.stderr_offset:].decode("utf-8", "replace"),
        "offset": max(len(out), req.offset),
        "stderr_offset": max(len(err), req.stderr_offset),
        "command": cmd.info(),
    })


SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL, "SIGINT": signal.SIGINT}


@app.post("/v1/bash/kill")
async def bash_kill(req: BashKillRequest):
    s = SESSIONS.get(req.session_id)
    if s is None:
        return envelope(None, message=f"Session not found: {req.session_id}", success=False)
    sig = SIGNALS.get(req.signal.upper())
    if sig is None:
        return envelope(None, message=f"Unsupported signal: {req.signal}", success=False)
    killed = 0
    for cmd in s.commands.values():
        if not cmd.done.is_set():
            cmd.status = "killed"
            cmd.signal_group(sig)
            killed += 1
    return envelope({"session_id": s.session_id, "killed": killed}, message=f"Sent {req.signal.upper()}")


@app.get("/v1/bash/sessions")
async def bash_sessions():
    return envelope([s.info() for s in SESSIONS.values() if s.status != "closed"])


@app.post("/v1/bash/sessions/create")
async def bash_session_create(req: BashSessionCreateRequest):
    if req.session_id and req.session_id in SESSIONS and SESSIONS[req.session_id].status != "closed":
        return envelope(None, message=f"Session already exists: {req.session_id}", success=False)
    return envelope(_session(req.session_id, req.exec_dir).info())


@app.post("/v1/bash/sessions/{session_id}/close")
async def bash_session_close(session_id: str):
    s = SESSIONS.pop(session_id, None)
    if s is None:
        return envelope(None, message=f"Session not found: {session_id}", success=False)
    s.status = "closed"
    for cmd in s.commands.values():
        if not cmd.done.is_set():
            cmd.status = "killed"
            cmd.signal_group(signal.SIGKILL)
    return envelope(None, message=f"Session {session_id} closed")


# ---------------------------------------------------------------------------------------------
# /v1/file


class FileReadRequest(BaseModel):
    file: str
    start_line: Optional[int] = None
    end_line: Optional[int] = None
    sudo: Optional[bool] = False


class FileWriteRequest(BaseModel):
    file: str
    content: str
    encoding: Optional[Literal["utf-8", "base64", "raw"]] = "utf-8"
    append: Optional[bool] = False
    leading_newline: Optional[bool] = False
    trailing_newline: Optional[bool] = False
    sudo: Optional[bool] = False


class FileReplaceRequest(BaseModel):
    file: str
    old_str: str
    new_str: str
    sudo: Optional[bool] = False


class FileSearchRequest(BaseModel):
    file: str
    regex: str
    sudo: Optional[bool] = False


class FileFindRequest(BaseModel):
    path: str
    glob: str


class FileListRequest(BaseModel):
    path: str
    recursive: Optional[bool] = False
    show_hidden: Optional[bool] = True
    file_types: Optional[List[str]] = None
    max_depth: Optional[int] = None
    include_size: Optional[bool] = True
    include_permissions: Optional[bool] = False
    sort_by: Optional[str] = "name"
    sort_desc: Optional[bool] = False


class FileGrepRequest(BaseModel):
    path: str
    pattern: str
    include: Optional[List[str]] = None
    exclude: Optional[List[str]] = None
    case_insensitive: Optional[bool] = False
    fixed_strings: Optional[bool] = False
    context_before: Optional[int] = Field(default=0, ge=0, le=20)
    context_after: Optional[int] = Field(default=0, ge=0, le=20)
    max_results: Optional[int] = Field(default=500, ge=1, le=10000)
    max_file_size: Optional[str] = "1M"
    multiline: Optional[bool] = False
    offset: Optional[int] = Field(default=0, ge=0)
    type: Optional[str] = None
    recursive: Optional[bool] = True


class FileGlobRequest(BaseModel):
    path: str
    pattern: str
    exclude: Optional[List[str]] = None
    include_hidden: Optional[bool] = False
    files_only: Optional[bool] = True
    include_metadata: Optional[bool] = True
    max_results: Optional[int] = Field(default=5000, ge=1, le=50000)
    sort_by: Optional[str] = "path"
    sort_desc: Optional[bool] = False


def _absolute(path: str) -> str:
    if not os.path.isabs(path):
        raise ValueError(f"path must be absolute: {path}")
    return path


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).isoformat()


@app.post("/v1/file/read")
async def file_read(req: FileReadRequest):
    try:
        with open(_absolute(req.file), "rb") as f:
            raw = f.read()
        text = raw.decode("utf-8")
        if req.start_line is not None or req.end_line is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[req.start_line or 0:req.end_line])
        return envelope({"content": text, "file": req.file})
    except UnicodeDecodeError as exc:
        return file_error(req.file, "read", ValueError(f"not a UTF-8 text file ({exc.reason}); use /v1/file/download"))
    except (OSError, ValueError) as exc:
        return file_error(req.file, "read", exc)


@app.post("/v1/file/write")
async def file_write(req: FileWriteRequest):
    if req.encoding == "base64":
        try:
            data = base64.b64decode(req.content, validate=True)
        except (ValueError, TypeError):
            raise HTTPException(status_code=422, detail="content is not valid base64")
    else:
        text = req.content
        if req.leading_newline:
            text = "\n" + text
        if req.trailing_newline:
            text = text + "\n"
        data = text.encode("utf-8")
    try:
        path = _absolute(req.file)
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "ab" if req.append else "wb") as f:
            f.write(data)
        return envelope({"file": req.file, "bytes_written": len(data)})
    except (OSError, ValueError) as exc:
        return file_error(req.file, "write", exc)


@app.post("/v1/file/replace")
async def file_replace(req: FileReplaceRequest):
    try:
        with open(_absolute(req.file), "r", encoding="utf-8") as f:
            text = f.read()
        count = text.count(req.old_str) if req.old_str else 0
        if count:
            with open(req.file, "w", encoding="utf-8") as f:
                f.write(text.replace(req.old_str, req.new_str))
        return envelope({"file": req.file, "replaced_count": count})
    except (OSError, ValueError) as exc:
        return file_error(req.file, "replace", exc)


@app.post("/v1/file/search")
async def file_search(req: FileSearchRequest):
    try:
        rx = re.compile(req.regex)
    except re.error as exc:
        return file_error(req.file, "search", ValueError(f"invalid regex: {exc}"))
    try:
        with open(_absolute(req.file), "r", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        matches, numbers = [], []
        for i, line in enumerate(lines):
            if rx.search(line):
                matches.append(line)
                numbers.append(i)
        return envelope({"file": req.file, "matches": matches, "line_numbers": numbers})
    except (OSError, ValueError) as exc:
        return file_error(req.file, "search", exc)


def _walk_files(root: str, include_hidden: bool = True):
    """Files and directories under root, not following links to directories (as rg and find do)."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        if not include_hidden:
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            filenames = [f for f in filenames if not f.startswith(".")]
        dirnames.sort()
        for d in dirnames:
            yield os.path.join(dirpath, d), True
        for f in sorted(filenames):
            yield os.path.join(dirpath, f), False


@app.post("/v1/file/find")
async def file_find(req: FileFindRequest):
    try:
        root = _absolute(req.path)
        if not os.path.isdir(root):
            raise FileNotFoundError(errno_mod.ENOENT, "No such directory", root)
        files = [p for p, is_dir in _walk_files(root) if not is_dir and fnmatch.fnmatch(os.path.basename(p), req.glob)]
        return envelope({"path": req.path, "files": files})
    except (OSError, ValueError) as exc:
        return file_error(req.path, "find", exc)


def _glob_regex(pattern: str) -> re.Pattern:
    """A path glob: `**` crosses directories, `*` and `?` do not, `[...]` a class."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
            continue
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j == -1:
                out += re.escape(c)
            else:
                cls = pattern[i + 1:j]
                if cls.startswith("!"):
                    cls = "^" + cls[1:]
                out += "[" + cls + "]"
                i = j
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out + r"\Z")


@app.post("/v1/file/glob")
async def file_glob(req: FileGlobRequest):
    try:
        root = _absolute(req.path)
        if not os.path.isdir(root):
            raise FileNotFoundError(errno_mod.ENOENT, "No such directory", root)
        rx = _glob_regex(req.pattern)
        excludes = [_glob_regex(e) for e in (req.exclude or [])]
        found = []
        for p, is_dir in _walk_files(root, include_hidden=bool(req.include_hidden)):
            if is_dir and req.files_only:
                continue
            rel = os.path.relpath(p, root)
            if not rx.match(rel) or any(e.match(rel) for e in excludes):
                continue
            info: Dict[str, Any] = {"path": p, "name": os.path.basename(p), "is_directory": is_dir}
            if req.include_metadata:
                try:
                    st = os.lstat(p)
                    info["size"] = st.st_size
                    info["modified_time"] = _iso(st.st_mtime)
                except OSError:
                    pass
            found.append(info)
        key = {"name": lambda f: f["name"], "size": lambda f: f.get("size") or 0,
               "modified": lambda f: f.get("modified_time") or ""}.get(req.sort_by or "path", lambda f: f["path"])
        found.sort(key=key, reverse=bool(req.sort_desc))
        limit = req.max_results or 5000
        return envelope({"path": req.path, "pattern": req.pattern, "files": found[:limit],
                         "total_count": len(found), "truncated": len(found) > limit})
    except (OSError, ValueError) as exc:
        return file_error(req.path, "glob", exc)


def _size_limit(text: Optional[str]) -> Optional[int]:
    if not text:
        return None
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if not m:
        raise ValueError(f"invalid max_file_size: {text}")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]


@app.post("/v1/file/grep")
async def file_grep(req: FileGrepRequest):
    try:
        root = _absolute(req.path)
        flags = re.IGNORECASE if req.case_insensitive else 0
        try:
            rx = re.compile(re.escape(req.pattern) if req.fixed_strings else req.pattern, flags)
        except re.error as exc:
            raise ValueError(f"invalid pattern: {exc}")
        max_size = _size_limit(req.max_file_size)
        if os.path.isfile(root):
            candidates = [root]
        elif os.path.isdir(root):
            candidates = [p for p, is_dir in _walk_files(root) if not is_dir]
        else:
            raise FileNotFoundError(errno_mod.ENOENT, "No such file or directory", root)
        matches, searched, matched_files = [], 0, set()
        skip, limit = req.offset or 0, req.max_results or 500
        truncated = False
        for path in candidates:
            name = os.path.basename(path)
            if req.include and not any(fnmatch.fnmatch(name, g) for g in req.include):
                continue
            if req.exclude and any(fnmatch.fnmatch(name, g) or g in path.split(os.sep) for g in req.exclude):
                continue
            try:
                st = os.stat(path)
                if not stat.S_ISREG(st.st_mode) or (max_size is not None and st.st_size > max_size):
                    continue
                with open(path, "rb") as f:
                    raw = f.read()
            except OSError:
                continue
            if b"\0" in raw[:8192]:
                continue  # binary, as rg skips it
            searched += 1
            for i, line in enumerate(raw.decode("utf-8", "replace").splitlines()):
                if rx.search(line):
                    if skip:
                        skip -= 1
                        continue
                    if len(matches) >= limit:
                        truncated = True
                        break
                    matched_files.add(path)
                    matches.append({"file": path, "line_number": i + 1, "line_content": line})
            if truncated:
                break
        return envelope({"path": req.path, "pattern": req.pattern, "matches": matches,
                         "match_count": len(matches), "files_searched": searched,
                         "files_matched": len(matched_files), "truncated": truncated})
    except (OSError, ValueError) as exc:
        return file_error(req.path, "grep", exc)


@app.post("/v1/file/list")
async def file_list(req: FileListRequest):
    try:
        root = _absolute(req.path)
        if not os.path.isdir(root):
            if os.path.exists(root):
                raise NotADirectoryError(errno_mod.ENOTDIR, "Not a directory", root)
            raise FileNotFoundError(errno_mod.ENOENT, "No such file or directory", root)
        entries = []
        depth_limit = req.max_depth if req.recursive else 1
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            depth = 0 if dirpath == root else os.path.relpath(dirpath, root).count(os.sep) + 1
            names = dirnames + filenames
            if not req.recursive or (depth_limit is not None and depth + 1 >= depth_limit):
                dirnames[:] = []
            for name in names:
                if not req.show_hidden and name.startswith("."):
                    continue
                full = os.path.join(dirpath, name)
                is_dir = os.path.isdir(full)
                ext = os.path.splitext(name)[1] or None
                if req.file_types and (is_dir or ext not in req.file_types):
                    continue
                info: Dict[str, Any] = {"name": name, "path": full, "is_directory": is_dir,
                                        "extension": None if is_dir else ext}
                try:
                    st = os.lstat(full)
                    info["modified_time"] = _iso(st.st_mtime)
                    if req.include_size:
                        info["size"] = None if is_dir else st.st_size
                    if req.include_permissions:
                        info["permissions"] = stat.filemode(st.st_mode)
                except OSError:
                    pass
                entries.append(info)
        key = {"size": lambda f: f.get("size") or 0, "modified": lambda f: f.get("modified_time") or "",
               "type": lambda f: (not f["is_directory"], f["name"])}.get(req.sort_by or "name", lambda f: f["name"])
        entries.sort(key=key, reverse=bool(req.sort_desc))
        dirs = sum(1 for e in entries if e["is_directory"])
        return envelope({"path": req.path, "files": entries, "total_count": len(entries),
                         "directory_count": dirs, "file_count": len(entries) - dirs})
    except (OSError, ValueError) as exc:
        return file_error(req.path, "list", exc)


@app.post("/v1/file/upload")
async def file_upload(file: UploadFile = File(...), path: Optional[str] = Form(None)):
    target = path or os.path.join(STATE["home"], os.path.basename(file.filename or "upload"))
    try:
        _absolute(target)
        if target.endswith("/") or os.path.isdir(target):
            target = os.path.join(target, os.path.basename(file.filename or "upload"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        size = 0
        with open(target, "wb") as f:
            while chunk := await file.read(65536):
                f.write(chunk)
                size += len(chunk)
        return envelope({"file_path": target, "file_size": size, "success": True})
    except (OSError, ValueError) as exc:
        return file_error(target, "upload", exc)


@app.get("/v1/file/download")
async def file_download(path: str, change_policy: Literal["ignore", "abort"] = "ignore"):
    if not os.path.isabs(path):
        return JSONResponse(file_error(path, "download", ValueError(f"path must be absolute: {path}")), status_code=400)
    if not os.path.isfile(path):
        exc = IsADirectoryError(errno_mod.EISDIR, "Is a directory", path) if os.path.isdir(path) \
            else FileNotFoundError(errno_mod.ENOENT, "No such file or directory", path)
        return JSONResponse(file_error(path, "download", exc), status_code=404)
    return FileResponse(path, media_type="application/octet-stream", filename=os.path.basename(path))


# ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT (port 0 picks a free one)")
    ap.add_argument("--token-env", default="AIO_TEST_SERVER_TOKEN",
                    help="environment variable holding the token to require (unset: no auth)")
    ap.add_argument("--home", default=None, help="home directory the server reports (default: cwd)")
    args = ap.parse_args()
    STATE["token"] = os.environ.get(args.token_env) or None
    if args.home:
        STATE["home"] = os.path.abspath(args.home)
    host, _, port = args.listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    # Listen before announcing the address: a client that connects as soon as it reads the
    # line must find a listening socket, not a bound one (which refuses connections).
    sock.listen(128)
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    print(f"aio-test-server listening on http://{shown}:{bound[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
