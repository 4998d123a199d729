"""The async client against a real server: every method, with its effects checked."""

from __future__ import annotations

import asyncio
import io
import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import AsyncIterator

import httpx
import pytest

from sessionbox import (
    AlreadyExists,
    AsyncClient,
    BackgroundCommand,
    BadGateway,
    Conflict,
    ExecExit,
    InvalidId,
    InvalidRequest,
    NotFound,
    OutputChunk,
    OutsideWorkspace,
    RangeNotSatisfiable,
    RuntimeUnavailable,
    Unauthorized,
)

from .conftest import Server

pytestmark = pytest.mark.anyio

ALL_BYTES = bytes(range(256))
RUNTIME = os.environ.get("SESSIONBOX_TEST_RUNTIME", "host")


def new_id(prefix: str = "a") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def test_server_routes_and_errors(server: Server) -> None:
    async with AsyncClient(server.url, server.key) as sb:
        assert (await sb.health())["status"] == "ok"
        assert (await sb.ready())["runtime"] == RUNTIME
        assert "/v1/snapshots" in (await sb.openapi())["paths"]
        assert "sessionbox_http_requests_total" in await sb.metrics()
        r = await sb.request("GET", "/healthz")
        assert r.status_code == 200
        with pytest.raises(InvalidId) as e:
            await sb.open_conversation("no/slash")
        assert e.value.code == "invalid_id" and e.value.status == 400
        assert isinstance(e.value, InvalidRequest)
    async with AsyncClient(server.url, "sbk_0000000000000000_" + "1" * 64) as bad:
        with pytest.raises(Unauthorized) as u:
            await bad.list_conversations()
        assert u.value.code == "unauthorized" and u.value.status == 401


async def test_conversations(server: Server) -> None:
    cid = new_id("alife")
    async with AsyncClient(server.url, server.key) as sb:
        opened = await sb.open_conversation(cid)
        assert opened.created
        assert (await sb.create_conversation(cid)).created is False
        conv = await sb.get_conversation(cid)
        assert conv.id == cid and conv.state == "active"
        await asyncio.sleep(1.1)
        renewed = await sb.renew_conversation(cid)
        assert renewed.last_used_at > conv.last_used_at
        assert (await sb.disk_usage(cid)) is None or RUNTIME == "isolated"
        page = await sb.list_conversations(limit=1000)
        assert cid in [c.id for c in page.conversations]
        ids = [c.id async for c in sb.iter_conversations(page_size=1)]
        assert cid in ids and ids == sorted(ids)
        await sb.destroy_conversation(cid)
        with pytest.raises(NotFound) as e:
            await sb.get_conversation(cid)
        assert e.value.code == "not_found"
        assert cid not in [c.id async for c in sb.iter_conversations()]
        await sb.destroy_conversation(cid)  # idempotent


async def test_exec_and_stream(server: Server) -> None:
    cid = new_id("aexec")
    async with AsyncClient(server.url, server.key) as sb:
        try:
            r = await sb.exec(cid, "echo $X; cat; exit 2", env={"X": "y"}, stdin=b"\x00\xff")
            assert r.exit_code == 2 and r.stdout_bytes == b"y\n\x00\xff"
            r = await sb.exec(cid, "pwd", cwd=".", timeout_ms=5000, output_limit=1000)
            assert r.ok
            cmd = "for i in 1 2 3; do echo o$i; sleep 0.1; echo e$i >&2; sleep 0.1; done"
            events = [e async for e in sb.exec_stream(cid, cmd)]
            assert isinstance(events[-1], ExecExit) and events[-1].exit_code == 0
            seq = "".join(f"{e.stream}:{e.text}" for e in events if isinstance(e, OutputChunk))
            assert seq == "".join(f"stdout:o{i}\nstderr:e{i}\n" for i in range(1, 4))
            t0 = time.monotonic()
            first = None
            async for ev in sb.exec_stream(cid, "echo a; sleep 1.2; echo b"):
                if first is None and isinstance(ev, OutputChunk):
                    first = time.monotonic() - t0
            assert first is not None and first < time.monotonic() - t0 - 0.8
            with pytest.raises(InvalidId):
                async for _ in sb.exec_stream("bad id", "true"):
                    pass
        finally:
            await sb.destroy_conversation(cid)


