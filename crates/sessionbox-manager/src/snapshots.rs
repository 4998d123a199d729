//! Snapshots, restore, fork and templates: a conversation's workspace saved as an archive,
//! put back, branched into a new conversation, or made the starting state of new ones.
//!
//! A snapshot is an archive of the workspace ([`Session::archive_workspace`]; the rules are
//! `sessionbox_core`'s) checked and rewritten in its canonical form with [`sessionbox_archive::rewrite_archive`] (an archive comes from
//! inside a sandbox, so it is untrusted), compressed with zstd and kept as
//! `<dir>/<id>.tar.zst`, written to a temporary name and renamed into place, then recorded in
//! the store ([`sessionbox_store::Store::create_snapshot`], which applies the tenant's cap in the same
//! transaction). A snapshot is immutable: restoring or forking reads it; only delete and
//! retention remove it. The archive file goes after its record, so a crash between the two
//! leaves a file no record names, which garbage collection removes
//! ([`Manager::collect_snapshot_garbage`]).
//!
//! Fork makes a new conversation of the same tenant from a snapshot or from a live
//! conversation (taken as a snapshot that is never recorded), by restoring the archive into
//! it: the new workspace is a copy, so nothing writable is shared with the origin. A tenant's
//! template [`DEFAULT_TEMPLATE`] is restored into every conversation it creates.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use sessionbox_archive::ArchiveSource;
use sessionbox_core::{
    ArchiveStats, ConversationId, ConversationRef, Error, Operation, Result, Session, TenantId,
    temporary_archive, validate_snapshot_name,
};
use sessionbox_store::{PolicyScope, SnapshotRecord};

use crate::{Conversation, Manager};

mod clones;
mod files;
mod policy;
mod slots;
mod templates;

pub(crate) use slots::SnapshotSlots;

pub(crate) use clones::Start;

use files::{
    PrivateDir, STALE_TEMPORARY, Scratch, ZSTD_MAGIC, blocking, check_and_compress, decompress,
    io_error, missing_or, new_id, older_than_a_minute, publish,
};

/// The template restored into every new conversation of a tenant that has one.
pub const DEFAULT_TEMPLATE: &str = "default";

/// Where snapshots are kept and how much they may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotConfig {
    /// The directory of the archives (made 0700 on first use).
    pub dir: PathBuf,
    /// How long a snapshot is kept when its maker names no time (`None`: until deleted).
    pub retention: Option<Duration>,
    /// Most bytes of stored (compressed) archives one tenant may keep (`None`: no cap).
    pub tenant_cap_bytes: Option<u64>,
    /// Largest archive one snapshot, restore or import may be before compression, in bytes.
    pub max_archive_bytes: u64,
    /// zstd's compression level (1 to 19; 3 is zstd's own default).
    pub level: i32,
}

impl SnapshotConfig {
    /// Default retention: 30 days.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
    /// Default cap of one tenant's snapshots: 10 GiB stored.
    pub const DEFAULT_TENANT_CAP_BYTES: u64 = 10 << 30;
    /// Default largest archive: 4 GiB.
    pub const DEFAULT_MAX_ARCHIVE_BYTES: u64 = 4 << 30;

    /// Snapshots kept in `dir` with the defaults above.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        SnapshotConfig {
            dir: dir.into(),
            retention: Some(Self::DEFAULT_RETENTION),
            tenant_cap_bytes: Some(Self::DEFAULT_TENANT_CAP_BYTES),
            max_archive_bytes: Self::DEFAULT_MAX_ARCHIVE_BYTES,
            level: 3,
        }
    }

    fn archive_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.tar.zst"))
    }
}

/// Where a fork starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForkFrom {
    /// A snapshot of the tenant, by name.
    Snapshot(String),
    /// A live conversation of the tenant, as it is now.
    Conversation(ConversationId),
}

impl Manager {
    /// Keeps snapshots as `config` says; without it, every snapshot operation is refused.
    #[must_use]
    pub fn with_snapshots(mut self, config: SnapshotConfig) -> Self {
        self.snapshots = Some(Arc::new(config));
        self
    }

