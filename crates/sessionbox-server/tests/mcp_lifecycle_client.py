"""Lifecycle and skills as the model sees them, through the official MCP Python SDK
(streamable HTTP).

Usage: mcp_lifecycle_client.py URL KEY. The server (tests/lifecycle.rs) has tenant acme's
conversation `old`, expired and not yet collected, and a skills directory with `hello` and a
skill that breaks a rule. Prints OK and exits 0 when every check passes; any failure raises.
Every log record of WARNING or above from the SDK fails the run.
"""

import logging
import sys

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

URL, KEY = sys.argv[1], sys.argv[2]

warnings = []


class Collect(logging.Handler):
    def emit(self, record):
        warnings.append(self.format(record))


logging.getLogger().addHandler(Collect(level=logging.WARNING))


async def call(session, tool, args):
    r = (await session.call_tool(tool, args)).model_dump(by_alias=True, exclude_none=True)
    return "".join(c.get("text", "") for c in r["content"]), bool(r.get("isError"))


async def main():
    with anyio.fail_after(60):
        headers = {"Authorization": f"Bearer {KEY}", "X-Conversation-Id": "old"}
        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(URL, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    # An expired conversation: the model is told, not shown an empty workspace
                    # as if it were its old one.
                    text, err = await call(session, "ls", {})
                    assert "expired at" in text and "files are gone" in text, (text, err)
                    text, err = await call(session, "read", {"path": "notes.txt"})
                    assert err and "expired at" in text, (text, err)
                    # The next bash makes a new conversation, and says so once.
                    text, err = await call(session, "bash", {"command": "ls"})
                    assert not err and text.startswith("Note: this conversation expired at"), text
                    assert "notes.txt" not in text, text
                    text, err = await call(session, "bash", {"command": "echo again"})
                    assert not err and text == "again\nExit code: 0", repr(text)
                    # A skill that breaks a rule is left out; the others work.
                    text, err = await call(session, "skill", {})
                    assert not err and "- hello: Greets." in text and "broken" not in text, text
                    text, err = await call(session, "skill", {"name": "hello"})
                    assert not err and text.startswith("Skill: hello"), text
    assert not warnings, warnings
    print("OK")


anyio.run(main)
