"""Expiry as the clients see it, on a server whose conversations live 2 seconds unused."""

from __future__ import annotations

import os
import time
import uuid
from typing import Iterator

import pytest

from sessionbox import AsyncClient, Client, NotFound

from .conftest import Server, binary, start_server, stop_server


@pytest.fixture(scope="module")
def short_server() -> Iterator[Server]:
    """A server whose conversations expire 2 s after their last use."""
    s = start_server(
        os.environ.get("SESSIONBOX_TEST_RUNTIME", "host"),
        binary(),
        extra_config="\n[lifecycle]\nttl_secs = 2\n",
    )
    try:
        yield s
    finally:
        stop_server(s)


def test_expired_conversation_is_reported_and_starts_empty(short_server: Server) -> None:
    cid = f"exp-{uuid.uuid4().hex[:8]}"
    with Client(short_server.url, short_server.key) as sb:
        opened = sb.open_conversation(cid)
        assert opened.conversation.expires_at is not None
        sb.write_file(cid, "f.txt", "gone soon")
        time.sleep(3)
        assert sb.get_conversation(cid).state == "expired"
        with pytest.raises(NotFound) as e:
            sb.read_file(cid, "f.txt")
        assert "expired" in e.value.message
        # the next creating call makes it anew and says when the old one expired
        r = sb.exec(cid, "ls")
        assert r.previous_expired_at is not None
        assert r.stdout == ""
        again = sb.open_conversation(cid)
        assert again.created is False and again.previous_expired_at is None
        sb.destroy_conversation(cid)


@pytest.mark.anyio
async def test_expired_conversation_open_says_so(short_server: Server) -> None:
    cid = f"aexp-{uuid.uuid4().hex[:8]}"
    async with AsyncClient(short_server.url, short_server.key) as sb:
        await sb.open_conversation(cid)
        await sb.write_file(cid, "f.txt", "gone soon")
        time.sleep(3)
        opened = await sb.open_conversation(cid)
        assert opened.created is True and opened.previous_expired_at is not None
        with pytest.raises(NotFound):
            await sb.read_file(cid, "f.txt")
        await sb.destroy_conversation(cid)
