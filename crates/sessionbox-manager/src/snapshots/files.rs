//! The snapshot directory's files: scratch files, ids, compression and decompression through
//! the archive rules, publishing by rename.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use sessionbox_archive::ArchiveSource;
use sessionbox_core::{ArchiveStats, Error, Result, TenantId};

/// The first bytes of a zstd frame (RFC 8878, section 3.1.1).
pub(super) const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// A temporary file older than this in the snapshot directory belongs to no running operation
/// and is removed by garbage collection.
pub(super) const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// A temporary file removed when dropped.
pub(super) struct Scratch(pub(super) PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A store-unique id for a snapshot: 26 hex digits of a hash of its tenant, name, the time and
/// this process (names are unique per tenant, so two ids never collide in practice; the store
/// refuses the second if they do).
pub(super) fn new_id(tenant: &TenantId, name: &str) -> String {
    use sha2::{Digest, Sha256};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut h = Sha256::new();
    h.update(tenant.as_str().as_bytes());
    h.update([0]);
    h.update(name.as_bytes());
    h.update(Utc::now().timestamp_nanos_opt().unwrap_or(0).to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    h.update(NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let digest = h.finalize();
    digest.iter().take(13).map(|b| format!("{b:02x}")).collect()
}

/// A snapshot's archive that cannot be opened: absent (taken by a process whose snapshot
/// directory this one does not share, or removed by hand) is [`Error::NotFound`] saying so.
pub(super) fn missing_or(path: &Path, e: &std::io::Error) -> Error {
    if e.kind() != std::io::ErrorKind::NotFound {
        return io_error("open", path, e);
    }
    Error::NotFound(format!(
        "the snapshot's archive {} is not in this process's snapshot directory: every \
         replica must share one snapshot directory (else delete the snapshot and take it again)",
        path.display()
    ))
}

pub(super) fn io_error(what: &str, path: &Path, e: &std::io::Error) -> Error {
    Error::Backend(format!("cannot {what} {}: {e}", path.display()))
}

/// Runs blocking file work off the async runtime.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Backend(format!("a snapshot task failed: {e}")))?
}

/// Checks the plain archive `tar` (at most `max` bytes) against the rules and writes it in
/// the canonical form, compressed at `level`, into `out`, synced, in one pass
/// ([`sessionbox_archive::rewrite_archive`]; `source` says whose archive it is). Returns its
/// counts and the compressed size.
pub(super) fn check_and_compress(
    tar: &Path,
    out: &Path,
    max: u64,
    level: i32,
    source: ArchiveSource,
) -> Result<(ArchiveStats, u64)> {
    let len = std::fs::metadata(tar)
        .map_err(|e| io_error("read", tar, &e))?
        .len();
    if len > max {
        return Err(Error::TooLarge {
            what: "the workspace archive".into(),
            limit: max,
        });
    }
    let input = std::fs::File::open(tar).map_err(|e| io_error("open", tar, &e))?;
    // Before any tar reader: an extension header it would hold whole in memory is bounded.
    sessionbox_archive::check_extension_sizes(&input)?;
    let output = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .map_err(|e| io_error("create", out, &e))?;
    let mut enc = zstd::Encoder::new(output, level).map_err(|e| io_error("compress", out, &e))?;
    let stats =
        sessionbox_archive::rewrite_archive(std::io::BufReader::new(input), &mut enc, source)?;
    let output = enc
        .finish()
        .map_err(|e| io_error("compress into", out, &e))?;
    output.sync_all().map_err(|e| io_error("sync", out, &e))?;
    let stored = output
        .metadata()
        .map_err(|e| io_error("read", out, &e))?
        .len();
    Ok((stats, stored))
}

/// Decompresses the stored archive `zst` into the plain archive `out`, at most `max` bytes.
pub(super) fn decompress(zst: &Path, out: &Path, max: u64) -> Result<()> {
    let input = std::fs::File::open(zst).map_err(|e| missing_or(zst, &e))?;
    let dec = zstd::Decoder::new(input).map_err(|e| io_error("decompress", zst, &e))?;
    let mut output = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .map_err(|e| io_error("create", out, &e))?;
    use std::io::Read;
    let copied = std::io::copy(&mut dec.take(max + 1), &mut output).map_err(|e| {
        Error::InvalidRequest(format!(
            "the archive is not a valid zstd-compressed tar archive: {e}"
        ))
    })?;
    if copied > max {
        return Err(Error::TooLarge {
            what: "the workspace archive".into(),
            limit: max,
        });
    }
    Ok(())
}

/// Renames `from` to `to` and syncs the directory, so the name survives a crash.
pub(super) fn publish(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|e| io_error("rename into place", to, &e))?;
    if let Some(dir) = to.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error("sync", dir, &e))?;
    }
    Ok(())
}

/// An archive file whose record is missing is removed only once it is older than a minute: a
/// snapshot being taken publishes its file just before recording it.
pub(super) fn older_than_a_minute(entry: &std::fs::DirEntry) -> bool {
    entry
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age >= Duration::from_secs(60))
}

/// `DirBuilder` made private (0700) on Unix.
pub(super) trait PrivateDir {
    fn mode_private(&mut self) -> &mut Self;
}

impl PrivateDir for std::fs::DirBuilder {
    fn mode_private(&mut self) -> &mut Self {
        use std::os::unix::fs::DirBuilderExt;
        self.mode(0o700)
    }
}
