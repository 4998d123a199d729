"""The sync client against a real server."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import sys
import tarfile
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import httpx
import pytest

import sessionbox
from sessionbox import (
    AlreadyExists,
    BackgroundCommand,
    Client,
    Conflict,
    ExecExit,
    Forbidden,
    InvalidId,
    InvalidRequest,
    NotFound,
    OutputChunk,
    OutsideWorkspace,
    RangeNotSatisfiable,
    RuntimeUnavailable,
    SessionboxError,
    TransportError,
    Unauthorized,
)

from .conftest import Server

ALL_BYTES = bytes(range(256))


def new_id(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# ---------------------------------------------------------------- server routes


def test_health_ready_openapi_metrics(client: Client, server: Server) -> None:
    assert client.health() == {"status": "ok"}
    ready = client.ready()
    assert ready["status"] == "ready"
    assert ready["runtime"] == os.environ.get("SESSIONBOX_TEST_RUNTIME", "host")
    doc = client.openapi()
    assert doc["openapi"].startswith("3.1")
    assert "/v1/conversations/{id}/exec" in doc["paths"]
    client.exec(new_id("metrics"), "true")
    text = client.metrics()
    assert "sessionbox_http_requests_total" in text
    assert 'mode="json"' in text
    # health needs no key; metrics does
    with Client(server.url, api_key="") as anon:
        assert anon.health()["status"] == "ok"
        with pytest.raises(Unauthorized):
            anon.metrics()


def test_env_configuration(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSIONBOX_URL", server.url + "/")
    monkeypatch.setenv("SESSIONBOX_API_KEY", server.key)
    with Client() as c:
        assert c.base_url == server.url
        assert isinstance(c.list_conversations().conversations, list)


# ---------------------------------------------------------------- errors


def test_wrong_key_is_unauthorized(server: Server) -> None:
    with Client(server.url, "sbk_0000000000000000_" + "0" * 64) as bad:
        with pytest.raises(Unauthorized) as e:
            bad.list_conversations()
    assert e.value.code == "unauthorized"
    assert e.value.status == 401
    assert e.value.message
    assert isinstance(e.value, SessionboxError)


def test_a_scoped_read_only_key_is_forbidden_what_it_does_not_reach(
    client: Client, server: Server
) -> None:
    import subprocess

    own, other = new_id("scoped"), new_id("other")
    client.write_file(own, "a.txt", b"mine\n")
    client.write_file(other, "b.txt", b"theirs\n")
    key = subprocess.run(
        [server.bin, "--data-dir", str(server.data_dir), "--tenant", "acme", "keys", "create",
         "--conversation", own, "--read-only", "--expires-in", "1h"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    with Client(server.url, key) as scoped:
        assert scoped.read_text(own, "a.txt") == "mine\n"
        assert [c.id for c in scoped.list_conversations().conversations] == [own]
        with pytest.raises(Forbidden) as e:
            scoped.write_file(own, "a.txt", b"changed")
        assert e.value.code == "forbidden" and e.value.status == 403
        assert "read-only" in e.value.message
        with pytest.raises(Forbidden) as e:
            scoped.read_text(other, "b.txt")
        assert f"limited to conversation {own!r}".replace("'", '"') in e.value.message
    assert client.read_text(own, "a.txt") == "mine\n"
    assert client.read_text(other, "b.txt") == "theirs\n"


def test_bad_id_is_invalid_request(client: Client) -> None:
    with pytest.raises(InvalidRequest) as e:
        client.open_conversation("bad id!")
    assert isinstance(e.value, InvalidId)
    assert e.value.code == "invalid_id"
    assert e.value.status == 400
    assert "bad id!" in e.value.message
    with pytest.raises(InvalidId):
        client.exec("-starts-with-dash", "true")
    with pytest.raises(InvalidId):
        client.get_conversation("..")
    # nothing was created
    ids = [c.id for c in client.iter_conversations()]
    assert "bad id!" not in ids and "-starts-with-dash" not in ids


def test_missing_things_are_not_found(client: Client, cid: str) -> None:
    with pytest.raises(NotFound) as e:
        client.get_conversation(cid)
    assert e.value.code == "not_found" and e.value.status == 404
    client.open_conversation(cid)
    with pytest.raises(NotFound) as e:
        client.read_file(cid, "missing.txt")
    assert e.value.code == "not_found"
    assert "missing.txt" in e.value.message
    with pytest.raises(NotFound):
        client.stat(cid, "missing.txt")
    with pytest.raises(NotFound):
        client.remove(cid, "missing.txt")
    with pytest.raises(NotFound):
        client.get_command(cid, "0123456789abcdef")
    with pytest.raises(NotFound):
        client.get_snapshot(new_id("snap"))
    with pytest.raises(NotFound):
        client.load_skill(cid, "nope")


def test_outside_workspace_and_conflicts(client: Client, cid: str) -> None:
    client.write_file(cid, "a.txt", "x x\n")
    with pytest.raises(OutsideWorkspace) as e:
        client.read_file(cid, "../etc/passwd")
    assert e.value.code == "outside_workspace" and e.value.status == 403
    with pytest.raises(OutsideWorkspace):
        client.read_file(cid, "/etc/passwd")
    with pytest.raises(Conflict) as c:
        client.edit(cid, "a.txt", "x", "y")
    assert c.value.code == "conflict" and c.value.status == 409
    with pytest.raises(RangeNotSatisfiable) as r:
        client.read_file(cid, "a.txt", start=100, end=200)
    assert r.value.code == "range_not_satisfiable" and r.value.status == 416


def test_unknown_field_is_invalid_request(client: Client, cid: str) -> None:
    r = client.request(
        "POST", f"/v1/conversations/{cid}/exec", json={"command": "true", "bogus": 1}
    )
    assert r.status_code == 422
    err = sessionbox._errors.error_from_response(r)
    assert isinstance(err, InvalidRequest) and err.code == "invalid_request"


def test_transport_error(server: Server) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", server.key, timeout=2) as c:
        with pytest.raises(TransportError):
            c.health()


# ---------------------------------------------------------------- conversations


def test_conversation_lifecycle(client: Client, server: Server) -> None:
    cid = new_id("life")
    opened = client.open_conversation(cid)
    assert opened.created is True
    assert opened.conversation.id == cid and opened.conversation.state == "active"
    assert len(opened.key) == 64 and opened.workspace_root
    again = client.create_conversation(cid)
    assert again.created is False and again.key == opened.key

    client.exec(cid, "true")
    conv = client.get_conversation(cid)
    assert conv.runtime == os.environ.get("SESSIONBOX_TEST_RUNTIME", "host")
    assert conv.usage is not None and conv.usage.by_operation.get("open", 0) >= 1
    assert conv.usage.execs == 1 and conv.usage.by_operation["exec"] == 1
    before = conv.last_used_at
    time.sleep(1.1)
    renewed = client.renew_conversation(cid)
    assert renewed.last_used_at > before
    if conv.runtime == "host":  # no disk quota on host
        assert client.disk_usage(cid) is None

    # list with pagination finds it
    others = [new_id("life") for _ in range(3)]
    for o in others:
        client.open_conversation(o)
    page = client.list_conversations(limit=2)
    assert len(page.conversations) == 2 and page.next_cursor is not None
    all_ids = [c.id for c in client.iter_conversations(page_size=2)]
    assert all_ids == sorted(all_ids)
    for x in [cid, *others]:
        assert x in all_ids

    # another tenant does not see it
    with Client(server.url, server.other_key) as other:
        assert cid not in [c.id for c in other.iter_conversations()]
        with pytest.raises(NotFound):
            other.get_conversation(cid)

    # destroy removes workspace and record; destroy is idempotent
    client.write_file(cid, "f.txt", b"x")
    ws = Path(opened.workspace_root)
    if conv.runtime == "host":
        assert (ws / "f.txt").exists()
    for x in [cid, *others]:
        client.destroy_conversation(x)
    client.destroy_conversation(cid)
    with pytest.raises(NotFound):
        client.get_conversation(cid)
    assert cid not in [c.id for c in client.iter_conversations()]
    if conv.runtime == "host":
        assert not ws.exists()
    reopened = client.open_conversation(cid)
    assert reopened.created is True
    assert client.ls(cid) == []
    client.destroy_conversation(cid)


# ---------------------------------------------------------------- exec


def test_exec_json(client: Client, cid: str) -> None:
    r = client.exec(cid, "echo out; echo err >&2; exit 3")
    assert r.exit_code == 3 and r.status.code == 3 and r.status.signal is None
    assert r.stdout == "out\n" and r.stderr == "err\n"
    assert not r.ok and not r.timed_out and r.duration_ms >= 0
    r = client.exec(cid, 'mkdir -p sub && cd sub && printf "%s|%s" "$FOO" "$(pwd)"', env={"FOO": "bar"})
    assert r.ok and r.stdout.startswith("bar|") and r.stdout.endswith("/sub")
    r = client.exec(cid, "pwd", cwd="sub")
    assert r.stdout.strip().endswith("/sub")
    r = client.exec(cid, "cat", stdin="text in")
    assert r.stdout == "text in"
    r = client.exec(cid, "cat", stdin=ALL_BYTES)
    assert r.stdout_bytes == ALL_BYTES and r.stdout_base64 is not None
    r = client.exec(cid, "sleep 5", timeout_ms=300)
    assert r.timed_out and r.exit_code == 124
    r = client.exec(cid, "head -c 5000 /dev/zero", output_limit=100)
    assert r.stdout_truncated and len(r.stdout_bytes) == 100
    r = client.exec(cid, "kill -9 $$")
    assert r.status.signal == 9 and r.exit_code == 137


def test_exec_stream_order_and_liveness(client: Client, cid: str) -> None:
    cmd = "for i in 1 2 3 4; do echo out$i; sleep 0.1; echo err$i >&2; sleep 0.1; done; exit 7"
    events = list(client.exec_stream(cid, cmd))
    assert isinstance(events[-1], ExecExit)
    assert events[-1].exit_code == 7 and events[-1].status.code == 7
    chunks = [e for e in events if isinstance(e, OutputChunk)]
    assert len(chunks) + 1 == len(events)
    seq = "".join(f"[{c.stream}]{c.text}" for c in chunks)
    expected = "".join(f"[stdout]out{i}\n[stderr]err{i}\n" for i in range(1, 5))
    assert seq == expected

    # output arrives while the command runs, not at its end
    t0 = time.monotonic()
    first_at = None
    for ev in client.exec_stream(cid, "echo a; sleep 1.5; echo b"):
        if isinstance(ev, OutputChunk) and first_at is None:
            first_at = time.monotonic() - t0
            assert ev.text == "a\n"
    total = time.monotonic() - t0
    assert first_at is not None and first_at < total - 1.0

    # binary output keeps its exact bytes
    data = b"".join(
        e.data for e in client.exec_stream(cid, "cat", stdin=ALL_BYTES) if isinstance(e, OutputChunk)
    )
    assert data == ALL_BYTES


def test_exec_stream_errors_before_stream(client: Client, cid: str) -> None:
    with pytest.raises(InvalidId):
        list(client.exec_stream("bad id", "true"))
    # a missing cwd: a JSON 404 before any event, with or without the stream
    with pytest.raises(NotFound) as e:
        client.exec(cid, "pwd", cwd="nope")
    assert e.value.status == 404 and e.value.code == "not_found"
    with pytest.raises(NotFound) as e:
        list(client.exec_stream(cid, "pwd", cwd="nope"))
    assert e.value.status == 404 and e.value.code == "not_found"


def test_exec_stream_close_kills(client: Client, cid: str) -> None:
    gen = client.exec_stream(cid, "echo started; sleep 3; echo late > late.txt")
    first = next(gen)
    assert isinstance(first, OutputChunk) and first.text == "started\n"
    gen.close()
    time.sleep(3.5)
    with pytest.raises(NotFound):
        client.stat(cid, "late.txt")


# ---------------------------------------------------------------- background commands


def test_background_commands(client: Client, cid: str) -> None:
    cmd = client.spawn(cid, "echo one; sleep 0.5; echo two; echo err >&2; exit 4")
    assert isinstance(cmd, BackgroundCommand) and cmd.running and cmd.exit_code is None
    listed = client.list_commands(cid)
    assert [c.id for c in listed] == [cmd.id]
    logs = client.command_logs(cid, cmd.id, wait_ms=5000)
    assert logs.stdout.text.startswith("one")
    # follow from the offsets the first read gave
    events = list(
        client.follow_command(
            cid, cmd.id, stdout_offset=logs.stdout_next_offset, stderr_offset=logs.stderr_next_offset
        )
    )
    final = events[-1]
    assert isinstance(final, BackgroundCommand)
    assert final.exit_code == 4 and not final.running and final.status is not None
    out = logs.stdout.text + "".join(
        e.text for e in events if isinstance(e, OutputChunk) and e.stream == "stdout"
    )
    assert out == "one\ntwo\n"
    done = client.wait_command(cid, cmd.id, timeout=10)
    assert done.exit_code == 4 and done.stdout_bytes == 8 and done.stderr_bytes == 4
    status = client.get_command(cid, cmd.id)
    assert status.finished_at is not None and status.exit_code == 4
    # offsets: the tail after 4 bytes
    tail = client.command_logs(cid, cmd.id, stdout_offset=4, stderr_offset=0)
    assert tail.stdout.text == "two\n" and tail.stderr.text == "err\n" and tail.exit_code == 4
    assert tail.stdout_next_offset == 8 and not tail.running
    with pytest.raises(InvalidRequest):
        client.command_logs(cid, cmd.id, stdout_offset=999)
    # kill of an ended command answers its status as it was
    assert client.kill_command(cid, cmd.id).killed is False


def test_background_kill_and_binary_logs(client: Client, cid: str) -> None:
    cmd = client.spawn(cid, "printf '\\377\\376'; sleep 30", stdin=b"")
    time.sleep(0.3)
    # While it runs, the conversation's memory is measured (host: its processes' resident sets).
    memory = client.get_conversation(cid).memory
    assert memory is not None and memory.bytes_used > 0, memory
    if os.environ.get("SESSIONBOX_TEST_RUNTIME", "host") == "host":
        assert memory.measured == "processes" and memory.bytes_limit is None
    killed = client.kill_command(cid, cmd.id)
    assert killed.killed and not killed.running
    assert killed.status is not None and killed.status.signal == 9
    logs = client.command_logs(cid, cmd.id)
    assert logs.stdout.data == b"\xff\xfe" and logs.stdout.base64 is not None


def test_stdin_routes(client: Client, cid: str, server: Server) -> None:
    runtime = os.environ.get("SESSIONBOX_TEST_RUNTIME", "host")
    if runtime in ("host", "aio"):
        # these runtimes cannot keep stdin open: the server refuses with 503
        with pytest.raises(RuntimeUnavailable) as e:
            client.spawn(cid, "cat", keep_stdin_open=True)
        assert e.value.code == "runtime_unavailable" and e.value.status == 503
        assert client.list_commands(cid) == []  # nothing started
        cmd = client.spawn(cid, "sleep 5")
        with pytest.raises(RuntimeUnavailable):
            client.write_stdin(cid, cmd.id, b"x")
        with pytest.raises(RuntimeUnavailable):
            client.close_stdin(cid, cmd.id)
        client.kill_command(cid, cmd.id)
        return
    cmd = client.spawn(cid, 'while read l; do echo "got $l"; done', keep_stdin_open=True)
    assert client.write_stdin(cid, cmd.id, b"a\n") == 2
    assert client.write_stdin(cid, cmd.id, "b\n", close=True) == 2
    done = client.wait_command(cid, cmd.id, timeout=10)
    assert done.exit_code == 0
    assert client.command_logs(cid, cmd.id).stdout.text == "got a\ngot b\n"
    cmd2 = client.spawn(cid, "cat", keep_stdin_open=True)
    client.close_stdin(cid, cmd2.id)
    assert client.wait_command(cid, cmd2.id, timeout=10).exit_code == 0
    with pytest.raises(Conflict):
        client.write_stdin(cid, cmd2.id, b"late")


# ---------------------------------------------------------------- files


def test_binary_file_round_trip(client: Client, cid: str, tmp_path: Path) -> None:
    client.write_file(cid, "bin/all.bin", ALL_BYTES)
    assert client.read_file(cid, "bin/all.bin") == ALL_BYTES
    st = client.stat(cid, "bin/all.bin")
    assert st.size == 256 and st.kind == "file"
    r = client.exec(cid, "sha256sum bin/all.bin || shasum -a 256 bin/all.bin")
    assert r.stdout.split()[0] == hashlib.sha256(ALL_BYTES).hexdigest()
    # ranges
    assert client.read_file(cid, "bin/all.bin", start=10, end=19) == ALL_BYTES[10:20]
    assert client.read_file(cid, "bin/all.bin", start=250) == ALL_BYTES[250:]
    # streamed download and upload, larger than one chunk
    big = os.urandom(300_000) + ALL_BYTES
    src = tmp_path / "big.bin"
    src.write_bytes(big)
    client.upload_file(cid, "big/big.bin", src)
    dest = tmp_path / "back.bin"
    assert client.download_file(cid, "big/big.bin", dest) == len(big)
    assert dest.read_bytes() == big
    buf = io.BytesIO()
    client.download_file(cid, "big/big.bin", buf)
    assert buf.getvalue() == big
    assert b"".join(client.iter_file(cid, "big/big.bin", chunk_size=4096)) == big
    # write from an iterator and from a file object
    client.write_file(cid, "iter.bin", (bytes([i]) * 1000 for i in range(256)))
    assert client.read_file(cid, "iter.bin") == b"".join(bytes([i]) * 1000 for i in range(256))
    client.write_file(cid, "fobj.bin", io.BytesIO(ALL_BYTES * 3))
    assert client.read_file(cid, "fobj.bin") == ALL_BYTES * 3
    # a missing file downloads nothing and leaves no file behind
    with pytest.raises(NotFound):
        client.download_file(cid, "nope.bin", tmp_path / "nope.bin")
    assert not (tmp_path / "nope.bin").exists()


def test_text_and_odd_paths(client: Client, cid: str) -> None:
    name = "dir with space/ünï cødé?#%&.txt"
    client.write_file(cid, name, "héllo\n")
    assert client.read_text(cid, name) == "héllo\n"
    assert [e.name for e in client.ls(cid, "dir with space")] == ["ünï cødé?#%&.txt"]
    r = client.exec(cid, "cat 'dir with space/ünï cødé?#%&.txt'")
    assert r.stdout == "héllo\n"
    # an absolute path inside the workspace works too
    root = client.open_conversation(cid).workspace_root
    assert client.read_text(cid, root + "/" + name) == "héllo\n"


def test_upload_files(client: Client, cid: str, tmp_path: Path) -> None:
    local = tmp_path / "local.bin"
    local.write_bytes(ALL_BYTES)
    files: dict[str, bytes | str | os.PathLike[str]] = {
        "data/a.bin": ALL_BYTES,
        "data/b.txt": "bee",
        "data/c.bin": local,
    }
    out = client.upload_files(cid, files)
    assert [(f.path, f.bytes) for f in out] == [
        ("data/a.bin", 256),
        ("data/b.txt", 3),
        ("data/c.bin", 256),
    ]
    assert client.read_file(cid, "data/a.bin") == ALL_BYTES
    assert client.read_file(cid, "data/b.txt") == b"bee"
    assert client.read_file(cid, "data/c.bin") == ALL_BYTES
    # one bad path refuses the whole upload
    with pytest.raises(OutsideWorkspace):
        client.upload_files(cid, [("ok.txt", b"1"), ("../evil.txt", b"2")])
    with pytest.raises(NotFound):
        client.stat(cid, "ok.txt")


def test_fs_operations(client: Client, cid: str) -> None:
    client.mkdir(cid, "src/pkg")
    st = client.stat(cid, "src/pkg")
    assert st.kind == "directory" and st.mode_bits & 0o700 == 0o700
    client.write_file(cid, "src/pkg/a.py", "x = 1\nX = 2\nx = 3\n")
    client.write_file(cid, "src/b.py", "print('x')\n")
    client.write_file(cid, "README", "nothing\n")
    entries = {e.name: e for e in client.ls(cid)}
    assert entries["src"].kind == "directory" and entries["README"].kind == "file"
    assert entries["README"].size == 8 and entries["README"].modified_unix > 0
    assert sorted(e.name for e in client.ls(cid, "src")) == ["b.py", "pkg"]
    assert sorted(client.glob(cid, "src/**/*.py")) == ["src/b.py", "src/pkg/a.py"]
    assert client.glob(cid, "*.nothing") == []

    m = client.grep(cid, "^x =")
    assert [(g.path, g.line_number, g.line) for g in m] == [
        ("src/pkg/a.py", 1, "x = 1"),
        ("src/pkg/a.py", 3, "x = 3"),
    ]
    assert len(client.grep(cid, "^x =", case_insensitive=True)) == 3
    assert len(client.grep(cid, "^x =", case_insensitive=True, max_matches=1)) == 1
    assert [g.path for g in client.grep(cid, "x", glob="src/*.py")] == ["src/b.py"]
    assert [g.path for g in client.grep(cid, "nothing", path="README")] == ["README"]

    assert client.edit(cid, "src/pkg/a.py", "X = 2", "Y = 2") == 1
    assert client.edit(cid, "src/pkg/a.py", "x =", "z =", replace_all=True) == 2
    assert client.read_text(cid, "src/pkg/a.py") == "z = 1\nY = 2\nz = 3\n"

    with pytest.raises(Conflict):
        client.remove(cid, "src")
    client.remove(cid, "README")
    with pytest.raises(NotFound):
        client.stat(cid, "README")
    client.remove(cid, "src", recursive=True)
    assert client.ls(cid) == []


def test_watch(client: Client, cid: str) -> None:
    client.mkdir(cid, "w")
    gen = client.watch(cid, "w")
    try:
        ready = next(gen)
        assert ready.kind == "ready" and ready.path is not None and ready.path.endswith("/w")
        client.write_file(cid, "w/new.txt", "hi")
        seen = []
        for ev in gen:
            seen.append(ev)
            if ev.kind in ("moved", "created") and (ev.to or ev.path or "").endswith("/w/new.txt"):
                break
        assert not seen[-1].dir
    finally:
        gen.close()
    with pytest.raises(NotFound):
        next(client.watch(new_id("nowatch")))


# ---------------------------------------------------------------- previews


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_previews(client: Client, cid: str, server: Server) -> None:
    if os.environ.get("SESSIONBOX_TEST_RUNTIME", "host") != "host":
        pytest.skip("the preview test runs a host python on the host runtime")
    client.write_file(cid, "site/index.txt", "previewed\n")
    port = _free_port()
    cmd = client.spawn(cid, f"cd site && exec {sys.executable} -m http.server {port} --bind 127.0.0.1")
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                r = client.preview(cid, port, "index.txt")
                if r.status_code == 200:
                    break
            except sessionbox.BadGateway:
                pass
            assert time.monotonic() < deadline, "the preview server did not start"
            time.sleep(0.2)
        assert r.text == "previewed\n"
        assert "sandbox" in r.headers["content-security-policy"]
        # the program's own error answers are returned, not raised
        missing = client.preview(cid, port, "missing.txt")
        assert missing.status_code == 404
        posted = client.preview(cid, port, "index.txt", method="HEAD")
        assert posted.status_code == 200
        link = client.create_preview_link(cid, port, ttl_secs=60)
        assert link.port == port and link.path.startswith("/v1/previews/")
        anon = httpx.get(server.url + link.path + "index.txt")
        assert anon.status_code == 200 and anon.text == "previewed\n"
    finally:
        client.kill_command(cid, cmd.id)
    with pytest.raises(NotFound):
        client.create_preview_link(new_id("nopreview"), port)


# ---------------------------------------------------------------- policies and egress


def test_policies(client: Client, cid: str, server: Server) -> None:
    default = client.get_policy()
    assert default.source == "default" and default.profile == "none"
    assert default.updated_at is None and len(default.hash) == 64
    p = client.set_policy("allowlist", allow=["*.pypi.org:443"], deny=["evil.pypi.org"])
    try:
        assert p.source == "tenant" and p.profile == "allowlist"
        assert p.allow == ["*.pypi.org:443"] and p.deny == ["evil.pypi.org"]
        assert client.get_policy() == p
        with Client(server.url, server.other_key) as other:
            assert other.get_policy().source == "default"
        # a conversation inherits it, then its own policy wins
        assert client.get_conversation_policy(cid).source == "tenant"
        own = client.set_conversation_policy(cid, "none")
        assert own.source == "conversation" and own.profile == "none"
        assert client.get_conversation_policy(cid) == own
        with pytest.raises(NotFound):  # setting a policy does not create the conversation
            client.get_conversation(cid)
        back = client.delete_conversation_policy(cid)
        assert back.source == "tenant" and back.hash == p.hash
        with pytest.raises(InvalidRequest) as e:
            client.set_conversation_policy(cid, "allowlist", allow=["169.254.169.254"])
        assert e.value.status == 422 and "169.254.169.254" in e.value.message
        assert client.get_conversation_policy(cid).source == "tenant"
    finally:
        after = client.delete_policy()
    assert after.source == "default" and after.profile == "none"
    assert client.get_policy().source == "default"


def test_egress_log(client: Client, cid: str) -> None:
    # nothing in these tests opens a network connection through a gateway
    assert client.egress_log(since="15m", limit=5) == []
    assert client.conversation_egress_log(cid, since="1h", limit=10) == []
    with pytest.raises(InvalidRequest):
        client.egress_log(since="not a time")


# ---------------------------------------------------------------- skills


def test_skills(client: Client, server: Server) -> None:
    assert client.list_skills() == []  # tenant acme has none
    cid = new_id("skills")
    with Client(server.url, server.skills_key) as wiz:
        try:
            _check_skills(wiz, cid)
        finally:
            wiz.destroy_conversation(cid)


def _check_skills(client: Client, cid: str) -> None:
    skills = client.list_skills()
    assert [(s.name, s.description.split(".")[0]) for s in skills] == [
        ("greet", "Greets people by name")
    ]
    client.open_conversation(cid)
    skill = client.load_skill(cid, "greet")
    assert skill.name == "greet" and "greet.sh NAME" in skill.body
    r = client.exec(cid, f"sh '{skill.base_path}/greet.sh' Ada")
    assert r.stdout == "hello, Ada\n"


# ---------------------------------------------------------------- snapshots, forks, templates


def test_snapshots_forks_templates(client: Client, cid: str, tmp_path: Path) -> None:
    snap, snap2, tmpl = new_id("snap"), new_id("imp"), new_id("tmpl")
    forks = [new_id("fork") for _ in range(3)]
    client.write_file(cid, "keep/a.bin", ALL_BYTES)
    try:
        s = client.create_snapshot(cid, snap, keep_seconds=3600)
        assert s.name == snap and s.origin == cid and s.files == 1 and s.bytes == 256
        assert s.expires_at is not None
        with pytest.raises(AlreadyExists) as e:
            client.create_snapshot(cid, snap)
        assert e.value.code == "already_exists" and e.value.status == 409
        assert isinstance(e.value, Conflict)
        assert client.get_snapshot(snap) == s
        assert snap in [x.name for x in client.list_snapshots()]

        # restore puts the workspace back
        client.write_file(cid, "keep/a.bin", b"changed")
        client.write_file(cid, "later.txt", b"later")
        restored = client.restore_snapshot(cid, snap)
        assert restored.conversation == cid and restored.files == 1
        assert client.read_file(cid, "keep/a.bin") == ALL_BYTES
        with pytest.raises(NotFound):
            client.stat(cid, "later.txt")

        # fork of the live conversation shares nothing writable
        f = client.fork_conversation(cid, forks[0])
        assert f.conversation == forks[0]
        client.write_file(forks[0], "keep/a.bin", b"fork")
        assert client.read_file(cid, "keep/a.bin") == ALL_BYTES
        with pytest.raises(AlreadyExists):
            client.fork_conversation(cid, forks[0])

        # export and import
        archive = client.export_snapshot(snap)
        assert archive[:4] == b"\x28\xb5\x2f\xfd"  # zstd magic
        path = tmp_path / "snap.tar.zst"
        assert client.export_snapshot_to(snap, path) == len(archive)
        assert path.read_bytes() == archive
        imported = client.import_snapshot(snap2, path, keep_seconds=0)
        assert imported.origin is None and imported.runtime == "import"
        assert imported.expires_at is None and imported.bytes == 256
        client.delete_snapshot(snap2)
        imported = client.import_snapshot(snap2, archive)
        assert imported.files == 1
        with pytest.raises(InvalidRequest):
            client.import_snapshot(new_id("bad"), b"not an archive")
        # a plain tar (not compressed) from a file object
        tar_buf = io.BytesIO()
        with tarfile.open(fileobj=tar_buf, mode="w") as tar:
            info = tarfile.TarInfo("hello.txt")
            info.size = 5
            tar.addfile(info, io.BytesIO(b"hello"))
        tar_name = new_id("tar")
        client.import_snapshot(tar_name, io.BytesIO(tar_buf.getvalue()))
        client.fork_snapshot(tar_name, forks[2])
        assert client.read_text(forks[2], "hello.txt") == "hello"
        client.delete_snapshot(tar_name)

        # fork from a snapshot, templates
        assert client.fork_snapshot(snap2, forks[1]).files == 1
        assert client.read_file(forks[1], "keep/a.bin") == ALL_BYTES
        t = client.set_template(tmpl, snap2)
        assert t.name == tmpl and t.snapshot == snap2
        assert any(x.name == tmpl and x.snapshot == snap2 for x in client.list_templates())
        with pytest.raises(Conflict):
            client.delete_snapshot(snap2)  # a template names it
        fork_t = new_id("fromtmpl")
        forks.append(fork_t)
        client.fork_template(tmpl, fork_t)
        assert client.read_file(fork_t, "keep/a.bin") == ALL_BYTES
        client.delete_template(tmpl)
        assert tmpl not in [x.name for x in client.list_templates()]
        client.delete_template(tmpl)  # idempotent
    finally:
        for fork in forks:
            client.destroy_conversation(fork)
        client.delete_template(tmpl)
        for name in (snap, snap2):
            client.delete_snapshot(name)
    with pytest.raises(NotFound):
        client.get_snapshot(snap)
    client.delete_snapshot(snap)  # absent: still fine


# ---------------------------------------------------------------- concurrency sanity


def test_reads_overlap_a_running_command(client: Client, cid: str, server: Server) -> None:
    client.write_file(cid, "r.txt", "r")
    done = threading.Event()

    def long() -> None:
        with Client(server.url, server.key) as c2:
            c2.exec(cid, "sleep 1.5")
        done.set()

    t = threading.Thread(target=long)
    t.start()
    time.sleep(0.4)
    t0 = time.monotonic()
    assert client.read_file(cid, "r.txt") == b"r"
    assert time.monotonic() - t0 < 1.0 and not done.is_set()
    t.join()


def _iter_public(cls: type) -> Iterator[str]:
    for name in dir(cls):
        if not name.startswith("_") and callable(getattr(cls, name)):
            yield name


def test_every_method_is_exercised() -> None:
    here = Path(__file__).parent
    sync_src = (here / "test_sync.py").read_text()
    async_src = (here / "test_async.py").read_text()
    for name in _iter_public(Client):
        if name in ("close",):
            continue
        assert f".{name}(" in sync_src, f"Client.{name} is not tested"
    for name in _iter_public(sessionbox.AsyncClient):
        if name in ("aclose",):
            continue
        assert f".{name}(" in async_src, f"AsyncClient.{name} is not tested"
