//! Escape tests of the `isolated` runtime: real sandboxes, launched the way the CLI launches them
//! (the real `sessionbox` binary as init and agent, a store-backed uid allocator, the manager),
//! real attacks from inside, and every verdict read on the HOST: files on the host, the host's
//! `/proc`, the sandbox's cgroups. Each test names its attack, is bounded in time, and destroys
//! what it made (an idle timeout of 3 s and `Env`'s drop are the second and third nets).
//!
//! They need root (CI runs them as root); without it each prints SKIPPED and passes.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them); support modules are `pub` for the files that use them,
// and a test binary has no public API.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sessionbox_core::{
    ConversationKey, EditRequest, Error, ExecRequest, ExitStatus, GrepRequest, Session,
};
use sessionbox_sandbox::SandboxLimits;

use support::*;

macro_rules! needs_root {
    () => {
        if !is_root() {
            eprintln!("SKIPPED: isolated runtime tests need root (CI runs them as root)");
            return;
        }
    };
}

/// The bomb tests measure how fast others answer: one at a time.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What the sandbox's root holds; anything else of the host's `/` must stay out of sight.
const SANDBOX_ROOT: &[&str] = &[
    ".sessionbox",
    "bin",
    "dev",
    "etc",
    "lib",
    "lib32",
    "lib64",
    "libx32",
    "proc",
    "sbin",
    "tmp",
    "usr",
    "workspace",
];

/// Asserts a refusal for leaving the workspace whose message carries none of `secrets`.
fn refused(what: &str, e: &Error, secrets: &[String]) {
    assert_eq!(
        e.code(),
        "outside_workspace",
        "{what}: refused for another reason: {e}"
    );
    let msg = e.to_string();
    for s in secrets {
        assert!(
            !msg.contains(s.as_str()),
            "{what}: the error carries file contents: {msg}"
        );
    }
}

/// Every file operation of the Session API aimed at `path`, each with its outcome.
async fn attempts(
    s: &dyn Session,
    path: &str,
    payload: &str,
) -> Vec<(&'static str, Result<String, Error>)> {
    let edit = EditRequest {
        old: "root".into(),
        new: payload.into(),
        replace_all: true,
    };
    let mut grep = GrepRequest::new("root");
    grep.path = Some(path.to_owned());
    let mut out = vec![
        ("read", s.read(path).await.map(|d| text(&d))),
        (
            "write",
            s.write(path, payload.as_bytes())
                .await
                .map(|()| "written".into()),
        ),
        ("edit", s.edit(path, &edit).await.map(|e| format!("{e:?}"))),
        ("stat", s.stat(path).await.map(|st| format!("{st:?}"))),
        ("list", s.list(path).await.map(|e| format!("{e:?}"))),
        ("grep", s.grep(&grep).await.map(|m| format!("{m:?}"))),
        (
            "mkdir",
            s.mkdir(&format!("{path}/sub"))
                .await
                .map(|()| "made".into()),
        ),
    ];
    // Removing a link itself is allowed; removing through one is not.
    if path.trim_end_matches('/').contains('/') {
        out.push((
            "remove",
            s.remove(path, true).await.map(|()| "removed".into()),
        ));
    }
    out
}

/// The lines of `out` between `== NAME` and the next `== ` line.
fn section<'a>(out: &'a str, name: &str) -> Vec<&'a str> {
    out.lines()
        .skip_while(|l| *l != format!("== {name}"))
        .skip(1)
        .take_while(|l| !l.starts_with("== "))
        .collect()
}

/// Lines `NAME CODE` of a `r NAME command...` script: every command must have failed.
fn all_failed(out: &str, names: &[&str]) {
    for name in names {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(*name))
            .unwrap_or_else(|| panic!("no result for {name} in:\n{out}"));
        let code = line.split_whitespace().nth(1).unwrap_or("");
        assert_ne!(code, "0", "{name} succeeded inside the sandbox:\n{out}");
    }
}

/// CVE-2025-53109 (`ln -s /etc/passwd leak`), LightFTP #72 (`r -> /`, an intermediate link),
/// DesktopCommanderMCP #420 (writing through a link to a new file outside) and `d/up -> ../..`:
/// every `symlink_cases` entry of the shared cases, the link made by a command inside the
/// sandbox and the operation sent through the Session file API. The operation is refused as
/// leaving the workspace, and so is every other file operation on the same path. Nothing is
/// read out (no line of the host's `/etc/passwd` in any error) and nothing is created or
/// changed: the host's `/tmp` target (a unique name) does not exist, nor the sandbox's, nor
/// `x.txt` in the data directory or `/`; the workspaces on the host are exactly as the setup
/// left them; the payload is nowhere in the data directory. Before each destroy the links are
/// pointed at a canary directory, which the destroy must leave intact (it never follows a link
/// out of the workspace; aimed at the host's `/`, a bug there would wipe the host).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn symlink_escape_cases_are_refused_by_the_file_api_and_change_nothing_on_the_host() {
    needs_root!();
    bounded(120, async {
        let cases: serde_json::Value = serde_json::from_str(include_str!(
            "../../sessionbox-core/tests/cases/workspace-paths.json"
        ))
        .unwrap();
        let cases = cases["symlink_cases"].as_array().expect("symlink_cases");
        assert!(cases.len() >= 4, "{cases:?}");
        let env = Env::new(3);
        let host_passwd = std::fs::read("/etc/passwd").unwrap();
        let secrets: Vec<String> = text(&host_passwd)
            .lines()
            .filter(|l| l.len() >= 12)
            .map(str::to_owned)
            .collect();
        for (i, case) in cases.iter().enumerate() {
            let outside = format!("/tmp/{}-outside-new.txt", unique("link"));
            let setup = case["setup"]
                .as_str()
                .unwrap()
                .replace("/tmp/outside-new.txt", &outside);
            let op = case["op"].as_str().unwrap();
            let what = format!("case {i} `{setup}` then `{op}` ({})", case["expect"]);
            let (verb, path) = op.split_once(' ').unwrap();
            let id = format!("link-{i}");
            let conv = env.open(&id).await;
            let r = sh(&conv, &setup).await;
            assert!(r.success(), "{what}: setup failed: {r:?}");
            let before = tree(&env.data.join("workspaces"));
            let payload = unique("payload");

            let err = match verb {
                "read" => match conv.read(path).await {
                    Ok(d) => panic!("{what}: read returned {:?}", text(&d)),
                    Err(e) => e,
                },
                "write" => match conv.write(path, payload.as_bytes()).await {
                    Ok(()) => panic!("{what}: write succeeded"),
                    Err(e) => e,
                },
                v => panic!("{what}: unknown operation {v:?}"),
            };
            refused(&what, &err, &secrets);
            for (name, result) in attempts(&conv, path, &payload).await {
                match result {
                    Ok(v) => panic!("{what}: {name} {path:?} succeeded: {v}"),
                    Err(e) => refused(&format!("{what}: {name}"), &e, &secrets),
                }
            }

            assert_eq!(
                tree(&env.data.join("workspaces")),
                before,
                "{what}: a workspace changed on the host"
            );
            assert!(
                !Path::new(&outside).exists(),
                "{what}: the host's {outside} was created"
            );
            for p in [
                env.data.join("x.txt"),
                env.data.join("workspaces/x.txt"),
                PathBuf::from("/x.txt"),
            ] {
                assert!(!p.exists(), "{what}: {} was created", p.display());
            }
            assert_eq!(std::fs::read("/etc/passwd").unwrap(), host_passwd, "{what}");
            assert!(
                !tree(&env.data).values().any(|v| v.contains(&payload)),
                "{what}: the payload reached the data directory"
            );
            let inside = sh(
                &conv,
                &format!(
                    "for p in {outside} /x.txt /tmp/x.txt; do test -e $p && echo \"$p exists\"; done; \
                     grep -rl {payload} /tmp /workspace /dev/shm 2>/dev/null; true"
                ),
            )
            .await;
            assert_eq!(text(&inside.stdout), "", "{what}: inside the sandbox");

            // `destroy` removes the workspace as root on the host, where these links lead to
            // the host's `/` or files: a destroy that followed one would remove what it leads
            // to. Every link is first pointed at a canary directory of this test, so that such
            // a bug fails the assertion below instead of wiping the host.
            let canary = env.data.parent().unwrap().join(format!("canary-{i}"));
            std::fs::create_dir_all(canary.join("dir")).unwrap();
            std::fs::write(canary.join("dir/keep"), "keep").unwrap();
            let r = sh(
                &conv,
                &format!(
                    "find . -type l -exec ln -sfn {} {{}} \\;",
                    canary.display()
                ),
            )
            .await;
            assert!(r.success(), "{what}: {r:?}");
            let ws = env.workspace(conv.key());
            let links: Vec<String> = tree(&ws)
                .into_values()
                .filter(|v| v.starts_with("link"))
                .collect();
            assert!(!links.is_empty(), "{what}");
            for l in &links {
                assert_eq!(l, &format!("link -> {canary:?}"), "{what}");
            }
            drop(conv);
            let out = env.manager.destroy(&Env::conv(&id)).await.unwrap();
            assert!(out.runtime.workspace_removed, "{what}: {out:?}");
            assert!(!ws.exists(), "{what}");
            assert_eq!(
                std::fs::read_to_string(canary.join("dir/keep")).ok().as_deref(),
                Some("keep"),
                "{what}: destroy followed a link out of the workspace"
            );
        }
    })
    .await;
}

