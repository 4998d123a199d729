"""Drives `sessionbox mcp --conversation ID` (MCP over stdio) with the official MCP Python SDK.

Usage: mcp_stdio.py SESSIONBOX_EXE DATA_DIR RUNTIME [--exact CASES_JSON OUT_DIR]. Starts one
server process per conversation, as an MCP client configured with `command: sessionbox` would.
Prints OK and exits 0 when every check passes; any failure raises. Run by tests/mcp_stdio.rs.

With --exact, runs each case of CASES_JSON (a list of {"name", "command"}) with the bash tool
in conversation `exact` instead, and writes the bytes the result carries to OUT_DIR/NAME.out and
NAME.err: base64 decoded where the result says a stream is not UTF-8, else the text. The Rust
side compares them with the bytes the command wrote.
"""

import base64
import json
import os
import sys

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

EXE, DATA, RUNTIME = sys.argv[1], sys.argv[2], sys.argv[3]
EXACT = sys.argv[5:7] if len(sys.argv) > 4 and sys.argv[4] == "--exact" else None


def dump(m):
    return m.model_dump(by_alias=True, exclude_none=True)


async def call(session, tool, args):
    r = dump(await session.call_tool(tool, args))
    text = "".join(c.get("text", "") for c in r["content"])
    return text, bool(r.get("isError"))


async def with_conversation(conversation, body):
    """Runs `body` in a server process on `conversation`, or on a new one of its own with
    None (`mcp --new`: then returns the conversation the instructions name)."""
    which = ["--conversation", conversation] if conversation is not None else ["--new"]
    params = StdioServerParameters(
        command=EXE,
        args=["--data-dir", DATA, "--runtime", RUNTIME, "mcp", *which],
        # The server's own settings pass (the opensandbox runtime reads its server from them).
        env={"PATH": "/usr/bin:/bin",
             **{k: v for k, v in os.environ.items() if k.startswith("OPEN_SANDBOX_")}},
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = dump(await session.initialize())
            # The server names itself and tells the model what a conversation is and where
            # skills are on this runtime.
            assert init["serverInfo"]["name"] == "sessionbox", init["serverInfo"]
            text = init.get("instructions", "")
            # This data directory has no skills: the model is told none are configured, never
            # a skill path that does not exist.
            where = "none are configured"
            for words in ("workspace of its own", "persist across turns", where):
                assert words in text, (words, text)
            result = await body(session)
            if conversation is None:
                marker = "This session's conversation is `"
                assert marker in text, text
                return text.split(marker, 1)[1].split("`", 1)[0]
            return result


def split_result(text):
    """(stdout bytes, stderr bytes, exit code) of a bash tool result. A stream that is not UTF-8
    is a marker line and its base64; text streams are run together, so text is all stdout."""
    body, _, code = text.rpartition("Exit code: ")

    def take(name, rest):
        if rest.startswith(f"[{name} is not valid UTF-8: "):
            line, b64, rest = rest.split("\n", 2)
            assert line.endswith("bytes, shown as base64]"), line
            return base64.b64decode(b64, validate=True), rest
        return None, rest

    out, rest = take("stdout", body)
    if out is None:
        i = rest.find("[stderr is not valid UTF-8: ")
        out, rest = (rest, "") if i < 0 else (rest[:i], rest[i:])
        out = out.encode()
    err, rest = take("stderr", rest)
    if err is None:
        err = rest.encode()
    return out, err, int(code)


async def exact(cases_json, out_dir):
    with open(cases_json) as f:
        cases = json.load(f)

    async def run(session):
        for case in cases:
            text, err = await call(session, "bash", {"command": case["command"]})
            assert not err, (case["name"], text)
            out, err_bytes, code = split_result(text)
            assert code == 0, (case["name"], text)
            with open(os.path.join(out_dir, case["name"] + ".out"), "wb") as f:
                f.write(out)
            with open(os.path.join(out_dir, case["name"] + ".err"), "wb") as f:
                f.write(err_bytes)

    with anyio.fail_after(240):
        await with_conversation("exact", run)
    print("OK")


async def main():
    if EXACT:
        return await exact(*EXACT)
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
            # Before his first bash or write, bob's workspace is empty, not an error.
            text, err = await call(session, "ls", {})
            assert not err and text == ". is empty", text
            text, err = await call(session, "glob", {"pattern": "**/*"})
            assert not err and text == "No files found", text
            text, err = await call(session, "read", {"path": "notes/report.txt"})
            assert err and text == "error (not_found): not found: notes/report.txt", text
            text, err = await call(session, "bash", {"command": "echo hi > mine.txt; ls -R"})
            assert not err and "report.txt" not in text and "mine.txt" in text, text
            text, err = await call(session, "read", {"path": "notes/report.txt"})
            assert err and "not_found" in text, text

        await with_conversation("bob", bob)

        # `mcp --new`: each process a conversation of its own, named to the model.
        async def first(session):
            text, err = await call(session, "write", {"path": "only-first.txt", "content": "1"})
            assert not err, text
            text, err = await call(session, "read", {"path": "notes/report.txt"})
            assert err and "not_found" in text, f"a new conversation sees alice's file: {text}"

        async def second(session):
            text, err = await call(session, "read", {"path": "only-first.txt"})
            assert err and "not_found" in text, f"two --new processes share a workspace: {text}"

        a = await with_conversation(None, first)
        b = await with_conversation(None, second)
        assert a != b and a.startswith("mcp-") and b.startswith("mcp-"), (a, b)
    print("OK")


anyio.run(main)
