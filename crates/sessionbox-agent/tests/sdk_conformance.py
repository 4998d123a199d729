#!/usr/bin/env python3
"""Conformance of sessionbox-agent with the official OpenSandbox Python SDK (opensandbox==1.1.1).

Usage: sdk_conformance.py http://127.0.0.1:PORT WORKSPACE_ROOT [TOKEN]

Drives the agent with the SDK's own execd service adapters (the classes a `Sandbox` uses for
`sandbox.commands` and `sandbox.files`), pointed straight at the agent, as the SDK does for a
sandbox endpoint reached directly. Exits non-zero on the first failed assertion. Run by
tests/sdk.rs; needs `pip install opensandbox==1.1.1` (scripts/test installs it).
"""

import sys
import time
from datetime import timedelta

try:
    from opensandbox.config.connection_sync import ConnectionConfigSync
    from opensandbox.models.execd import RunCommandOpts
    from opensandbox.models.filesystem import (
        ContentReplaceEntry,
        DirectoryListEntry,
        MoveEntry,
        SearchEntry,
        WriteEntry,
    )
    from opensandbox.models.sandboxes import SandboxEndpoint
    from opensandbox.sync.adapters.command_adapter import CommandsAdapterSync
    from opensandbox.sync.adapters.filesystem_adapter import FilesystemAdapterSync
except ImportError as e:  # pragma: no cover - reported by tests/sdk.rs
    print(
        f"the opensandbox SDK is not installed ({e}); run scripts/test or "
        "`python3 -m pip install opensandbox==1.1.1`",
        file=sys.stderr,
    )
    sys.exit(3)


def stdout_of(execution):
    # One event per line without its terminator, as upstream execd frames output; joined as
    # upstream's own e2e tests join them.
    return "\n".join(m.text for m in execution.logs.stdout)


def stderr_of(execution):
    return "\n".join(m.text for m in execution.logs.stderr)


