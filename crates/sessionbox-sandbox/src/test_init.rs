//! Test support: a standalone sandbox init, so `tests/sandbox.rs` can launch real sandboxes.
//! Production re-executes the `sessionbox` binary with a hidden subcommand instead.
//!
//! `sessionbox-sandbox-init launch SPEC_JSON` is a second test mode: it launches the spec from
//! this process (which the tests start as an unprivileged user), waits for the program, kills the
//! sandbox and prints one line: `ok <exit status> <processes killed>` or `error <message>`.
//!
//! The stand-in for the agent (a program that runs one command through
//! `sessionbox_process::run` inside a sandbox) is the test binary itself: see
//! `run_command_entry` in `tests/sandbox.rs`.

use std::path::PathBuf;
use std::time::Duration;

use sessionbox_sandbox::{self as sandbox, SandboxSpec};

fn main() {
    let args: Vec<String> = std::env::args().collect();
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
