"""Fixtures: a real ``sessionbox serve`` on a free port, a temporary data directory and keys.

The binary is ``$SESSIONBOX_BIN`` (default ``sessionbox`` on ``PATH``); the runtime is ``host``
unless ``$SESSIONBOX_TEST_RUNTIME`` names another.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from sessionbox import Client

SKILL_MD = """---
name: greet
description: Greets people by name. Use it when someone says hello.
---
Run `sh $SKILL_DIR/greet.sh NAME` to greet NAME.
"""


@dataclass
class Server:
    """A running server and what the tests need to reach it."""

    url: str
    key: str
    other_key: str
    skills_key: str
    data_dir: Path
    process: subprocess.Popen[bytes]
    bin: str


def binary() -> str:
    name = os.environ.get("SESSIONBOX_BIN", "sessionbox")
    found = shutil.which(name) if os.sep not in name else name
    if not found or not os.access(found, os.X_OK):
        pytest.exit(f"sessionbox binary not found: {name} (set SESSIONBOX_BIN)", returncode=2)
    return found


def start_server(runtime: str, bin_path: str, extra_config: str = "") -> Server:
    """Start ``sessionbox serve`` with a fresh data directory and three tenants' keys
    (``acme``; ``globex``; ``wizards``, which has a skill)."""
    data = Path(tempfile.mkdtemp(prefix="sessionbox-sdk-test-"))
    skills = data / "skills-src"
    (skills / "greet").mkdir(parents=True)
    (skills / "greet" / "SKILL.md").write_text(SKILL_MD)
    (skills / "greet" / "greet.sh").write_text('echo "hello, $1"\n')
    (data / "sessionbox.toml").write_text(
        f'runtime = "{runtime}"\n\n[skills.tenants]\nwizards = ["{skills}"]\n' + extra_config
    )
    base = [bin_path, "--data-dir", str(data)]
    key = subprocess.run(
        [*base, "keys", "create", "--tenant", "acme", "--label", "sdk-tests"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    other = subprocess.run(
        [*base, "keys", "create", "--tenant", "globex"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    skills_key = subprocess.run(
        [*base, "keys", "create", "--tenant", "wizards"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    log = open(data / "serve.log", "wb")
    proc = subprocess.Popen(
        [*base, "serve", "--listen", "127.0.0.1:0", "--gc-interval-secs", "0"],
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    m = re.search(r"(https?://[0-9.]+:\d+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"serve did not print its address: {line!r}; see {data}/serve.log")
    url = m.group(1)
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("serve did not become healthy")
        time.sleep(0.05)
    return Server(
        url=url,
        key=key,
        other_key=other,
        skills_key=skills_key,
        data_dir=data,
        process=proc,
        bin=bin_path,
    )


def stop_server(server: Server) -> None:
    """Stop the server (SIGTERM, then SIGKILL) and remove its data directory."""
    server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
    if server.process.stdout is not None:
        server.process.stdout.close()
    shutil.rmtree(server.data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """One server for the whole test session."""
    s = start_server(os.environ.get("SESSIONBOX_TEST_RUNTIME", "host"), binary())
    try:
        yield s
    finally:
        stop_server(s)


@pytest.fixture()
def client(server: Server) -> Iterator[Client]:
    """A sync client with tenant acme's key."""
    with Client(server.url, server.key, timeout=30) as c:
        yield c


@pytest.fixture()
def cid(client: Client) -> Iterator[str]:
    """A fresh conversation id, destroyed after the test."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    yield name
    client.destroy_conversation(name)


@pytest.fixture()
def anyio_backend() -> str:
    """Run the async tests on asyncio."""
    return "asyncio"
