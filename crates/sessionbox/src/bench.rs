//! `sessionbox bench` and `sessionbox bench-egress`: thin subcommands over the
//! `sessionbox-bench` executable, which is kept out of this binary with everything only it
//! uses (plotting, an MCP client). It is looked for next to this executable.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use anyhow::Context;

use crate::cli::Globals;

/// The benchmark executable's file name.
const BENCH_EXE: &str = "sessionbox-bench";

/// Becomes `sessionbox-bench` from this executable's directory with the global options that
/// apply to it, then `leading` (its subcommand, if any) and `args`: its exit status is this
/// command's. Returns only when it cannot be run.
pub(crate) fn run(
    globals: &Globals,
    leading: &[&str],
    args: Vec<OsString>,
) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the sessionbox executable")?;
    let bench = exe.with_file_name(BENCH_EXE);
    if !bench.is_file() {
        anyhow::bail!(
            "{} not found: `sessionbox bench` runs it from sessionbox's directory; build both \
             with `cargo build --release -p sessionbox -p sessionbox-bench`",
            bench.display()
        );
    }
    let mut command = std::process::Command::new(&bench);
    if let Some(d) = &globals.data_dir {
        command.arg("--data-dir").arg(d);
    }
    if let Some(t) = &globals.tenant {
        command.args(["--tenant", t]);
    }
    if let Some(r) = globals.runtime {
        command.args(["--runtime", r.name()]);
    }
    command.args(leading).args(args);
    let error = command.exec();
    Err(error).with_context(|| format!("cannot run {}", bench.display()))
}
