"""Drives the MCP `skill` tool with the official MCP Python SDK (streamable HTTP).

Usage: mcp_skills_client.py URL KEY. Prints OK and exits 0 when every check passes; any failure
raises. Run by tests/skills.rs (the server there has tenant acme's skill `hello`).
"""

import sys

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

URL, KEY = sys.argv[1], sys.argv[2]


async def call(session, tool, args):
    r = (await session.call_tool(tool, args)).model_dump(by_alias=True, exclude_none=True)
    return "".join(c.get("text", "") for c in r["content"]), bool(r.get("isError"))


async def main():
    with anyio.fail_after(60):
        headers = {"Authorization": f"Bearer {KEY}", "X-Conversation-Id": "agent"}
        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(URL, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    tools = {t.name: t for t in (await session.list_tools()).tools}
                    assert "skill" in tools, tools
                    text, err = await call(session, "skill", {})
                    assert not err and "- hello: Greets from a script." in text, text
                    text, err = await call(session, "skill", {"name": "hello"})
                    assert not err, text
                    lines = text.split("\n")
                    assert lines[0] == "Skill: hello", text
                    assert lines[1].startswith("Base directory: /") and lines[1].endswith("/.skills/hello"), text
                    base = lines[1].removeprefix("Base directory: ")
                    assert text.endswith("Run scripts/hi.sh.\n"), text
                    # The model runs the skill's script from its base directory.
                    text, err = await call(session, "bash", {"command": f"sh {base}/scripts/hi.sh"})
                    assert not err and text == "hi from skill\nExit code: 0", repr(text)
                    text, err = await call(session, "skill", {"name": "nope"})
                    assert err and "not_found" in text, text
                    text, err = await call(session, "skill", {"name": "../etc"})
                    assert err and "invalid_request" in text, text
    print("OK")


anyio.run(main)
