#!/usr/bin/env python3
"""Drives the official AIO Sandbox Python SDK (`agent-sandbox`) against a server and asserts the
results: bash exec (sync, async + output polling, timeouts, kill, sessions) and the file calls
(write text and base64, read, download, upload, list, search, find, grep, glob, replace), the
HTTP-200 failure envelope, the 422 validation shape, and authentication.

Usage: sdk_conformance.py BASE_URL SCRATCH_DIR [TOKEN]
SCRATCH_DIR must be an existing, empty directory the server can write; everything happens in it.
Prints `sdk conformance: ok` at the end; any failed assertion exits non-zero.
"""

import base64
import os
import sys
import time

import httpx
import pydantic
from agent_sandbox import Sandbox
from agent_sandbox.core.api_error import ApiError
from agent_sandbox.errors import UnprocessableEntityError

base_url, scratch = sys.argv[1], os.path.abspath(sys.argv[2])
token = sys.argv[3] if len(sys.argv) > 3 else None
assert os.path.isdir(scratch) and not os.listdir(scratch), "SCRATCH_DIR must exist and be empty"

headers = {"Authorization": f"Bearer {token}"} if token else None
client = Sandbox(base_url=base_url, headers=headers, timeout=30)
checks = []


def check(name):
    def wrap(fn):
        fn()
        checks.append(name)
        print(f"  ok  {name}", flush=True)
        return fn
    return wrap


@check("auth: no token is refused, bearer and X-AIO-API-Key are accepted")
def _():
    if not token:
        return
    bare = Sandbox(base_url=base_url, timeout=30)
    try:
        bare.bash.exec(command="true")
        raise AssertionError("a request without a token was accepted")
    except ApiError as e:
        assert e.status_code == 401, e.status_code
    wrong = Sandbox(base_url=base_url, headers={"X-AIO-API-Key": token + "x"}, timeout=30)
    try:
        wrong.bash.exec(command="true")
        raise AssertionError("a wrong token was accepted")
    except ApiError as e:
        assert e.status_code == 401, e.status_code
    keyed = Sandbox(base_url=base_url, headers={"X-AIO-API-Key": token}, timeout=30)
    r = keyed.bash.exec(command="echo keyed", exec_dir=scratch)
    assert r.success and r.data.stdout == "keyed\n", r


@check("sandbox context reports a version and a home directory")
def _():
    ctx = client.sandbox.get_context()
    assert ctx.version, ctx
    assert ctx.home_dir, ctx


@check("bash exec: separate stdout and stderr, exit code, status completed")
def _():
    r = client.bash.exec(command="echo out; echo err >&2; exit 7", exec_dir=scratch)
    assert r.success is True, r
    d = r.data
    assert d.status == "completed", d
    assert d.exit_code == 7, d
    assert d.stdout == "out\n" and d.stderr == "err\n", d
    assert d.offset == 4 and d.stderr_offset == 4, d
    assert d.session_id and d.command_id, d


@check("bash exec: exec_dir is the working directory, env is passed")
def _():
    r = client.bash.exec(command='pwd; printf %s "$SB_X"', exec_dir=scratch, env={"SB_X": "v a l"})
    assert r.data.stdout == scratch + "\nv a l", r.data


@check("bash exec: cd and export do not carry over in a session")
def _():
    r1 = client.bash.exec(command="cd /; export SB_Y=1", exec_dir=scratch)
    sid = r1.data.session_id
    r2 = client.bash.exec(command='pwd; echo "${SB_Y:-unset}"', session_id=sid)
    assert r2.data.session_id == sid
    assert r2.data.stdout == scratch + "\nunset\n", r2.data
    client.bash.close_session(sid)


@check("bash exec async + output polling by offset until completed")
def _():
    r = client.bash.exec(command="for i in 1 2 3; do echo line$i; sleep 0.2; done; echo done >&2",
                         exec_dir=scratch, async_mode=True)
    d = r.data
    assert d.status == "running", d
    out, err, off, eoff = "", "", 0, 0
    status = "running"
    deadline = time.time() + 20
    while status == "running":
        assert time.time() < deadline, "the command did not finish"
        o = client.bash.output(session_id=d.session_id, command_id=d.command_id, offset=off,
                               stderr_offset=eoff, wait=True, wait_timeout=2).data
        out += o.stdout or ""
        err += o.stderr or ""
        off, eoff = o.offset, o.stderr_offset
        status = o.command.status
        exit_code = o.command.exit_code
    assert out == "line1\nline2\nline3\n" and err == "done\n", (out, err)
    assert status == "completed" and exit_code == 0, status


@check("bash exec: sync timeout returns running, hard_timeout kills (timed_out)")
def _():
    r = client.bash.exec(command="sleep 30", exec_dir=scratch, timeout=0.3, hard_timeout=1.0)
    assert r.data.status == "running", r.data
    time.sleep(1.5)
    o = client.bash.output(session_id=r.data.session_id, command_id=r.data.command_id).data
    assert o.command.status == "timed_out", o.command