/// Conversation A aims at conversation B's workspace by its absolute host path (the path the
/// runtime itself reports as B's location): `cat`, `ls`, `echo >`, `touch`, `cp`, `mkdir`,
/// `rm`, `mv` and `find` from a command, and the absolute path and links to it through every
/// file operation of the API. B's secret never appears, every command fails, every operation
/// is refused, and on the host B's workspace holds exactly what B put there, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conversation_a_cannot_read_list_or_write_b_by_b_host_path() {
    needs_root!();
    bounded(60, async {
        let env = Env::new(3);
        let a = env.open("alice").await;
        let b = env.open("bob").await;
        let secret = unique("secret");
        b.write("secret.txt", secret.as_bytes()).await.unwrap();
        let b_ws = env.workspace(b.key());
        // The aim is right: this is where B's file is on the host.
        assert_eq!(
            std::fs::read(b_ws.join("secret.txt")).unwrap(),
            secret.as_bytes()
        );
        let b_before = tree(&b_ws);
        let bp = b_ws.display().to_string();
        let data = env.data.display().to_string();
        let script = format!(
            r#"r() {{ name=$1; shift; "$@" > /tmp/out 2>&1; echo "$name $?"; cat /tmp/out; }}
r cat cat {bp}/secret.txt
r ls ls -la {bp}
r ls-data ls -la {data}/workspaces
r write sh -c 'echo pwned > {bp}/pwned.txt'
r touch touch {bp}/pwned2.txt
r cp cp /etc/hostname {bp}/pwned3.txt
r mkdir mkdir {bp}/pwned-dir
r rm rm {bp}/secret.txt
r mv mv {bp}/secret.txt /workspace/stolen.txt
r find find {data} -name secret.txt
r cd cd {bp}
"#
        );
        let r = sh(&a, &script).await;
        let out = text(&r.stdout) + &text(&r.stderr);
        assert!(!out.contains(&secret), "A read B's secret:\n{out}");
        all_failed(
            &out,
            &[
                "cat", "ls", "ls-data", "write", "touch", "cp", "mkdir", "rm", "mv", "find", "cd",
            ],
        );

        let r = sh(&a, &format!("ln -s {bp}/secret.txt lb && ln -s {bp} db")).await;
        assert!(r.success(), "{r:?}");
        let absolute = [
            format!("{bp}/secret.txt"),
            format!("{bp}/pwned.txt"),
            bp.clone(),
        ];
        let links = ["lb", "db", "db/secret.txt", "db/pwned.txt"];
        for path in absolute.iter().map(String::as_str).chain(links) {
            for (name, result) in attempts(&a, path, "pwned").await {
                match result {
                    Ok(v) => panic!("A's {name} {path:?} succeeded: {v}"),
                    Err(e) => {
                        refused(
                            &format!("A's {name} {path:?}"),
                            &e,
                            std::slice::from_ref(&secret),
                        );
                    }
                }
            }
        }
        // Searching A's own workspace, which holds links to B's, finds nothing of B's.
        let found = a.grep(&GrepRequest::new(secret.clone())).await;
        assert!(
            found.as_ref().map_or(true, Vec::is_empty),
            "grep in A: {found:?}"
        );
        if let Ok(paths) = a.glob("**/*").await {
            assert!(!paths.iter().any(|p| p.contains("secret.txt")), "{paths:?}");
        }

        assert_eq!(tree(&b_ws), b_before, "B's workspace changed on the host");
        assert!(
            !tree(&env.data)
                .keys()
                .any(|p| p.to_string_lossy().contains("pwned")
                    || p.to_string_lossy().contains("stolen")),
            "{:#?}",
            tree(&env.data)
        );
        assert_eq!(b.read("secret.txt").await.unwrap(), secret.as_bytes());
        drop((a, b));
        // A's workspace holds links to B's: destroying A does not follow them.
        env.manager.destroy(&Env::conv("alice")).await.unwrap();
        assert_eq!(tree(&b_ws), b_before, "destroying A changed B's workspace");
        env.manager.destroy(&Env::conv("bob")).await.unwrap();
    })
    .await;
}

