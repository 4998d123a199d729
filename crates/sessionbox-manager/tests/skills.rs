//! Skills through the manager on the real `host` runtime (copies in the workspace, delivered
//! through the `Session` trait like every copying runtime) and a real SQLite store: a skill's
//! script runs in the conversation; a conversation that changes its copy changes nothing at the
//! source and gets the copy back on its next open; a bootstrap runs once across resumes.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sessionbox_core::{ConversationRef, ExecRequest, Session};
use sessionbox_local::host::{HostConfig, HostRuntime};
use sessionbox_manager::Manager;
use sessionbox_skills::{SkillLimits, Skills};
use sessionbox_store::{AuditFilter, BootstrapState, Store};

/// A skills directory with `hello` (a script, a secret, a counting bootstrap) and `broken-boot`
/// (a bootstrap that fails).
fn skills_dir(root: &Path) -> PathBuf {
    let skills = root.join("skills");
    let hello = skills.join("hello");
    std::fs::create_dir_all(hello.join("scripts")).unwrap();
    std::fs::write(
        hello.join("SKILL.md"),
        "---\nname: hello\ndescription: Greets from a script.\nmetadata:\n  sessionbox-bootstrap: echo boot >> boot.count && test -f \"$SKILL_DIR/SKILL.md\"\n---\nRun scripts/hi.sh.\n",
    )
    .unwrap();
    std::fs::write(
        hello.join("scripts/hi.sh"),
        "#!/bin/sh\necho \"hi from $0\"\n",
    )
    .unwrap();
    std::fs::set_permissions(
        hello.join("scripts/hi.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(hello.join(".env"), "TOKEN=secret\n").unwrap();
    std::fs::write(hello.join("credentials.json"), "{}\n").unwrap();
    let broken = skills.join("broken-boot");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(
        broken.join("SKILL.md"),
        "---\nname: broken-boot\ndescription: Its bootstrap fails.\nmetadata:\n  sessionbox-bootstrap: echo try >> broken.count; exit 3\n---\n",
    )
    .unwrap();
    skills
}

fn manager(dir: &Path, skills: &Path) -> (Manager, Store) {
    let store = Store::open(&dir.join("sessionbox.db")).unwrap();
    let runtime = HostRuntime::new(HostConfig::new(dir)).unwrap();
    let tenants = BTreeMap::from([("default".to_owned(), vec![skills.to_owned()])]);
    let m = Manager::new(store.clone(), Arc::new(runtime))
        .with_skills(Skills::new(tenants, SkillLimits::default()));
    (m, store)
}

async fn sh(s: &dyn Session, cmd: &str) -> (i32, String) {
    let r = s.exec(ExecRequest::new(cmd)).await.unwrap();
    let mut out = String::from_utf8_lossy(&r.stdout).into_owned();
    out.push_str(&String::from_utf8_lossy(&r.stderr));
    (r.shell_exit_code(), out)
}

fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(tree(&p));
        } else {
            out.insert(p.clone(), std::fs::read(&p).unwrap());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_script_runs_in_the_conversation_and_secrets_are_not_copied() {
    let d = tempfile::tempdir().unwrap();
    let skills = skills_dir(d.path());
    let (m, _) = manager(d.path(), &skills);
    let conv = ConversationRef::parse("default", "chat").unwrap();
    let s = m.open(&conv).await.unwrap();
    let base = m.skill_delivery(&conv).base_path("hello");
    assert_eq!(base, format!("{}/.skills/hello", s.workspace_root()));
    let (code, out) = sh(&s, &format!("{base}/scripts/hi.sh")).await;
    assert_eq!(
        (code, out.trim()),
        (0, format!("hi from {base}/scripts/hi.sh").as_str())
    );
    let (_, out) = sh(&s, "ls -A .skills/hello; stat -c %a .skills/hello/SKILL.md").await;
    assert_eq!(out, "SKILL.md\nscripts\n644\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_copy_leaves_the_source_alone_and_is_copied_again_on_the_next_open() {
    let d = tempfile::tempdir().unwrap();
    let skills = skills_dir(d.path());
    let source = tree(&skills);
    let (m, store) = manager(d.path(), &skills);
    let conv = ConversationRef::parse("default", "chat").unwrap();
    let s = m.open(&conv).await.unwrap();
    // Every way a conversation can change its copy: edit, add, remove the executable bit,
    // replace a file with a link, delete.
    for tamper in [
        "echo evil > .skills/hello/SKILL.md",
        "echo extra > .skills/hello/scripts/extra.sh",
        "chmod 644 .skills/hello/scripts/hi.sh",
        "rm .skills/hello/SKILL.md && ln -s /etc/hostname .skills/hello/SKILL.md",
        "rm -r .skills/hello",
        "rm -r .skills && ln -s /tmp .skills",
    ] {
        let (code, out) = sh(&s, tamper).await;
        assert_eq!(code, 0, "{tamper}: {out}");
        assert_eq!(tree(&skills), source, "{tamper}: the source is unchanged");
        let s2 = m.open(&conv).await.unwrap();
        let (code, out) = sh(
            &s2,
            "cat .skills/hello/SKILL.md | head -2; ls .skills/hello/scripts; test -x .skills/hello/scripts/hi.sh && test ! -L .skills",
        )
        .await;
        assert_eq!(
            (code, out.as_str()),
            (0, "---\nname: hello\nhi.sh\n"),
            "{tamper}: restored"
        );
    }
    // Each restore was a copy found different by its hashes, recorded in the audit log.
    let copies = store
        .audit_log(&AuditFilter::default())
        .unwrap()
        .into_iter()
        .filter(|r| {
            let d = r.entry.detail.as_deref().unwrap_or("");
            r.entry.operation == "skills"
                && d.split(' ').any(|w| {
                    w.strip_prefix("copied=")
                        .is_some_and(|l| l.split(',').any(|n| n == "hello"))
                })
        })
        .count();
    assert_eq!(copies, 1 + 6);
    // An unchanged copy is not written again.
    let s3 = m.open(&conv).await.unwrap();
    drop(s3);
    let last = store.audit_log(&AuditFilter::default()).unwrap();
    let last = last.iter().find(|r| r.entry.operation == "skills").unwrap();
    assert_eq!(last.entry.detail.as_deref(), Some("skills=2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_runs_once_across_resumes_and_again_only_when_the_skill_changes() {
    let d = tempfile::tempdir().unwrap();
    let skills = skills_dir(d.path());
    let (m, store) = manager(d.path(), &skills);
    let conv = ConversationRef::parse("default", "chat").unwrap();
    for _ in 0..4 {
        let s = m.open(&conv).await.unwrap();
        Box::new(s).close().await.unwrap();
    }
    // Another manager (another process, as far as the store knows) resumes it too.
    let (m2, _) = manager(d.path(), &skills);
    let s = m2.open(&conv).await.unwrap();
    let (_, out) = sh(&s, "cat boot.count; cat broken.count").await;
    // hello's bootstrap ran once; the failing one ran on each of the 5 opens.
    assert_eq!(out, format!("boot\n{}", "try\n".repeat(5)));
    let records = store.bootstraps(&conv.key).unwrap();
    let hello = records.iter().find(|r| r.skill == "hello").unwrap();
    assert_eq!(
        (hello.state, hello.exit_code, hello.runs),
        (BootstrapState::Ok, Some(0), 1)
    );
    let broken = records.iter().find(|r| r.skill == "broken-boot").unwrap();
    assert_eq!(
        (broken.state, broken.exit_code),
        (BootstrapState::Failed, Some(3))
    );

    // A new version of the skill is copied and bootstrapped again, once.
    std::fs::write(skills.join("hello/scripts/new.sh"), "echo new\n").unwrap();
    for _ in 0..2 {
        let _ = m.open(&conv).await.unwrap();
    }
    let s = m.open(&conv).await.unwrap();
    let (_, out) = sh(&s, "cat boot.count; cat .skills/hello/scripts/new.sh").await;
    assert_eq!(out, "boot\nboot\necho new\n");

    // A skill no longer configured loses its copy.
    std::fs::remove_dir_all(skills.join("broken-boot")).unwrap();
    let s = m.open(&conv).await.unwrap();
    let (_, out) = sh(&s, "ls .skills").await;
    assert_eq!(out, "hello\n");
}

/// A skill that breaks a rule is left out, with the rule in the catalog and the audit; the
/// conversation opens, and its tenant's other skills are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_skill_is_left_out_with_the_rule_it_broke_and_the_rest_delivered() {
    let d = tempfile::tempdir().unwrap();
    let skills = skills_dir(d.path());
    std::os::unix::fs::symlink("/etc/hostname", skills.join("hello/link")).unwrap();
    let (m, store) = manager(d.path(), &skills);
    let conv = ConversationRef::parse("default", "chat").unwrap();
    let s = m.open(&conv).await.expect("one bad skill failed the open");
    let (code, out) = sh(&s, "ls .skills").await;
    assert_eq!(
        (code, out.trim()),
        (0, "broken-boot"),
        "the bad skill was delivered"
    );
    Box::new(s).close().await.unwrap();
    let catalog = m.skill_catalog(&conv.tenant).await.unwrap();
    assert_eq!(catalog.skills.len(), 1);
    assert_eq!(catalog.skipped.len(), 1);
    assert_eq!(catalog.skipped[0].name(), "hello");
    assert!(
        catalog.skipped[0]
            .error
            .to_string()
            .contains("link in a skill must be relative"),
        "{}",
        catalog.skipped[0].error
    );
    let log = store
        .audit_log(&AuditFilter {
            key: Some(conv.key.clone()),
            ..Default::default()
        })
        .unwrap();
    let skills_entry = log
        .iter()
        .find(|e| e.entry.operation == "skills")
        .expect("no skills audit entry");
    let detail = skills_entry.entry.detail.clone().unwrap_or_default();
    assert_eq!(skills_entry.entry.outcome, "ok");
    assert!(
        detail.contains("skipped=hello (") && detail.contains("must be relative"),
        "{detail}"
    );
}
