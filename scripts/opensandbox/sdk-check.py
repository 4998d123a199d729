"""The official OpenSandbox Python SDK (opensandbox==1.1.1), on its DEFAULT connection settings,
against a real opensandbox-server 1.1.1 whose sandboxes run sessionbox's agent as execd.

It creates a sandbox through the server and drives it as upstream's own end-to-end suite does
(tests/python/tests/test_sandbox_e2e.py in the OpenSandbox repository), checking the same
expectations, each counted on its own: lifecycle and endpoint, foreground, failing and
background commands, status and cursor logs, envs, interrupt, and the file operations
(write, whole/range/line reads, info with modes and owners, search, replace, move, delete,
mkdir with modes, chmod/chown, rmdir). It prints how many hold, deletes the sandbox, checks that
the server no longer lists it, and exits non-zero when any expectation fails.

    eval "$(scripts/opensandbox-up)"; python3 scripts/opensandbox/sdk-check.py [--server-proxy]

`ConnectionConfig()` is built with no arguments: the domain and the API key come from
OPEN_SANDBOX_DOMAIN and OPEN_SANDBOX_API_KEY, as the SDK reads them by default, and execd is
reached directly at the endpoint the server hands out (in docker bridge mode
`127.0.0.1:<port>/proxy/44772`, i.e. through the agent's own `/proxy/{port}` route).
`--server-proxy` sets use_server_proxy=True instead (traffic through the server's proxy), for
comparison.

Deliberate differences from upstream's suite, each because of what sessionbox is:
- Paths: upstream works in /tmp; the agent confines file operations to its workspace, so every
  directory and file here lives under /workspace/sdk-e2e-<ms>/ (the analogue of /tmp), and the
  commands that upstream runs with working_directory="/tmp" run there.
- The content written is upstream's Python literal (one line holding a literal backslash-n),
  as upstream; the JavaScript check uses real newlines, as upstream's JavaScript suite does.
- Not exercised: the bash session API (create_session/run_in_session), the code interpreter,
  volumes, pause/resume, egress and signed endpoints: the agent is no code interpreter and has
  no /session, and the rest belong to the server, not to execd.
- Checked on top (not in upstream's suite, counted apart): upstream execd's line framing as
  its code has it (an empty line is a "\n" event, a last unterminated line comes at exit), and
  a file operation outside the workspace (upstream's own /tmp path) refused with a clear error.
"""
import asyncio
import logging
import os
import sys
import time
from datetime import datetime, timedelta, timezone
from io import BytesIO

from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig
from opensandbox.manager import SandboxManager
from opensandbox.models.execd import ExecutionHandlers, RunCommandOpts
from opensandbox.models.filesystem import (
    ContentReplaceEntry,
    MoveEntry,
    SearchEntry,
    SetPermissionEntry,
    WriteEntry,
)

SERVER_PROXY = "--server-proxy" in sys.argv[1:]
# The SDK logs every failed call with a traceback; the checks below report failures themselves.
logging.getLogger("opensandbox").setLevel(logging.DEBUG if os.environ.get("SDK_CHECK_VERBOSE") else logging.CRITICAL + 1)
IMAGE = os.environ.get("OPENSANDBOX_SANDBOX_IMAGE", "sessionbox/sandbox:local")
EXECD_PORT = 44772

results: list[tuple[str, bool, str]] = []  # upstream's expectations
extras: list[tuple[str, bool, str]] = []  # on top of upstream's suite


class Outcome:
    """An awaited call's value, or the exception it raised (re-raised on .v)."""

    def __init__(self, value=None, exc: BaseException | None = None, seconds: float = 0.0):
        self.value, self.exc, self.seconds = value, exc, seconds

    @property
    def v(self):
        if self.exc is not None:
            raise self.exc
        return self.value

    @property
    def raised(self) -> bool:
        return self.exc is not None


async def attempt(aw) -> Outcome:
    t0 = time.monotonic()
    try:
        value = await aw
    except Exception as e:  # noqa: BLE001 - recorded, judged by the checks
        return Outcome(exc=e, seconds=time.monotonic() - t0)
    return Outcome(value, seconds=time.monotonic() - t0)


class Unmet(Exception):
    pass


