"""Shared fixtures for the recipes' tests: a real `sessionbox serve` (runtime `host`) on a free
loopback port with a temporary data directory and a key for tenant `acme`.

The binary is $SESSIONBOX_BIN. Run everything through ./test.sh.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent


@dataclass
class Sessionbox:
    bin: str
    data_dir: Path  # the server's data directory (runtime = "host")
    url: str  # http://127.0.0.1:PORT
    key: str  # tenant acme's API key


def binary() -> str:
    name = os.environ.get("SESSIONBOX_BIN", "sessionbox")
    found = name if os.sep in name else shutil.which(name)
    if not found or not os.access(found, os.X_OK):
        pytest.exit(f"sessionbox binary not found: {name} (set SESSIONBOX_BIN)", returncode=2)
    return os.path.abspath(found)


def new_data_dir(prefix: str) -> Path:
    """A fresh data directory whose sessionbox.toml picks the `host` runtime (no root)."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    (d / "sessionbox.toml").write_text('runtime = "host"\n')
    return d


@pytest.fixture(scope="session")
def sessionbox() -> Iterator[Sessionbox]:
    bin_path = binary()
    data = new_data_dir("sessionbox-recipes-")
    key = subprocess.run(
        [bin_path, "--data-dir", str(data), "keys", "create", "--tenant", "acme"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    log = open(data / "serve.log", "wb")
    proc = subprocess.Popen(
        [bin_path, "--data-dir", str(data), "serve", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=log, start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()  # "listening on http://127.0.0.1:PORT"
    m = re.search(r"(http://127\.0\.0\.1:\d+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"serve printed no address: {line!r}; see {data}/serve.log")
    url = m.group(1)
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("serve did not become healthy")
        time.sleep(0.05)
    try:
        yield Sessionbox(bin=bin_path, data_dir=data, url=url, key=key)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        log.close()
        shutil.rmtree(data, ignore_errors=True)
