//! `sessionbox-agent`: the in-sandbox agent serving the OpenSandbox execd API. See the crate
//! documentation and `sessionbox-agent --help`.

fn main() -> std::process::ExitCode {
    sessionbox_agent::run_cli(std::env::args_os())
}
