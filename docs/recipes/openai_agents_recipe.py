import os

from agents import Agent
from agents.mcp import MCPServerStdio, MCPServerStreamableHttp

# Calls wait for the tool: `bash` runs up to 120 s by default (its `timeout` argument, in ms).
TOOL_TIMEOUT_SECS = 130


def sessionbox_http(base_url: str, api_key: str, conversation_id: str) -> MCPServerStreamableHttp:
    """sessionbox over streamable HTTP, the conversation named in a header."""
    return MCPServerStreamableHttp(
        name="sessionbox",
        params={
            "url": f"{base_url}/mcp",
            "headers": {
                "Authorization": f"Bearer {api_key}",
                "X-Conversation-Id": conversation_id,
            },
            "timeout": 30,
        },
        client_session_timeout_seconds=TOOL_TIMEOUT_SECS,
    )


def sessionbox_stdio(
    command: str = "sessionbox", env: dict[str, str] | None = None
) -> MCPServerStdio:
    """sessionbox as a child process: `sessionbox mcp --new`, a conversation of its own.

    The MCP SDK gives a child only a few variables (PATH, HOME, ...), so the caller's
    SESSIONBOX_* settings (data directory, tenant, runtime) are passed on unless `env` is given.
    """
    if env is None:
        env = {k: v for k, v in os.environ.items() if k.startswith("SESSIONBOX_")}
    return MCPServerStdio(
        name="sessionbox",
        params={"command": command, "args": ["mcp", "--new"], "env": env},
        client_session_timeout_seconds=TOOL_TIMEOUT_SECS,
    )


def coding_agent(server: MCPServerStreamableHttp | MCPServerStdio) -> Agent:
    """An agent whose tools are sessionbox's; Runner.run(agent, ...) needs a model and a key."""
    return Agent(
        name="coder",
        instructions="You work in a sandboxed workspace: use the bash, read and write tools.",
        mcp_servers=[server],
    )
