//! Test support: a standalone sandbox init, so `tests/sandbox.rs` can launch real sandboxes.
//! Production re-executes the `sessionbox` binary with a hidden subcommand instead.
//!
//! `sessionbox-sandbox-init launch SPEC_JSON` is a second test mode: it launches the spec from
//! this process (which the tests start as an unprivileged user), waits for the program, kills the
//! sandbox and prints one line: `ok <exit status> <processes killed>` or `error <message>`.
//!
//! `sessionbox-sandbox-init run-command COMMAND` is a third: run as the program inside a
//! sandbox, it stands in for the agent and runs `COMMAND` in `/workspace` through
//! `sessionbox_local::process::run`, as the agent runs every command; it prints the command's
//! output and exits with its exit code (125 when it could not run it).

use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

use sessionbox_core::{ExecRequest, ExitStatus};
use sessionbox_local::process::{self, Spawn};
use sessionbox_local::sandbox::{self, SandboxSpec};

fn run_command(command: &str) -> i32 {
    let req = ExecRequest::new(command);
    let cwd = match std::fs::File::open("/workspace") {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cannot open /workspace: {e}");
            return 125;
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match rt.block_on(process::run(
        Spawn::new(&req, cwd.as_fd(), "/workspace"),
        None,
    )) {
        Ok(r) => {
            let _ = std::io::stdout().write_all(&r.stdout);
            let _ = std::io::stderr().write_all(&r.stderr);
            match r.status {
                ExitStatus::Code(c) => c,
                ExitStatus::Signal(s) => 128 + s,
            }
        }
        Err(e) => {
            eprintln!("cannot run the command: {e}");
            125
        }
    }
}

fn main() {
    // Also the host runtime's command supervisor, for tests/host_background.rs.
    if sessionbox_local::supervise::is_supervisor_invocation() {
        sessionbox_local::supervise::supervisor_main();
    }
    let args: Vec<String> = std::env::args().collect();
    if !sandbox::is_init_invocation() && args.get(1).map(String::as_str) == Some("run-command") {
        std::process::exit(run_command(&args[2]));
    }
    if !sandbox::is_init_invocation() && args.get(1).map(String::as_str) == Some("launch") {
        let spec: SandboxSpec = serde_json::from_str(&args[2]).expect("a spec as JSON");
        let exe: PathBuf = std::env::current_exe().expect("the current executable");
        match sandbox::launch(&spec, &exe, &[]) {
            Ok(h) => {
                let status = h.wait_timeout(Duration::from_secs(30));
                let killed = h.kill();
                println!("ok {status:?} {killed:?}");
            }
            Err(e) => println!("error {e}"),
        }
        return;
    }
    sandbox::init_main()
}
