from langchain_core.tools import BaseTool
from langchain_mcp_adapters.client import MultiServerMCPClient


async def sessionbox_tools(base_url: str, api_key: str, conversation_id: str) -> list[BaseTool]:
    """sessionbox's tools (bash, read, write, edit, ls, glob, grep, ...) for one conversation.

    The adapters open a new MCP session for every tool call, so the conversation is named in
    a header (the `/mcp` address): every call of these tools lands in the same workspace.
    """
    client = MultiServerMCPClient(
        {
            "sessionbox": {
                "transport": "streamable_http",
                "url": f"{base_url}/mcp",
                "headers": {
                    "Authorization": f"Bearer {api_key}",
                    "X-Conversation-Id": conversation_id,
                },
            }
        }
    )
    return await client.get_tools()
