//! `sessionbox-agent`: the in-sandbox agent serving the OpenSandbox execd API. See the crate
//! documentation and `sessionbox-agent --help`. Two more modes of the same binary, so one static
//! build makes every image: `sessionbox-agent egress-sidecar` is OpenSandbox's egress sidecar
//! (see `egress_sidecar`), and `sessionbox-agent confined-exec ... -- PROGRAM` runs a program
//! under the agent's own confinement (see `confined_exec`).

fn main() -> std::process::ExitCode {
    let mode = std::env::args_os().nth(1);
    if mode.as_deref().is_some_and(|a| a == "egress-sidecar") {
        return sessionbox_agent::egress_sidecar::run();
    }
    if mode.as_deref().is_some_and(|a| a == "confined-exec") {
        let args: Vec<_> = std::env::args_os().skip(2).collect();
        return sessionbox_agent::confined_exec(&args);
    }
    sessionbox_agent::run_cli(std::env::args_os())
}
