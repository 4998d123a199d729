//! A whole CLI call, for `sessionbox bench`: `sessionbox exec -c ID -- true` as a new process
//! on a conversation whose sandbox is up, against the run's bare spawn baseline.
//!
//! The call is the `sessionbox` executable beside this one (as `scripts/test` and `cargo build
//! --release -p sessionbox -p sessionbox-bench` leave them), with the bench's data directory and
//! tenant, so it opens the store, finds the conversation's sandbox, runs `true` in it, writes its
//! audit record and exits: everything a user's one-off call pays. Without that executable the
//! measurement is skipped (and says so).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use sessionbox_core::ConversationRef;

use crate::run::Bench;
use crate::stats::{Stats, ms};

/// Target: a whole CLI call's p50, as a multiple of the bare spawn's p50 (issue 20).
pub(crate) const CALL_RATIO: f64 = 5.0;

/// The `sessionbox` executable beside this one, if there is one.
fn sessionbox_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let beside = exe.parent()?.join("sessionbox");
    beside.is_file().then_some(beside)
}

/// One `sessionbox exec -c ID -- true` call, timed (ms).
fn call(exe: &Path, b: &Bench, conv: &ConversationRef) -> anyhow::Result<f64> {
    let t = Instant::now();
    let out = Command::new(exe)
        .arg("--data-dir")
        .arg(&b.data_dir)
        .args(["--tenant", conv.tenant.as_str(), "--runtime", "isolated"])
        .args(["exec", "-c", conv.id.as_str(), "--", "true"])
        .env_remove("SESSIONBOX_HOME")
        .env_remove(sessionbox_store::STORE_URL_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("cannot run {}", exe.display()))?;
    let elapsed = ms(t);
    if !out.status.success() {
        bail!(
            "`sessionbox exec -- true` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(elapsed)
}

/// At most 200 of `b.warm` whole CLI calls on the conversation `cli` (its sandbox launched by a first,
/// untimed call, then a few untimed ones); `None` when there is no
/// `sessionbox` executable beside this one.
pub(crate) fn calls(
    b: &Bench,
    created: &mut Vec<ConversationRef>,
) -> anyhow::Result<Option<Value>> {
    let Some(exe) = sessionbox_exe() else {
        return Ok(None);
    };
    b.progress.set_message("isolated whole CLI call");
    let conv = b.conversation("cli")?;
    created.push(conv.clone());
    // The first call launches the sandbox; the warm-up lets the page cache settle.
    for _ in 0..=b.warmup.min(5) {
        call(&exe, b, &conv)?;
    }
    let n = b.warm.min(200);
    let mut calls = Vec::with_capacity(n);
    for _ in 0..n {
        calls.push(call(&exe, b, &conv)?);
        b.progress.inc(1);
    }
    Ok(Some(json!({
        "what": "`sessionbox exec -c ID -- true` as a new process (store open, sandbox found, exec, audit, exit) on a conversation whose sandbox is up",
        "executable": exe,
        "stats": Stats::of(&calls),
        "target_ratio": CALL_RATIO,
    })))
}