async def test_background(server: Server) -> None:
    cid = new_id("abg")
    async with AsyncClient(server.url, server.key) as sb:
        try:
            cmd = await sb.spawn(cid, "echo one; sleep 0.4; echo two >&2; exit 5")
            assert cmd.running
            assert [c.id for c in await sb.list_commands(cid)] == [cmd.id]
            first = await sb.command_logs(cid, cmd.id, wait_ms=5000)
            assert first.stdout.text == "one\n"
            events = [
                e
                async for e in sb.follow_command(
                    cid,
                    cmd.id,
                    stdout_offset=first.stdout_next_offset,
                    stderr_offset=first.stderr_next_offset,
                )
            ]
            assert isinstance(events[-1], BackgroundCommand) and events[-1].exit_code == 5
            assert [(e.stream, e.text) for e in events if isinstance(e, OutputChunk)] == [
                ("stderr", "two\n")
            ]
            done = await sb.wait_command(cid, cmd.id, timeout=10)
            assert done.exit_code == 5 and not done.running
            assert (await sb.get_command(cid, cmd.id)).stderr_bytes == 4
            long = await sb.spawn(cid, "sleep 30")
            killed = await sb.kill_command(cid, long.id)
            assert killed.killed and killed.status is not None and killed.status.signal == 9
            if RUNTIME in ("host", "aio"):
                with pytest.raises(RuntimeUnavailable):
                    await sb.spawn(cid, "cat", keep_stdin_open=True)
                with pytest.raises(RuntimeUnavailable):
                    await sb.write_stdin(cid, long.id, b"x", close=True)
                with pytest.raises(RuntimeUnavailable):
                    await sb.close_stdin(cid, long.id)
            else:
                s = await sb.spawn(cid, "cat", keep_stdin_open=True)
                assert await sb.write_stdin(cid, s.id, ALL_BYTES) == 256
                await sb.close_stdin(cid, s.id)
                await sb.wait_command(cid, s.id, timeout=10)
                assert (await sb.command_logs(cid, s.id)).stdout.data == ALL_BYTES
                with pytest.raises(Conflict):
                    await sb.write_stdin(cid, s.id, b"late")
        finally:
            await sb.destroy_conversation(cid)
        with pytest.raises(NotFound):
            await sb.list_commands(cid)


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]
        await asyncio.sleep(0)