def need(cond, detail: str) -> None:
    if not cond:
        raise Unmet(detail)


def same(got, want, what: str) -> None:
    if got != want:
        raise Unmet(f"{what}: got {got!r}, want {want!r}")


def check(name: str, fn, into=results) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        detail = str(e) if isinstance(e, Unmet) else f"{type(e).__name__}: {e}"
        into.append((name, False, detail[:600]))
        print(f"  FAIL {name}: {detail[:600]}")
    else:
        into.append((name, True, ""))
        print(f"  ok   {name}")


def now_ms() -> int:
    return int(time.time() * 1000)


def recent_ms(ts, what: str, tolerance_ms: int = 60_000) -> None:
    need(isinstance(ts, int) and ts > 0, f"{what}: timestamp {ts!r} is not a positive int")
    need(abs(now_ms() - ts) <= tolerance_ms, f"{what}: timestamp {ts} is {now_ms() - ts} ms off")


def times_close(a: datetime, b: datetime, what: str, tolerance_s: float = 2.0) -> None:
    d = abs((b - a).total_seconds())
    need(d <= tolerance_s, f"{what}: created_at/modified_at {d:.3f}s apart")


def moved_forward(before: datetime, after: datetime, what: str) -> None:
    # upstream: after - before >= min_delta(1 ms) - skew(1000 ms)
    d = (after - before).total_seconds() * 1000
    need(d >= 1 - 1000, f"{what}: modified_at moved {d:.0f} ms")


def endpoint_form(endpoint: str, port: int) -> None:
    # upstream's JavaScript assertEndpointHasPort: no scheme; a route ends with /<port>,
    # otherwise host:<port>.
    need(endpoint, "endpoint is empty")
    need("://" not in endpoint, f"endpoint {endpoint!r} has a scheme")
    if "/" in endpoint:
        need(endpoint.endswith(f"/{port}"), f"endpoint {endpoint!r} does not end with /{port}")
        need(endpoint.split("/", 1)[0], f"endpoint {endpoint!r} has no host")
    else:
        host, _, p = endpoint.rpartition(":")
        need(host and p == str(port), f"endpoint {endpoint!r} is not host:{port}")


def stdout_texts(execution) -> list[str]:
    return [m.text for m in execution.logs.stdout]


class Recorder:
    """ExecutionHandlers that keep every event, as upstream's suite does."""

    def __init__(self):
        self.stdout, self.stderr, self.inits, self.completes, self.errors = [], [], [], [], []
        self.init_seen = asyncio.Event()

    def handlers(self) -> ExecutionHandlers:
        async def on_stdout(m):
            self.stdout.append(m)

        async def on_stderr(m):
            self.stderr.append(m)

        async def on_init(i):
            self.inits.append(i)
            self.init_seen.set()

        async def on_complete(c):
            self.completes.append(c)

        async def on_error(e):
            self.errors.append(e)

        return ExecutionHandlers(
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            on_init=on_init,
            on_execution_complete=on_complete,
            on_error=on_error,
        )


