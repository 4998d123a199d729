"""Drives the MCP `network` tool with the official MCP Python SDK (streamable HTTP), and tries
every tool as a prompt-injected model would to widen the conversation's network policy.

Usage: mcp_network_client.py URL KEY CONVERSATION HASH. CONVERSATION has an allowlist policy
(allow *.allowed.test:443, deny evil.allowed.test) whose hash is HASH, and verdicts in the
egress log (see tests/policy.rs). Prints OK and exits 0 when every check passes; any failure
raises.
"""

import sys

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

URL, KEY, CONV, HASH = sys.argv[1:5]

WIDEN = {"profile": "allowlist", "allow": ["0.0.0.0/0", "*.evil.example"], "deny": []}


async def call(session, tool, args):
    r = (await session.call_tool(tool, args)).model_dump(by_alias=True, exclude_none=True)
    return "".join(c.get("text", "") for c in r["content"]), bool(r.get("isError"))


async def in_conversation(conversation, body):
    headers = {"Authorization": f"Bearer {KEY}", "X-Conversation-Id": conversation}
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(URL, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await body(session)


async def with_policy(session):
    tools = {t.name: t for t in (await session.list_tools()).tools}
    network = tools["network"]
    assert set(network.input_schema["properties"]) == {"limit"}, network.input_schema
    assert "no tool can change it" in network.description, network.description
    # No tool takes anything that looks like a policy.
    for name, t in tools.items():
        props = set(t.input_schema.get("properties", {}))
        assert not props & {"profile", "allow", "deny", "policy", "rules"}, (name, props)

    text, err = await call(session, "network", {})
    assert not err, text
    lines = text.split("\n")
    assert lines[0] == f"Network policy: allowlist (set for this conversation), hash {HASH}", text
    assert "Allowed: *.allowed.test:443" in lines, text
    assert "Denied: evil.allowed.test" in lines, text
    assert "The operator sets this policy; no tool can change it." in lines, text
    assert "Recent connections (newest first, 2):" in lines, text
    verdicts = [l for l in lines if l.endswith(")") or " B up" in l]
    assert len(verdicts) == 2, text
    assert " denied CONNECT evil.allowed.test:443 (deny rule evil.allowed.test)" in verdicts[0], verdicts
    assert " allowed CONNECT www.allowed.test:443 (*.allowed.test:443), 120 B up, 4096 B down, closed" in verdicts[1], verdicts
    assert "SECRET" not in text, text

    text, err = await call(session, "network", {"limit": 1})
    assert not err and "Recent connections (newest first, 1):" in text, text
    text, err = await call(session, "network", {"limit": 0})
    assert err and "invalid_request" in text, text

    # The attack: widen the policy through MCP. Every way is refused or does nothing.
    text, err = await call(session, "network", WIDEN)
    assert err and "read-only" in text, text
    for name in ["policy", "set_policy", "network_policy", "egress"]:
        text, err = await call(session, name, WIDEN)
        assert err and "no tool named" in text, (name, text)
    required = {
        "bash": {"command": "true"},
        "read": {"path": "f.txt"},
        "write": {"path": "f.txt", "content": "x"},
        "edit": {"path": "f.txt", "old_string": "x", "new_string": "y"},
        "ls": {},
        "glob": {"pattern": "*"},
        "grep": {"pattern": "y"},
        "skill": {},
        "preview": {"port": 8000},
    }
    assert set(required) | {"network"} == set(tools), tools
    for name, args in required.items():
        await call(session, name, {**args, **WIDEN})
    text, err = await call(session, "network", {})
    assert not err and f"hash {HASH}" in text and "0.0.0.0/0" not in text, text


async def fresh(session):
    text, err = await call(session, "network", {})
    assert not err, text
    assert text.startswith("Network policy: none (the default), hash "), text
    assert "No network at all" in text and "No connections recorded yet." in text, text


async def main():
    with anyio.fail_after(90):
        await in_conversation(CONV, with_policy)
        await in_conversation("fresh", fresh)
    print("OK")


anyio.run(main)