    /// The snapshot configuration, when snapshots are on.
    pub fn snapshot_config(&self) -> Option<&SnapshotConfig> {
        self.snapshots.as_deref()
    }

    /// One of this process's snapshot slots for an operation of `tenant`, held for its
    /// length: they bound the scratch disk snapshot operations take at once, and one tenant
    /// holds at most half of them.
    ///
    /// # Errors
    /// [`Error::Busy`] when `tenant` holds its share, or every slot is taken (retry).
    pub(crate) fn snapshot_slot(&self, tenant: &TenantId) -> Result<slots::SnapshotSlot> {
        self.snapshot_slots.take(tenant)
    }

    fn snapshot_dir(&self) -> Result<Arc<SnapshotConfig>> {
        let config = self
            .snapshots
            .clone()
            .ok_or_else(|| Error::RuntimeUnavailable {
                runtime: self.runtime.info().name,
                reason: "snapshots are not configured in this process".into(),
                hint: "run it with a data directory (the CLI and `serve` keep snapshots under it)"
                    .into(),
            })?;
        let dir = config.dir.clone();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode_private()
            .create(&dir)
            .map_err(|e| io_error("create", &dir, &e))?;
        Ok(config)
    }

    /// Takes a snapshot named `name` of `conversation`'s workspace, kept for `keep` (`None`:
    /// the configured retention; zero: until deleted): opens it held ([`Operation::Snapshot`]), then
    /// [`Manager::snapshot_of`].
    ///
    /// # Errors
    /// As [`Manager::snapshot_of`]; [`Error::NotFound`] for an absent conversation.
    pub async fn snapshot(
        &self,
        conversation: &ConversationRef,
        name: &str,
        keep: Option<Duration>,
    ) -> Result<SnapshotRecord> {
        validate_snapshot_name(name)?;
        let opened = self
            .open_for(conversation, Operation::Snapshot.open_mode())
            .await?;
        let (conv, lock) = opened.into_parts();
        let r = self.snapshot_of(&conv, name, keep).await;
        let closed = Box::new(conv).close().await;
        drop(lock);
        let record = r?;
        closed?;
        Ok(record)
    }

    /// Takes a snapshot named `name` of the open `conversation` (the caller holds it for the
    /// snapshot's length; the runtime pauses its background commands).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad name or an archive that breaks the rules;
    /// [`Error::AlreadyExists`] when the tenant has a snapshot of that name;
    /// [`Error::TooLarge`] past the archive limit or the tenant's cap (nothing kept); the
    /// runtime's errors.
    pub async fn snapshot_of(
        &self,
        conversation: &Conversation,
        name: &str,
        keep: Option<Duration>,
    ) -> Result<SnapshotRecord> {
        validate_snapshot_name(name)?;
        let config = self.snapshot_dir()?;
        let conv = conversation.conversation().clone();
        let _slot = self.snapshot_slot(&conv.tenant)?;
        let tenant = conv.tenant.clone();
        let (t, n) = (tenant.clone(), name.to_owned());
        if self.store.run(move |s| s.snapshot(&t, &n)).await?.is_some() {
            return Err(taken(name));
        }
        let tar = Scratch(temporary_archive(&config.dir, "snapshot"));
        conversation
            .archive_workspace(&tar.0, config.max_archive_bytes)
            .await?;
        let packed = Scratch(temporary_archive(&config.dir, "snapshot"));
        let (t, p, c) = (tar.0.clone(), packed.0.clone(), config.clone());
        let (stats, stored) = blocking(move || {
            check_and_compress(
                &t,
                &p,
                c.max_archive_bytes,
                c.level,
                ArchiveSource::Workspace,
            )
        })
        .await?;
        drop(tar);
        let record = new_record(
            self.store.now(),
            &tenant,
            name,
            Some(conv.id.clone()),
            self.runtime.info().name,
            stats,
            stored,
            keep.or(config.retention),
        );
        self.keep_snapshot(&config, packed, record).await
    }