async def lifecycle(sb: Sandbox, cfg: ConnectionConfig) -> None:
    print("lifecycle")
    healthy = await attempt(sb.is_healthy())
    check("is_healthy() is True", lambda: same(healthy.v, True, "is_healthy"))

    info = await attempt(sb.get_info())

    def running():
        i = info.v
        same(i.id, sb.id, "info.id")
        same(i.status.state, "Running", "state")
        same(list(i.entrypoint)[-3:], ["tail", "-f", "/dev/null"], "entrypoint")
        same((i.metadata or {}).get("tag"), "e2e-test", "metadata tag")

    check("get_info: Running, entrypoint, metadata", running)

    def expiry():
        i = info.v
        need(i.expires_at > i.created_at, "expires_at is not after created_at")
        d = i.expires_at - i.created_at
        need(timedelta(minutes=1) <= d <= timedelta(minutes=6), f"timeout 5 min gave {d}")

    check("get_info: expiry within [1, 6] min of creation", expiry)

    ep = await attempt(sb.get_endpoint(EXECD_PORT))
    check(
        f"get_endpoint({EXECD_PORT}): host:port or a route ending /{EXECD_PORT}",
        lambda: endpoint_form(ep.v.endpoint, EXECD_PORT),
    )
    print(f"  (execd endpoint: {ep.value.endpoint if not ep.raised else ep.exc})")

    metrics = await attempt(sb.get_metrics())

    def metrics_ok():
        m = metrics.v
        need(m.cpu_count > 0, f"cpu_count {m.cpu_count}")
        need(0.0 <= m.cpu_used_percentage <= 100.0, f"cpu {m.cpu_used_percentage}%")
        need(m.memory_total_in_mib > 0, f"memory total {m.memory_total_in_mib}")
        need(0.0 <= m.memory_used_in_mib <= m.memory_total_in_mib, f"memory used {m.memory_used_in_mib}")
        recent_ms(m.timestamp, "metrics", 120_000)

    check("get_metrics: cpu, memory, recent timestamp", metrics_ok)

    renew = await attempt(sb.renew(timedelta(minutes=20)))
    renewed = await attempt(sb.get_info())

    def renew_ok():
        r, i = renew.v, renewed.v
        need(r.expires_at > info.v.expires_at, "renew did not move expires_at forward")
        need(abs((i.expires_at - r.expires_at).total_seconds()) < 10, "renew answer and info differ")
        left = i.expires_at - datetime.now(tz=i.expires_at.tzinfo or timezone.utc)
        need(timedelta(minutes=18) < left < timedelta(minutes=22), f"remaining {left}")

    check("renew(20 min): expires_at moves forward, 18-22 min left", renew_ok)

    async def via_connect():
        sb2 = await Sandbox.connect(sandbox_id=sb.id, connection_config=cfg)
        try:
            return sb2.id, await sb2.is_healthy(), await sb2.commands.run("echo connect-ok")
        finally:
            await sb2.close()

    conn = await attempt(via_connect())

    def connect_ok():
        sid, ok, r = conn.v
        same(sid, sb.id, "connected id")
        same(ok, True, "connected is_healthy")
        same(r.error, None, "error")
        same(stdout_texts(r), ["connect-ok"], "stdout")

    check("Sandbox.connect: healthy, `echo connect-ok` gives one stdout line", connect_ok)


async def foreground(sb: Sandbox, base: str) -> None:
    print("commands")
    rec = Recorder()
    echo = await attempt(sb.commands.run("echo 'Hello OpenSandbox E2E'", handlers=rec.handlers()))

    def echo_id():
        r = echo.v
        need(r.id and r.id.strip(), f"execution id {r.id!r}")
        same(r.error, None, "error")

    check("run(echo): an id, no error", echo_id)

    def echo_stdout():
        r = echo.v
        same(stdout_texts(r), ["Hello OpenSandbox E2E"], "stdout messages")
        same(r.logs.stdout[0].is_error, False, "is_error")
        recent_ms(r.logs.stdout[0].timestamp, "stdout")
        same(len(r.logs.stderr), 0, "stderr messages")

    check("run(echo): exactly one stdout message, the line without its newline", echo_stdout)

    def echo_complete():
        r = echo.v
        same(r.exit_code, 0, "exit_code")
        need(r.complete is not None, "no execution_complete")
        need(r.complete.execution_time_in_millis >= 0, "execution_time < 0")
        recent_ms(r.complete.timestamp, "complete")

    check("run(echo): exit code 0, execution_complete with a time", echo_complete)

    def echo_handlers():
        r = echo.v
        same(len(rec.inits), 1, "init events")
        same(rec.inits[0].id, r.id, "init id")
        recent_ms(rec.inits[0].timestamp, "init")
        same(len(rec.completes), 1, "complete events")
        same([m.text for m in rec.stdout], ["Hello OpenSandbox E2E"], "on_stdout")
        same(len(rec.errors), 0, "error events")

    check("run(echo): handlers see 1 init, 1 stdout, 1 complete, 0 errors", echo_handlers)

    pwd = await attempt(sb.commands.run("pwd", opts=RunCommandOpts(working_directory=base)))

    def pwd_ok():
        r = pwd.v
        same(r.error, None, "error")
        same(stdout_texts(r), [base], "stdout")
        same(r.logs.stdout[0].is_error, False, "is_error")
        same(r.exit_code, 0, "exit_code")
        need(r.complete is not None, "no execution_complete")

    check("run(pwd, working_directory): that directory, one line", pwd_ok)

    bg = await attempt(sb.commands.run("sleep 30", opts=RunCommandOpts(background=True)))

    def bg_ok():
        r = bg.v
        need(bg.seconds < 10, f"took {bg.seconds:.1f}s")
        same(r.exit_code, None, "exit_code")

    check("run(sleep 30, background): returns within 10 s, no exit code", bg_ok)

    rec = Recorder()
    name = "nonexistent-command-that-does-not-exist"
    fail = await attempt(sb.commands.run(name, handlers=rec.handlers()))

    def fail_error():
        r = fail.v
        need(r.id and r.id.strip(), f"execution id {r.id!r}")
        need(r.error is not None, "no error")
        same(r.error.name, "CommandExecError", "error.name")

    check("run(missing command): error CommandExecError", fail_error)

    def fail_stderr():
        r = fail.v
        need(len(r.logs.stderr) > 0, "no stderr")
        need(any(name in m.text for m in r.logs.stderr), f"stderr {[m.text for m in r.logs.stderr]}")
        need(all(m.is_error is True for m in r.logs.stderr), "a stderr message with is_error False")
        recent_ms(r.logs.stderr[0].timestamp, "stderr")

    check("run(missing command): stderr names the command", fail_stderr)

    def fail_code():
        r = fail.v
        same(r.complete, None, "complete")
        same(r.exit_code, int(r.error.value), "exit_code vs error.value")

    check("run(missing command): no complete, exit_code == int(error.value)", fail_code)

    def fail_handlers():
        r = fail.v
        same(len(rec.inits), 1, "init events")
        same(rec.inits[0].id, r.id, "init id")
        need(len(rec.errors) >= 1, "no error event")
        same(rec.errors[0].name, "CommandExecError", "error event name")
        same(len(rec.completes), 0, "complete events")
        need(rec.stderr and name in rec.stderr[0].text, "on_stderr's first message lacks the name")

    check("run(missing command): handlers see 1 init, an error, 0 completes", fail_handlers)


