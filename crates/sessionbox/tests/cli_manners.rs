//! The CLI speaks its own language and behaves like a Unix tool: `exec` output arrives as the
//! command writes it; errors name the CLI's flags (never a JSON field) and carry each kind of
//! prefix once; oversized input names its limit; routine garbage collection logs at info; no
//! colour codes go to a pipe. A real `sessionbox` binary on the `host` runtime, and on
//! `isolated` too when run as root.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn cli(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sessionbox"));
    c.arg("--data-dir")
        .arg(data)
        .env_remove("SESSIONBOX_RUNTIME")
        .env_remove("SESSIONBOX_TENANT")
        .env_remove("SESSIONBOX_LOG")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null());
    c
}

fn run(data: &Path, args: &[&str]) -> Output {
    cli(data).args(args).output().expect("run sessionbox")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| text(&o.stdout).trim() == "0")
}

/// `host`, and `isolated` when it can run here (root).
fn runtimes() -> Vec<&'static str> {
    let mut r = vec!["host"];
    if is_root() {
        r.push("isolated");
    } else {
        eprintln!("not root: the isolated runtime is SKIPPED");
    }
    r
}

fn data_dir(d: &Path, runtime: &str) -> std::path::PathBuf {
    let data = d.join(runtime);
    std::fs::create_dir_all(&data).unwrap();
    // Sandboxes left warm by a test stop soon after it.
    std::fs::write(
        data.join("sessionbox.toml"),
        "[isolated]\nidle_timeout_secs = 3\n",
    )
    .unwrap();
    data
}

/// A command that prints, sleeps 2 s and prints again: its first line reaches the CLI's stdout
/// pipe while it still runs, not when it ends.
#[test]
fn exec_output_reaches_the_pipe_while_the_command_runs() {
    let d = tempfile::tempdir().unwrap();
    for runtime in runtimes() {
        let data = data_dir(d.path(), runtime);
        let started = Instant::now();
        let mut child = cli(&data)
            .args([
                "--runtime",
                runtime,
                "exec",
                "-c",
                "stream",
                "--",
                "echo first; sleep 2; echo second",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let first = started.elapsed();
        assert_eq!(line, "first\n", "{runtime}");
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        let status = child.wait().unwrap();
        let ended = started.elapsed();
        assert!(status.success(), "{runtime}");
        assert_eq!(rest, "second\n", "{runtime}");
        assert!(
            ended - first >= Duration::from_millis(1500),
            "{runtime}: the first line came {first:?} after the start, the end {ended:?}: \
             not while the command ran"
        );
    }
}

/// Refusals name the CLI's flags (`--recursive`, `--all`, `--old`), never a JSON field
/// (`recursive`, `replace_all`, `` `old` ``); a kind of error is named once ("not found:
/// nodir", not "not found: not found: nodir").
#[test]
fn errors_use_the_cli_words_and_one_prefix() {
    let d = tempfile::tempdir().unwrap();
    for runtime in runtimes() {
        let data = data_dir(d.path(), runtime);
        let rt = ["--runtime", runtime];
        let out = run(
            &data,
            &[
                &rt[..],
                &[
                    "exec",
                    "-c",
                    "w",
                    "--",
                    "mkdir d && touch d/x && echo 'one one' > a.txt",
                ],
            ]
            .concat(),
        );
        assert!(out.status.success(), "{runtime}: {}", text(&out.stderr));

        let check = |args: &[&str], want: &str, never: &[&str]| {
            let out = run(&data, &[&rt[..], args].concat());
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{runtime} {args:?}: {err}");
            assert!(err.contains(want), "{runtime} {args:?}: {err}");
            for n in never {
                assert!(!err.contains(n), "{runtime} {args:?} says {n:?}: {err}");
            }
        };
        check(
            &["rm", "-c", "w", "d"],
            "error: conflict: d is a directory that is not empty; pass --recursive",
            &["set recursive"],
        );
        check(
            &["edit", "-c", "w", "a.txt", "--old", "one", "--new", "1"],
            "occurs 2 times in a.txt; give more context in --old, or pass --all",
            &["replace_all", "`old`"],
        );
        check(
            &["edit", "-c", "w", "a.txt", "--old", "three", "--new", "3"],
            "does not occur in a.txt; read the file and give its exact text in --old",
            &["`old`"],
        );
        for args in [
            &["exec", "-c", "w", "--cwd", "nodir", "--", "ls"][..],
            &["ls", "-c", "w", "nodir"],
            &["rm", "-c", "w", "nodir"],
            &["read", "-c", "w", "nodir"],
            &["stat", "-c", "w", "nodir"],
        ] {
            check(args, "error: not found: ", &["not found: not found"]);
        }
        let out = run(&data, &[&rt[..], &["rm", "-c", "w", "-r", "d"]].concat());
        assert!(out.status.success(), "{runtime}: {}", text(&out.stderr));
    }
}

/// A command, an environment or stdin over its limit is refused naming the limit, before
/// anything runs (on the host runtime too, where the kernel would refuse with E2BIG).
#[test]
fn oversized_exec_input_names_its_limit() {
    let d = tempfile::tempdir().unwrap();
    for runtime in runtimes() {
        let data = data_dir(d.path(), runtime);
        let big = "a".repeat(sessionbox_core::MAX_COMMAND_BYTES + 1);
        let env = format!("A={}", "a".repeat(sessionbox_core::MAX_ENV_BYTES));
        for (args, limit) in [
            (
                vec!["exec", "-c", "big", "--", big.as_str()],
                sessionbox_core::MAX_COMMAND_BYTES,
            ),
            (
                vec!["exec", "-c", "big", "-e", env.as_str(), "--", "true"],
                sessionbox_core::MAX_ENV_BYTES,
            ),
        ] {
            let out = run(&data, &[&["--runtime", runtime][..], &args].concat());
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{runtime}: {err}");
            assert!(
                err.contains(&format!("the limit is {limit} bytes")),
                "{runtime}: {err}"
            );
            assert!(!err.contains("Argument list too long"), "{runtime}: {err}");
        }
    }
}

/// `serve` logs a routine garbage collection (an expired conversation removed) at info, and
/// its log on a pipe has no colour codes.
#[test]
fn routine_garbage_collection_logs_at_info_without_colour_on_a_pipe() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path();
    std::fs::write(
        data.join("sessionbox.toml"),
        "runtime = \"host\"\n[lifecycle]\nttl_secs = 1\n",
    )
    .unwrap();
    let out = run(data, &["exec", "-c", "old", "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::thread::sleep(Duration::from_millis(1500));
    let mut serve = cli(data)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--gc-interval-secs",
            "1",
        ])
        .env("SESSIONBOX_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = serve.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    let found = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let hit = line.contains("garbage collection") && line.contains("expired=1");
                seen.push(line.clone());
                if hit {
                    break Some(line);
                }
            }
            Err(_) => break None,
        }
    };
    let _ = serve.kill();
    let _ = serve.wait();
    let line = found.unwrap_or_else(|| panic!("no garbage collection line in {seen:#?}"));
    assert!(line.contains(" INFO "), "{line}");
    for l in &seen {
        assert!(!l.contains('\u{1b}'), "a colour code on a pipe: {l:?}");
    }
}