    /// Publishes the compressed archive `packed` as `record`'s file, then records it; on a
    /// refusal the file goes.
    async fn keep_snapshot(
        &self,
        config: &SnapshotConfig,
        packed: Scratch,
        record: SnapshotRecord,
    ) -> Result<SnapshotRecord> {
        let path = config.archive_path(&record.id);
        let (from, to) = (packed.0.clone(), path.clone());
        blocking(move || publish(&from, &to)).await?;
        std::mem::forget(packed);
        let (r, cap) = (record.clone(), config.tenant_cap_bytes);
        let created = self.store.run(move |s| s.create_snapshot(&r, cap)).await;
        let detail = format!(
            "snapshot={} bytes={} files={} stored_bytes={}",
            record.name, record.bytes, record.files, record.stored_bytes
        );
        if let Err(e) = created {
            let _ = std::fs::remove_file(&path);
            self.audit_tenant(&record.tenant, "snapshot", &Err::<(), _>(e.clone()), detail)
                .await;
            return Err(e);
        }
        self.audit_tenant(&record.tenant, "snapshot", &Ok::<(), Error>(()), detail)
            .await;
        Ok(record)
    }

    /// The tenant's snapshots, oldest first.
    ///
    /// # Errors
    /// When the store fails.
    pub async fn snapshots(&self, tenant: &TenantId) -> Result<Vec<SnapshotRecord>> {
        let t = tenant.clone();
        self.store.run(move |s| s.snapshots(&t)).await
    }

    /// The tenant's snapshot `name`.
    ///
    /// # Errors
    /// [`Error::NotFound`] when it has none of that name.
    pub async fn snapshot_record(&self, tenant: &TenantId, name: &str) -> Result<SnapshotRecord> {
        validate_snapshot_name(name)?;
        let (t, n) = (tenant.clone(), name.to_owned());
        self.store
            .run(move |s| s.snapshot(&t, &n))
            .await?
            .ok_or_else(|| no_snapshot(name))
    }

    /// The stored archive (zstd-compressed tar) of snapshot `name`, opened: what an export
    /// sends. The file stays readable through the handle if the snapshot is deleted meanwhile.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the tenant has none of that name or its file is missing.
    pub async fn snapshot_archive(
        &self,
        tenant: &TenantId,
        name: &str,
    ) -> Result<(SnapshotRecord, std::fs::File)> {
        let config = self.snapshot_dir()?;
        let record = self.snapshot_record(tenant, name).await?;
        let path = config.archive_path(&record.id);
        let file = std::fs::File::open(&path).map_err(|e| missing_or(&path, &e))?;
        Ok((record, file))
    }

