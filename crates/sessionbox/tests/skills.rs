//! Agent Skills through the real `sessionbox` binary: on `isolated` a skill is mounted
//! read-only at `/skills/<name>` (its script runs there; writing fails and the host's skill
//! directory is unchanged; secrets are not in it) and its bootstrap runs once across resumes,
//! also across an idle stop; a skill added while the sandbox runs is not announced over MCP
//! (`sessionbox mcp`, the official Python SDK) until the sandbox has started again with it
//! mounted; on `host` the skills of `[skills.tenants]` are copied, and
//! `sessionbox skills` lists them and warns of a broken one (left out, with the rule it breaks);
//! on `aio` (against the
//! AIO test server) they are uploaded through the runtime's API, and a changed copy is restored.
//!
//! The isolated test needs root (CI runs it as root); without it, it prints SKIPPED and passes.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use support::*;

/// A skills directory (a 0700 temporary directory, as an operator's may be) with `hello`: a
/// script, a secret, a bootstrap that counts its runs in the workspace.
fn skills_dir(root: &Path) -> PathBuf {
    let skills = root.join("skills");
    let hello = skills.join("hello");
    std::fs::create_dir_all(hello.join("scripts")).unwrap();
    std::fs::set_permissions(&skills, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(
        hello.join("SKILL.md"),
        "---\nname: hello\ndescription: Greets from a script.\nmetadata:\n  sessionbox-bootstrap: echo boot >> boot.count\n---\nRun scripts/hi.sh.\n",
    )
    .unwrap();
    std::fs::write(
        hello.join("scripts/hi.sh"),
        "#!/bin/sh\necho hi from skill\n",
    )
    .unwrap();
    std::fs::set_permissions(
        hello.join("scripts/hi.sh"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    std::fs::write(hello.join(".env"), "TOKEN=secret\n").unwrap();
    skills
}

fn tree(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let mode = std::fs::symlink_metadata(&p).unwrap().permissions().mode();
        if p.is_dir() {
            out.insert(p.clone(), (Vec::new(), mode));
            out.extend(tree(&p));
        } else {
            out.insert(p.clone(), (std::fs::read(&p).unwrap(), mode));
        }
    }
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn isolated_mounts_skills_read_only_runs_their_scripts_and_bootstraps_once_across_resumes() {
    if !is_root() {
        eprintln!("SKIPPED: isolated runtime tests need root (CI runs them as root)");
        return;
    }
    let env = Env::new(1);
    let holder = tempfile::tempdir().unwrap();
    let skills = skills_dir(holder.path());
    let before = tree(&skills);
    let dirs = skills.to_string_lossy().into_owned();
    let vars = [("SESSIONBOX_SKILLS_DIR", dirs.as_str())];
    let exec = |cmd: &str| env.cli(&["exec", "-c", "chat", "--", cmd], &vars);

    let o = exec(
        "sh /skills/hello/scripts/hi.sh && /skills/hello/scripts/hi.sh && ls -A /skills/hello",
    );
    assert_eq!(
        stdout(&o),
        "hi from skill\nhi from skill\nSKILL.md\nscripts\n",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // Every way of changing the skill from inside fails with a read-only or permission error.
    for attack in [
        "touch /skills/hello/new",
        "echo evil > /skills/hello/SKILL.md",
        "rm -f /skills/hello/SKILL.md",
        "rm -rf /skills/hello/scripts",
        "mv /skills/hello/SKILL.md /skills/hello/x",
        "chmod 777 /skills/hello/scripts/hi.sh",
        "mkdir /skills/other",
        "ln -s /workspace /skills/hello/w",
    ] {
        let o = exec(&format!("( {attack} ) 2>&1; echo \"exit=$?\""));
        let out = stdout(&o);
        assert!(
            !out.ends_with("exit=0\n")
                && (out.contains("Read-only file system")
                    || out.contains("Permission denied")
                    || out.contains("Operation not permitted")),
            "{attack}: {out}"
        );
    }
    assert_eq!(
        tree(&skills),
        before,
        "the host's skill directory is unchanged"
    );

    // Resumes, one after an idle stop: the bootstrap ran once.
    let o = exec("cat boot.count");
    assert_eq!(stdout(&o), "boot\n");
    let key = sessionbox_core::ConversationRef::parse("default", "chat")
        .unwrap()
        .key;
    let first = Record::read(&env.run_dir(&key)).expect("a sandbox record");
    std::thread::sleep(std::time::Duration::from_millis(3000));
    let o = exec("cat boot.count; cat /skills/hello/SKILL.md | head -2");
    assert_eq!(stdout(&o), "boot\n---\nname: hello\n");
    let second = Record::read(&env.run_dir(&key)).expect("a sandbox record");
    assert_ne!(
        first.init, second.init,
        "the sandbox stopped when idle and was launched again"
    );

    let o = env.cli(&["destroy", "-c", "chat"], &vars);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(tree(&skills), before);
}

fn write_skill(skills: &Path, name: &str, description: &str, body: &str, script: &str) {
    let dir = skills.join(name);
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    std::fs::write(
        dir.join("SKILL.md"),
        format!("---\nname: {name}\ndescription: {description}\n---\n{body}"),
    )
    .unwrap();
    std::fs::write(dir.join("scripts/b.sh"), script).unwrap();
}

/// Issue 16 on `isolated`, through `sessionbox mcp --conversation` and the official MCP Python
/// SDK (`tests/mcp_stdio_skills.py`, which fails on any warning the SDK logs): a skill added to
/// the tenant's skills directory while the conversation's sandbox runs is not mounted there, so
/// the `skill` tool neither lists it nor hands out its path; once the sandbox has stopped (idle)
/// and starts again on the same workspace, it is mounted and announced.
#[test]
fn isolated_announces_a_skill_added_while_the_sandbox_runs_only_once_it_is_mounted() {
    if !is_root() {
        eprintln!("SKIPPED: isolated runtime tests need root (CI runs them as root)");
        return;
    }
    let env = Env::new(1);
    let holder = tempfile::tempdir().unwrap();
    let skills = holder.path().join("skills");
    write_skill(
        &skills,
        "alpha",
        "First skill.",
        "Run scripts/b.sh.\n",
        "echo alpha here\n",
    );
    std::fs::create_dir_all(&env.data).unwrap();
    std::fs::write(
        env.data.join("sessionbox.toml"),
        format!(
            "[isolated]\nidle_timeout_secs = {}\nuid_base = {}\nuid_count = {}\n\
             [skills.tenants]\ndefault = [{:?}]\n",
            env.idle_secs,
            env.uids.start,
            env.uids.len(),
            skills.to_string_lossy()
        ),
    )
    .unwrap();
    let none: [(&str, &str); 0] = [];
    let cli = |args: &[&str]| {
        let o = env.cli(args, &none);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        stdout(&o)
    };
    let mcp = |phase: &str| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_stdio_skills.py");
        let out = std::process::Command::new("python3")
            .arg(script)
            .arg(EXE)
            .arg(&env.data)
            .arg(phase)
            .output()
            .expect("python3 runs (scripts/test installs the mcp package)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.trim_end().ends_with("OK"),
            "the MCP stdio client failed in phase {phase}:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };

    // The sandbox starts with alpha mounted, and a background command keeps it running (not
    // idle) while beta is added and the model asks.
    let id = cli(&["exec", "-c", "chat", "--background", "--", "sleep 300"])
        .trim()
        .to_owned();
    let key = sessionbox_core::ConversationRef::parse("default", "chat")
        .unwrap()
        .key;
    let first = Record::read(&env.run_dir(&key)).expect("a sandbox record");
    write_skill(
        &skills,
        "beta",
        "Added later.",
        "Run scripts/b.sh.\n",
        "echo beta here\n",
    );
    mcp("running");
    assert!(
        proc_info(first.init).is_some_and(|p| p.state != 'Z'),
        "the sandbox ran throughout"
    );

    // Let it stop when idle (not destroyed: the workspace stays).
    cli(&["kill", "-c", "chat", &id]);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while proc_info(first.init).is_some_and(|p| p.state != 'Z') {
        assert!(
            std::time::Instant::now() < until,
            "the sandbox did not stop when idle"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    mcp("restarted");
    let second = Record::read(&env.run_dir(&key)).expect("a sandbox record");
    assert_ne!(first.init, second.init, "the sandbox was launched again");
    cli(&["destroy", "-c", "chat"]);
}

#[test]
fn host_copies_the_tenants_skills_from_the_config_file_and_skills_lists_them() {
    let d = tempfile::tempdir().unwrap();
    let skills = skills_dir(d.path());
    let data = d.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("sessionbox.toml"),
        format!(
            "[skills.tenants]\nacme = [{:?}]\n",
            skills.to_string_lossy()
        ),
    )
    .unwrap();
    let cli = |args: &[&str]| {
        std::process::Command::new(EXE)
            .arg("--data-dir")
            .arg(&data)
            .args(["--runtime", "host", "--tenant", "acme"])
            .args(args)
            .env_remove("SESSIONBOX_SKILLS_DIR")
            .env_remove("SESSIONBOX_RUNTIME")
            .output()
            .unwrap()
    };
    let o = cli(&["skills"]);
    assert_eq!(stdout(&o), "hello: Greets from a script.\n");
    let o = cli(&["skills", "hello"]);
    assert_eq!(stdout(&o), "Run scripts/hi.sh.\n");
    let o = cli(&[
        "exec",
        "-c",
        "c",
        "--",
        ".skills/hello/scripts/hi.sh; cat boot.count",
    ]);
    assert_eq!(
        stdout(&o),
        "hi from skill\nboot\n",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = cli(&[
        "exec",
        "-c",
        "c",
        "--",
        "ls -A .skills/hello; cat boot.count",
    ]);
    assert_eq!(stdout(&o), "SKILL.md\nscripts\nboot\n");

    // A broken skill is left out with a warning naming it and the rule; the tenant's other
    // skills and its conversations carry on.
    std::fs::create_dir_all(skills.join("other")).unwrap();
    std::fs::write(
        skills.join("other/SKILL.md"),
        "---\nname: other\ndescription: Still here.\n---\nBody.\n",
    )
    .unwrap();
    std::fs::write(
        skills.join("hello/SKILL.md"),
        "---\nname: Hello\ndescription: d\n---\n",
    )
    .unwrap();
    let o = cli(&["skills"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(stdout(&o), "other: Still here.\n");
    assert!(
        err.contains("warning: skill hello is left out")
            && err.contains("hello/SKILL.md")
            && err.contains("invalid name"),
        "{err}"
    );
    assert_eq!(
        err.matches("hello is left out").count(),
        1,
        "said once, not also by the log: {err}"
    );
    let o = cli(&["exec", "-c", "c", "--", "ls .skills"]);
    assert_eq!(
        stdout(&o),
        "other\n",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A command's stderr is its own: no warning about the skill is mixed into it.
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The AIO test server (`tests/aio-server/server.py`, built from the AIO spec), on a free port;
/// killed on drop.
struct AioServer(std::process::Child, String);

impl AioServer {
    fn start(home: &Path) -> AioServer {
        let (child, url) = sessionbox_test_support::start_aio_server(home);
        AioServer(child, url)
    }
}

impl Drop for AioServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn aio_uploads_skills_only_when_changed_restores_a_changed_copy_and_bootstraps_once() {
    let d = tempfile::tempdir().unwrap();
    let skills = skills_dir(d.path());
    let before = tree(&skills);
    let home = d.path().join("aio-home");
    std::fs::create_dir_all(&home).unwrap();
    let server = AioServer::start(&home);
    let data = d.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("sessionbox.toml"),
        format!(
            "runtime = \"aio\"\n[aio]\nendpoint = {:?}\nroot = {:?}\n",
            server.1,
            home.join("conversations").to_string_lossy()
        ),
    )
    .unwrap();
    let exec = |cmd: &str| {
        std::process::Command::new(EXE)
            .arg("--data-dir")
            .arg(&data)
            .args(["exec", "-c", "chat", "--", cmd])
            .env("SESSIONBOX_SKILLS_DIR", &skills)
            .env_remove("SESSIONBOX_RUNTIME")
            .env_remove("AIO_SANDBOX_BASE_URL")
            .env_remove("AIO_SANDBOX_TOKEN")
            .output()
            .unwrap()
    };
    let o = exec(".skills/hello/scripts/hi.sh && ls -A .skills/hello && cat boot.count");
    assert_eq!(
        stdout(&o),
        "hi from skill\nSKILL.md\nscripts\nboot\n",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = exec("echo evil > .skills/hello/SKILL.md && chmod 644 .skills/hello/scripts/hi.sh");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = exec(
        "head -2 .skills/hello/SKILL.md && test -x .skills/hello/scripts/hi.sh && cat boot.count",
    );
    assert_eq!(
        stdout(&o),
        "---\nname: hello\nboot\n",
        "restored, bootstrapped once"
    );
    assert_eq!(tree(&skills), before, "the source is unchanged");
    // Uploaded twice in three opens: first, and after the change; the unchanged copy was not.
    let o = std::process::Command::new(EXE)
        .arg("--data-dir")
        .arg(&data)
        .args(["audit", "-c", "chat", "--json"])
        .output()
        .unwrap();
    let text = stdout(&o);
    let records: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    let uploads = records
        .iter()
        .filter(|r| {
            r["operation"] == "skills"
                && r["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("copied=hello"))
        })
        .count();
    assert_eq!(uploads, 2, "{text}");
}

// Shared with the isolated lifecycle and escape tests; this file uses a few of its helpers.
use crate::support;
