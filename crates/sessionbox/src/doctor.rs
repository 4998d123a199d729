//! `sessionbox doctor`: which sandbox layers this machine enforces, and what to do about a
//! missing one. Never falls back silently: the `isolated` runtime either runs with every layer
//! reported here or fails naming the missing one.

use std::process::ExitCode;

use sessionbox_local::sandbox::{self, LayerState};

use crate::config::RuntimeKind;

/// Prints the report; exit 0 only when `default` can run here.
pub fn run(default: RuntimeKind) -> ExitCode {
    let layers = sandbox::probe();
    let width = layers.iter().map(|l| l.layer.len()).max().unwrap_or(10);
    println!("sandbox layers (needed by the isolated runtime):");
    let mut missing = 0;
    for l in &layers {
        let state = match l.state {
            LayerState::Enforced => "enforced",
            LayerState::Missing => {
                missing += 1;
                "MISSING"
            }
        };
        println!("  {:<width$}  {state:<8}  {}", l.layer, l.detail);
        if let Some(hint) = &l.hint
            && l.state == LayerState::Missing
        {
            println!("  {:<width$}            fix: {hint}", "");
        }
    }
    println!();
    let isolated_ok = missing == 0;
    println!(
        "isolated runtime: {}",
        if isolated_ok {
            "can run (every layer enforced)".to_owned()
        } else {
            format!("cannot run: {missing} layer(s) missing; see the fixes above")
        }
    );
    println!("host runtime: can run (not a security boundary: directory separation only)");
    println!(
        "aio runtime: needs a reachable AIO Sandbox server (--endpoint); one shared container, trusted users only"
    );
    println!("default runtime: {}", default.name());
    let ok = match default {
        RuntimeKind::Isolated => isolated_ok,
        RuntimeKind::Host | RuntimeKind::Aio => true,
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