/// `sessionbox bench` and `bench-egress` run the `sessionbox-bench` next to the `sessionbox`
/// executable with the global options and the arguments as given, and end with its exit
/// status; without it they fail naming the command that builds it.
#[test]
fn bench_runs_sessionbox_bench_beside_it_and_passes_its_exit_status() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let exe = dir.path().join("sessionbox");
    // A hard link: the executable's directory is the link's (a symbolic link resolves).
    std::fs::hard_link(env!("CARGO_BIN_EXE_sessionbox"), &exe)
        .or_else(|_| std::fs::copy(env!("CARGO_BIN_EXE_sessionbox"), &exe).map(drop))
        .unwrap();
    let data = dir.path().join("data");
    let sessionbox = |args: &[&str]| {
        Command::new(&exe)
            .arg("--data-dir")
            .arg(&data)
            .args(args)
            .env_remove("SESSIONBOX_RUNTIME")
            .env_remove("SESSIONBOX_TENANT")
            .output()
            .unwrap()
    };

    let out = sessionbox(&["bench", "--quick"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("cargo build --release -p sessionbox -p sessionbox-bench"),
        "{}",
        text(&out.stderr)
    );

    let bench = dir.path().join("sessionbox-bench");
    std::fs::write(&bench, "#!/bin/sh\nprintf '%s\\n' \"$@\"\nexit 7\n").unwrap();
    std::fs::set_permissions(&bench, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = sessionbox(&["--runtime", "host", "bench", "--quick", "--out", "o d"]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let data = data.to_str().unwrap();
    assert_eq!(
        text(&out.stdout),
        format!("--data-dir\n{data}\n--runtime\nhost\n--quick\n--out\no d\n")
    );
    let out = sessionbox(&["bench-egress", "--mib", "4", "--help"]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!("--data-dir\n{data}\negress\n--mib\n4\n--help\n")
    );
}