async def test_files(server: Server, tmp_path: Path) -> None:
    cid = new_id("afiles")
    async with AsyncClient(server.url, server.key) as sb:
        try:
            await sb.write_file(cid, "all.bin", ALL_BYTES)
            assert await sb.read_file(cid, "all.bin") == ALL_BYTES
            assert await sb.read_file(cid, "all.bin", start=0, end=0) == b"\x00"
            with pytest.raises(RangeNotSatisfiable):
                await sb.read_file(cid, "all.bin", start=300)
            big = os.urandom(200_000)
            await sb.write_file(cid, "async-iter.bin", _chunks(big, 7000))
            assert await sb.read_file(cid, "async-iter.bin") == big
            await sb.write_file(cid, "sync-iter.bin", iter([b"a", b"b", b"c"]))
            await sb.write_file(cid, "fobj.bin", io.BytesIO(ALL_BYTES))
            assert await sb.read_file(cid, "fobj.bin") == ALL_BYTES
            await sb.write_file(cid, "t.txt", "tëxt")
            assert await sb.read_text(cid, "t.txt") == "tëxt"
            assert await sb.read_text(cid, "sync-iter.bin") == "abc"
            local = tmp_path / "up.bin"
            local.write_bytes(big + ALL_BYTES)
            await sb.upload_file(cid, "up/up.bin", local)
            assert await sb.download_file(cid, "up/up.bin", tmp_path / "down.bin") == len(big) + 256
            assert (tmp_path / "down.bin").read_bytes() == big + ALL_BYTES
            buf = io.BytesIO()
            await sb.download_file(cid, "all.bin", buf)
            assert buf.getvalue() == ALL_BYTES
            assert b"".join([c async for c in sb.iter_file(cid, "up/up.bin")]) == big + ALL_BYTES
            up = await sb.upload_files(cid, [("m/1.bin", ALL_BYTES), ("m/2.txt", "two")])
            assert [(f.path, f.bytes) for f in up] == [("m/1.bin", 256), ("m/2.txt", 3)]
            assert await sb.read_file(cid, "m/1.bin") == ALL_BYTES

            await sb.mkdir(cid, "d/e")
            assert (await sb.stat(cid, "d/e")).kind == "directory"
            await sb.write_file(cid, "d/e/f.txt", "alpha\nbeta\nalpha\n")
            assert [e.name for e in await sb.ls(cid, "d/e")] == ["f.txt"]
            assert "d" in [e.name for e in await sb.ls(cid)]
            assert await sb.glob(cid, "d/**/*.txt") == ["d/e/f.txt"]
            hits = await sb.grep(cid, "ALPHA", path="d", glob="**/*.txt", case_insensitive=True, max_matches=5)
            assert [(h.line_number, h.line) for h in hits] == [(1, "alpha"), (3, "alpha")]
            with pytest.raises(Conflict):
                await sb.edit(cid, "d/e/f.txt", "alpha", "gamma")
            assert await sb.edit(cid, "d/e/f.txt", "alpha", "gamma", replace_all=True) == 2
            assert await sb.edit(cid, "d/e/f.txt", "beta", "delta") == 1
            assert await sb.read_text(cid, "d/e/f.txt") == "gamma\ndelta\ngamma\n"
            with pytest.raises(OutsideWorkspace):
                await sb.stat(cid, "../../x")
            with pytest.raises(Conflict):
                await sb.remove(cid, "d")
            await sb.remove(cid, "d", recursive=True)
            await sb.remove(cid, "t.txt")
            with pytest.raises(NotFound) as e:
                await sb.read_file(cid, "t.txt")
            assert e.value.code == "not_found" and e.value.status == 404
        finally:
            await sb.destroy_conversation(cid)


async def test_watch(server: Server) -> None:
    cid = new_id("awatch")
    async with AsyncClient(server.url, server.key) as sb:
        try:
            await sb.mkdir(cid, "w")
            gen = sb.watch(cid, "w")
            ready = await gen.__anext__()
            assert ready.kind == "ready"
            await sb.mkdir(cid, "w/sub")
            async for ev in gen:
                if ev.kind == "created" and (ev.path or "").endswith("/w/sub"):
                    assert ev.dir
                    break
            await gen.aclose()
        finally:
            await sb.destroy_conversation(cid)


async def test_previews(server: Server) -> None:
    if RUNTIME != "host":
        pytest.skip("the preview test runs a host python on the host runtime")
    cid = new_id("aprev")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    async with AsyncClient(server.url, server.key) as sb:
        try:
            await sb.write_file(cid, "p.txt", "async preview")
            cmd = await sb.spawn(cid, f"exec {sys.executable} -m http.server {port} --bind 127.0.0.1")
            deadline = time.monotonic() + 15
            while True:
                try:
                    r = await sb.preview(cid, port, "/p.txt")
                    if r.status_code == 200:
                        break
                except BadGateway:
                    pass
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            assert r.text == "async preview"
            link = await sb.create_preview_link(cid, port)
            async with httpx.AsyncClient() as anon:
                got = await anon.get(server.url + link.path + "p.txt")
            assert got.text == "async preview"
            await sb.kill_command(cid, cmd.id)
        finally:
            await sb.destroy_conversation(cid)


