"""Runs the Claude Desktop and Claude Code configurations next to claude-desktop-and-code.md as
the clients would: each stdio server is started exactly as its entry says (only the binary path
and the data directory are replaced), each HTTP entry is reached at its URL with its headers,
and the tools are called with the official MCP Python SDK (mcp==2.3.0)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import HERE, Sessionbox, new_data_dir

Body = Callable[[ClientSession], Awaitable[Any]]


async def call(session: ClientSession, tool: str, args: dict[str, Any]) -> tuple[str, bool]:
    """Call a tool as the client does; return its text and whether it is a tool error."""
    r = await session.call_tool(tool, args)
    text = "".join(getattr(c, "text", "") for c in r.content)
    return text, bool(r.is_error)


async def over_stdio(entry: dict[str, Any], body: Body, *, cwd: str | None = None) -> Any:
    params = StdioServerParameters(
        command=entry["command"], args=entry.get("args", []), env=entry.get("env") or None, cwd=cwd
    )
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                assert init.server_info.name == "sessionbox"
                return await body(session)


async def over_http(url: str, headers: dict[str, str], body: Body) -> Any:
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await body(session)


def expand(value: str, env: dict[str, str]) -> str:
    """Claude Code's expansion of ${VAR} and ${VAR:-default} in .mcp.json."""

    def one(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(3)
        if name in env:
            return env[name]
        if default is None:
            raise KeyError(f"${{{name}}} is not set and has no default")
        return default

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}", one, value)


async def write_then_read(session: ClientSession) -> str:
    text, err = await call(session, "write", {"path": "notes/todo.md", "content": "ship it\n"})
    assert not err, text
    text, err = await call(session, "bash", {"command": "cat notes/todo.md && pwd"})
    assert not err and "ship it" in text and "Exit code: 0" in text, text
    text, err = await call(session, "read", {"path": "notes/todo.md"})
    assert not err and "ship it" in text, text
    text, err = await call(session, "ls", {"path": "notes"})
    assert not err and "todo.md" in text, text
    return text


async def sees_no_notes(session: ClientSession) -> None:
    text, err = await call(session, "read", {"path": "notes/todo.md"})
    assert err and "not_found" in text, f"another conversation's file is visible: {text}"


async def sees_no_notes_then_writes(session: ClientSession) -> None:
    await sees_no_notes(session)
    text, err = await call(session, "bash", {"command": "echo second > chat.txt"})
    assert not err, text


def test_claude_desktop_stdio_entry_gives_each_process_its_own_workspace(
    sessionbox: Sessionbox,
) -> None:
    config = json.loads((HERE / "claude_desktop_config.json").read_text())
    entry = dict(config["mcpServers"]["sessionbox"])
    assert entry["args"] == ["mcp", "--new"]
    data = new_data_dir("sessionbox-desktop-")
    try:
        entry["command"] = sessionbox.bin  # the binary path
        entry["env"] = {**entry["env"], "SESSIONBOX_HOME": str(data)}  # the data directory
        asyncio.run(over_stdio(entry, write_then_read))
        # Desktop starts one process per chat: the next chat starts empty.
        asyncio.run(over_stdio(entry, sees_no_notes_then_writes))
        # Both chats were conversations of their own (mcp-<16 hex digits>) in that data directory.
        listed = subprocess.run(
            [sessionbox.bin, "--data-dir", str(data), "conversations", "--json"],
            check=True, capture_output=True, text=True,
        ).stdout
        ids = sorted(c["id"] for c in json.loads(listed))
        assert len(ids) == 2 and all(re.fullmatch(r"mcp-[0-9a-f]{16}", i) for i in ids), ids
    finally:
        shutil.rmtree(data, ignore_errors=True)


def test_claude_desktop_remote_entry_through_mcp_remote(sessionbox: Sessionbox) -> None:
    npm_dir = os.environ.get("RECIPES_NPM_DIR")
    if not npm_dir or shutil.which("npx") is None:
        pytest.fail("npx and RECIPES_NPM_DIR (mcp-remote installed by test.sh) are needed")
    config = json.loads((HERE / "claude_desktop_config.json").read_text())
    entry = json.loads(json.dumps(config["mcpServers"]["sessionbox-remote"]))
    # Point it at the test server, with its key: the URL's origin and the key are replaced.
    entry["args"] = [
        a.replace("https://sessionbox.example.com", sessionbox.url) for a in entry["args"]
    ]
    assert f"{sessionbox.url}/mcp/new" in entry["args"]
    entry["env"]["SESSIONBOX_AUTH"] = f"Bearer {sessionbox.key}"
    # npx finds the pinned mcp-remote that test.sh installed in npm_dir.
    asyncio.run(over_stdio(entry, write_then_read, cwd=npm_dir))
    asyncio.run(over_stdio(entry, sees_no_notes, cwd=npm_dir))


def test_claude_code_mcp_json(sessionbox: Sessionbox) -> None:
    config = json.loads((HERE / "claude-code.mcp.json").read_text())
    stdio_entry = dict(config["mcpServers"]["sessionbox"])
    http_entry = config["mcpServers"]["sessionbox-http"]
    assert stdio_entry["type"] == "stdio" and http_entry["type"] == "http"

    env = {"SESSIONBOX_URL": sessionbox.url, "SESSIONBOX_API_KEY": sessionbox.key}
    url = expand(http_entry["url"], env)
    headers = {k: expand(v, env) for k, v in http_entry["headers"].items()}
    assert url == f"{sessionbox.url}/mcp" and headers["X-Conversation-Id"] == "my-project"

    # The HTTP entry: the project's conversation, kept across sessions.
    asyncio.run(over_http(url, headers, write_then_read))

    async def still_there(session: ClientSession) -> None:
        text, err = await call(session, "read", {"path": "notes/todo.md"})
        assert not err and "ship it" in text, text

    asyncio.run(over_http(url, headers, still_there))
    # Another project (another X-Conversation-Id) does not see it.
    other = {**headers, "X-Conversation-Id": "other-project"}
    asyncio.run(over_http(url, other, sees_no_notes))

    # The stdio entry: a conversation of the process's own, in its data directory.
    data = new_data_dir("sessionbox-code-")
    try:
        stdio_entry["command"] = sessionbox.bin
        stdio_entry["env"] = {**stdio_entry["env"], "SESSIONBOX_HOME": str(data)}
        asyncio.run(over_stdio(stdio_entry, write_then_read))
        asyncio.run(over_stdio(stdio_entry, sees_no_notes))
    finally:
        shutil.rmtree(data, ignore_errors=True)
