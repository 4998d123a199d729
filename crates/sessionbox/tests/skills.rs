//! Agent Skills through the real `sessionbox` binary: on `isolated` a skill is mounted
//! read-only at `/skills/<name>` (its script runs there; writing fails and the host's skill
//! directory is unchanged; secrets are not in it) and its bootstrap runs once across resumes,
//! also across an idle stop; on `host` the skills of `[skills.tenants]` are copied, and
//! `sessionbox skills` lists them or reports the rule a broken one breaks.
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

    // A broken skill: the error names it and the rule.
    std::fs::write(
        skills.join("hello/SKILL.md"),
        "---\nname: Hello\ndescription: d\n---\n",
    )
    .unwrap();
    let o = cli(&["skills"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("hello/SKILL.md") && err.contains("invalid name"),
        "{err}"
    );
}

// Shared with the isolated lifecycle and escape tests; this file uses a few of its helpers.
#[allow(dead_code)]
mod support;