    /// Deletes the tenant's snapshot `name` (its record, then its archive). False when it had
    /// none.
    ///
    /// # Errors
    /// [`Error::Conflict`] while a template names it.
    pub async fn delete_snapshot(&self, tenant: &TenantId, name: &str) -> Result<bool> {
        validate_snapshot_name(name)?;
        let config = self.snapshot_dir()?;
        let (t, n) = (tenant.clone(), name.to_owned());
        let r = self.store.run(move |s| s.delete_snapshot(&t, &n)).await;
        self.audit_tenant(tenant, "snapshot.delete", &r, format!("snapshot={name}"))
            .await;
        let Some(record) = r? else {
            return Ok(false);
        };
        let path = config.archive_path(&record.id);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // The record is gone: garbage collection removes the file later.
            Err(e) => tracing::warn!("cannot remove {}: {e}", path.display()),
        }
        if let Some(clones) = self.runtime.clones()
            && let Err(e) = clones.remove_layer(&record.id).await
        {
            // As the archive: garbage collection removes it later.
            tracing::warn!("cannot remove the layer of snapshot {name}: {e}");
        }
        Ok(true)
    }

    /// Decompresses snapshot `record`'s archive into a scratch file.
    async fn unpack(
        &self,
        config: &Arc<SnapshotConfig>,
        record: &SnapshotRecord,
    ) -> Result<Scratch> {
        let tar = Scratch(temporary_archive(&config.dir, "restore"));
        let (from, to, max) = (
            config.archive_path(&record.id),
            tar.0.clone(),
            config.max_archive_bytes,
        );
        blocking(move || decompress(&from, &to, max)).await?;
        Ok(tar)
    }

    /// Replaces `conversation`'s workspace with snapshot `name` of its tenant: opens it held
    /// ([`Operation::Restore`]), then [`Manager::restore_into`].
    ///
    /// # Errors
    /// As [`Manager::restore_into`]; [`Error::NotFound`] for an absent conversation.
    pub async fn restore(
        &self,
        conversation: &ConversationRef,
        name: &str,
    ) -> Result<ArchiveStats> {
        let config = self.snapshot_dir()?;
        let _slot = self.snapshot_slot(&conversation.tenant)?;
        let record = self.snapshot_record(&conversation.tenant, name).await?;
        let tar = self.unpack(&config, &record).await?;
        let opened = self
            .open_for(conversation, Operation::Restore.open_mode())
            .await?;
        let (conv, lock) = opened.into_parts();
        let r = conv.restore_workspace(&tar.0).await;
        let closed = Box::new(conv).close().await;
        drop(lock);
        let stats = r?;
        closed?;
        Ok(stats)
    }

    /// Replaces the open `conversation`'s workspace with snapshot `name` of its tenant (the
    /// caller holds it). Background commands are not stopped: stop them first.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an absent snapshot; the runtime's errors ([`Error::TooLarge`]
    /// when it does not fit the disk quota).
    pub async fn restore_into(
        &self,
        conversation: &Conversation,
        name: &str,
    ) -> Result<ArchiveStats> {
        let config = self.snapshot_dir()?;
        let _slot = self.snapshot_slot(&conversation.conversation().tenant)?;
        let record = self
            .snapshot_record(&conversation.conversation().tenant, name)
            .await?;
        let tar = self.unpack(&config, &record).await?;
        conversation.restore_workspace(&tar.0).await
    }

    /// Makes conversation `to` (which must not exist) from `from`, of the same tenant: its
    /// workspace is a copy of the snapshot's, or of the live conversation's as it is now (held
    /// while it is archived). The tenant's default template is not applied to it. A fork that
    /// fails removes what it made.
    ///
    /// # Errors
    /// [`Error::AlreadyExists`] when `to` exists (it is left alone); [`Error::NotFound`] for
    /// an absent origin; the runtime's errors.
    pub async fn fork(&self, from: &ForkFrom, to: &ConversationRef) -> Result<ArchiveStats> {
        match from {
            ForkFrom::Snapshot(name) => {
                let config = self.snapshot_dir()?;
                let _slot = self.snapshot_slot(&to.tenant)?;
                self.refuse_existing(to).await?;
                let record = self.snapshot_record(&to.tenant, name).await?;
                let r = self
                    .create_from(to, Start::Snapshot(&record), || async {
                        self.unpack(&config, &record).await
                    })
                    .await;
                self.audit(to, "fork", &r, Some(format!("from_snapshot={name}")))
                    .await;
                r
            }
            ForkFrom::Conversation(id) => {
                let origin = ConversationRef::new(to.tenant.clone(), id.clone());
                if origin.key == to.key {
                    return Err(into_itself());
                }
                let opened = self
                    .open_for(&origin, Operation::Snapshot.open_mode())
                    .await?;
                let (conv, lock) = opened.into_parts();
                let r = self.fork_of(&conv, to).await;
                let _ = Box::new(conv).close().await;
                drop(lock);
                r
            }
        }
    }

    /// Makes conversation `to` (which must not exist, same tenant) from the open conversation
    /// `origin` as it is now (the caller holds it): as [`Manager::fork`].
    ///
    /// # Errors
    /// As [`Manager::fork`].
    pub async fn fork_of(
        &self,
        origin: &Conversation,
        to: &ConversationRef,
    ) -> Result<ArchiveStats> {
        let config = self.snapshot_dir()?;
        let _slot = self.snapshot_slot(&to.tenant)?;
        let from = origin.conversation();
        if from.key == to.key {
            return Err(into_itself());
        }
        if from.tenant != to.tenant {
            return Err(Error::InvalidRequest("a fork stays in its tenant".into()));
        }
        self.refuse_existing(to).await?;
        // Where the runtime clones the live workspace, no archive is made.
        let fallback = || async {
            let tar = Scratch(temporary_archive(&config.dir, "fork"));
            origin
                .archive_workspace(&tar.0, config.max_archive_bytes)
                .await?;
            let (t, max) = (tar.0.clone(), config.max_archive_bytes);
            blocking(move || {
                let len = std::fs::metadata(&t)
                    .map_err(|e| io_error("read", &t, &e))?
                    .len();
                if len > max {
                    return Err(Error::TooLarge {
                        what: "the workspace archive".into(),
                        limit: max,
                    });
                }
                let f = std::fs::File::open(&t).map_err(|e| io_error("open", &t, &e))?;
                sessionbox_archive::check_extension_sizes(&f)?;
                sessionbox_archive::rewrite_archive(
                    std::io::BufReader::new(f),
                    std::io::sink(),
                    ArchiveSource::Workspace,
                )
                .map(drop)
            })
            .await?;
            Ok(tar)
        };
        // A fork stays as restrained as its origin: a network policy of the origin's own goes
        // with it (set before the fork's sandbox first starts), unless the fork's id already
        // has one. Without this, forking would be a way around a conversation's policy.
        let carried = self.carry_policy(from, to).await?;
        let r = self
            .create_from(to, Start::Conversation(from), fallback)
            .await;
        if r.is_err() && carried {
            let scope = PolicyScope::Conversation(to.clone());
            let _ = self.store.run(move |s| s.clear_egress_policy(&scope)).await;
        }
        let detail = format!("from_conversation={}", from.id.as_str());
        self.audit(to, "fork", &r, Some(detail)).await;
        r
    }

    /// [`Error::AlreadyExists`] when `to` has a record.
    async fn refuse_existing(&self, to: &ConversationRef) -> Result<()> {
        let key = to.key.clone();
        if self.store.run(move |s| s.get(&key)).await?.is_some() {
            return Err(exists(to));
        }
        Ok(())
    }

    /// Makes conversation `to` (absent) from `start`: a clone where the runtime makes one,
    /// else the plain archive `fallback` gives restored into it. On a failure after it was
    /// made, destroys it.
    async fn create_from<F, Fut>(
        &self,
        to: &ConversationRef,
        start: Start<'_>,
        fallback: F,
    ) -> Result<ArchiveStats>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Scratch>>,
    {
        let lock = self.hold(to).await?;
        // Without the tenant's default template: the fork's own state replaces it.
        let conv = self.open_known(to, None, start).await?;
        if !conv.created() {
            let _ = Box::new(conv).close().await;
            return Err(exists(to));
        }
        let r = match conv.cloned.as_ref() {
            Some((stats, _)) => Ok(*stats),
            None => match fallback().await {
                Ok(tar) => conv.restore_workspace(&tar.0).await,
                Err(e) => Err(e),
            },
        };
        let closed = Box::new(conv).close().await;
        drop(lock);
        match (r, closed) {
            (Ok(stats), Ok(())) => Ok(stats),
            (Err(e), _) | (Ok(_), Err(e)) => {
                if let Err(d) = self.destroy(to).await {
                    tracing::warn!("a failed fork could not remove what it made: {d}");
                }
                Err(e)
            }
        }
    }

    /// Imports the archive in `from` (a tar, or a zstd-compressed tar) as snapshot `name` of
    /// `tenant`, checked against the rules first.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad name or archive; [`Error::AlreadyExists`];
    /// [`Error::TooLarge`] past the archive limit or the tenant's cap.
    pub async fn import_snapshot(
        &self,
        tenant: &TenantId,
        name: &str,
        from: &Path,
        keep: Option<Duration>,
    ) -> Result<SnapshotRecord> {
        validate_snapshot_name(name)?;
        let config = self.snapshot_dir()?;
        let _slot = self.snapshot_slot(tenant)?;
        let (t, n) = (tenant.clone(), name.to_owned());
        if self.store.run(move |s| s.snapshot(&t, &n)).await?.is_some() {
            return Err(taken(name));
        }
        let plain = Scratch(temporary_archive(&config.dir, "import"));
        let packed = Scratch(temporary_archive(&config.dir, "import"));
        let (src, p, k, c) = (
            from.to_path_buf(),
            plain.0.clone(),
            packed.0.clone(),
            config.clone(),
        );
        let (stats, stored) = blocking(move || {
            let mut magic = [0u8; 4];
            let n = {
                use std::io::Read;
                // The caller's file: one that cannot be opened is their input's fault.
                let mut f = std::fs::File::open(&src).map_err(|e| {
                    Error::InvalidRequest(format!("cannot open {}: {e}", src.display()))
                })?;
                let mut got = 0;
                while got < 4 {
                    match f.read(&mut magic[got..]) {
                        Ok(0) => break,
                        Ok(k) => got += k,
                        Err(e) => return Err(io_error("read", &src, &e)),
                    }
                }
                got
            };
            let tar = if n == 4 && magic == ZSTD_MAGIC {
                decompress(&src, &p, c.max_archive_bytes)?;
                p
            } else {
                src
            };
            check_and_compress(
                &tar,
                &k,
                c.max_archive_bytes,
                c.level,
                ArchiveSource::Restore,
            )
        })
        .await?;
        drop(plain);
        let record = new_record(
            self.store.now(),
            tenant,
            name,
            None,
            "import".into(),
            stats,
            stored,
            keep.or(config.retention),
        );
        self.keep_snapshot(&config, packed, record).await
    }

    /// Removes snapshots past their retention (their records, then their archives), archive
    /// files no record names, and temporary files older than an hour. Returns the names of
    /// the expired snapshots removed and how many files went. Nothing to do without
    /// snapshots configured.
    ///
    /// # Errors
    /// When the store or the directory cannot be read.
    pub async fn collect_snapshot_garbage(&self, dry_run: bool) -> Result<(Vec<String>, usize)> {
        let Some(config) = self.snapshots.clone() else {
            return Ok((Vec::new(), 0));
        };
        let now = self.store.now();
        let expired = self.store.run(move |s| s.expired_snapshots(now)).await?;
        let mut names = Vec::new();
        for record in expired {
            names.push(format!("{}/{}", record.tenant, record.name));
            if dry_run {
                continue;
            }
            // By id, and only while still expired and unpinned: a snapshot deleted and made
            // again under the same name meanwhile is not this one.
            let id = record.id.clone();
            match self
                .store
                .run(move |s| s.delete_expired_snapshot(&id, now))
                .await
            {
                Ok(None) => {}
                Ok(Some(_)) => {
                    let _ = std::fs::remove_file(config.archive_path(&record.id));
                    self.audit_tenant(
                        &record.tenant,
                        "snapshot.expire",
                        &Ok::<(), Error>(()),
                        format!("snapshot={}", record.name),
                    )
                    .await;
                }
                Err(e) => {
                    tracing::warn!(snapshot = %record.name, "cannot remove an expired snapshot: {e}")
                }
            }
        }
        let ids = self.store.run(move |s| s.snapshot_ids()).await?;
        let layers = self.collect_layers(&ids, dry_run).await?;
        let dir = config.dir.clone();
        let files = blocking(move || {
            let mut removed = 0;
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
                Err(e) => return Err(io_error("read", &dir, &e)),
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let stale = || {
                    entry
                        .metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age >= STALE_TEMPORARY)
                };
                let orphan = match name.strip_suffix(".tar.zst") {
                    Some(id) if !name.starts_with('.') => {
                        !ids.contains(id) && older_than_a_minute(&entry)
                    }
                    _ => name.starts_with('.') && name.ends_with(".tmp") && stale(),
                };
                if orphan && (dry_run || std::fs::remove_file(entry.path()).is_ok()) {
                    removed += 1;
                }
            }
            Ok(removed)
        })
        .await?;
        Ok((names, files + layers))
    }

    /// An audit entry about a tenant's snapshots (no conversation).
    async fn audit_tenant<T>(
        &self,
        tenant: &TenantId,
        operation: &str,
        outcome: &Result<T>,
        detail: String,
    ) {
        crate::audit_tenant(&self.store, tenant, operation, outcome, Some(detail)).await;
    }
}