@check("bash kill ends a running command; sessions list and close")
def _():
    r = client.bash.exec(command="sleep 30", exec_dir=scratch, async_mode=True)
    sid = r.data.session_id
    assert any(s.session_id == sid for s in client.bash.sessions().data)
    k = client.bash.kill(session_id=sid, signal="SIGKILL")
    assert k.success, k
    for _ in range(50):
        o = client.bash.output(session_id=sid, command_id=r.data.command_id).data
        if o.command.status != "running":
            break
        time.sleep(0.1)
    assert o.command.status == "killed", o.command
    assert client.bash.close_session(sid).success
    assert not any(s.session_id == sid for s in client.bash.sessions().data)


@check("bash exec: max_output_length truncates the middle in sync mode")
def _():
    r = client.bash.exec(command="head -c 1000 /dev/zero | tr '\\0' a", exec_dir=scratch,
                         max_output_length=100)
    s = r.data.stdout
    assert s.startswith("a" * 50) and s.endswith("a" * 50) and "truncated" in s, s
    assert r.data.offset == 1000, r.data


@check("file write (utf-8, base64, append) and read, download byte-exact")
def _():
    p = os.path.join(scratch, "sub", "notes.txt")
    w = client.file.write_file(file=p, content="héllo\n")
    assert w.success and w.data.bytes_written == len("héllo\n".encode()), w
    client.file.write_file(file=p, content="more", append=True, trailing_newline=True)
    assert client.file.read_file(file=p).data.content == "héllo\nmore\n"
    assert client.file.read_file(file=p, start_line=1, end_line=2).data.content == "more\n"
    blob = bytes(range(256)) * 4
    b = os.path.join(scratch, "blob.bin")
    w = client.file.write_file(file=b, content=base64.b64encode(blob).decode(), encoding="base64")
    assert w.data.bytes_written == len(blob), w
    assert b"".join(client.file.download_file(path=b)) == blob
    with open(b, "rb") as f:
        assert f.read() == blob


@check("file upload (multipart) then download")
def _():
    target = os.path.join(scratch, "up", "u.bin")
    r = client.file.upload_file(file=("u.bin", b"\x00up\xff"), path=target)
    assert r.success and r.data.file_size == 4 and r.data.file_path == target, r
    assert b"".join(client.file.download_file(path=target)) == b"\x00up\xff"


@check("file list, search, find, grep, glob, replace")
def _():
    listing = client.file.list_path(path=scratch).data
    names = {f.name: f for f in listing.files}
    assert {"sub", "blob.bin", "up"} <= set(names), names
    assert names["sub"].is_directory and not names["blob.bin"].is_directory
    assert names["blob.bin"].size == 1024
    p = os.path.join(scratch, "sub", "notes.txt")
    s = client.file.search_in_file(file=p, regex="^mo").data
    assert s.matches == ["more"] and s.line_numbers == [1], s
    f = client.file.find_files(path=scratch, glob="*.txt").data
    assert f.files == [p], f
    g = client.file.grep_files(path=scratch, pattern="MORE", case_insensitive=True).data
    assert [(m.file, m.line_number, m.line_content) for m in g.matches] == [(p, 2, "more")], g
    gl = client.file.glob_files(path=scratch, pattern="**/*.txt").data
    assert [x.path for x in gl.files] == [p], gl
    r = client.file.replace_in_file(file=p, old_str="more", new_str="less").data
    assert r.replaced_count == 1
    assert client.file.read_file(file=p).data.content == "héllo\nless\n"


@check("file failures are HTTP 200 with success=false and a message")
def _():
    missing = os.path.join(scratch, "missing.txt")
    raw = httpx.post(base_url + "/v1/file/read", json={"file": missing}, headers=headers or {})
    assert raw.status_code == 200, raw.status_code
    body = raw.json()
    assert body["success"] is False and "No such file" in body["message"], body
    assert body["data"]["error_type"] == "not_found" and body["data"]["path"] == missing, body
    # A difference between the SDK and the spec it claims: agent-sandbox 0.0.30 types `data` as
    # the success model only, where spec 1.9.4 says Union[FileReadResult, FileOperationError].
    # So the SDK raises a pydantic ValidationError on this (spec-conforming) failure of a call
    # whose result model has required fields, and returns success=False (the error fields as
    # extras) for one whose fields are all optional.
    try:
        client.file.read_file(file=missing)
        raise AssertionError("the SDK accepted a FileOperationError as a FileReadResult")
    except pydantic.ValidationError as e:
        assert "content" in str(e), e
    r = client.file.list_path(path=missing)
    assert r.success is False and r.data.error_type == "not_found", r


@check("download of a missing file is an HTTP error, not bytes")
def _():
    try:
        b"".join(client.file.download_file(path=os.path.join(scratch, "missing.bin")))
        raise AssertionError("download of a missing file succeeded")
    except ApiError as e:
        assert e.status_code == 404, e.status_code


@check("request validation: 422 with detail list; bad base64: 422 with detail string")
def _():
    try:
        client.bash.exec(command=None)  # type: ignore[arg-type]
        raise AssertionError("a request without command was accepted")
    except UnprocessableEntityError as e:
        assert e.status_code == 422
        assert e.body.detail and e.body.detail[0].loc[-1] == "command", e.body
    raw = httpx.post(base_url + "/v1/file/write", headers=headers or {},
                     json={"file": os.path.join(scratch, "x"), "content": "%%%", "encoding": "base64"})
    assert raw.status_code == 422 and isinstance(raw.json()["detail"], str), raw.text
    assert not os.path.exists(os.path.join(scratch, "x"))


print(f"sdk conformance: ok ({len(checks)} checks)")
