//! A new conversation's starting state made by the runtime's clones
//! ([`sessionbox_core::WorkspaceClones`]) where it has them: a fork or template start then
//! costs a copy of blocks (a reflink where the file system has them) instead of an archive
//! streamed in file by file. A snapshot becomes a *layer* the first time a clone needs it
//! (named after the snapshot's id, which no other snapshot ever has); a layer whose snapshot
//! is gone is removed by [`crate::Manager::collect_snapshot_garbage`].

use std::sync::Arc;

use sessionbox_core::{ArchiveStats, ConversationKey, ConversationRef, Result, WorkspaceClones};
use sessionbox_store::SnapshotRecord;

use super::{DEFAULT_TEMPLATE, SnapshotConfig};
use crate::Manager;

/// The state a conversation starts from when an open creates it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Start<'a> {
    /// The tenant's [`DEFAULT_TEMPLATE`], when it has one (a plain open).
    DefaultTemplate,
    /// A clone of a snapshot, where the runtime makes one (else empty: the caller restores).
    Snapshot(&'a SnapshotRecord),
    /// A clone of a live conversation, held by the caller, where the runtime makes one.
    Conversation(&'a ConversationRef),
}

impl Manager {
    /// Makes `to`'s workspace from `start` with the runtime's clones, before its first open;
    /// `None` when the runtime made none (no clones, nothing to clone, or an image it cannot
    /// clone). Returns what the clone holds and where it came from.
    pub(crate) async fn clone_start(
        &self,
        to: &ConversationRef,
        start: &Start<'_>,
    ) -> Result<Option<(ArchiveStats, String)>> {
        let Some(clones) = self.runtime.clones() else {
            return Ok(None);
        };
        match *start {
            Start::DefaultTemplate => {
                let Some(config) = self.snapshots.clone() else {
                    return Ok(None);
                };
                let Some(record) = self.template_snapshot(&to.tenant, DEFAULT_TEMPLATE).await?
                else {
                    return Ok(None);
                };
                let _slot = self.snapshot_slot(&to.tenant)?;
                self.clone_snapshot(clones, &config, &record, &to.key).await
            }
            Start::Snapshot(record) => {
                let config = self.snapshot_dir()?;
                self.clone_snapshot(clones, &config, record, &to.key).await
            }
            Start::Conversation(from) => Ok(clones
                .clone_conversation(&from.key, &to.key)
                .await?
                .map(|s| (s, format!("conversation={}", from.id.as_str())))),
        }
    }

    /// Clones snapshot `record`'s layer into `to`, making the layer from its archive first
    /// when the runtime has none.
    async fn clone_snapshot(
        &self,
        clones: &dyn WorkspaceClones,
        config: &Arc<SnapshotConfig>,
        record: &SnapshotRecord,
        to: &ConversationKey,
    ) -> Result<Option<(ArchiveStats, String)>> {
        // A layer is the snapshot laid out: it holds what the record counts.
        let made = || {
            Some((
                ArchiveStats {
                    bytes: record.bytes,
                    files: record.files,
                    directories: record.directories,
                    links: record.links,
                    skipped: 0,
                },
                format!("snapshot={}", record.name),
            ))
        };
        if clones.clone_layer(&record.id, to).await? {
            return Ok(made());
        }
        let tar = self.unpack(config, record).await?;
        if !clones.make_layer(&record.id, &tar.0).await? {
            return Ok(None);
        }
        drop(tar);
        Ok(clones
            .clone_layer(&record.id, to)
            .await?
            .then(made)
            .flatten())
    }

    /// Removes the runtime's layers whose snapshot is gone (every one with no id in `ids`).
    /// Returns how many went (would go, with `dry_run`).
    pub(crate) async fn collect_layers(
        &self,
        ids: &std::collections::BTreeSet<String>,
        dry_run: bool,
    ) -> Result<usize> {
        let Some(clones) = self.runtime.clones() else {
            return Ok(0);
        };
        let mut removed = 0;
        for layer in clones.layers().await? {
            if ids.contains(&layer) {
                continue;
            }
            if dry_run || clones.remove_layer(&layer).await? {
                removed += 1;
            }
        }
        Ok(removed)
    }
}