async def test_policy_egress_skills(server: Server) -> None:
    cid = new_id("apol")
    async with AsyncClient(server.url, server.key) as sb:
        try:
            p = await sb.set_policy("allowlist", allow=["example.com:443"])
            assert p.source == "tenant" and p.allow == ["example.com:443"] and p.deny == []
            assert (await sb.get_policy()).hash == p.hash
            c = await sb.set_conversation_policy(cid, "allowlist", allow=["a.example"], deny=["b.example"])
            assert c.source == "conversation" and c.deny == ["b.example"]
            assert (await sb.get_conversation_policy(cid)).hash == c.hash
            assert (await sb.delete_conversation_policy(cid)).source == "tenant"
            with pytest.raises(InvalidRequest):
                await sb.set_policy("allowlist", allow=["localhost"])
            assert await sb.egress_log(limit=10) == []
            assert await sb.conversation_egress_log(cid, since="2h") == []
        finally:
            assert (await sb.delete_policy()).source == "default"
        assert await sb.list_skills() == []
    async with AsyncClient(server.url, server.skills_key) as wiz:
        try:
            assert [s.name for s in await wiz.list_skills()] == ["greet"]
            await wiz.open_conversation(cid)
            skill = await wiz.load_skill(cid, "greet")
            assert skill.description.startswith("Greets") and skill.body.startswith("Run")
            with pytest.raises(NotFound):
                await wiz.load_skill(cid, "absent")
        finally:
            await wiz.destroy_conversation(cid)


async def test_snapshots(server: Server, tmp_path: Path) -> None:
    cid, snap, imp, tmpl = new_id("asnap"), new_id("s"), new_id("i"), new_id("t")
    forks = [new_id("af") for _ in range(3)]
    async with AsyncClient(server.url, server.key) as sb:
        try:
            await sb.write_file(cid, "x.bin", ALL_BYTES)
            s = await sb.create_snapshot(cid, snap)
            assert s.files == 1 and s.bytes == 256 and s.origin == cid
            with pytest.raises(AlreadyExists):
                await sb.create_snapshot(cid, snap, keep_seconds=10)
            assert (await sb.get_snapshot(snap)).stored_bytes == s.stored_bytes
            assert snap in [x.name for x in await sb.list_snapshots()]
            await sb.remove(cid, "x.bin")
            assert (await sb.restore_snapshot(cid, snap)).files == 1
            assert await sb.read_file(cid, "x.bin") == ALL_BYTES
            await sb.fork_conversation(cid, forks[0])
            assert await sb.read_file(forks[0], "x.bin") == ALL_BYTES
            data = await sb.export_snapshot(snap)
            n = await sb.export_snapshot_to(snap, tmp_path / "a.tar.zst")
            assert n == len(data) and (tmp_path / "a.tar.zst").read_bytes() == data
            i = await sb.import_snapshot(imp, _chunks(data, 50), keep_seconds=0)
            assert i.runtime == "import" and i.expires_at is None
            await sb.delete_snapshot(imp)
            i = await sb.import_snapshot(imp, tmp_path / "a.tar.zst")
            assert i.bytes == 256
            await sb.fork_snapshot(imp, forks[1])
            assert await sb.read_file(forks[1], "x.bin") == ALL_BYTES
            t = await sb.set_template(tmpl, imp)
            assert t.snapshot == imp
            assert tmpl in [x.name for x in await sb.list_templates()]
            await sb.fork_template(tmpl, forks[2])
            assert await sb.read_file(forks[2], "x.bin") == ALL_BYTES
            with pytest.raises(Conflict):
                await sb.delete_snapshot(imp)
        finally:
            await sb.delete_template(tmpl)
            for f in forks:
                await sb.destroy_conversation(f)
            await sb.delete_snapshot(snap)
            await sb.delete_snapshot(imp)
            await sb.destroy_conversation(cid)
        assert [x.name for x in await sb.list_snapshots() if x.name in (snap, imp)] == []
        assert [x.name for x in await sb.list_templates() if x.name == tmpl] == []


async def test_env_and_aclose(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSIONBOX_URL", server.url)
    monkeypatch.setenv("SESSIONBOX_API_KEY", server.key)
    sb = AsyncClient(timeout=10)
    assert sb.base_url == server.url
    assert isinstance((await sb.list_conversations()).conversations, list)
    await sb.aclose()
