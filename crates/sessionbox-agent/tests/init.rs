//! `confined-exec` as PID 1 of a new PID namespace, as an OpenSandbox container's bootstrap
//! runs it: the orphans of the namespace are reaped, the signals a container is stopped with
//! reach the program, and the program's exit status is the init's. (A user namespace too, so
//! no privilege is needed; `unshare` from util-linux.)

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `sh -c SCRIPT` under `confined-exec`, which `unshare --fork` makes PID 1 of a new PID
/// namespace with its own `/proc`.
fn as_pid1(script: &str) -> Child {
    Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--mount",
            "--mount-proc",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_sessionbox-agent"))
        .args(["confined-exec", "--", "/bin/sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare (util-linux) runs")
}

/// Attack: a program that never waits (the container's main process, here `sleep` as
/// `tail -f /dev/null` is by default) while 300 orphans (a child whose parent exits first) are
/// made beside it. Every one is reaped by the init: none is left a zombie holding a process
/// id. (With the program as PID 1 itself, all 300 stay zombies.) The init exits with the
/// program's own status.
#[test]
fn the_init_reaps_every_orphan_and_exits_with_the_programs_status() {
    let out = as_pid1(
        "(i=0; while [ $i -lt 300 ]; do (true &); i=$((i+1)); done; sleep 1; \
         z=0; for f in /proc/[0-9]*/stat; do \
         [ \"$(cut -d' ' -f3 $f 2>/dev/null)\" = Z ] && z=$((z+1)); done; \
         echo made=$i zombies=$z pid1=$(cat /proc/1/comm)) & exec sleep 3",
    )
    .wait_with_output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.trim(),
        "made=300 zombies=0 pid1=sessionbox-agen",
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0));
    let out = as_pid1("exit 7").wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(7));
}

/// SIGTERM sent to the init (what `docker stop` does) reaches the program, whose exit status
/// the init returns; a program ended by a signal gives 128 + its number.
#[test]
fn the_init_forwards_a_stop_signal_to_the_program() {
    let child = as_pid1("trap 'exit 42' TERM; echo ready; while :; do sleep 0.05; done");
    // The init is unshare's child (PID 1 inside, an ordinary pid here).
    let init = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let children =
                std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id()))
                    .unwrap_or_default();
            if let Some(pid) = children.split_whitespace().next() {
                let pid: i32 = pid.parse().unwrap();
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                // The program runs (the init has spawned it) once the init has a child.
                let has_child = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                    .map(|c| !c.trim().is_empty())
                    .unwrap_or(false);
                if comm.trim() == "sessionbox-agen" && has_child {
                    break pid;
                }
            }
            assert!(Instant::now() < deadline, "the init did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // Let the shell set its trap.
    std::thread::sleep(Duration::from_millis(300));
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(init).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ready");
    assert_eq!(out.status.code(), Some(42));

    let out = as_pid1("kill -KILL $$").wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + 9));
}

/// A stop signal sent the moment the program exists is not lost: the init installs its
/// handlers before it starts the program (PID 1 ignores a signal it has no handler for, so a
/// signal in that window used to leave the container running until it was killed).
#[test]
fn a_stop_signal_at_the_programs_start_still_reaches_it() {
    for _ in 0..5 {
        let child = as_pid1("exec sleep 30");
        let started = Instant::now();
        let init = loop {
            let children =
                std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id()))
                    .unwrap_or_default();
            if let Some(pid) = children.split_whitespace().next() {
                let pid: i32 = pid.parse().unwrap();
                let has_child = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                    .map(|c| !c.trim().is_empty())
                    .unwrap_or(false);
                if has_child {
                    break pid;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the init did not start"
            );
            std::thread::yield_now();
        };
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(init).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(128 + 15));
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the signal was lost"
        );
    }
}