/// Through `/proc`, conversation A sees only its own processes and its own root. While B runs a
/// marker command (seen from the host in B's cgroup), A's `/proc` shows no process of B: not by
/// command line, not by any of B's host pids (marker, agent, init, monitor). Every
/// `/proc/*/root` A can open, `/proc/1/root` included, shows the sandbox's root and none of the
/// host's own top-level directories (`/proc/1/root` of the init is not even readable), and B's
/// file is not reachable through any `/proc/*/root`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sees_only_its_own_processes_and_its_own_root_through_proc() {
    needs_root!();
    bounded(60, async {
        let env = Env::new(3);
        let a = env.open("alice").await;
        let b = env.open("bob").await;
        let secret = unique("secret");
        b.write("secret.txt", secret.as_bytes()).await.unwrap();
        let bp = env.workspace(b.key()).display().to_string();
        let data = env.data.display().to_string();
        let b_rec = env.record(b.key());
        let marker = format!("sleep 29.{}", 100_000 + std::process::id() % 800_000);

        let b_side = b.exec(ExecRequest::new(marker.clone()).timeout(Duration::from_secs(5)));
        let a_side = async {
            let mut seen = None;
            let up = eventually(4.0, || {
                seen = b_rec.members().into_iter().find(|p| p.cmdline == marker);
                seen.is_some()
            })
            .await;
            assert!(up, "B's marker never ran");
            let b_agent = b_rec.agent().expect("B's agent");
            let host_pids = [seen.unwrap().pid, b_agent.pid, b_rec.init, b_rec.monitor];
            let pids = host_pids.map(|p| p.to_string()).join(" ");
            let script = format!(
                r#"echo "== cmdlines"; for p in /proc/[0-9]*; do printf '%s: ' $p; tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done
echo "== host pids"; for p in {pids}; do test -e /proc/$p && echo "visible $p"; done
echo "== roots"; for p in /proc/1 /proc/[0-9]* /proc/self; do ls -A $p/root/ 2>/dev/null; done
echo "== init root"; ls -A /proc/1/root/ 2>&1
echo "== through root"; cat /proc/[0-9]*/root{bp}/secret.txt /proc/self/root{bp}/secret.txt 2>&1; ls /proc/[0-9]*/root{data} 2>&1
echo "== end""#
            );
            sh(&a, &script).await
        };
        let (b_result, r) = tokio::join!(b_side, a_side);
        let b_result = b_result.unwrap();
        assert!(b_result.timed_out, "B's marker: {b_result:?}");
        let out = text(&r.stdout);

        let cmdlines = section(&out, "cmdlines");
        assert!(!cmdlines.is_empty(), "{out}");
        for l in &cmdlines {
            assert!(!l.contains("sleep"), "A sees B's process: {l}\n{out}");
        }
        // init, agent, the shell and its pipeline: nothing else lives in A.
        assert!(cmdlines.len() <= 8, "{out}");
        assert_eq!(section(&out, "host pids"), Vec::<&str>::new(), "{out}");

        let roots: BTreeSet<&str> = section(&out, "roots").into_iter().collect();
        assert!(
            roots.contains("workspace"),
            "no /proc/*/root was readable: {out}"
        );
        let host_only: Vec<String> = std::fs::read_dir("/")
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !SANDBOX_ROOT.contains(&n.as_str()))
            .collect();
        assert!(!host_only.is_empty());
        for name in &roots {
            assert!(
                SANDBOX_ROOT.contains(name),
                "a /proc/*/root shows {name:?}, which is not the sandbox's:\n{out}"
            );
        }
        for name in section(&out, "init root") {
            assert!(
                !host_only.iter().any(|h| h == name),
                "/proc/1/root shows the host's {name}:\n{out}"
            );
        }
        let through = section(&out, "through root").join("\n");
        assert!(!through.contains(&secret), "{out}");
        assert!(!r.stdout.is_empty() && out.contains("== end"), "{out}");
        drop((a, b));
        for id in ["alice", "bob"] {
            env.manager.destroy(&Env::conv(id)).await.unwrap();
        }
    })
    .await;
}

/// A hard link to B's file, by B's host path, through `/proc/*/root`, from inside B's directory,
/// or with `ln -L` through a symbolic link, fails; writing through whatever the attempts left
/// reaches nothing of B's. On the host B's file keeps its content, its single link and its
/// owner, and no file in A's workspace shares its inode.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cannot_hard_link_b_files() {
    needs_root!();
    bounded(60, async {
        use std::os::unix::fs::MetadataExt;
        let env = Env::new(3);
        let a = env.open("alice").await;
        let b = env.open("bob").await;
        let original = unique("original");
        b.write("victim.txt", original.as_bytes()).await.unwrap();
        let b_ws = env.workspace(b.key());
        let victim = b_ws.join("victim.txt");
        let before = std::fs::metadata(&victim).unwrap();
        assert_eq!(before.nlink(), 1);
        let bp = b_ws.display().to_string();
        let script = format!(
            r#"r() {{ name=$1; shift; "$@" > /dev/null 2>&1; echo "$name $?"; }}
r ln ln {bp}/victim.txt hl
r ln-proc-root sh -c 'ln /proc/[0-9]*/root{bp}/victim.txt hl2'
r ln-self-root ln /proc/self/root{bp}/victim.txt hl3
r ln-from-b sh -c 'cd {bp} && ln victim.txt /workspace/hl4'
ln -s {bp}/victim.txt sym
r ln-L ln -L sym hl5
for f in hl hl2 hl3 hl4 hl5; do echo pwned > $f 2>/dev/null; done
true"#
        );
        let r = sh(&a, &script).await;
        let out = text(&r.stdout);
        all_failed(
            &out,
            &["ln", "ln-proc-root", "ln-self-root", "ln-from-b", "ln-L"],
        );
        // Through the API too: a write to the names the attacks used reaches only A.
        a.write("hl", b"pwned").await.unwrap();

        let after = std::fs::metadata(&victim).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), original.as_bytes());
        assert_eq!(after.nlink(), 1, "B's file gained a link");
        assert_eq!(after.uid(), before.uid());
        assert_eq!(after.ino(), before.ino());
        for (p, _) in tree(&env.workspace(a.key())) {
            let m = std::fs::symlink_metadata(&p).unwrap();
            assert!(
                !(m.ino() == after.ino() && m.dev() == after.dev()),
                "{} is B's file",
                p.display()
            );
        }
        drop((a, b));
        // A's workspace holds a link to B's file: destroying A does not follow it.
        env.manager.destroy(&Env::conv("alice")).await.unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), original.as_bytes());
        env.manager.destroy(&Env::conv("bob")).await.unwrap();
    })
    .await;
}

