//! What the CLI takes in and prints out stays contained: `write` reads stdin only up to the file
//! limit (refusing more, exit 2, with memory bounded by the limit and nothing written), and
//! workspace names reach a terminal escaped, a pipe byte for byte. A real `sessionbox` binary
//! on the `host` runtime.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The file limit the tests' configuration sets (`[limits] max_file_bytes`).
const LIMIT: usize = 1024 * 1024;

fn data_dir(d: &Path) -> PathBuf {
    let data = d.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("sessionbox.toml"),
        format!("runtime = \"host\"\n[limits]\nmax_file_bytes = {LIMIT}\n"),
    )
    .unwrap();
    data
}

fn cli(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sessionbox"));
    c.arg("--data-dir")
        .arg(data)
        .env_remove("SESSIONBOX_RUNTIME")
        .env_remove("SESSIONBOX_TENANT")
        .env_remove("SESSIONBOX_LOG");
    c
}

/// Starts `write -c c1 PATH` with stdin and stderr piped.
fn spawn_write(data: &Path, path: &str) -> std::process::Child {
    cli(data)
        .args(["write", "-c", "c1", path])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs `write -c c1 PATH` with `input` on stdin; exit code and stderr.
fn write(data: &Path, path: &str, input: &[u8]) -> (Option<i32>, String) {
    let mut child = spawn_write(data, path);
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The one workspace under `data` (of conversation c1).
fn workspace(data: &Path) -> PathBuf {
    let mut all: Vec<_> = std::fs::read_dir(data.join("workspaces"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(all.len(), 1, "{all:?}");
    all.pop().unwrap()
}

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

/// Peak resident memory (VmHWM) of process `pid`, in bytes, if it still runs.
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[test]
fn write_refuses_stdin_over_the_file_limit_without_reading_it_all() {
    let d = tempfile::tempdir().unwrap();
    let data = data_dir(d.path());
    // Under and at the limit: written byte for byte.
    let exact: Vec<u8> = (0..LIMIT).map(|i| (i * 7 + i / 251) as u8).collect();
    assert_eq!(
        write(&data, "keep.bin", &exact[..1000]),
        (Some(0), String::new())
    );
    assert_eq!(write(&data, "full.bin", &exact), (Some(0), String::new()));
    let ws = workspace(&data);
    assert_eq!(std::fs::read(ws.join("full.bin")).unwrap(), exact);

    // 256 MiB of zeros from a generator, on an existing file and on a new one.
    const INPUT: usize = 256 * 1024 * 1024;
    for path in ["keep.bin", "new.bin"] {
        let mut child = spawn_write(&data, path);
        let mut stdin = child.stdin.take().unwrap();
        let feeder = std::thread::spawn(move || {
            let zeros = vec![0u8; 1024 * 1024];
            let mut sent = 0;
            // Ends when the CLI stops reading (a broken pipe) or all is sent.
            while sent < INPUT && stdin.write_all(&zeros).is_ok() {
                sent += zeros.len();
            }
            sent
        });
        let pid = child.id();
        let mut peak = None;
        while child.try_wait().unwrap().is_none() {
            peak = peak_rss(pid).max(peak);
            std::thread::sleep(Duration::from_millis(1));
        }
        let sent = feeder.join().unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!("stdin is larger than {LIMIT} bytes"))
                && err.contains("max_file_bytes in [limits]")
                && err.contains("nothing was written"),
            "{err}"
        );
        assert!(!err.contains("backend error"), "{err}");
        assert!(sent < INPUT, "the CLI read all {sent} bytes");
        let peak = peak.expect("sampled the CLI's memory while it ran");
        assert!(
            peak < 100 * 1024 * 1024,
            "peak RSS {peak} bytes for a {LIMIT}-byte limit"
        );
    }
    assert_eq!(std::fs::read(ws.join("keep.bin")).unwrap(), &exact[..1000]);
    assert_eq!(names(&ws), ["full.bin", "keep.bin"]);
}

/// A name that would set the terminal's title, and one with a newline and a C1 CSI.
const HOSTILE: &str = "\x1b]0;pwned\x07";
const HOSTILE_ESCAPED: &str = "\\x1b]0;pwned\\x07";
const OTHER: &str = "a\nb\u{9b}2J";
const OTHER_ESCAPED: &str = "a\\nb\\u{9b}2J";

/// `sessionbox ARGS` with stdout on a pseudo-terminal (through `script`); what it printed.
fn on_a_terminal(data: &Path, args: &str) -> String {
    let line = format!(
        "'{}' --data-dir '{}' {args}",
        env!("CARGO_BIN_EXE_sessionbox"),
        data.display()
    );
    let out = Command::new("script")
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .env_remove("SESSIONBOX_RUNTIME")
        .env_remove("SESSIONBOX_TENANT")
        .stdin(Stdio::null())
        .output()
        .expect("run script(1)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{args}: {text}");
    text
}

#[test]
fn names_are_escaped_on_a_terminal_and_exact_on_a_pipe() {
    let d = tempfile::tempdir().unwrap();
    let data = data_dir(d.path());
    assert_eq!(write(&data, "plain.txt", b"x\n"), (Some(0), String::new()));
    let ws = workspace(&data);
    for name in [HOSTILE, OTHER] {
        std::fs::write(ws.join(name), "x\n").unwrap();
    }
    for args in ["ls -c c1 .", "glob -c c1 '*'", "grep -c c1 x"] {
        let shown = on_a_terminal(&data, args);
        assert!(
            !shown.contains('\x1b') && !shown.contains('\x07'),
            "{args}: {shown:?}"
        );
        for name in [HOSTILE_ESCAPED, OTHER_ESCAPED, "plain.txt"] {
            assert!(shown.contains(name), "{args}: {shown:?} lacks {name:?}");
        }
        let piped = cli(&data)
            .args(shell_split(args))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(piped.status.success(), "{args}: {piped:?}");
        let piped = String::from_utf8(piped.stdout).unwrap();
        for name in [HOSTILE, OTHER, "plain.txt"] {
            assert!(piped.contains(name), "{args}: {piped:?} lacks {name:?}");
        }
        assert!(!piped.contains(HOSTILE_ESCAPED), "{args}: {piped:?}");
    }
}

/// `args` split at spaces, without the quotes a shell would remove.
fn shell_split(args: &str) -> Vec<String> {
    args.split(' ')
        .map(|a| a.trim_matches('\'').to_owned())
        .collect()
}

/// Per-uid kernel allowances shared across installations: two installations on one host, each
/// with its own data directory and store and neither setting `uid_base`, used to give their
/// first conversations the same host uid (3000000), so one could take the other's inotify
/// instances, pending signals and processes. Now each claims a range of its own host-wide: the
/// same conversation id in both runs as two different host uids, each inside its own
/// installation's recorded range, and the ranges are disjoint. As root only (without root every
/// conversation runs as the caller).
#[test]
fn two_installations_on_one_host_never_share_a_sandbox_uid() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: per-conversation uids need root (CI runs as root)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let mut seen = Vec::new();
    for name in ["one", "two"] {
        let data = d.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(
            data.join("sessionbox.toml"),
            "runtime = \"isolated\"\n[isolated]\nuid_count = 64\nidle_timeout_secs = 5\n",
        )
        .unwrap();
        let out = cli(&data)
            .args(["exec", "-c", "same-id", "--", "id", "-u"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "1000\n");
        let range = std::fs::read_to_string(data.join("uid-range")).unwrap();
        let mut w = range.split_whitespace().map(|w| w.parse::<u32>().unwrap());
        let (base, count) = (w.next().unwrap(), w.next().unwrap());
        assert_eq!(count, 64);
        let mut owners: Vec<_> = std::fs::read_dir(data.join("workspaces"))
            .unwrap()
            .map(|e| std::os::unix::fs::MetadataExt::uid(&e.unwrap().metadata().unwrap()))
            .collect();
        let owner = owners.pop().unwrap();
        assert!(
            (base..base + count).contains(&owner),
            "{owner} outside {range}"
        );
        seen.push((base, owner, data));
    }
    let (a, b) = (&seen[0], &seen[1]);
    assert_ne!(a.1, b.1, "the same host uid in two installations");
    assert!(
        a.0 + 64 <= b.0 || b.0 + 64 <= a.0,
        "overlapping ranges {} and {}",
        a.0,
        b.0
    );
    for (base, _, data) in &seen {
        let out = cli(data)
            .args(["destroy", "-c", "same-id"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let claim = Path::new("/var/lib/sessionbox/uid-ranges").join(base.to_string());
        assert_eq!(
            std::fs::read_to_string(&claim).unwrap().trim(),
            std::fs::canonicalize(data).unwrap().to_str().unwrap()
        );
        std::fs::remove_file(claim).unwrap();
    }
}

/// README's "Sizing the host": a sandbox's cgroups are made beneath the cgroups of the process
/// that starts it, so a limit there bounds all of its sandboxes together. The attack: under a
/// `sessionbox` started in a pids cgroup of the test's own capped at 80, conversation A keeps 50
/// sleeping processes in the background, then conversation B starts 50 more. Each is far
/// within its own limit of 512, yet B's forks are refused (its `pids.events` counts them) and
/// the two together never pass the cap. As root, on cgroup v1 (this host and CI).
#[test]
fn a_pids_limit_on_the_starting_process_bounds_all_its_sandboxes_together() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: sandbox cgroups need root (CI runs as root)");
        return;
    }
    let pids_root = Path::new("/sys/fs/cgroup/pids");
    if !pids_root.join("cgroup.procs").exists() {
        eprintln!("SKIPPED: no cgroup v1 pids hierarchy here");
        return;
    }
    let parent = pids_root.join(format!("sbtest-bound-{}", std::process::id()));
    std::fs::create_dir(&parent).unwrap();
    std::fs::write(parent.join("pids.max"), "80").unwrap();
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("sessionbox.toml"),
        "runtime = \"isolated\"\n[isolated]\nuid_count = 64\nidle_timeout_secs = 60\n",
    )
    .unwrap();
    // `sessionbox` joins the capped cgroup before it starts (the shell moves itself, then execs).
    let in_parent = |args: &[&str]| {
        Command::new("sh")
            .arg("-c")
            .arg("echo $$ > \"$0/cgroup.procs\" && exec \"$@\"")
            .arg(&parent)
            .arg(env!("CARGO_BIN_EXE_sessionbox"))
            .arg("--data-dir")
            .arg(&data)
            .args(args)
            .env_remove("SESSIONBOX_RUNTIME")
            .env_remove("SESSIONBOX_TENANT")
            .output()
            .unwrap()
    };
    let flood = "i=0; while [ $i -lt 50 ]; do sleep 60 & i=$((i+1)); done; wait";
    let pids_of = |id: &str| -> PathBuf {
        let key = sessionbox_core::ConversationKey::derive(
            &sessionbox_core::TenantId::new("default").unwrap(),
            &sessionbox_core::ConversationId::new(id).unwrap(),
        );
        let record: serde_json::Value = serde_json::from_slice(
            &std::fs::read(data.join("run").join(key.as_str()).join("sandbox.json")).unwrap(),
        )
        .unwrap();
        record["cgroups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| PathBuf::from(c.as_str().unwrap()))
            .find(|c| c.starts_with(pids_root))
            .unwrap()
    };
    let read = |dir: &Path, file: &str| -> u64 {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let value = text.split_whitespace().last().unwrap();
        value.parse().unwrap()
    };

    let out = in_parent(&["exec", "-c", "bound-a", "--background", "--", flood]);
    assert!(out.status.success(), "{out:?}");
    let a = pids_of("bound-a");
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while read(&a, "pids.current") < 50 {
        assert!(std::time::Instant::now() < until, "A did not start its 50");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = in_parent(&["exec", "-c", "bound-b", "--timeout", "10", "--", flood]);
    let b = pids_of("bound-b");
    let (held_a, held_b, total) = (
        read(&a, "pids.current"),
        read(&b, "pids.current"),
        read(&parent, "pids.current"),
    );
    let refused_b = read(&b, "pids.events");
    eprintln!(
        "under a cap of 80: A holds {held_a}, B {held_b} ({refused_b} forks refused), {total} in all; B's exec: {:?}",
        out.status.code()
    );
    for s in [&a, &b] {
        assert!(
            s.starts_with(&parent),
            "the sandbox's pids cgroup {} is not beneath the starting process's {}",
            s.display(),
            parent.display()
        );
        assert_eq!(read(s, "pids.max"), 512, "{}", s.display());
    }
    for id in ["bound-a", "bound-b"] {
        let out = cli(&data).args(["destroy", "-c", id]).output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let claim = std::fs::read_to_string(data.join("uid-range")).unwrap();
    let base = claim.split_whitespace().next().unwrap().to_owned();
    let _ = std::fs::remove_file(Path::new("/var/lib/sessionbox/uid-ranges").join(base));
    // Empty now: the sandboxes' cgroups went with them.
    std::fs::remove_dir(&parent).unwrap();
    assert!(held_a >= 50, "A holds {held_a}");
    assert!(refused_b > 0, "B's forks were not refused");
    assert!(total <= 80, "{total} processes under a cap of 80");
}
