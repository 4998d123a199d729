"""Drives sessionbox's URL-named and per-session MCP routes with the official MCP Python SDK
(streamable HTTP): /mcp/conversations/{id} for connectors that take a URL alone, and /mcp/new,
where every session gets a conversation of its own.

Usage: mcp_routes_client.py BASE_URL KEY. Prints OK and exits 0 when every check passes; any
failure raises. Run by tests/mcp.rs.
"""

import sys

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

BASE, KEY = sys.argv[1], sys.argv[2]


async def call(session, tool, args):
    r = (await session.call_tool(tool, args)).model_dump(by_alias=True, exclude_none=True)
    return "".join(c.get("text", "") for c in r["content"]), bool(r.get("isError"))


async def with_session(url, body):
    # The key alone: no X-Conversation-Id header (a connector that takes only a URL).
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {KEY}"}) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await body(session)


async def main():
    # The conversation named in the path.
    async def named(session):
        text, err = await call(session, "write", {"path": "who.txt", "content": "alice"})
        assert not err, text
        return await call(session, "read", {"path": "who.txt"})

    text, err = await with_session(f"{BASE}/mcp/conversations/alice", named)
    assert not err and "alice" in text, text

    # Two sessions at /mcp/new: two conversations, neither alice's nor each other's.
    async def first(session):
        text, err = await call(session, "write", {"path": "mine.txt", "content": "first"})
        assert not err, text
        return await call(session, "read", {"path": "who.txt"})

    text, err = await with_session(f"{BASE}/mcp/new", first)
    assert err and "not_found" in text, f"a new session sees alice's file: {text}"

    async def second(session):
        return await call(session, "read", {"path": "mine.txt"})

    text, err = await with_session(f"{BASE}/mcp/new", second)
    assert err and "not_found" in text, f"a second new session sees the first's file: {text}"
    print("OK")


anyio.run(main)