/// The record of a snapshot made now: its id, counts and expiry (`keep` from now; a zero
/// `keep` never expires, as a zero retention).
#[allow(clippy::too_many_arguments)]
fn new_record(
    now: chrono::DateTime<Utc>,
    tenant: &TenantId,
    name: &str,
    origin: Option<ConversationId>,
    runtime: String,
    stats: ArchiveStats,
    stored_bytes: u64,
    keep: Option<Duration>,
) -> SnapshotRecord {
    // To the millisecond, as the store keeps it: the record returned now and the one read
    // back later show the same time.
    let now = chrono::DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now);
    SnapshotRecord {
        id: new_id(tenant, name),
        tenant: tenant.clone(),
        name: name.to_owned(),
        origin,
        runtime,
        bytes: stats.bytes,
        files: stats.files,
        directories: stats.directories,
        links: stats.links,
        stored_bytes,
        created_at: now,
        expires_at: keep
            .filter(|k| !k.is_zero())
            .and_then(|k| chrono::Duration::from_std(k).ok())
            .map(|k| now + k),
    }
}

fn exists(to: &ConversationRef) -> Error {
    Error::AlreadyExists(format!(
        "conversation {:?} exists: a fork makes a new conversation; pick an unused id",
        to.id.as_str()
    ))
}

