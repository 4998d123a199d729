"""langchain.md: the tools from langchain_recipe.sessionbox_tools, invoked as an agent would
(`tool.ainvoke(args)`), against a real server. Runs in the langchain venv (mcp 1.x)."""

from __future__ import annotations

import asyncio

from conftest import Sessionbox
from langchain_recipe import sessionbox_tools


def text_of(result: object) -> str:
    """A tool's answer as the model sees it: a string, or a list of text blocks."""
    if isinstance(result, str):
        return result
    assert isinstance(result, list), result
    return "".join(b["text"] if isinstance(b, dict) else str(b) for b in result)


def test_langchain_tools_share_a_workspace_per_conversation(sessionbox: Sessionbox) -> None:
    async def main() -> None:
        tools = {t.name: t for t in await sessionbox_tools(sessionbox.url, sessionbox.key, "lc-alice")}
        assert {"bash", "read", "write", "edit", "ls", "glob", "grep"} <= set(tools)
        assert "command" in tools["bash"].args  # the JSON schema the model is given

        out = text_of(await tools["write"].ainvoke({"path": "src/app.py", "content": "print('hi')\n"}))
        assert "error" not in out.lower(), out
        out = text_of(await tools["bash"].ainvoke({"command": "python3 src/app.py && ls src"}))
        assert "hi" in out and "app.py" in out and "Exit code: 0" in out, out
        out = text_of(await tools["edit"].ainvoke(
            {"path": "src/app.py", "old_string": "'hi'", "new_string": "'bye'"}))
        out = text_of(await tools["read"].ainvoke({"path": "src/app.py"}))
        assert "print('bye')" in out, out

        # Another conversation's tools see another, empty workspace; a tool error is text.
        bob = {t.name: t for t in await sessionbox_tools(sessionbox.url, sessionbox.key, "lc-bob")}
        out = text_of(await bob["read"].ainvoke({"path": "src/app.py"}))
        assert "not_found" in out, out
        out = text_of(await bob["glob"].ainvoke({"pattern": "**/*.py"}))
        assert "app.py" not in out, out

    asyncio.run(main())