async def framing(sb: Sandbox) -> None:
    # On top of upstream's suite: upstream execd's line framing (its code, not its e2e tests):
    # one event per line without its terminator, an empty line as "\n", a last unterminated
    # line at exit.
    blank = await attempt(sb.commands.run("printf 'a\\n\\nb\\n'"))
    check(
        "framing: printf 'a\\n\\nb\\n' gives stdout events a, \\n, b",
        lambda: same(stdout_texts(blank.v), ["a", "\n", "b"], "stdout events"),
        into=extras,
    )
    tail = await attempt(sb.commands.run("printf 'x\\ny'"))
    check(
        "framing: printf 'x\\ny' gives x, then y at exit",
        lambda: same(stdout_texts(tail.v), ["x", "y"], "stdout events"),
        into=extras,
    )


async def status_and_logs(sb: Sandbox) -> None:
    started = await attempt(
        sb.commands.run(
            "sh -c 'echo log-line-1; echo log-line-2; sleep 2'", opts=RunCommandOpts(background=True)
        )
    )
    cid = started.value.id if not started.raised else None
    status = await attempt(sb.commands.get_command_status(cid))

    def status_ok():
        need(started.v.id, "no command id")
        same(status.v.id, cid, "status.id")
        need(isinstance(status.v.running, bool), f"running {status.v.running!r}")

    check("get_command_status(background id): that id, running a bool", status_ok)

    async def poll():
        text, cursor = "", None
        for _ in range(20):
            logs = await sb.commands.get_background_command_logs(cid, cursor=cursor)
            text += logs.content
            cursor = logs.cursor if logs.cursor is not None else cursor
            if "log-line-2" in text:
                break
            await asyncio.sleep(1.0)
        return text

    logs = await attempt(poll())

    def logs_ok():
        need("log-line-1" in logs.v and "log-line-2" in logs.v, f"logs {logs.v!r}")

    check("get_background_command_logs(cursor): both lines", logs_ok)


