"""The MCP `skill` tool on the isolated runtime, over stdio, with the official MCP Python SDK:
a skill added while the conversation's sandbox runs is not announced (nor loaded) until the
sandbox has started again with it mounted.

Usage: mcp_stdio_skills.py SESSIONBOX_EXE DATA_DIR PHASE. The data directory's sessionbox.toml
names the default tenant's skills directory. Run by tests/skills.rs, twice on conversation
`chat`:
- `running`: its sandbox runs with /skills/alpha mounted; beta was added to the skills
  directory since. alpha is announced and loads at /skills/alpha; beta is neither listed nor
  loaded (no path under /skills is handed out for it) and /skills/beta does not exist.
  Leaves a file in the workspace.
- `restarted`: the sandbox has stopped since. Both are announced, beta loads at /skills/beta,
  which exists, and the workspace is the same.
Prints OK and exits 0 when every check passes; any failure raises. Every log record of WARNING
or above from the SDK fails the run.
"""

import logging
import os
import sys

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

EXE, DATA, PHASE = sys.argv[1], sys.argv[2], sys.argv[3]

warnings = []


class Collect(logging.Handler):
    def emit(self, record):
        warnings.append(self.format(record))


logging.getLogger().addHandler(Collect(level=logging.WARNING))


async def call(session, tool, args):
    r = (await session.call_tool(tool, args)).model_dump(by_alias=True, exclude_none=True)
    return "".join(c.get("text", "") for c in r["content"]), bool(r.get("isError"))


async def running(session):
    text, err = await call(session, "skill", {})
    assert not err and "- alpha: First skill." in text, text
    assert "beta" not in text, text
    text, err = await call(session, "skill", {"name": "alpha"})
    assert not err and text.startswith("Skill: alpha\nBase directory: /skills/alpha\n"), text
    # Loading beta hands out no path: it is not in this sandbox.
    text, err = await call(session, "skill", {"name": "beta"})
    assert err and "not_found" in text, text
    assert "/skills" not in text and "Base directory" not in text, text
    text, err = await call(session, "bash", {"command": "test -d /skills/alpha; echo alpha=$?; test -d /skills/beta; echo beta=$?"})
    assert not err and text == "alpha=0\nbeta=1\nExit code: 0", repr(text)
    text, err = await call(session, "write", {"path": "mark.txt", "content": "same workspace\n"})
    assert not err, text
    # Still not announced after the calls above.
    text, err = await call(session, "skill", {})
    assert not err and "alpha" in text and "beta" not in text, text


async def restarted(session):
    # The sandbox is stopped: the next start mounts the skills as they are now.
    text, err = await call(session, "skill", {})
    assert not err and "- alpha: First skill." in text and "- beta: Added later." in text, text
    text, err = await call(session, "skill", {"name": "beta"})
    assert not err and text.startswith("Skill: beta\nBase directory: /skills/beta\n"), text
    assert text.endswith("Run scripts/b.sh.\n"), text
    text, err = await call(session, "bash", {"command": "test -d /skills/beta && sh /skills/beta/scripts/b.sh && cat mark.txt"})
    assert not err and text == "beta here\nsame workspace\nExit code: 0", repr(text)
    # Now the sandbox runs with both: both are announced still.
    text, err = await call(session, "skill", {})
    assert not err and "- alpha:" in text and "- beta:" in text, text


async def main():
    body = {"running": running, "restarted": restarted}[PHASE]
    params = StdioServerParameters(
        command=EXE,
        args=["--data-dir", DATA, "--runtime", "isolated", "mcp", "--conversation", "chat"],
        env={"PATH": "/usr/bin:/bin"},
    )
    with anyio.fail_after(90):
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                init = (await session.initialize()).model_dump(by_alias=True, exclude_none=True)
                text = init.get("instructions", "")
                assert "/skills/NAME, read-only" in text, text
                await body(session)
    assert not warnings, warnings
    print("OK")


anyio.run(main)
