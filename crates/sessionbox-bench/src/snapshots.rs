//! Snapshots, forks and template starts against the size of the workspace, with a plain copy
//! of the same files on the host (`cp -a`) as the baseline measured in the same run.
//!
//! For each size (files of equal size, of random printable bytes: zstd gains little, as with
//! real build output): a conversation is filled by one command in its sandbox, then timed:
//! taking a snapshot, forking the snapshot into a new conversation, opening a new conversation
//! whose tenant's default template is that snapshot, and forking the live conversation. The
//! ratio of each to the copy is the result; the stored (compressed) size is reported too.
//!
//! Where the runtime clones workspaces (`isolated`: [`sessionbox_core::WorkspaceClones`]), the
//! first fork of a snapshot also lays the snapshot out as a layer; a second fork of it
//! ("fork again") and the template start clone that layer, and the live fork clones the
//! origin's volume. Each row names the mechanism (`clones`: reflink or copy; `null` without).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};
use sessionbox_core::{ConversationRef, ExecRequest, Session};
use sessionbox_manager::{DEFAULT_TEMPLATE, ForkFrom, Manager};

use crate::run::Bench;
use crate::stats::round3;

/// One workspace size: `files` files of `file_bytes` bytes each.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Size {
    pub(crate) files: usize,
    pub(crate) file_bytes: usize,
}

/// The sizes a run measures: `files` files of 10 KiB each when given, else up to 100 MiB in
/// 10,000 files, or 10 MiB in 1,000 with `quick`.
pub(crate) fn sizes(quick: bool, files: &[u32]) -> Vec<Size> {
    let counts: Vec<usize> = match (files.is_empty(), quick) {
        (false, _) => files.iter().map(|&n| n as usize).collect(),
        (true, true) => vec![100, 1000],
        (true, false) => vec![100, 1000, 10_000],
    };
    counts
        .into_iter()
        .map(|files| Size {
            files,
            file_bytes: 10 * 1024,
        })
        .collect()
}

/// The shell command that fills `dir` with `size`: one awk run writes every file (a command
/// per file would measure process starts).
fn fill_command(dir: &str, size: Size) -> String {
    format!(
        "mkdir -p {dir} && awk -v n={n} -v b={b} -v d={dir} 'BEGIN {{ srand(7); \
         for (i = 0; i < n; i++) {{ f = d \"/f\" i; s = \"\"; \
         while (length(s) < b) s = s sprintf(\"%c\", 33 + int(rand() * 90)); \
         printf \"%s\", substr(s, 1, b) > f; close(f) }} }}'",
        n = size.files,
        b = size.file_bytes,
    )
}

fn ms(d: Duration) -> f64 {
    round3(d.as_secs_f64() * 1000.0)
}

/// `cp -a` of `from` into a new directory under `scratch`, timed, then removed.
fn copy_baseline(from: &Path, scratch: &Path) -> anyhow::Result<Duration> {
    let to = scratch.join("copy");
    let t = Instant::now();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(&to)
        .status()
        .context("cannot run cp")?;
    let took = t.elapsed();
    anyhow::ensure!(status.success(), "cp -a failed: {status}");
    std::fs::remove_dir_all(&to).context("cannot remove the copy")?;
    Ok(took)
}

/// Measures every size on `manager` (snapshots on); each conversation made is pushed to
/// `created`.
pub(crate) async fn measure(
    bench: &Bench,
    manager: &Manager,
    sizes: &[Size],
    created: &mut Vec<ConversationRef>,
) -> anyhow::Result<Value> {
    let scratch = tempfile::tempdir_in(&bench.data_dir).context("cannot make a scratch dir")?;
    let mut rows = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let origin = bench.conversation(&format!("snap-{i}"))?;
        created.push(origin.clone());
        let conv = manager.open(&origin).await?;
        let fill = conv
            .exec(ExecRequest::new(fill_command("data", size)).timeout(Duration::from_secs(600)))
            .await?;
        anyhow::ensure!(
            fill.success(),
            "filling the workspace failed: {}",
            String::from_utf8_lossy(&fill.stderr)
        );
        Box::new(conv).close().await?;
        let location = manager.runtime().workspace_location(&origin.key);
        let copy = copy_baseline(Path::new(&location), scratch.path())?;

        let name = format!("bench-{}-{i}", bench.id);
        let t = Instant::now();
        let record = manager.snapshot(&origin, &name, None).await?;
        let snapshot = t.elapsed();

        let forked = bench.conversation(&format!("snap-{i}-fork"))?;
        created.push(forked.clone());
        let t = Instant::now();
        manager
            .fork(&ForkFrom::Snapshot(name.clone()), &forked)
            .await?;
        let fork = t.elapsed();
        let again = bench.conversation(&format!("snap-{i}-again"))?;
        created.push(again.clone());
        let t = Instant::now();
        manager
            .fork(&ForkFrom::Snapshot(name.clone()), &again)
            .await?;
        let fork_again = t.elapsed();

        manager
            .set_template(&bench.tenant, DEFAULT_TEMPLATE, &name)
            .await?;
        let templated = bench.conversation(&format!("snap-{i}-template"))?;
        created.push(templated.clone());
        let t = Instant::now();
        let opened = manager.open(&templated).await;
        let template_open = t.elapsed();
        manager
            .remove_template(&bench.tenant, DEFAULT_TEMPLATE)
            .await?;
        let opened = opened?;
        let seen = opened.stat("data/f0").await.map(|s| s.size);
        Box::new(opened).close().await?;
        anyhow::ensure!(
            seen.as_ref().ok() == Some(&(size.file_bytes as u64)),
            "a conversation started from the template lacks the snapshot's files: {seen:?}"
        );

        let live = bench.conversation(&format!("snap-{i}-live"))?;
        created.push(live.clone());
        let t = Instant::now();
        manager
            .fork(&ForkFrom::Conversation(origin.id.clone()), &live)
            .await?;
        let live_fork = t.elapsed();
        manager.delete_snapshot(&bench.tenant, &name).await?;

        let ratio = |d: Duration| round3(d.as_secs_f64() / copy.as_secs_f64().max(1e-9));
        rows.push(json!({
            "files": size.files,
            "bytes": size.files * size.file_bytes,
            "stored_bytes": record.stored_bytes,
            "copy_ms": ms(copy),
            "snapshot_ms": ms(snapshot),
            "fork_ms": ms(fork),
            "fork_again_ms": ms(fork_again),
            "fork_again_x_copy": ratio(fork_again),
            "clones": manager.runtime().clones().map(|c| c.mechanism()),
            "template_open_ms": ms(template_open),
            "live_fork_ms": ms(live_fork),
            "snapshot_x_copy": ratio(snapshot),
            "fork_x_copy": ratio(fork),
            "template_open_x_copy": ratio(template_open),
            "live_fork_x_copy": ratio(live_fork),
        }));
    }
    Ok(Value::Array(rows))
}