/// A secret in the manager's environment never reaches the sandbox. (1) The real CLI launches
/// the sandbox with a unique variable and an AWS-style secret in its own environment: neither
/// name nor value appears in `env` inside, in `/proc/*/environ` of any process the sandbox can
/// see, nor, read from the host, in the environment of the monitor, the init, the agent or any
/// other process of the sandbox, nor in the agent's log. (2) In-process, the same for every
/// variable cargo set for this test process (`CARGO_MANIFEST_DIR`, ...).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn manager_environment_secrets_never_reach_the_sandbox() {
    needs_root!();
    bounded(60, async {
        let env = Env::new(3);
        let name = format!("SESSIONBOX_ESCAPE_SECRET_{}", std::process::id());
        let value = unique("secretvalue");
        let aws = unique("awssecret");
        let script = r#"env; for f in /proc/[0-9]*/environ /proc/self/environ; do echo "== $f"; tr '\0' '\n' < $f; done 2>&1; echo "== cmdlines"; cat /proc/[0-9]*/cmdline | tr '\0' ' '"#;
        let out = env.cli(
            &["exec", "-c", "envcli", "--", script],
            &[(&name, &value), ("AWS_SECRET_ACCESS_KEY", &aws)],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        let inside = text(&out.stdout) + &text(&out.stderr);
        assert!(inside.contains("HOME=/workspace"), "{inside}");
        for s in [&name, &value, &aws, &"AWS_SECRET_ACCESS_KEY".to_owned()] {
            assert!(!inside.contains(s.as_str()), "{s} is visible inside:\n{inside}");
        }
        let key = Env::conv("envcli").key;
        let rec = env.record(&key);
        let mut pids = vec![rec.monitor, rec.init];
        pids.extend(rec.members().iter().map(|p| p.pid));
        assert!(rec.agent().is_some_and(|a| pids.contains(&a.pid)));
        for pid in &pids {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let environ = text(&environ);
            for s in [&value, &aws] {
                assert!(
                    !environ.contains(s.as_str()),
                    "host process {pid} of the sandbox has the secret"
                );
            }
        }
        let log = std::fs::read(env.run_dir(&key).join("agent.log")).unwrap_or_default();
        assert!(!text(&log).contains(&value) && !text(&log).contains(&aws));

        // In-process: this test process's own variables.
        let mine: Vec<String> = std::env::vars()
            .map(|(k, _)| k)
            .filter(|k| {
                !matches!(
                    k.as_str(),
                    "PATH" | "HOME" | "LANG" | "TERM" | "PWD" | "SHLVL" | "_" | "OLDPWD"
                )
            })
            .collect();
        assert!(mine.iter().any(|k| k == "CARGO_MANIFEST_DIR"), "{mine:?}");
        let conv = env.open("envlib").await;
        let r = sh(&conv, script).await;
        let inside = text(&r.stdout);
        assert!(inside.contains("HOME=/workspace"), "{inside}");
        let rec = env.record(conv.key());
        let mut host_env = String::new();
        for p in rec.members() {
            host_env += &text(&std::fs::read(format!("/proc/{}/environ", p.pid)).unwrap_or_default())
                .replace('\0', "\n");
        }
        for k in &mine {
            let set = format!("{k}=");
            assert!(
                !inside.lines().any(|l| l.starts_with(&set)),
                "{k} reached the sandbox:\n{inside}"
            );
            assert!(
                !host_env.lines().any(|l| l.starts_with(&set)),
                "{k} is in the environment of a sandbox process (read from the host)"
            );
        }
        drop(conv);
        for id in ["envcli", "envlib"] {
            env.manager.destroy(&Env::conv(id)).await.unwrap();
        }
    })
    .await;
}