async def envs(sb: Sandbox) -> None:
    key, value = "OPEN_SANDBOX_E2E_CMD_ENV", f"env-ok-{int(time.time())}"
    probe = f"sh -c 'if [ -z \"${{{key}:-}}\" ]; then echo \"__EMPTY__\"; else echo \"${{{key}}}\"; fi'"
    base = await attempt(sb.commands.run(probe))
    injected = await attempt(
        sb.commands.run(
            probe, opts=RunCommandOpts(envs={key: value, "OPEN_SANDBOX_E2E_SECOND_ENV": "second-ok"})
        )
    )

    def baseline_ok():
        same(base.v.error, None, "error")
        same("\n".join(stdout_texts(base.v)).strip(), "__EMPTY__", "output")

    check("run(probe): variable unset without envs", baseline_ok)

    def injected_ok():
        same(injected.v.error, None, "error")
        same("\n".join(stdout_texts(injected.v)).strip(), value, "output")

    check("run(probe, envs): the variable's value", injected_ok)


async def interrupt(sb: Sandbox) -> None:
    rec = Recorder()
    t0 = time.monotonic()
    task = asyncio.create_task(sb.commands.run("sleep 30", handlers=rec.handlers()))

    async def go():
        await asyncio.wait_for(rec.init_seen.wait(), timeout=15)
        await sb.commands.interrupt(rec.inits[0].id)
        execution = await asyncio.wait_for(task, timeout=30)
        return execution, time.monotonic() - t0

    out = await attempt(go())
    if not task.done():
        task.cancel()

    def stopped():
        execution, elapsed = out.v
        same(len(rec.inits), 1, "init events")
        recent_ms(rec.inits[0].timestamp, "init")
        same(execution.id, rec.inits[0].id, "execution id")
        need(elapsed < 20, f"took {elapsed:.1f}s")

    check("interrupt(init id): the run ends within 20 s", stopped)

    def reported():
        execution, _ = out.v
        need(rec.completes or rec.errors, "neither complete nor error")
        if rec.completes:
            same(len(rec.completes), 1, "complete events")
        need(execution.error is not None or execution.logs.stderr, "no error and no stderr")
        if execution.error is not None:
            need(execution.error.name and execution.error.value, f"error {execution.error!r}")
            recent_ms(execution.error.timestamp, "error", 180_000)

    check("interrupt: an error (name and value) or stderr reports it", reported)