fn into_itself() -> Error {
    Error::InvalidRequest("a conversation cannot be forked into itself".into())
}

fn taken(name: &str) -> Error {
    Error::AlreadyExists(format!(
        "the tenant has a snapshot named {name:?}: choose another name or delete it first"
    ))
}

fn no_snapshot(name: &str) -> Error {
    Error::NotFound(format!("the tenant has no snapshot named {name:?}"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sessionbox_core::{ConversationRef, Error, Session, TenantId};
    use sessionbox_local::host::{HostConfig, HostRuntime};
    use sessionbox_store::Store;

    use super::SnapshotConfig;
    use crate::Manager;

    /// The attack: many conversations snapshotting at once, each holding scratch archives on
    /// the host's disk. Past the process's slots an operation is refused as busy, holding
    /// nothing, and runs once a slot is free.
    #[tokio::test(flavor = "multi_thread")]
    async fn snapshot_operations_past_the_slots_are_refused_busy_and_hold_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
        let runtime = HostRuntime::new(HostConfig::new(dir.path())).unwrap();
        let snapshots = dir.path().join("snapshots");
        let m =
            Manager::new(store, Arc::new(runtime)).with_snapshots(SnapshotConfig::new(&snapshots));
        let a = ConversationRef::parse("default", "a").unwrap();
        let s = m.open(&a).await.unwrap();
        s.write("f", b"x").await.unwrap();
        Box::new(s).close().await.unwrap();

        let held: Vec<_> = (0..crate::SNAPSHOT_SLOTS)
            .map(|i| {
                m.snapshot_slot(&TenantId::new(format!("t{i}")).unwrap())
                    .unwrap()
            })
            .collect();
        let e = m.snapshot(&a, "one", None).await.unwrap_err();
        assert!(matches!(e, Error::Busy(_)), "{e:?}");
        assert!(m.snapshots(&a.tenant).await.unwrap().is_empty());
        let left = std::fs::read_dir(&snapshots).map_or(0, Iterator::count);
        assert_eq!(left, 0, "a refused snapshot leaves no file");
        drop(held);
        m.snapshot(&a, "one", None).await.unwrap();
    }
}