/// `mount` (the tool and the raw system call, tmpfs, bind and proc), `umount`, `unshare` of
/// the user (`-U`, `-r`), mount, PID and network namespaces, and `ptrace` (`strace -p`,
/// `strace` of a child, `gdb -p`, raw PTRACE_ATTACH/SEIZE/TRACEME and `process_vm_readv`) all
/// fail inside. From the host: the unique tmpfs source is in no mount table (the host's, the
/// sandbox init's, the agent's), every process of the sandbox stayed in the init's user, mount,
/// PID and network namespaces throughout, and none was ever traced (`TracerPid` 0), including
/// the victim the attacks aimed at.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mount_unshare_and_ptrace_fail_inside_and_change_nothing_on_the_host() {
    needs_root!();
    bounded(90, async {
        let env = Env::new(3);
        let a = env.open("attacker").await;
        let rec = env.record(a.key());
        let src = unique("mnt");
        let perl = if cfg!(target_arch = "x86_64") {
            r#"perl -e '$p = shift; $m = shift; my ($t, $f, $proc) = ("/tmp/m", "tmpfs", "/proc");
  $r = syscall(165, $m, $t, $f, 0, 0); print "sys-mount $r $!\n";
  $r = syscall(166, $proc, 2); print "sys-umount2 $r $!\n";
  $r = syscall(272, 0x10000000); print "sys-unshare $r $!\n";
  $r = syscall(101, 16, $p, 0, 0); print "ptrace-attach $r $!\n";
  $r = syscall(101, 0x4206, $p, 0, 0); print "ptrace-seize $r $!\n";
  $r = syscall(101, 0, 0, 0, 0); print "ptrace-traceme $r $!\n";
  $r = syscall(310, $p, 0, 1, 0, 1, 0); print "process-vm-readv $r $!\n";' $victim SRC"#
                .replace("SRC", &src)
        } else {
            String::new()
        };
        let script = format!(
            r#"mkdir -p /tmp/m
r() {{ name=$1; shift; "$@" > /dev/null 2>&1; echo "$name $?"; }}
r mount mount -t tmpfs {src} /tmp/m
r mount-bind mount --bind /workspace /tmp/m
r mount-proc mount -t proc proc /tmp/m
r umount umount /proc
r unshare-U unshare -U true
r unshare-r unshare -r true
r unshare-m unshare -m true
r unshare-p unshare -p -f true
r unshare-n unshare -n true
sleep 30 & victim=$!
r strace-p timeout 10 strace -p $victim -o /dev/null
r strace-child timeout 10 strace -f -o /dev/null true
timeout 10 gdb -batch -nx -p $victim > /tmp/gdb 2>&1; echo "gdb $?"
{perl}
echo "mounted $(grep -c {src} /proc/self/mountinfo)"
sleep 0.3
kill $victim"#
        );
        let init = proc_info(rec.init).expect("init");
        let kinds = ["user", "mnt", "pid", "net"];
        let init_ns: Vec<_> = kinds.iter().map(|k| init.ns(k)).collect();
        let done = std::sync::atomic::AtomicBool::new(false);
        let exec = async {
            let r = sh(&a, &script).await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            r
        };
        let watch = async {
            let mut traced = Vec::new();
            let mut escaped = Vec::new();
            let mut victim_seen = false;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                for p in rec.members() {
                    if p.pid == rec.monitor {
                        continue;
                    }
                    victim_seen |= p.cmdline == "sleep 30";
                    if p.tracer != 0 {
                        traced.push(p.clone());
                    }
                    let ns: Vec<_> = kinds.iter().map(|k| p.ns(k)).collect();
                    if p.alive() && ns.iter().zip(&init_ns).any(|(a, b)| a.is_some() && a != b) {
                        escaped.push(p);
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (traced, escaped, victim_seen)
        };
        let (r, (traced, escaped, victim_seen)) = tokio::join!(exec, watch);
        let out = text(&r.stdout) + &text(&r.stderr);
        all_failed(
            &out,
            &[
                "mount",
                "mount-bind",
                "mount-proc",
                "umount",
                "unshare-U",
                "unshare-r",
                "unshare-m",
                "unshare-p",
                "unshare-n",
                "strace-p",
                "strace-child",
                "gdb",
            ],
        );
        if cfg!(target_arch = "x86_64") {
            for l in [
                "sys-mount -1 Operation not permitted",
                "sys-umount2 -1 Operation not permitted",
                "sys-unshare -1 Operation not permitted",
                "ptrace-attach -1 Operation not permitted",
                "ptrace-seize -1 Operation not permitted",
                "ptrace-traceme -1 Operation not permitted",
                "process-vm-readv -1 Operation not permitted",
            ] {
                assert!(out.lines().any(|x| x == l), "missing {l:?} in:\n{out}");
            }
        }
        assert!(out.contains("mounted 0"), "{out}");
        assert!(victim_seen, "the watcher never saw the victim: {out}");
        assert!(traced.is_empty(), "traced from inside: {traced:?}");
        assert!(
            escaped.is_empty(),
            "left the sandbox's namespaces: {escaped:?}"
        );
        let agent = rec.agent().expect("agent");
        for pid in [std::process::id(), 1, rec.init, agent.pid] {
            let table = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
            assert!(
                !table.contains(&src),
                "{src} is mounted in the view of {pid}"
            );
            if pid == rec.init {
                assert!(table.contains(" /workspace "), "{table}");
            }
        }
        drop(a);
        env.manager.destroy(&Env::conv("attacker")).await.unwrap();
    })
    .await;
}

/// A command that backgrounds children (`sleep 1000 &`, twice, and once from a subshell) and
/// waits is killed at its 1 s timeout with its whole process group: the call reports
/// `timed_out` within a few seconds, and from the host, no `sleep 1000` remains in the
/// sandbox's cgroup, and every `sleep 1000` host process the watcher saw while it ran is gone.
/// The agent itself is untouched and answers the next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timeout_kills_the_whole_process_group_with_background_children() {
    needs_root!();
    bounded(60, async {
        let env = Env::new(3);
        let a = env.open("sleeper").await;
        let rec = env.record(a.key());
        let agent = rec.agent().expect("agent");
        let done = std::sync::atomic::AtomicBool::new(false);
        let exec = async {
            let started = Instant::now();
            let r = a
                .exec(
                    ExecRequest::new(
                        "sleep 1000 & echo $! > pid; sleep 1000 & echo $! >> pid; (sleep 1000 &); wait",
                    )
                    .timeout(Duration::from_secs(1)),
                )
                .await
                .unwrap();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            (r, started.elapsed())
        };
        let watch = async {
            let mut seen: Vec<Proc> = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                for p in rec.members() {
                    if p.cmdline == "sleep 1000" && !seen.iter().any(|s| s.pid == p.pid) {
                        seen.push(p);
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            seen
        };
        let ((r, took), seen) = tokio::join!(exec, watch);
        assert!(r.timed_out, "{r:?}");
        assert!(took < Duration::from_secs(5), "took {took:?}");
        assert_eq!(seen.len(), 3, "the watcher saw {seen:?}");
        let gone = eventually(2.0, || {
            seen.iter().all(|p| !p.alive())
                && !rec.members().iter().any(|p| p.cmdline.starts_with("sleep"))
        })
        .await;
        assert!(
            gone,
            "left running: {:?}",
            rec.members()
                .into_iter()
                .filter(|p| p.cmdline.starts_with("sleep"))
                .collect::<Vec<_>>()
        );
        assert!(agent.alive(), "the agent was killed with the command");
        let r = sh(&a, "cat pid | wc -l").await;
        assert_eq!(text(&r.stdout).trim(), "2");
        drop(a);
        env.manager.destroy(&Env::conv("sleeper")).await.unwrap();
    })
    .await;
}

/// Small limits for the bomb tests (what a host with many conversations would set).
fn bomb_limits() -> SandboxLimits {
    SandboxLimits {
        pids: 128,
        nproc: 128,
        memory_bytes: 256 << 20,
        tmpfs_bytes: 64 << 20,
        ..SandboxLimits::default()
    }
}

/// Runs `attack` in A while B answers `echo ok` and the host starts `/bin/true`, again and
/// again; returns the attack's result and the slowest B and host answers.
async fn while_attacking(
    a: &dyn Session,
    b: &dyn Session,
    attack: ExecRequest,
) -> (
    sessionbox_core::Result<sessionbox_core::ExecResult>,
    Duration,
    Duration,
    usize,
) {
    let done = std::sync::atomic::AtomicBool::new(false);
    let attack = async {
        let r = a.exec(attack).await;
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        r
    };
    let probe = async {
        let (mut slowest_b, mut slowest_host, mut n) = (Duration::ZERO, Duration::ZERO, 0);
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            let t = Instant::now();
            let r = b
                .exec(ExecRequest::new("echo ok").timeout(Duration::from_secs(30)))
                .await
                .expect("B answers");
            assert_eq!(text(&r.stdout), "ok\n", "{r:?}");
            slowest_b = slowest_b.max(t.elapsed());
            let t = Instant::now();
            let ok = tokio::task::spawn_blocking(|| std::process::Command::new("true").status())
                .await
                .unwrap()
                .unwrap();
            assert!(ok.success());
            slowest_host = slowest_host.max(t.elapsed());
            n += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (slowest_b, slowest_host, n)
    };
    let (r, (sb, sh, n)) = tokio::join!(attack, probe);
    (r, sb, sh, n)
}

/// After an attack: A answers again, on the running agent or after a clean relaunch.
async fn a_recovers(env: &Env, id: &str) {
    let conv = env.open(id).await;
    let r = conv
        .exec(ExecRequest::new("echo alive").timeout(Duration::from_secs(20)))
        .await;
    match r {
        Ok(r) if text(&r.stdout) == "alive\n" => {}
        other => {
            eprintln!("A did not answer after the attack ({other:?}); reopening");
            drop(conv);
            let conv = env.open(id).await;
            let r = sh(&conv, "echo alive").await;
            assert_eq!(text(&r.stdout), "alive\n", "{r:?}");
        }
    }
}

/// A fork bomb (`f(){ f|f& }; (f) &`, its shell then waiting in `sleep`) in conversation A is contained by its cgroup's `pids.max`:
/// from the host, A's `pids.current` never passes the limit, `pids.events` shows the limit was
/// hit, and no process of A's uid exists outside its cgroup; meanwhile conversation B answers
/// every `echo` in under 2 s and the host starts processes in under 2 s. The bomb ends at its
/// timeout with its whole group; afterwards A answers again and its cgroup holds only the
/// sandbox's own processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fork_bomb_in_a_is_contained_while_b_keeps_answering() {
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(120, async {
        let env = Env::with_limits(3, bomb_limits());
        let a = env.open("bomber").await;
        let b = env.open("bystander").await;
        let rec = env.record(a.key());
        let uid = env.uid(a.key());
        let pids = rec.cgroup("pids");
        let read = |f: &str| std::fs::read_to_string(pids.join(f)).unwrap_or_default();
        assert_eq!(read("pids.max").trim(), "128");
        let peak = std::sync::atomic::AtomicU64::new(0);
        let outside = std::sync::Mutex::new(Vec::new());
        let stop = std::sync::atomic::AtomicBool::new(false);
        let watch = async {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(n) = read("pids.current").trim().parse::<u64>() {
                    peak.fetch_max(n, std::sync::atomic::Ordering::SeqCst);
                }
                // A process of A's uid outside A's cgroup. A child is visible in /proc a
                // moment before the kernel links it to its parent's cgroups: look twice.
                let suspects: Vec<Proc> = processes()
                    .into_iter()
                    .filter(|p| p.uid == uid && !p.exiting() && !p.in_cgroup(&rec.name()))
                    .collect();
                if !suspects.is_empty() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    for p in suspects {
                        if let Some(now) = proc_info(p.pid).filter(|n| {
                            n.start == p.start
                                && n.state != 'Z'
                                && !n.exiting()
                                && !n.in_cgroup(&rec.name())
                        }) {
                            outside.lock().unwrap().push(now);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let attack = async {
            let r = while_attacking(
                &a,
                &b,
                ExecRequest::new("f(){ f|f& }; (f) & exec sleep 30").timeout(Duration::from_secs(6)),
            )
            .await;
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            r
        };
        let ((r, slowest_b, slowest_host, probes), ()) = tokio::join!(attack, watch);
        let summary = r.as_ref().map(|r| (r.status, r.timed_out, r.duration, r.stderr.len()));
        eprintln!(
            "fork bomb: {summary:?}; B slowest {slowest_b:?}, host slowest {slowest_host:?} over {probes} probes; pids peak {}",
            peak.load(std::sync::atomic::Ordering::SeqCst)
        );
        assert!(probes >= 5, "{probes}");
        assert!(slowest_b < Duration::from_secs(2), "B took {slowest_b:?}");
        assert!(slowest_host < Duration::from_secs(2), "host took {slowest_host:?}");
        assert!(peak.load(std::sync::atomic::Ordering::SeqCst) <= 128);
        let max_hits: u64 = read("pids.events")
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(max_hits > 0, "the bomb never reached pids.max: {}", read("pids.events"));
        assert!(outside.lock().unwrap().is_empty(), "{:?}", outside.lock().unwrap());
        if let Ok(r) = &r {
            assert!(r.timed_out || !r.success(), "{r:?}");
        }
        let settled = eventually(15.0, || rec.procs().len() <= 3 || Record::read(&env.run_dir(a.key())) != Some(rec.clone())).await;
        assert!(settled, "A's cgroup still holds {:?}", rec.procs());
        drop((a, b));
        a_recovers(&env, "bomber").await;
        for id in ["bomber", "bystander"] {
            env.manager.destroy(&Env::conv(id)).await.unwrap();
        }
    })
    .await;
}

/// A memory bomb in conversation A is contained by its memory cgroup. A perl appending 8 MiB
/// strings forever is killed by the OOM killer inside A (it ends killed, not at its timeout);
/// then the same bomb restarted in a loop for 5 s keeps A at its limit while B answers every
/// `echo` in under 2 s and the host starts processes in under 2 s. From the host, the
/// cgroup's peak usage never passed its 256 MiB limit and the OOM killer acted inside it, and
/// afterwards A answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_bomb_in_a_is_contained_while_b_keeps_answering() {
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(120, async {
        let env = Env::with_limits(3, bomb_limits());
        let a = env.open("hog").await;
        let b = env.open("bystander").await;
        let rec = env.record(a.key());
        let mem = rec.cgroup("memory");
        let read = |f: &str| std::fs::read_to_string(mem.join(f)).unwrap_or_default();
        let v1 = mem.join("memory.limit_in_bytes").exists();
        let limit: u64 = read(if v1 { "memory.limit_in_bytes" } else { "memory.max" })
            .trim()
            .parse()
            .unwrap();
        assert_eq!(limit, 256 << 20);
        let oom_kills = || -> u64 {
            let (file, key) = if v1 {
                ("memory.oom_control", "oom_kill ")
            } else {
                ("memory.events", "oom_kill ")
            };
            read(file)
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0)
        };
        let bomb = r#"perl -e 'my @a; while (1) { push @a, "x" x (8 << 20) }'"#;

        let r = a
            .exec(ExecRequest::new(bomb).timeout(Duration::from_secs(60)))
            .await
            .unwrap();
        assert!(!r.timed_out && !r.success(), "the bomb was not killed: {:?}", (r.status, r.timed_out, r.duration));
        assert!(
            matches!(r.status, ExitStatus::Signal(9) | ExitStatus::Code(137)),
            "{:?}",
            r.status
        );
        let kills_before = oom_kills();

        let (r, slowest_b, slowest_host, probes) = while_attacking(
            &a,
            &b,
            ExecRequest::new(format!("while :; do {bomb}; done"))
                .timeout(Duration::from_secs(5)),
        )
        .await;
        let summary = r.as_ref().map(|r| (r.status, r.timed_out, r.duration));
        let kills = oom_kills();
        eprintln!(
            "memory bomb: {summary:?}; OOM kills {kills}; B slowest {slowest_b:?}, host slowest {slowest_host:?} over {probes} probes"
        );
        assert!(r.expect("the bomb's call returns").timed_out);
        assert!(probes >= 5, "{probes}");
        assert!(slowest_b < Duration::from_secs(2), "B took {slowest_b:?}");
        assert!(slowest_host < Duration::from_secs(2), "host took {slowest_host:?}");
        // The kernel charges a page or a few past the limit before it reclaims or OOM-kills
        // (seen: 4 KiB over); a bomb that escaped the limit would be hundreds of MiB over.
        let slack = 1024 * 1024;
        if v1 {
            let peak: u64 = read("memory.max_usage_in_bytes").trim().parse().unwrap();
            assert!(peak <= limit + slack, "peak {peak} > limit {limit}");
        } else if let Ok(peak) = read("memory.peak").trim().parse::<u64>() {
            assert!(peak <= limit + slack, "peak {peak} > limit {limit}");
        }
        if read(if v1 { "memory.oom_control" } else { "memory.events" }).contains("oom_kill ") {
            assert!(
                kills_before >= 1 && kills > kills_before,
                "OOM kills in A's cgroup: {kills_before}, then {kills}"
            );
        } else {
            let failures: u64 = ["memory.failcnt", "memory.memsw.failcnt"]
                .iter()
                .filter_map(|f| read(f).trim().parse::<u64>().ok())
                .sum();
            assert!(failures > 0, "the memory limit never acted");
        }
        drop((a, b));
        a_recovers(&env, "hog").await;
        for id in ["hog", "bystander"] {
            env.manager.destroy(&Env::conv(id)).await.unwrap();
        }
    })
    .await;
}

fn vm_hwm_kib(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// An output bomb is capped while it streams. `head -c 2G /dev/zero` returns in bounded time
/// with exactly `output_limit` bytes of stdout and the truncated flag (and the command's own
/// exit 0 and stderr intact); `yes` is cut at its timeout with exactly the limit; a stderr bomb
/// is capped the same way. From the host, neither this test process's peak memory nor the
/// agent's grew by anything near the 2 GiB that streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_bomb_is_capped_in_bounded_time_and_memory() {
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(120, async {
        let env = Env::new(3);
        let a = env.open("chatty").await;
        let agent = env.record(a.key()).agent().expect("agent");
        let limit = sessionbox_core::DEFAULT_OUTPUT_LIMIT;
        let hwm_before = vm_hwm_kib("self");
        let t = Instant::now();
        let r = a
            .exec(
                ExecRequest::new("head -c 2G /dev/zero; echo done >&2")
                    .timeout(Duration::from_secs(90))
                    .output_limit(limit),
            )
            .await
            .unwrap();
        let took = t.elapsed();
        eprintln!("2 GiB output bomb took {took:?}");
        assert_eq!(r.stdout.len(), limit);
        assert!(r.stdout.iter().all(|b| *b == 0));
        assert!(
            r.stdout_truncated && !r.stderr_truncated && !r.timed_out,
            "{:?}",
            (
                r.stdout_truncated,
                r.stderr_truncated,
                r.timed_out,
                r.status
            )
        );
        assert_eq!(r.status, ExitStatus::Code(0));
        assert_eq!(text(&r.stderr), "done\n");
        assert!(took < Duration::from_secs(60), "took {took:?}");

        let r = a
            .exec(
                ExecRequest::new("yes")
                    .timeout(Duration::from_secs(2))
                    .output_limit(1000),
            )
            .await
            .unwrap();
        assert!(
            r.timed_out && r.stdout_truncated,
            "{:?}",
            (r.timed_out, r.stdout_truncated)
        );
        assert_eq!(r.stdout.len(), 1000);
        assert!(r.stdout.chunks(2).all(|c| c == b"y\n"));

        let r = a
            .exec(
                ExecRequest::new("head -c 100M /dev/zero >&2; echo out")
                    .timeout(Duration::from_secs(60))
                    .output_limit(4096),
            )
            .await
            .unwrap();
        assert_eq!(r.stderr.len(), 4096);
        assert!(r.stderr_truncated && !r.stdout_truncated);
        assert_eq!(text(&r.stdout), "out\n");

        let grown_mib = vm_hwm_kib("self").saturating_sub(hwm_before) / 1024;
        assert!(
            grown_mib < 256,
            "this process's peak memory grew by {grown_mib} MiB"
        );
        let agent_mib = vm_hwm_kib(&agent.pid.to_string()) / 1024;
        assert!(
            agent.alive() && agent_mib < 256,
            "the agent's peak memory is {agent_mib} MiB"
        );
        drop(a);
        env.manager.destroy(&Env::conv("chatty")).await.unwrap();
    })
    .await;
}

/// No process of a conversation survives its destroy: not a command running in another
/// session at that moment, not a `setsid` daemon that left its command's session and group.
/// From the host, right after `destroy` returns: no process is in the sandbox's cgroups or runs
/// as its uid, every process seen before (monitor, init, agent, daemon, command) is gone (and
/// soon reaped), the cgroup directories, the run directory and the workspace are removed, and
/// the store has no record; the call that was running ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn destroy_leaves_no_process_cgroup_run_dir_or_workspace() {
    needs_root!();
    bounded(60, async {
        let env = Env::new(3);
        let id = "doomed";
        let a = env.open(id).await;
        let key: ConversationKey = a.key().clone();
        let r = sh(
            &a,
            "echo data > f; \
             setsid sh -c 'echo $$ > daemon; exec sleep 1000' > /dev/null 2>&1 < /dev/null & \
             while [ ! -s daemon ]; do sleep 0.01; done; echo started",
        )
        .await;
        assert_eq!(text(&r.stdout), "started\n");
        let other = env.open(id).await;
        let running = tokio::spawn(async move {
            other
                .exec(ExecRequest::new("sleep 1002").timeout(Duration::from_secs(60)))
                .await
        });
        let rec = env.record(&key);
        let uid = env.uid(&key);
        assert!(env.uids.contains(&uid));
        let up = eventually(5.0, || {
            let m = rec.members();
            m.iter().any(|p| p.cmdline == "sleep 1000")
                && m.iter().any(|p| p.cmdline == "sleep 1002")
        })
        .await;
        assert!(up, "{:?}", rec.members());
        let before = rec.members();
        assert!(before.iter().any(|p| p.pid == rec.monitor));
        assert!(before.iter().any(|p| p.pid == rec.init));
        assert!(rec.agent().is_some());

        let out = env.manager.destroy(&Env::conv(id)).await.unwrap();
        assert!(
            out.record_removed && out.runtime.workspace_removed && out.runtime.sandbox_removed,
            "{out:?}"
        );
        assert!(out.runtime.processes_killed >= 4, "{out:?}");

        let left = conversation_processes(&rec.name(), uid);
        assert!(left.is_empty(), "survived destroy: {left:?}");
        for p in &before {
            assert!(!p.alive(), "survived destroy: {p:?}");
        }
        assert!(
            eventually(2.0, || before.iter().all(|p| !p.exists())).await,
            "not reaped: {:?}",
            before.iter().filter(|p| p.exists()).collect::<Vec<_>>()
        );
        for c in &rec.cgroups {
            assert!(!c.exists(), "cgroup {} is left", c.display());
        }
        assert!(!env.run_dir(&key).exists());
        assert!(!env.workspace(&key).exists());
        assert!(env.manager.list(None).await.unwrap().is_empty());
        let r = tokio::time::timeout(Duration::from_secs(10), running)
            .await
            .expect("the running command's call ended");
        eprintln!("the call running during destroy ended with {r:?}");
        drop(a);
    })
    .await;
}

/// Host-side helpers (see `support/mod.rs`).
#[allow(dead_code)]
mod support;

/// Pseudo-terminals in use on the whole host, every devpts instance counted.
fn host_ptys() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/pty/nr")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A pseudo-terminal flood: conversation A opens `/dev/ptmx` until the kernel refuses, and
/// holds what it got. The kernel's terminal pool is shared by every devpts instance (3072
/// terminals beyond the host's reserve by default), so before the limit one sandbox could take
/// them all and `openpty` failed in every other. Now A's own devpts instance stops it at its
/// maximum (`ptys`, 8 here) with ENOSPC: from the host, the count of terminals in use grows by
/// at most A's 8 and B's one, the instance is mounted with `max=8`, and meanwhile conversation
/// B still gets a terminal and answers in under 2 s every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pty_flood_in_a_stops_at_its_own_maximum_while_b_still_gets_a_terminal() {
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(120, async {
        let env = Env::with_limits(
            3,
            SandboxLimits {
                ptys: 8,
                ..bomb_limits()
            },
        );
        let a = env.open("pty-hog").await;
        let b = env.open("pty-bystander").await;
        let mounts = sh(&a, "grep ' /dev/pts ' /proc/self/mountinfo").await;
        assert!(text(&mounts.stdout).contains("max=8"), "{mounts:?}");
        let before = host_ptys();
        let peak = std::sync::atomic::AtomicU64::new(before);
        let done = std::sync::atomic::AtomicBool::new(false);
        let attack = async {
            let r = a
                .exec(
                    ExecRequest::new(
                        r#"perl -e 'my @h; while (open(my $f, "+<", "/dev/ptmx")) { push @h, $f; last if @h > 5000 } print scalar(@h), " ", $!{ENOSPC} ? "ENOSPC" : "$!", "\n"; sleep 4'"#,
                    )
                    .timeout(Duration::from_secs(30)),
                )
                .await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            r
        };
        let probe = async {
            let (mut slowest, mut n) = (Duration::ZERO, 0);
            tokio::time::sleep(Duration::from_millis(300)).await;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                peak.fetch_max(host_ptys(), std::sync::atomic::Ordering::SeqCst);
                let t = Instant::now();
                let r = b
                    .exec(
                        ExecRequest::new(
                            r#"perl -e 'open(my $f, "+<", "/dev/ptmx") or die "no terminal: $!\n"; print "terminal\n"'"#,
                        )
                        .timeout(Duration::from_secs(30)),
                    )
                    .await
                    .expect("B answers");
                assert_eq!(text(&r.stdout), "terminal\n", "B got no terminal: {r:?}");
                slowest = slowest.max(t.elapsed());
                n += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (slowest, n)
        };
        let (r, (slowest, probes)) = tokio::join!(attack, probe);
        let r = r.expect("the flood runs");
        eprintln!(
            "pty flood: A held {:?}; host terminals {before} before, {} at the peak; B slowest {slowest:?} over {probes} probes",
            text(&r.stdout).trim(),
            peak.load(std::sync::atomic::Ordering::SeqCst)
        );
        assert_eq!(text(&r.stdout), "8 ENOSPC\n", "{r:?}");
        assert!(probes >= 5, "{probes}");
        assert!(slowest < Duration::from_secs(2), "B took {slowest:?}");
        assert!(
            peak.load(std::sync::atomic::Ordering::SeqCst) <= before + 9,
            "the host's terminals grew past A's maximum and B's one"
        );
        for id in ["pty-hog", "pty-bystander"] {
            env.manager.destroy(&Env::conv(id)).await.unwrap();
        }
    })
    .await;
}

