"""openai-agents.md: the OpenAI Agents SDK's MCP server classes connected to a real sessionbox,
tools listed and called as the agent's runner would. No model and no OpenAI key."""

from __future__ import annotations

import asyncio
import shutil

from agents import RunContextWrapper
from agents.mcp import MCPServerStdio, MCPServerStreamableHttp

from conftest import Sessionbox, new_data_dir
from openai_agents_recipe import coding_agent, sessionbox_http, sessionbox_stdio


async def call(server: MCPServerStreamableHttp | MCPServerStdio, tool: str, args: dict) -> tuple[str, bool]:
    r = await server.call_tool(tool, args)
    return "".join(getattr(c, "text", "") for c in r.content), bool(r.is_error)


async def write_read_bash(server: MCPServerStreamableHttp | MCPServerStdio) -> None:
    names = {t.name for t in await server.list_tools()}
    assert {"bash", "read", "write", "edit", "ls", "glob", "grep"} <= names, names
    # The tools the agent hands the model: the same names, from the same server.
    agent_tools = await coding_agent(server).get_all_tools(RunContextWrapper(context=None))
    assert {"bash", "read", "write"} <= {t.name for t in agent_tools}

    text, err = await call(server, "write", {"path": "data/n.txt", "content": "3\n4\n"})
    assert not err, text
    text, err = await call(server, "bash", {"command": "awk '{s += $1} END {print s}' data/n.txt > sum.txt"})
    assert not err and "Exit code: 0" in text, text
    text, err = await call(server, "read", {"path": "sum.txt"})
    assert not err and "7" in text, text


async def sees_nothing(server: MCPServerStreamableHttp | MCPServerStdio) -> None:
    text, err = await call(server, "read", {"path": "sum.txt"})
    assert err and "not_found" in text, text


def test_streamable_http(sessionbox: Sessionbox) -> None:
    async def main() -> None:
        async with sessionbox_http(sessionbox.url, sessionbox.key, "oa-alice") as server:
            await write_read_bash(server)
        async with sessionbox_http(sessionbox.url, sessionbox.key, "oa-alice") as server:
            text, err = await call(server, "read", {"path": "sum.txt"})  # a later turn
            assert not err and "7" in text, text
        async with sessionbox_http(sessionbox.url, sessionbox.key, "oa-bob") as server:
            await sees_nothing(server)

    asyncio.run(main())


def test_stdio(sessionbox: Sessionbox) -> None:
    data = new_data_dir("sessionbox-agents-")
    try:
        async def main() -> None:
            env = {"SESSIONBOX_HOME": str(data)}
            async with sessionbox_stdio(sessionbox.bin, env) as server:
                await write_read_bash(server)
            async with sessionbox_stdio(sessionbox.bin, env) as server:  # a new process
                await sees_nothing(server)

        asyncio.run(main())
    finally:
        shutil.rmtree(data, ignore_errors=True)
