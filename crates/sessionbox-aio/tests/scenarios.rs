//! The reference AIO scenarios against the AIO test server (started by each test): recovery,
//! isolation, 8 x 5 concurrency with the same file name, path refusal without any HTTP call,
//! and typed errors. Real commands, real files, real SQLite.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them); support modules are `pub` for the files that use them,
// and a test binary has no public API.
#![allow(clippy::unwrap_used, unreachable_pub)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Expect, Target};
use sessionbox_aio::{AioConfig, AioRuntime, Endpoint, Secret};
use sessionbox_core::{
    ConversationRef, EditRequest, Error, ExecRequest, ExitStatus, FileKind, GrepRequest,
    OutputStream, Runtime, Session,
};
use sessionbox_manager::Manager;
use sessionbox_store::Store;

fn conv(id: &str) -> ConversationRef {
    ConversationRef::parse("default", id).unwrap()
}

async fn sh(s: &dyn Session, cmd: &str) -> String {
    let r = s.exec(ExecRequest::new(cmd)).await.unwrap();
    assert_eq!(
        r.status,
        ExitStatus::Code(0),
        "{cmd}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    String::from_utf8(r.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recovery_resumes_files_through_the_store_with_a_new_runtime() {
    let target = Target::new();
    let db = tempfile::tempdir().unwrap();
    let store_path = db.path().join("sessionbox.db");
    let c = conv("recovery-1");
    {
        let m = Manager::new(
            Store::open(&store_path).unwrap(),
            Arc::new(target.runtime()),
        );
        let conversation = m.open(&c).await.unwrap();
        assert!(conversation.created());
        conversation
            .write("notes/a.txt", b"turn one\n")
            .await
            .unwrap();
        sh(&conversation, "echo from-shell > b.txt").await;
    }
    // A new process: new store handle, new runtime, same conversation.
    let m = Manager::new(
        Store::open(&store_path).unwrap(),
        Arc::new(target.runtime()),
    );
    let conversation = m.open(&c).await.unwrap();
    assert!(
        !conversation.created(),
        "the record was resumed, not made again"
    );
    assert_eq!(
        conversation.read("notes/a.txt").await.unwrap(),
        b"turn one\n"
    );
    assert_eq!(
        sh(&conversation, "cat b.txt notes/a.txt").await,
        "from-shell\nturn one\n"
    );
    let listed = m.list(None).await.unwrap();
    assert_eq!(listed.len(), 1);
    let out = m.destroy(&c).await.unwrap();
    assert!(out.runtime.workspace_removed);
    let rt = target.runtime();
    assert!(rt.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn isolation_other_workspaces_are_unreachable_by_path_or_link() {
    let target = Target::new();
    let rt = target.runtime();
    let alice = rt.open(&conv("alice")).await.unwrap();
    let bob = rt.open(&conv("bob")).await.unwrap();
    alice.write("secret.txt", b"alice's secret").await.unwrap();
    let alice_root = alice.workspace_root().to_owned();
    let alice_key = alice.key().as_str().to_owned();

    // Lexical escapes: refused by the path policy.
    for p in [
        format!("../{alice_key}/secret.txt"),
        format!("{alice_root}/secret.txt"),
        "/etc/passwd".to_owned(),
        format!("{}-evil/x", bob.workspace_root()),
    ] {
        let e = bob.read(&p).await.unwrap_err();
        assert_eq!(e.code(), "outside_workspace", "{p}: {e}");
    }

    // Link escapes: a link Bob's shell makes is checked inside the container.
    sh(
        &*bob,
        &format!("ln -s {alice_root}/secret.txt peek && ln -s {alice_root} dir && ln -s /nonexistent-sb dangling"),
    )
    .await;
    for p in ["peek", "dir/secret.txt"] {
        let e = bob.read(p).await.unwrap_err();
        assert_eq!(e.code(), "outside_workspace", "{p}: {e}");
    }
    let e = bob.write("dir/planted.txt", b"x").await.unwrap_err();
    assert_eq!(e.code(), "outside_workspace", "{e}");
    let e = bob.write("peek", b"overwritten").await.unwrap_err();
    assert_eq!(e.code(), "outside_workspace", "{e}");
    let e = bob.write("dangling", b"x").await.unwrap_err();
    assert_eq!(e.code(), "outside_workspace", "{e}");
    let e = bob
        .edit(
            "peek",
            &EditRequest {
                old: "alice".into(),
                new: "bob".into(),
                replace_all: false,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "outside_workspace", "{e}");
    for p in ["dir", "peek"] {
        assert_eq!(bob.stat(p).await.unwrap_err().code(), "outside_workspace");
    }
    assert_eq!(
        bob.list("dir").await.unwrap_err().code(),
        "outside_workspace"
    );
    assert_eq!(
        bob.mkdir("dir/sub").await.unwrap_err().code(),
        "outside_workspace"
    );
    let e = bob
        .exec(ExecRequest::new("ls").cwd("dir"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "outside_workspace", "{e}");
    // Searches do not descend through the link nor read through it.
    assert!(bob.glob("**/*.txt").await.unwrap().is_empty());
    assert!(
        bob.grep(&GrepRequest::new("secret"))
            .await
            .unwrap()
            .is_empty()
    );
    // Removing the link removes the link, not its target.
    bob.remove("dir", false).await.unwrap();
    bob.remove("peek", false).await.unwrap();
    assert_eq!(alice.read("secret.txt").await.unwrap(), b"alice's secret");
    assert!(
        alice
            .list(".")
            .await
            .unwrap()
            .iter()
            .all(|e| e.name == "secret.txt")
    );

    // Each conversation sees only its own files.
    bob.write("secret.txt", b"bob's").await.unwrap();
    assert_eq!(alice.read("secret.txt").await.unwrap(), b"alice's secret");
    assert_eq!(
        sh(&*bob, "cat secret.txt; pwd").await,
        format!("bob's{}\n", bob.workspace_root())
    );

    for c in ["alice", "bob"] {
        rt.destroy(&conv(c).key).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_8_conversations_5_rounds_same_file_name() {
    let target = Target::new();
    let rt = Arc::new(target.runtime());
    let mut sessions = Vec::new();
    for i in 0..8 {
        sessions.push(Arc::new(
            rt.open(&conv(&format!("conc-{i}"))).await.unwrap(),
        ));
    }
    for round in 0..5 {
        let mut tasks = Vec::new();
        for (i, s) in sessions.iter().enumerate() {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let value = format!("conversation {i} round {round}\n");
                if (i + round) % 2 == 0 {
                    s.write("same.txt", value.as_bytes()).await.unwrap();
                } else {
                    let r = s
                        .exec(
                            ExecRequest::new("printf '%s\\n' \"$V\" > same.txt")
                                .env("V", value.trim_end()),
                        )
                        .await
                        .unwrap();
                    assert_eq!(r.status, ExitStatus::Code(0));
                }
                assert_eq!(s.read("same.txt").await.unwrap(), value.as_bytes());
                let r = s.exec(ExecRequest::new("cat same.txt")).await.unwrap();
                assert_eq!(String::from_utf8(r.stdout).unwrap(), value);
                1
            }));
        }
        let mut verified = 0;
        for t in tasks {
            verified += t.await.unwrap();
        }
        assert_eq!(verified, 8);
    }
    for i in 0..8 {
        rt.destroy(&conv(&format!("conc-{i}")).key).await.unwrap();
    }
    assert!(rt.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_paths_make_no_http_call() {
    let target = Target::local(None);
    let server = target.server();
    let rt = target.runtime();
    let m = Manager::new(Store::open_in_memory().unwrap(), Arc::new(target.runtime()));

    // Through the manager, before anything is opened: no request, nothing created.
    let fresh = conv("never-opened");
    let before = server.requests().await;
    for p in ["../x", "/etc/passwd", "a/../../x", "", "a\0b"] {
        assert!(m.check_path(&fresh, p).is_err(), "{p:?}");
    }
    assert_eq!(server.requests().await, before);
    assert!(!std::path::Path::new(&target.root).exists());

    // On an open session: every refused path and bad input fails before any request.
    let s = rt.open(&conv("policy")).await.unwrap();
    let root = s.workspace_root().to_owned();
    let before = server.requests().await;
    let outside = [
        "../x",
        "/etc/passwd",
        "a/../../b",
        "/",
        &format!("{root}-evil/a"),
    ];
    for p in outside {
        assert_eq!(
            s.read(p).await.unwrap_err().code(),
            "outside_workspace",
            "{p}"
        );
        assert_eq!(
            s.write(p, b"x").await.unwrap_err().code(),
            "outside_workspace",
            "{p}"
        );
        assert_eq!(
            s.list(p).await.unwrap_err().code(),
            "outside_workspace",
            "{p}"
        );
        assert_eq!(
            s.stat(p).await.unwrap_err().code(),
            "outside_workspace",
            "{p}"
        );
        assert_eq!(
            s.remove(p, true).await.unwrap_err().code(),
            "outside_workspace",
            "{p}"
        );
        assert_eq!(
            s.mkdir(p).await.unwrap_err().code(),
            "outside_workspace",
            "{p}"
        );
        let e = s.exec(ExecRequest::new("true").cwd(p)).await.unwrap_err();
        assert_eq!(e.code(), "outside_workspace", "{p}");
        let mut g = GrepRequest::new("x");
        g.path = Some(p.to_owned());
        assert_eq!(
            s.grep(&g).await.unwrap_err().code(),
            "outside_workspace",
            "{p}"
        );
    }
    assert_eq!(s.read("").await.unwrap_err().code(), "invalid_path");
    assert_eq!(s.read("a\0b").await.unwrap_err().code(), "invalid_path");
    assert_eq!(
        s.glob("../*").await.unwrap_err().code(),
        "outside_workspace"
    );
    assert_eq!(s.glob("[").await.unwrap_err().code(), "invalid_request");
    assert_eq!(
        s.grep(&GrepRequest::new("(")).await.unwrap_err().code(),
        "invalid_request"
    );
    assert_eq!(
        s.exec(ExecRequest::new("")).await.unwrap_err().code(),
        "invalid_request"
    );
    assert_eq!(
        s.exec(ExecRequest::new("true").env("1BAD", "x"))
            .await
            .unwrap_err()
            .code(),
        "invalid_request"
    );
    assert_eq!(s.remove(".", true).await.unwrap_err().code(), "conflict");
    assert_eq!(
        server.requests().await,
        before,
        "a refused path made an HTTP call"
    );
    rt.destroy(s.key()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commands_and_files_behave_as_the_runtime_contract_says() {
    let target = Target::new();
    let rt = target.runtime();
    let s = rt.open(&conv("contract")).await.unwrap();

    // Exec: separate streams, exit code, env, cwd, stdin, HOME, no caller environment.
    let r = s
        .exec(ExecRequest::new("echo out; echo err >&2; exit 3"))
        .await
        .unwrap();
    assert_eq!(
        (r.status, &r.stdout[..], &r.stderr[..]),
        (ExitStatus::Code(3), &b"out\n"[..], &b"err\n"[..])
    );
    s.mkdir("d/e").await.unwrap();
    let r = s
        .exec(
            ExecRequest::new("pwd; echo \"$X\"; echo \"$HOME\"; cat")
                .cwd("d/e")
                .env("X", "a b")
                .stdin(b"piped".to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8(r.stdout).unwrap(),
        format!("{0}/d/e\na b\n{0}\npiped", s.workspace_root())
    );
    let r = s
        .exec(ExecRequest::new("echo \"${SB_CMD-unset}\""))
        .await
        .unwrap();
    assert_eq!(
        r.stdout, b"unset\n",
        "the wrapper's variables do not reach the command"
    );
    assert_eq!(
        s.exec(ExecRequest::new("true").cwd("missing"))
            .await
            .unwrap_err()
            .code(),
        "not_found"
    );

    // Timeout: the command is killed and reported as timed out.
    let r = s
        .exec(ExecRequest::new("echo started; sleep 30").timeout(Duration::from_millis(1500)))
        .await
        .unwrap();
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.shell_exit_code(), 124);
    assert_eq!(r.stdout, b"started\n");

    // A long command is followed by output polling past the first answer.
    let r = s
        .exec(ExecRequest::new(
            "for i in 1 2 3; do echo $i; sleep 0.3; done",
        ))
        .await
        .unwrap();
    assert_eq!(r.stdout, b"1\n2\n3\n");

    // Output is capped per stream.
    let r = s
        .exec(ExecRequest::new("head -c 5000 /dev/zero | tr '\\0' a").output_limit(100))
        .await
        .unwrap();
    assert_eq!(r.stdout.len(), 100);
    assert!(r.stdout_truncated);

    // Files: byte-exact both ways, atomic replace, edit, list, glob, grep, stat, remove.
    let blob: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    s.write("bin/blob.bin", &blob).await.unwrap();
    assert_eq!(s.read("bin/blob.bin").await.unwrap(), blob);
    let r = s
        .exec(ExecRequest::new("sha256sum bin/blob.bin | cut -c1-64"))
        .await
        .unwrap();
    let local = {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("b"), &blob).unwrap();
        let o = std::process::Command::new("sha256sum")
            .arg(d.path().join("b"))
            .output()
            .unwrap();
        String::from_utf8(o.stdout).unwrap()[..64].to_owned()
    };
    assert_eq!(String::from_utf8(r.stdout).unwrap().trim(), local);
    s.write("notes.md", b"alpha\nbeta\nalpha\n").await.unwrap();
    let e = s
        .edit(
            "notes.md",
            &EditRequest {
                old: "alpha".into(),
                new: "x".into(),
                replace_all: false,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "conflict");
    let r = s
        .edit(
            "notes.md",
            &EditRequest {
                old: "alpha".into(),
                new: "gamma".into(),
                replace_all: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(r.replacements, 2);
    assert_eq!(s.read("notes.md").await.unwrap(), b"gamma\nbeta\ngamma\n");
    let names: Vec<(String, FileKind)> = s
        .list(".")
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.kind))
        .collect();
    assert_eq!(
        names,
        vec![
            ("bin".into(), FileKind::Directory),
            ("d".into(), FileKind::Directory),
            ("notes.md".into(), FileKind::File)
        ]
    );
    assert_eq!(s.glob("**/*.bin").await.unwrap(), vec!["bin/blob.bin"]);
    assert_eq!(s.glob("*.md").await.unwrap(), vec!["notes.md"]);
    let mut g = GrepRequest::new("GAMMA");
    g.case_insensitive = true;
    let hits = s.grep(&g).await.unwrap();
    assert_eq!(
        hits.iter()
            .map(|m| (m.path.as_str(), m.line_number))
            .collect::<Vec<_>>(),
        vec![("notes.md", 1), ("notes.md", 3)]
    );
    g.glob = Some("bin/**".into());
    assert!(s.grep(&g).await.unwrap().is_empty());
    let st = s.stat("bin/blob.bin").await.unwrap();
    assert_eq!((st.kind, st.size), (FileKind::File, 70_000));
    assert_eq!(s.stat("bin").await.unwrap().kind, FileKind::Directory);

    // Typed errors from the server's answers.
    assert_eq!(s.read("missing.txt").await.unwrap_err().code(), "not_found");
    assert_eq!(s.read("bin").await.unwrap_err().code(), "conflict");
    assert_eq!(s.write("bin", b"x").await.unwrap_err().code(), "conflict");
    assert_eq!(s.remove("bin", false).await.unwrap_err().code(), "conflict");
    assert_eq!(s.list("notes.md").await.unwrap_err().code(), "conflict");
    assert_eq!(
        s.mkdir("notes.md").await.unwrap_err().code(),
        "already_exists"
    );
    sh(&*s, "ln notes.md hard").await;
    assert_eq!(
        s.write("notes.md", b"x").await.unwrap_err().code(),
        "conflict"
    );
    s.remove("hard", false).await.unwrap();
    s.remove("bin", true).await.unwrap();
    assert_eq!(s.stat("bin").await.unwrap_err().code(), "not_found");
    // No temporary files are left behind.
    assert_eq!(sh(&*s, "ls -A").await, "d\nnotes.md\n");
    rt.destroy(s.key()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn destroy_kills_background_commands_and_removes_the_workspace() {
    let target = Target::new();
    let rt = target.runtime();
    let c = conv("background");
    let s = rt.open(&c).await.unwrap();
    // A detached process (its own session) outlives the command that started it.
    // (It is given a moment to leave the command's process group, which ends with the command.)
    let pid = sh(
        &*s,
        "setsid sleep 300 >/dev/null 2>&1 </dev/null & p=$!; sleep 0.5; echo $p",
    )
    .await;
    let pid = pid.trim().to_owned();
    let other = rt.open(&conv("observer")).await.unwrap();
    // `kill -0` succeeds on a zombie, which nobody may reap in a container: read the state.
    let alive = format!(
        "s=$(sed -n 's/^State:[[:space:]]*\\(.\\).*/\\1/p' /proc/{pid}/status 2>/dev/null); \
         if [ -n \"$s\" ] && [ \"$s\" != Z ]; then echo alive; else echo dead; fi"
    );
    assert_eq!(sh(&*other, &alive).await, "alive\n");
    let listed = rt.list().await.unwrap();
    let mine = listed.iter().find(|r| r.key == c.key).unwrap();
    assert!(
        mine.processes.iter().any(|p| p.to_string() == pid),
        "{listed:?}"
    );

    let report = rt.destroy(&c.key).await.unwrap();
    assert!(report.workspace_removed);
    assert!(report.processes_killed >= 1, "{report:?}");
    let mut state = String::new();
    for _ in 0..50 {
        state = sh(&*other, &alive).await;
        if state == "dead\n" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, "dead\n");
    assert_eq!(s.read("x").await.unwrap_err().code(), "not_found");
    // Destroying again succeeds and removes nothing.
    let again = rt.destroy(&c.key).await.unwrap();
    assert!(!again.workspace_removed);
    rt.destroy(other.key()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_or_unauthorized_servers_are_typed_errors_without_the_token() {
    // Nothing listens on port 9 of 127.0.0.1 (discard; closed here).
    let mut cfg = AioConfig::new(Endpoint::new("http://127.0.0.1:9"));
    cfg.root = "/tmp/sessionbox-aio-unreachable".into();
    let rt = AioRuntime::new(cfg).unwrap();
    match rt.open(&conv("x")).await {
        Err(Error::RuntimeUnavailable { runtime, hint, .. }) => {
            assert_eq!(runtime, "aio");
            assert!(hint.contains("AIO_SANDBOX_BASE_URL"), "{hint}");
        }
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("opened a conversation on a closed port"),
    }

    let token = "s3cret-token-value";
    let target = Target::local(Some(token));
    let mut wrong = target.endpoint.clone();
    wrong.token = Some(Secret::new("wrong-token-value"));
    let mut cfg = AioConfig::new(wrong);
    cfg.root = target.root.clone();
    let e = match AioRuntime::new(cfg).unwrap().open(&conv("x")).await {
        Err(e) => e,
        Ok(_) => panic!("a wrong token was accepted"),
    };
    let text = format!("{e} {e:?}");
    assert_eq!(e.code(), "unauthorized", "{text}");
    assert!(
        text.contains("AIO_SANDBOX_TOKEN") && text.contains("401"),
        "{text}"
    );
    assert!(
        !text.contains("wrong-token-value") && !text.contains(token),
        "{text}"
    );

    // Both header styles work with the right token.
    for auth in [
        sessionbox_aio::AuthHeader::Bearer,
        sessionbox_aio::AuthHeader::ApiKey,
    ] {
        let mut ep = target.endpoint.clone();
        ep.auth = auth;
        let mut cfg = AioConfig::new(ep);
        cfg.root = target.root.clone();
        let rt = AioRuntime::new(cfg).unwrap();
        let s = rt.open(&conv("authed")).await.unwrap();
        assert_eq!(sh(&*s, "echo ok").await, "ok\n");
        rt.destroy(s.key()).await.unwrap();
    }
}

/// Issue 15: a command's output comes back byte for byte, through `exec` and `exec_stream`
/// (AIO's `/v1/bash/exec` carries text only; the runtime sends the bytes as base64), and the
/// per-command output directories are gone afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_is_exact_bytes_through_exec_and_exec_stream() {
    let target = Target::new();
    let rt = target.runtime();
    let s = rt.open(&conv("exact")).await.unwrap();
    for (name, command, stdout, stderr) in common::exact_cases() {
        let r = s.exec(ExecRequest::new(command)).await.unwrap();
        assert_eq!(r.status, ExitStatus::Code(0), "{name}: {r:?}");
        let want = match stdout {
            Expect::Bytes(b) => b.to_vec(),
            Expect::File(f) => s.read(f).await.unwrap(),
        };
        assert!(!want.is_empty(), "{name}");
        assert!(
            r.stdout == want,
            "{name}: stdout differs ({} bytes, want {})",
            r.stdout.len(),
            want.len()
        );
        assert_eq!(r.stderr, stderr, "{name}: stderr");

        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut sink = |stream: OutputStream, b: &[u8]| match stream {
            OutputStream::Stdout => out.extend_from_slice(b),
            OutputStream::Stderr => err.extend_from_slice(b),
        };
        let r2 = s
            .exec_stream(ExecRequest::new(command), &mut sink)
            .await
            .unwrap();
        let want = match stdout {
            Expect::Bytes(b) => b.to_vec(),
            Expect::File(f) => s.read(f).await.unwrap(),
        };
        assert!(
            out == want && r2.stdout == want,
            "{name}: streamed stdout differs"
        );
        assert_eq!(err, stderr, "{name}: streamed stderr");
    }
    // The cap still holds on exact output, and a timed-out command keeps its partial bytes.
    let r = s
        .exec(ExecRequest::new(r"printf '\377\000\377\000'").output_limit(3))
        .await
        .unwrap();
    assert_eq!(
        (&r.stdout[..], r.stdout_truncated),
        (&b"\xff\0\xff"[..], true)
    );
    let r = s
        .exec(ExecRequest::new(r"printf '\377x'; sleep 30").timeout(Duration::from_millis(1500)))
        .await
        .unwrap();
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.stdout, b"\xffx");
    // A command killed by a signal reports it, as on the other runtimes.
    let r = s.exec(ExecRequest::new("kill -9 $$")).await.unwrap();
    assert_eq!(r.status, ExitStatus::Signal(9), "{r:?}");
    if target.server.is_some() {
        let outputs = std::path::Path::new(&target.root).join(".sessionbox-exec");
        let left: Vec<_> = std::fs::read_dir(&outputs)
            .map(|d| d.collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "output directories left behind: {left:?}");
    }
    rt.destroy(s.key()).await.unwrap();
}
