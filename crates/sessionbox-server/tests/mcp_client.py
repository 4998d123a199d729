"""Drives sessionbox's /mcp endpoint with the official MCP Python SDK (streamable HTTP).

Usage: mcp_client.py URL KEY VERSION. Prints OK and exits 0 when every check passes; any
failure raises. Run by tests/mcp.rs. The SDK must log no warning (a refused session
termination, for one, is a warning): every record it logs at WARNING or above fails the run.
"""

import logging
import sys

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

URL, KEY, VERSION = sys.argv[1], sys.argv[2], sys.argv[3]


class Collect(logging.Handler):
    """Keeps every record logged at WARNING or above."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


WARNINGS = Collect()
logging.getLogger().addHandler(WARNINGS)
logging.getLogger().setLevel(logging.DEBUG)


def dump(m):
    return m.model_dump(by_alias=True, exclude_none=True)


async def call(session, tool, args):
    r = dump(await session.call_tool(tool, args))
    text = "".join(c.get("text", "") for c in r["content"])
    return text, bool(r.get("isError"))


async def with_session(conversation, body, key=KEY):
    headers = {"Authorization": f"Bearer {key}"}
    if conversation is not None:
        headers["X-Conversation-Id"] = conversation
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(URL, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                init = dump(await session.initialize())
                assert init["serverInfo"]["name"] == "sessionbox", init["serverInfo"]
                assert init["serverInfo"]["version"] == VERSION, init["serverInfo"]
                text = init.get("instructions", "")
                # This server has no skills configured: the model is told so, not a path.
                for words in ("workspace", "persist across turns", "none are configured"):
                    assert words in text, (words, text)
                return await body(session)


async def main():
    with anyio.fail_after(60):
        # The tools and their schemas: required parameters are marked required.
        async def list_tools(session):
            return {t["name"]: t["inputSchema"] for t in (dump(await session.list_tools()))["tools"]}

        tools = await with_session("alice", list_tools)
        assert set(tools) == {"bash", "read", "write", "edit", "ls", "glob", "grep", "skill", "network", "preview"}, tools
        required = {name: set(s.get("required", [])) for name, s in tools.items()}
        assert required["bash"] == {"command"}, required
        assert required["read"] == {"path"}, required
        assert required["write"] == {"path", "content"}, required
        assert required["edit"] == {"path", "old_string", "new_string"}, required
        assert required["glob"] == {"pattern"}, required
        assert required["grep"] == {"pattern"}, required
        assert required["ls"] == set(), required
        assert required["skill"] == set(), required
        assert required["network"] == set(), required
        assert required["preview"] == {"port"}, required
        assert set(tools["grep"]["properties"]["output_mode"]["enum"]) == {
            "content", "files_with_matches", "count"}

        # Alice: bash, write, read, edit, ls, glob, grep.
        async def alice(session):
            text, err = await call(session, "bash", {"command": "echo out; echo err >&2; exit 3"})
            assert not err and text == "out\nerr\nExit code: 3", repr(text)
            text, err = await call(session, "bash", {"command": "yes x | head -c 100000"})
            assert not err and "[output truncated" in text and "Exit code: 0" in text, text[-200:]
            # The cut says what to do next.
            assert "redirect the output to a file" in text, text[-300:]
            assert len(text) < 30_400, len(text)
            text, err = await call(session, "write", {"path": "notes/a.txt", "content": "one\ntwo\nthree\n"})
            assert not err, text
            text, err = await call(session, "read", {"path": "notes/a.txt"})
            assert not err and text == "     1\tone\n     2\ttwo\n     3\tthree\n", repr(text)
            text, err = await call(session, "read", {"path": "notes/a.txt", "offset": 2, "limit": 1})
            assert not err and text.startswith("     2\ttwo\n") and "offset 3" in text, repr(text)
            text, err = await call(session, "edit", {"path": "notes/a.txt", "old_string": "t", "new_string": "T"})
            assert err and "error" in text, text  # "t" occurs more than once
            text, err = await call(session, "edit", {"path": "notes/a.txt", "old_string": "two", "new_string": "2"})
            assert not err and "Replaced 1 occurrence" in text, text
            text, err = await call(session, "bash", {"command": "cat notes/a.txt", "cwd": "."})
            assert text == "one\n2\nthree\nExit code: 0", repr(text)
            text, err = await call(session, "ls", {})
            assert not err and "notes/" in text.split("\n"), text
            text, err = await call(session, "glob", {"pattern": "**/*.txt"})
            assert not err and text == "notes/a.txt", text
            for mode, want in (("content", "notes/a.txt:3:three"), ("files_with_matches", "notes/a.txt"),
                               ("count", "notes/a.txt:1")):
                text, err = await call(session, "grep", {"pattern": "^thr", "output_mode": mode})
                assert not err and text == want, (mode, text)
            # Failures are tool errors the model reads.
            text, err = await call(session, "read", {"path": "missing.txt"})
            assert err and "not_found" in text, text
            text, err = await call(session, "read", {"path": "../../etc/passwd"})
            assert err, text
            text, err = await call(session, "read", {})
            assert err and "path" in text, text
            text, err = await call(session, "bash", {"command": "sleep 5", "timeout": 200})
            assert not err and "timed out" in text and "Exit code: 124" in text, text
            text, err = await call(session, "bash", {"command": "true", "timeout": 600001})
            assert err, text

        await with_session("alice", alice)

        # Bob: his own workspace; Alice's file is not there. Before his first bash or write he
        # has no conversation yet: his workspace is empty, not an error.
        async def bob(session):
            text, err = await call(session, "ls", {})
            assert not err and text == ". is empty", text
            text, err = await call(session, "glob", {"pattern": "**/*"})
            assert not err and text == "No files found", text
            text, err = await call(session, "grep", {"pattern": "x"})
            assert not err and text == "No matches found", text
            text, err = await call(session, "read", {"path": "notes/a.txt"})
            assert err and text == "error (not_found): not found: notes/a.txt", text
            text, err = await call(session, "ls", {"path": "notes"})
            assert err and text == "error (not_found): not found: notes", text
            text, err = await call(session, "write", {"path": "b.txt", "content": "bob"})
            assert not err, text
            text, err = await call(session, "read", {"path": "notes/a.txt"})
            assert err and "not_found" in text, text
            text, err = await call(session, "bash", {"command": "ls -A; cat notes/a.txt"})
            assert text.startswith("b.txt\n") and "Exit code: 1" in text, text
            text, err = await call(session, "glob", {"pattern": "**/*"})
            assert text == "b.txt", text

        await with_session("bob", bob)

        async def alice_again(session):
            text, err = await call(session, "read", {"path": "b.txt"})
            assert err and "not_found" in text, text
            text, err = await call(session, "read", {"path": "notes/a.txt"})
            assert not err and "2" in text, text

        await with_session("alice", alice_again)

        # Workspace files as resources, read-only: listed with file:/// URIs, read whole (text
        # or base64), a missing one is the protocol's resource-not-found error.
        async def resources(session):
            text, err = await call(session, "bash", {"command": "printf 'h\\377\\000i' > 'bin ary.dat'"})
            assert not err, text
            listed = dump(await session.list_resources())
            uris = {r["uri"]: r for r in listed["resources"]}
            assert "file:///notes/a.txt" in uris, uris
            assert uris["file:///notes/a.txt"]["name"] == "notes/a.txt", uris
            assert uris["file:///notes/a.txt"]["mimeType"] == "text/plain", uris
            assert "file:///bin%20ary.dat" in uris, uris
            read = dump(await session.read_resource("file:///notes/a.txt"))
            assert read["contents"][0]["text"] == "one\n2\nthree\n", read
            read = dump(await session.read_resource("file:///bin%20ary.dat"))
            import base64
            assert base64.b64decode(read["contents"][0]["blob"]) == b"h\xff\x00i", read
            for bad in ("file:///nothing.txt", "file:///../etc/passwd", "http://x/a"):
                try:
                    await session.read_resource(bad)
                except Exception as e:  # noqa: BLE001 (the SDK raises McpError)
                    assert "error (" in str(e), str(e)
                    continue
                raise AssertionError(f"read {bad}")

        await with_session("alice", resources)

        # A conversation that was never made lists no resources, and listing does not make it.
        async def no_files(session):
            listed = dump(await session.list_resources())
            assert listed["resources"] == [], listed

        await with_session("never-made", no_files)

        # Every session so far ended cleanly: the SDK logged no warning (its DELETE answered
        # 200 or 204 included). The refused sessions below may log their HTTP errors.
        logged = [f"{r.name}: {r.getMessage()}" for r in WARNINGS.records]
        assert not logged, logged

        # Refused before MCP: a wrong key, a missing or invalid conversation id.
        for conversation, key in (("alice", "sbk_wrong"), (None, KEY), ("../alice", KEY)):
            try:
                await with_session(conversation, list_tools, key=key)
            except BaseException as e:  # noqa: BLE001 (the SDK raises groups or its own errors)
                if isinstance(e, (KeyboardInterrupt, anyio.get_cancelled_exc_class())):
                    raise
                continue
            raise AssertionError(f"accepted conversation={conversation!r} key={key!r}")
    print("OK")


anyio.run(main)
