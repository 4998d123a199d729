"""Drives `sessionbox serve` over HTTPS with the official MCP Python SDK (streamable HTTP).

Usage: mcp_tls.py URL KEY CA_FILE. Checks that the server's certificate is refused without the
test CA, then, trusting CA_FILE, writes a file with the `write` tool and reads it back with
`read`. Prints OK and exits 0 when every check passes; any failure raises. Run by
tests/serve_tls.rs.
"""

import ssl
import sys

import anyio
import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

URL, KEY, CA = sys.argv[1], sys.argv[2], sys.argv[3]
HEADERS = {"Authorization": f"Bearer {KEY}", "X-Conversation-Id": "tls-mcp"}


def text_of(result):
    r = result.model_dump(by_alias=True, exclude_none=True)
    assert not r.get("isError"), r
    return "".join(c.get("text", "") for c in r["content"])


async def main():
    # Without the test CA the certificate is not trusted: TLS is really checked.
    try:
        async with httpx.AsyncClient(headers=HEADERS, verify=ssl.create_default_context()) as h:
            await h.post(URL, json={})
        raise AssertionError("the server's certificate was trusted without its CA")
    except httpx.ConnectError as e:
        assert "CERTIFICATE_VERIFY_FAILED" in str(e), e

    verify = ssl.create_default_context(cafile=CA)
    async with httpx.AsyncClient(headers=HEADERS, verify=verify, timeout=60) as http:
        async with streamable_http_client(URL, http_client=http) as (read, write, *_):
            async with ClientSession(read, write) as session:
                init = (await session.initialize()).model_dump(by_alias=True)
                assert init["serverInfo"]["name"] == "sessionbox", init
                text_of(
                    await session.call_tool("write", {"path": "tls.txt", "content": "over tls\n"})
                )
                out = text_of(await session.call_tool("read", {"path": "tls.txt"}))
                assert "over tls" in out, out
    print("OK")


anyio.run(main)