async def filesystem(sb: Sandbox, base: str) -> None:
    print("files")
    ts = now_ms()
    d1, d2 = f"{base}/fs_test1_{ts}", f"{base}/fs_test2_{ts}"
    mk = await attempt(sb.files.create_directories([WriteEntry(path=d1, mode=755), WriteEntry(path=d2, mode=644)]))
    dinfo = await attempt(sb.files.get_file_info([d1, d2]))

    def dirs_ok():
        mk.v
        m = dinfo.v
        same(m[d1].path, d1, "path")
        same(m[d2].path, d2, "path")
        same(m[d1].mode, 755, "mode of the 755 directory")
        same(m[d2].mode, 644, "mode of the 644 directory")
        need(m[d1].owner and m[d1].group, "owner/group empty")
        times_close(m[d1].created_at, m[d1].modified_at, "directory")

    check("create_directories(755, 644): info shows those modes", dirs_ok)

    ls = await attempt(sb.commands.run("ls -la | grep fs_test", opts=RunCommandOpts(working_directory=base)))
    check("`ls -la | grep fs_test`: exactly 2 lines", lambda: same(len(ls.v.logs.stdout), 2, "lines"))

    f1, f2, f3 = (f"{d1}/test_file{i}.txt" for i in (1, 2, 3))
    content = "Hello Filesystem!\\nLine 2 with special chars: åäö\\nLine 3"
    size = len(content.encode("utf-8"))
    wrote = await attempt(
        sb.files.write_files(
            [
                WriteEntry(path=f1, data=content, mode=644),
                WriteEntry(path=f2, data=content.encode("utf-8"), mode=755),
                WriteEntry(path=f3, data=BytesIO(content.encode("utf-8")), owner="nobody", group="nogroup", mode=755),
            ]
        )
    )
    check("write_files(str 644, bytes 755, stream nobody:nogroup 755)", lambda: wrote.v)

    r1 = await attempt(sb.files.read_file(f1, encoding="utf-8"))
    r2 = await attempt(sb.files.read_bytes(f2))

    async def stream():
        out = b""
        async for chunk in await sb.files.read_bytes_stream(f3):
            out += chunk
        return out

    r3 = await attempt(stream())

    def reads_ok():
        same(r1.v, content, "read_file")
        same(r2.v.decode("utf-8"), content, "read_bytes")
        same(r3.v.decode("utf-8"), content, "read_bytes_stream")

    check("read_file / read_bytes / read_bytes_stream: the content", reads_ok)

    part = await attempt(sb.files.read_file(f1, encoding="utf-8", range_header="bytes=0-9"))
    check("read_file(range bytes=0-9): the first 10 bytes", lambda: same(part.v, content[:10], "range"))

    finfo = await attempt(sb.files.get_file_info([f1, f2, f3]))

    def info_of(path, mode, owner=None, group=None):
        def fn():
            i = finfo.v[path]
            same(i.path, path, "path")
            same(i.size, size, "size")
            same(i.mode, mode, "mode")
            need(i.owner is not None and i.group is not None, "owner/group missing")
            if owner:
                same(i.owner, owner, "owner")
                same(i.group, group, "group")
            times_close(i.created_at, i.modified_at, path)

        return fn

    check("get_file_info(str file): size, mode 644", info_of(f1, 644))
    check("get_file_info(bytes file): size, mode 755", info_of(f2, 755))
    check("get_file_info(stream file): mode 755, owner nobody, group nogroup", info_of(f3, 755, "nobody", "nogroup"))

    found = await attempt(sb.files.search(SearchEntry(path=d1, pattern="*")))

    def search_ok():
        by = {e.path: e for e in found.v}
        same(sorted(by), sorted([f1, f2, f3]), "found")
        same(by[f1].size, size, "size")
        times_close(by[f1].created_at, by[f1].modified_at, "search entry")

    check("search(dir, '*'): exactly the 3 files, by absolute path", search_ok)

    perm = await attempt(
        sb.files.set_permissions(
            [
                SetPermissionEntry(path=f1, mode=755, owner="nobody", group="nogroup"),
                SetPermissionEntry(path=f2, mode=600, owner="nobody", group="nogroup"),
            ]
        )
    )
    pinfo = await attempt(sb.files.get_file_info([f1, f2]))

    def perm_ok():
        perm.v
        m = pinfo.v
        same((m[f1].mode, m[f1].owner, m[f1].group), (755, "nobody", "nogroup"), "first file")
        same((m[f2].mode, m[f2].owner, m[f2].group), (600, "nobody", "nogroup"), "second file")

    check("set_permissions(755 and 600, nobody:nogroup): info shows them", perm_ok)

    before = await attempt(sb.files.get_file_info([f1]))
    up1, up2 = content + "\\nAppended line to file1", content + "\\nAppended line to file2"
    await asyncio.sleep(0.05)
    rewrote = await attempt(
        sb.files.write_files([WriteEntry(path=f1, data=up1, mode=644), WriteEntry(path=f2, data=up2, mode=755)])
    )
    n1 = await attempt(sb.files.read_file(f1, encoding="utf-8"))
    n2 = await attempt(sb.files.read_file(f2, encoding="utf-8"))
    after = await attempt(sb.files.get_file_info([f1]))

    def rewrite_ok():
        rewrote.v
        same(n1.v, up1, "first file")
        same(n2.v, up2, "second file")
        same(after.v[f1].size, len(up1.encode("utf-8")), "size")
        moved_forward(before.v[f1].modified_at, after.v[f1].modified_at, "rewrite")

    check("write_files again: new content, size, modified_at forward", rewrite_ok)

    await asyncio.sleep(0.05)
    rep = await attempt(
        sb.files.replace_contents_detailed([ContentReplaceEntry(path=f1, old_content="Appended line to file1", new_content="Replaced line in file1")])
    )
    rep_read = await attempt(sb.files.read_file(f1, encoding="utf-8"))
    rep_info = await attempt(sb.files.get_file_info([f1]))

    def rep_ok():
        same([(r.path, r.replaced_count) for r in rep.v], [(f1, 1)], "results")
        need("Replaced line in file1" in rep_read.v and "Appended line to file1" not in rep_read.v, rep_read.v)
        moved_forward(after.v[f1].modified_at, rep_info.v[f1].modified_at, "replace")

    check("replace_contents_detailed: replaced_count 1, text replaced", rep_ok)

    none = await attempt(
        sb.files.replace_contents_detailed([ContentReplaceEntry(path=f1, old_content="this string does not exist in file", new_content="irrelevant")])
    )
    none_read = await attempt(sb.files.read_file(f1, encoding="utf-8"))

    def none_ok():
        same([(r.path, r.replaced_count) for r in none.v], [(f1, 0)], "results")
        same(none_read.v, rep_read.v, "content")

    check("replace_contents_detailed(no match): replaced_count 0, unchanged", none_ok)

    multi = f"{d1}/multi_match.txt"
    mw = await attempt(sb.files.write_files([WriteEntry(path=multi, data="foo bar foo baz foo")]))
    mr = await attempt(sb.files.replace_contents_detailed([ContentReplaceEntry(path=multi, old_content="foo", new_content="qux")]))
    mc = await attempt(sb.files.read_file(multi, encoding="utf-8"))

    def multi_ok():
        mw.v
        same([r.replaced_count for r in mr.v], [3], "counts")
        same(mc.v, "qux bar qux baz qux", "content")

    check("replace_contents_detailed(3 matches): replaced_count 3", multi_ok)

    ba, bb = f"{d1}/batch_a.txt", f"{d1}/batch_b.txt"
    bw = await attempt(sb.files.write_files([WriteEntry(path=ba, data="hello world"), WriteEntry(path=bb, data="hello hello")]))
    br = await attempt(
        sb.files.replace_contents_detailed(
            [ContentReplaceEntry(path=ba, old_content="hello", new_content="hi"), ContentReplaceEntry(path=bb, old_content="hello", new_content="hi")]
        )
    )
    bca = await attempt(sb.files.read_file(ba, encoding="utf-8"))
    bcb = await attempt(sb.files.read_file(bb, encoding="utf-8"))

    def batch_ok():
        bw.v
        same(len(br.v), 2, "results")
        same({r.path: r.replaced_count for r in br.v}, {ba: 1, bb: 2}, "counts")
        same((bca.v, bcb.v), ("hi world", "hi hi"), "contents")

    check("replace_contents_detailed(batch of 2 files): 1 and 2", batch_ok)
    await attempt(sb.files.delete_files([multi, ba, bb]))

    plain = await attempt(
        sb.files.replace_contents([ContentReplaceEntry(path=f1, old_content="Replaced line in file1", new_content="Final line in file1")])
    )
    plain_read = await attempt(sb.files.read_file(f1, encoding="utf-8"))

    def plain_ok():
        plain.v
        need("Final line in file1" in plain_read.v, plain_read.v)

    check("replace_contents (no result): text replaced", plain_ok)

    moved = f"{d2}/moved_file3.txt"
    mv = await attempt(sb.files.move_files([MoveEntry(src=f3, dest=moved)]))
    mvr = await attempt(sb.files.read_bytes(moved))
    old = await attempt(sb.files.read_bytes(f3))

    def move_ok():
        mv.v
        same(mvr.v.decode("utf-8"), content, "moved content")
        need(old.raised, "the old path still reads")

    check("move_files: content at the destination, old path gone", move_ok)

    dl = await attempt(sb.files.delete_files([f2]))
    gone = await attempt(sb.files.read_file(f2, encoding="utf-8"))

    def delete_ok():
        dl.v
        need(gone.raised, "a deleted file still reads")

    check("delete_files: reading the file then raises", delete_ok)

    left = await attempt(sb.files.search(SearchEntry(path=d1, pattern="*")))
    check("search after move and delete: only the first file", lambda: same({e.path for e in left.v}, {f1}, "found"))

    rd = await attempt(sb.files.delete_directories([d1, d2]))
    verify = f"test ! -d {d1} && test ! -d {d2} && echo OK"
    vr = await attempt(sb.commands.run(verify, opts=RunCommandOpts(working_directory=base)))

    def rmdir_ok():
        rd.v
        same(vr.v.error, None, "error")
        same(stdout_texts(vr.v), ["OK"], "stdout")

    check("delete_directories: both gone (`test ! -d` prints OK)", rmdir_ok)

    print("line reads")
    path = f"{base}/line-read-e2e.txt"
    lw = await attempt(sb.files.write_files([WriteEntry(path=path, data="line1\nline2\nline3\nline4\nline5")]))
    for kw, want in (({"offset": 2, "limit": 2}, "line2\nline3"), ({"offset": 4}, "line4\nline5"), ({"limit": 2}, "line1\nline2")):
        got = await attempt(sb.files.read_file(path, **kw))

        def lines_ok(got=got, want=want):
            lw.v
            same(got.v, want, "lines")

        check("read_file(%s)" % ", ".join(f"{k}={v}" for k, v in kw.items()), lines_ok)
    await attempt(sb.files.delete_files([path]))

    # sessionbox's own, on top: upstream's /tmp is outside the workspace, refused clearly.
    out = await attempt(sb.files.write_files([WriteEntry(path=f"/tmp/sdk-e2e-{ts}.txt", data="x")]))

    def refused():
        need(out.raised, "a write to /tmp succeeded")
        need("OUTSIDE_WORKSPACE" in str(out.exc), f"error {out.exc}")
        print(f"  (the agent's answer: {str(out.exc)[:200]})")

    check("a write outside the workspace (/tmp) is refused, naming the workspace", refused, into=extras)


