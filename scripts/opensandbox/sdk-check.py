"""The official OpenSandbox Python SDK (opensandbox==1.1.1) against a real opensandbox-server
whose sandboxes run sessionbox's agent as execd: create a sandbox through the server, run
commands and file operations through the server proxy, delete it, and check it is gone.

Needs OPEN_SANDBOX_DOMAIN and OPEN_SANDBOX_API_KEY (eval "$(scripts/opensandbox-up)")."""
import asyncio
import os
import sys
import time
from datetime import timedelta

from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig


async def main() -> None:
    cfg = ConnectionConfig(
        domain=os.environ["OPEN_SANDBOX_DOMAIN"],
        api_key=os.environ["OPEN_SANDBOX_API_KEY"],
        use_server_proxy=True,
        request_timeout=timedelta(seconds=60),
    )
    image = os.environ.get("OPENSANDBOX_SANDBOX_IMAGE", "sessionbox/sandbox:local")
    t0 = time.monotonic()
    sb = await Sandbox.create(
        image,
        entrypoint=["tail", "-f", "/dev/null"],
        connection_config=cfg,
        timeout=timedelta(minutes=5),
        metadata={"sessionbox.test": "sdk-check"},
    )
    sandbox_id = sb.id
    try:
        r = await sb.commands.run("echo hello && pwd")
        created_to_exec = time.monotonic() - t0
        out = "".join(line.text for line in r.logs.stdout)
        assert out == "hello\n/workspace\n", out
        r = await sb.commands.run("exit 3")
        assert r.exit_code == 3, r.exit_code
        await sb.files.write_file("notes/a.txt", "alpha")
        assert await sb.files.read_file("notes/a.txt") == "alpha"
        r = await sb.commands.run("cat notes/a.txt")
        assert "".join(line.text for line in r.logs.stdout) == "alpha"
        info = await sb.files.get_file_info(["/workspace/notes/a.txt"])
        assert info["/workspace/notes/a.txt"].size == 5, info
        await sb.files.delete_files(["/workspace/notes/a.txt"])
        r = await sb.commands.run("test -e notes/a.txt")
        assert r.exit_code == 1, r.exit_code
        print(
            "official SDK: sandbox %s created through the server; commands and file operations "
            "ran against sessionbox-agent (create to first exec %.2f s)"
            % (sandbox_id, created_to_exec)
        )
    finally:
        await sb.kill()
        await sb.close()
    # Gone on the server.
    from opensandbox.manager import SandboxManager

    manager = await SandboxManager.create(connection_config=cfg)
    try:
        try:
            info = await manager.get_sandbox_info(sandbox_id)
        except Exception:  # noqa: BLE001 - not found is what we want
            info = None
        assert info is None or str(info.status.state).lower() in ("terminated", "stopping"), info
    finally:
        await manager.close()
    print("official SDK: sandbox deleted")


asyncio.run(main())