def main():
    url, root = sys.argv[1], sys.argv[2].rstrip("/")
    token = sys.argv[3] if len(sys.argv) > 3 else None
    protocol, _, hostport = url.partition("://")
    config = ConnectionConfigSync(protocol=protocol, request_timeout=timedelta(seconds=30))
    headers = {"X-EXECD-ACCESS-TOKEN": token} if token else {}
    endpoint = SandboxEndpoint(endpoint=hostport, headers=headers)
    commands = CommandsAdapterSync(config, endpoint)
    files = FilesystemAdapterSync(config, endpoint)

    # --- foreground commands ---
    started = time.monotonic()
    ex = commands.run("echo hello; echo oops >&2")
    assert ex.exit_code == 0, ex
    assert [m.text for m in ex.logs.stdout] == ["hello"], ex.logs.stdout
    assert stderr_of(ex) == "oops", stderr_of(ex)
    assert ex.id, "the init event carries the command id"
    assert ex.complete is not None and ex.error is None, ex
    # The SDK drains a foreground stream to EOF: the agent closes right after the terminal
    # event (upstream holds it about a second).
    assert time.monotonic() - started < 0.9, time.monotonic() - started

    ex = commands.run("exit 7")
    assert ex.exit_code == 7, ex
    assert ex.error is not None and ex.error.value == "7", ex.error

    # argv: an executable and literal arguments, no shell expansion.
    ex = commands.run(["printf", "%s", "$HOME 'quoted'"])
    assert ex.exit_code == 0, ex
    assert stdout_of(ex) == "$HOME 'quoted'", stdout_of(ex)

    ex = commands.run("sleep 5", opts=RunCommandOpts(timeout=timedelta(milliseconds=300)))
    assert ex.exit_code == -1, ex  # upstream's code for a command killed at its timeout
    assert ex.error is not None and ex.error.name == "CommandTimeoutError", ex.error

    # --- files: write, read, info, search, replace, move, list, delete ---
    files.create_directories([WriteEntry(path=root + "/sub/deeper", mode=755)])
    files.write_file(root + "/sub/a.txt", "alpha beta alpha\n")
    files.write_files(
        [
            WriteEntry(path=root + "/sub/deeper/b.txt", data=b"\x00\x01binary\xff"),
            WriteEntry(path=root + "/sub/c.log", data="log line\n"),
        ]
    )
    assert files.read_file(root + "/sub/a.txt") == "alpha beta alpha\n"
    assert files.read_bytes(root + "/sub/deeper/b.txt") == b"\x00\x01binary\xff"
    assert files.read_bytes(root + "/sub/a.txt", range_header="bytes=6-9") == b"beta"

    ex = commands.run(
        'printf "%s|%s" "$GREETING" "$(pwd)"',
        opts=RunCommandOpts(working_directory=root + "/sub", envs={"GREETING": "hi there"}),
    )
    assert ex.exit_code == 0, ex
    assert stdout_of(ex) == "hi there|" + root + "/sub", stdout_of(ex)

    info = files.get_file_info([root + "/sub/a.txt"])
    entry = info[root + "/sub/a.txt"]
    assert entry.path == root + "/sub/a.txt", entry
    assert entry.size == len("alpha beta alpha\n"), entry
    assert entry.entry_type == "file", entry

    found = files.search(SearchEntry(path=root + "/sub", pattern="*.txt"))
    paths = sorted(e.path for e in found)
    assert paths == [root + "/sub/a.txt", root + "/sub/deeper/b.txt"], paths

    listed = files.list_directory(DirectoryListEntry(path=root + "/sub"))
    names = [e.path for e in listed]
    assert names == [root + "/sub/a.txt", root + "/sub/c.log", root + "/sub/deeper"], names
    deep = files.list_directory(DirectoryListEntry(path=root + "/sub", depth=2))
    assert root + "/sub/deeper/b.txt" in [e.path for e in deep], deep

    results = files.replace_contents_detailed(
        [ContentReplaceEntry(path=root + "/sub/a.txt", old_content="alpha", new_content="omega")]
    )
    assert len(results) == 1, results
    assert files.read_file(root + "/sub/a.txt") == "omega beta omega\n"
    files.replace_contents(
        [ContentReplaceEntry(path=root + "/sub/a.txt", old_content="beta", new_content="gamma")]
    )
    assert files.read_file(root + "/sub/a.txt") == "omega gamma omega\n"

    files.move_files([MoveEntry(src=root + "/sub/c.log", dest=root + "/moved/c.log")])
    assert files.read_file(root + "/moved/c.log") == "log line\n"

    files.delete_files([root + "/sub/a.txt"])
    try:
        files.read_file(root + "/sub/a.txt")
        raise AssertionError("a deleted file was read")
    except AssertionError:
        raise
    except Exception:
        pass
    files.delete_directories([root + "/moved"])
    assert files.get_file_info([root + "/sub/deeper/b.txt"])

    # A path outside the workspace is refused.
    try:
        files.write_file("/etc/sessionbox-agent-conformance", "x")
        raise AssertionError("a write outside the workspace succeeded")
    except AssertionError:
        raise
    except Exception:
        pass

    # --- background commands: status and logs with a cursor ---
    ex = commands.run(
        "echo first; sleep 0.3; echo second",
        opts=RunCommandOpts(background=True),
    )
    assert ex.id, ex
    assert ex.exit_code is None, ex  # a background start has no exit code
    deadline = time.monotonic() + 10
    while True:
        status = commands.get_command_status(ex.id)
        if not status.running:
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    assert status.exit_code == 0, status
    assert status.id == ex.id, status
    assert status.started_at is not None and status.finished_at is not None, status
    logs = commands.get_background_command_logs(ex.id)
    assert logs.content == "first\nsecond\n", logs
    assert logs.cursor == len(logs.content), logs
    more = commands.get_background_command_logs(ex.id, cursor=len("first\n"))
    assert more.content == "second\n", more
    assert more.cursor == logs.cursor, more

    # Interrupt a long background command.
    ex = commands.run("sleep 1000", opts=RunCommandOpts(background=True))
    commands.interrupt(ex.id)
    deadline = time.monotonic() + 10
    while commands.get_command_status(ex.id).running:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    status = commands.get_command_status(ex.id)
    assert status.exit_code == -1, status
    assert "interrupted" in (status.error or ""), status

    # Bash sessions: what a run exports and where it cds carry over to the next run.
    sid = commands.create_session(working_directory=root)
    ex = commands.run_in_session(sid, "export SDK_VAR=kept; mkdir -p sess && cd sess")
    assert ex.exit_code == 0 and ex.error is None, ex
    ex = commands.run_in_session(sid, "echo $SDK_VAR; pwd")
    assert [m.text for m in ex.logs.stdout] == ["kept", root + "/sess"], ex.logs.stdout
    ex = commands.run_in_session(sid, "exit 4")
    assert ex.error is not None and ex.error.value == "4", ex
    commands.delete_session(sid)

    print("sdk conformance: ok")


if __name__ == "__main__":
    main()