/// The host's TCP memory in use, in pages (`/proc/net/sockstat`): one pool for every network
/// namespace, squeezed past `net.ipv4.tcp_mem`'s second value and refused past its third.
fn host_tcp_pages() -> u64 {
    let s = std::fs::read_to_string("/proc/net/sockstat").unwrap();
    let line = s.lines().find(|l| l.starts_with("TCP:")).unwrap();
    let mut words = line.split_whitespace();
    words.find(|w| *w == "mem").unwrap();
    words.next().unwrap().parse().unwrap()
}

/// Fills `n` loopback TCP connections until the kernel takes no more, holds them `secs`.
fn tcp_fill(n: u32, secs: u32) -> String {
    format!(
        r#"python3 - <<'EOF'
import socket, time
held, total = [], 0
for i in range({n}):
    l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(1)
    a = socket.create_connection(l.getsockname()); b, _ = l.accept(); l.close()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 30)
    a.setblocking(False)
    while True:
        try:
            total += a.send(b"x" * 65536)
        except BlockingIOError:
            break
    held.append((a, b))
print(total, flush=True)
time.sleep({secs})
EOF"#
    )
}

/// A TCP buffer flood: conversation A opens 100 loopback connections and fills each until the
/// kernel takes no more. The host's TCP memory is one pool (`net.ipv4.tcp_mem`: on this CI
/// machine 2.2 GiB, squeezed from 1.5 GiB) and cgroup v1 does not count socket buffers in a
/// sandbox's memory: before the limit A held 1.06 GiB of it (272 070 pages, its memory cgroup
/// charged 10 MiB), and 200 connections would have left every TCP connection on the host
/// (other sandboxes, the server, its store) without memory. Now A's sandbox has a TCP limit
/// (`tcp_bytes`, 16 MiB here): the host's pool grows by about that, and meanwhile B moves
/// 64 MiB over its own loopback connection in under 5 s and answers every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tcp_buffer_flood_in_a_stays_within_its_limit_of_the_hosts_pool() {
    needs_root!();
    let _heavy = HEAVY.lock().await;
    bounded(120, async {
        let limit: u64 = 16 << 20;
        let env = Env::with_limits(
            3,
            SandboxLimits {
                tcp_bytes: limit,
                ..bomb_limits()
            },
        );
        let a = env.open("tcp-hog").await;
        let b = env.open("tcp-bystander").await;
        let record = env.record(&Env::conv("tcp-hog").key);
        let memory = record.cgroup("memory");
        if memory.join("memory.kmem.tcp.limit_in_bytes").exists() {
            let set = std::fs::read_to_string(memory.join("memory.kmem.tcp.limit_in_bytes"));
            assert_eq!(set.unwrap().trim(), limit.to_string());
        }
        let before = host_tcp_pages();
        let peak = std::sync::atomic::AtomicU64::new(before);
        let done = std::sync::atomic::AtomicBool::new(false);
        let attack = async {
            let r = a
                .exec(ExecRequest::new(tcp_fill(100, 4)).timeout(Duration::from_secs(60)))
                .await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            r
        };
        let probe = async {
            let (mut slowest, mut n) = (Duration::ZERO, 0);
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                peak.fetch_max(host_tcp_pages(), std::sync::atomic::Ordering::SeqCst);
                let t = Instant::now();
                let r = b
                    .exec(
                        ExecRequest::new(
                            "python3 -c 'import socket,threading\n\
                             l=socket.socket();l.bind((\"127.0.0.1\",0));l.listen(1)\n\
                             a=socket.create_connection(l.getsockname());c,_=l.accept()\n\
                             n=[0]\n\
                             def rd():\n\
                             \x20while True:\n\
                             \x20\x20d=c.recv(1<<20)\n\
                             \x20\x20if not d: break\n\
                             \x20\x20n[0]+=len(d)\n\
                             t=threading.Thread(target=rd);t.start()\n\
                             [a.sendall(b\"x\"*(1<<20)) for i in range(64)]\n\
                             a.close();t.join();print(n[0])'",
                        )
                        .timeout(Duration::from_secs(30)),
                    )
                    .await
                    .expect("B answers");
                assert_eq!(text(&r.stdout), format!("{}\n", 64 << 20), "{r:?}");
                slowest = slowest.max(t.elapsed());
                n += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (slowest, n)
        };
        let (r, (slowest, probes)) = tokio::join!(attack, probe);
        let r = r.expect("the flood runs");
        let (peak, held): (u64, u64) = (
            peak.load(std::sync::atomic::Ordering::SeqCst),
            text(&r.stdout).trim().parse().unwrap_or(0),
        );
        eprintln!(
            "tcp flood: A held {held} bytes in its buffers; host TCP pages {before} before, {peak} at the peak; B slowest {slowest:?} over {probes} probes"
        );
        assert!(held > 0, "{r:?}");
        assert!(probes >= 3, "{probes}");
        assert!(slowest < Duration::from_secs(5), "B took {slowest:?}");
        // A's limit, B's 64 MiB transfers in flight and slack for the rest of the machine.
        let allowed = (limit + (64 << 20)) / 4096 * 2;
        assert!(
            peak <= before + allowed,
            "the host's TCP pool grew by {} pages, past {allowed}",
            peak - before
        );
        for id in ["tcp-hog", "tcp-bystander"] {
            env.manager.destroy(&Env::conv(id)).await.unwrap();
        }
    })
    .await;
}
