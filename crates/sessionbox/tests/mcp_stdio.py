"""Drives `sessionbox mcp --conversation ID` (MCP over stdio) with the official MCP Python SDK.

Usage: mcp_stdio.py SESSIONBOX_EXE DATA_DIR RUNTIME. Starts one server process per
conversation, as an MCP client configured with `command: sessionbox` would. Prints OK and
exits 0 when every check passes; any failure raises. Run by tests/mcp_stdio.rs.
"""

import sys

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

EXE, DATA, RUNTIME = sys.argv[1], sys.argv[2], sys.argv[3]


def dump(m):
    return m.model_dump(by_alias=True, exclude_none=True)


async def call(session, tool, args):
    r = dump(await session.call_tool(tool, args))
    text = "".join(c.get("text", "") for c in r["content"])
    return text, bool(r.get("isError"))


async def with_conversation(conversation, body):
    params = StdioServerParameters(
        command=EXE,
        args=["--data-dir", DATA, "--runtime", RUNTIME, "mcp", "--conversation", conversation],
        env={"PATH": "/usr/bin:/bin"},
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await body(session)


async def main():
    with anyio.fail_after(90):
        async def list_tools(session):
            return {t["name"]: t["inputSchema"] for t in dump(await session.list_tools())["tools"]}

        tools = await with_conversation("alice", list_tools)
        assert set(tools) == {"bash", "read", "write", "edit", "ls", "glob", "grep", "skill", "network"}, tools
        assert set(tools["edit"]["required"]) == {"path", "old_string", "new_string"}, tools

        async def alice(session):
            text, err = await call(session, "write", {"path": "notes/report.txt", "content": "alice's secret\n"})
            assert not err, text
            text, err = await call(session, "bash", {"command": "cat notes/report.txt; echo oops >&2; exit 4"})
            assert not err and text == "alice's secret\noops\nExit code: 4", repr(text)
            text, err = await call(session, "edit", {"path": "notes/report.txt", "old_string": "secret", "new_string": "plan"})
            assert not err and "Replaced 1 occurrence" in text, text
            text, err = await call(session, "read", {"path": "notes/report.txt"})
            assert not err and text == "     1\talice's plan\n", repr(text)
            # A path outside the workspace is a tool error the model can read.
            text, err = await call(session, "read", {"path": "../../etc/passwd"})
            assert err and "outside_workspace" in text, text

        await with_conversation("alice", alice)

        # Resume: a new process on the same conversation sees alice's file.
        async def alice_again(session):
            text, err = await call(session, "glob", {"pattern": "**/*.txt"})
            assert not err and text == "notes/report.txt", repr(text)

        await with_conversation("alice", alice_again)

        # Bob is another conversation: alice's file is not there.
        async def bob(session):
            text, err = await call(session, "bash", {"command": "echo hi > mine.txt; ls -R"})
            assert not err and "report.txt" not in text and "mine.txt" in text, text
            text, err = await call(session, "read", {"path": "notes/report.txt"})
            assert err and "not_found" in text, text

        await with_conversation("bob", bob)
    print("OK")


anyio.run(main)