async def main() -> int:
    mode = "use_server_proxy=True" if SERVER_PROXY else "default settings"
    cfg = ConnectionConfig(use_server_proxy=True) if SERVER_PROXY else ConnectionConfig()
    print(f"python SDK opensandbox==1.1.1, {mode}: creating a sandbox from {IMAGE}")
    t0 = time.monotonic()
    created = await attempt(
        Sandbox.create(
            IMAGE,
            entrypoint=["tail", "-f", "/dev/null"],
            connection_config=cfg,
            timeout=timedelta(minutes=5),
            ready_timeout=timedelta(seconds=30),
            health_check_polling_interval=timedelta(milliseconds=500),
            metadata={"tag": "e2e-test", "sessionbox.test": "sdk-check"},
            env={"E2E_TEST": "true", "EXECD_API_GRACE_SHUTDOWN": "3s"},
        )
    )
    check("Sandbox.create: ready (execd /ping through the endpoint handed out)", lambda: created.v)
    if created.raised:
        print(f"python SDK ({mode}): the sandbox never became ready; nothing else can run")
        return 1
    sb: Sandbox = created.value
    print(f"  (sandbox {sb.id} ready in {time.monotonic() - t0:.2f}s)")
    sandbox_id = sb.id
    base = f"/workspace/sdk-e2e-{now_ms()}"
    try:
        mk = await attempt(sb.commands.run(f"mkdir -p {base}"))
        if mk.raised or mk.value.exit_code != 0:
            print(f"  (could not make {base}: {mk.exc or mk.value.error})")
        await lifecycle(sb, cfg)
        await foreground(sb, base)
        await framing(sb)
        await status_and_logs(sb)
        await envs(sb)
        await interrupt(sb)
        await filesystem(sb, base)
    finally:
        await attempt(sb.kill())
        await attempt(sb.close())

    manager = await SandboxManager.create(connection_config=cfg)
    try:
        info = await attempt(manager.get_sandbox_info(sandbox_id))
    finally:
        await manager.close()
    state = None if info.raised else str(info.value.status.state).lower()
    deleted = state is None or state in ("terminated", "stopping")
    print(f"sandbox {sandbox_id}: {'deleted' if deleted else 'still ' + str(state)}")

    held = sum(ok for _, ok, _ in results)
    print(f"python SDK ({mode}): {held} of {len(results)} upstream expectations hold")
    for name, ok, detail in results:
        if not ok:
            print(f"  differs: {name}: {detail}")
    extra_held = sum(ok for _, ok, _ in extras)
    print(f"python SDK ({mode}): {extra_held} of {len(extras)} further checks hold (upstream framing, differences by design)")
    for name, ok, detail in extras:
        if not ok:
            print(f"  differs: {name}: {detail}")
    return 0 if held == len(results) and extra_held == len(extras) and deleted else 1


sys.exit(asyncio.run(main()))
