//! `sessionbox-agent`: the in-sandbox agent serving the OpenSandbox execd API. See the crate
//! documentation and `sessionbox-agent --help`. `sessionbox-agent egress-sidecar` is the same
//! binary as OpenSandbox's egress sidecar (see `egress_sidecar`), so one static build makes
//! both images.

fn main() -> std::process::ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "egress-sidecar")
    {
        return sessionbox_agent::egress_sidecar::run();
    }
    sessionbox_agent::run_cli(std::env::args_os())
}
