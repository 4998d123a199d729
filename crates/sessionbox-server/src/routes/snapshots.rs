//! Snapshots, restore, fork and templates:
//!
//! - `POST /v1/conversations/{id}/snapshots` takes one; `POST .../restore` puts one back;
//!   `POST .../fork` makes a new conversation from the live one.
//! - `/v1/snapshots` lists the tenant's; `/v1/snapshots/{name}` shows or deletes one;
//!   `/v1/snapshots/{name}/archive` exports (GET, zstd-compressed tar) or imports (PUT, tar or
//!   zstd-compressed tar); `POST /v1/snapshots/{name}/fork` makes a conversation from one.
//! - `/v1/templates` lists the tenant's templates; `PUT/DELETE /v1/templates/{name}` names or
//!   removes one; `POST /v1/templates/{name}/fork` makes a conversation from one. The template
//!   `default` is restored into every new conversation of the tenant.
//!
//! Operations on a conversation run in its turn, on its session ([`Operation::Snapshot`],
//! [`Operation::Restore`]); the manager does the rest.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sessionbox_core::{
    ArchiveStats, ConversationId, ConversationRef, ConversationScope, Error, Operation, TenantId,
};
use sessionbox_manager::ForkFrom;
use sessionbox_store::SnapshotRecord;
use tokio::io::AsyncWriteExt;

use super::{audited, on_conversation};
use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::{JsonBody, PathArgs, QueryArgs};
use crate::openapi::ConversationErrors;
use crate::views::Binary;

/// Imports written to disk at once, server-wide: each may be up to the archive limit.
static IMPORTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// The tenants writing an import now: one each, so that one tenant sending two uploads as
/// slowly as it likes (a body has no deadline) cannot keep every other tenant's imports
/// refused.
static IMPORTING: std::sync::Mutex<BTreeSet<TenantId>> = std::sync::Mutex::new(BTreeSet::new());

/// A tenant's turn to write an import, given back when dropped.
struct Importing(TenantId);

impl Importing {
    fn take(tenant: &TenantId) -> Result<Importing, Error> {
        let mut busy = IMPORTING.lock().unwrap_or_else(|e| e.into_inner());
        if !busy.insert(tenant.clone()) {
            return Err(Error::Busy(
                "this tenant is writing an import already (one at a time); retry when it ends"
                    .into(),
            ));
        }
        Ok(Importing(tenant.clone()))
    }
}

impl Drop for Importing {
    fn drop(&mut self) {
        IMPORTING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

/// A snapshot as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Snapshot)]
pub(crate) struct SnapshotView {
    /// Unique within the tenant.
    name: String,
    /// The conversation it was taken from; `null` when imported.
    origin: Option<String>,
    /// The runtime it was taken on, or `import`.
    runtime: String,
    /// Bytes of file contents.
    bytes: u64,
    /// Regular files.
    files: u64,
    /// Directories.
    directories: u64,
    /// Symbolic links.
    links: u64,
    /// Bytes the stored (compressed) archive takes: what the tenant's cap counts.
    stored_bytes: u64,
    /// When it was taken or imported, to the millisecond (as the store keeps it).
    created_at: DateTime<Utc>,
    /// When retention removes it; absent: kept until deleted.
    expires_at: Option<DateTime<Utc>>,
}

impl From<SnapshotRecord> for SnapshotView {
    fn from(r: SnapshotRecord) -> Self {
        SnapshotView {
            name: r.name,
            origin: r.origin.map(String::from),
            runtime: r.runtime,
            bytes: r.bytes,
            files: r.files,
            directories: r.directories,
            links: r.links,
            stored_bytes: r.stored_bytes,
            created_at: r.created_at,
            expires_at: r.expires_at,
        }
    }
}

/// What an archive put into a workspace held.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Restored)]
pub(crate) struct RestoredView {
    /// The conversation written.
    conversation: String,
    /// Bytes of file contents.
    bytes: u64,
    /// Regular files.
    files: u64,
    /// Directories.
    directories: u64,
    /// Symbolic links.
    links: u64,
}

impl RestoredView {
    fn of(conversation: &ConversationRef, s: ArchiveStats) -> Self {
        RestoredView {
            conversation: conversation.id.as_str().to_owned(),
            bytes: s.bytes,
            files: s.files,
            directories: s.directories,
            links: s.links,
        }
    }
}

/// `POST /v1/conversations/{id}/snapshots`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SnapshotBody {
    /// 1-64 ASCII letters, digits, `.`, `_`, `-`, starting with a letter or digit.
    name: String,
    /// How long to keep it, in seconds; default the server's retention (30 days).
    #[serde(default)]
    keep_seconds: Option<u64>,
}

/// The snapshots of the tenant.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct SnapshotList {
    snapshots: Vec<SnapshotView>,
}

/// `POST .../restore`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RestoreBody {
    /// The snapshot's name.
    snapshot: String,
}

/// `POST .../fork`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkBody {
    /// The id of the new conversation (it must not exist).
    to: String,
}

/// A template: a name for a snapshot.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Template)]
pub(crate) struct TemplateView {
    /// The template's name (`default`: restored into every new conversation).
    #[serde(default)]
    name: String,
    /// The snapshot it names.
    snapshot: String,
}

/// The templates of the tenant.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct TemplateList {
    templates: Vec<TemplateView>,
}

/// Takes a snapshot of the conversation's workspace (background commands paused meanwhile).
#[utoipa::path(post, path = "/v1/conversations/{id}/snapshots", tag = "snapshots",
    operation_id = "snapshot_conversation",
    params(("id" = String, Path, description = "conversation id")),
    request_body = SnapshotBody,
    responses((status = 201, body = SnapshotView), ConversationErrors))]
pub(crate) async fn take(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    JsonBody(body): JsonBody<SnapshotBody>,
) -> Response {
    on_conversation(&principal, "snapshot", &id, async |conv| {
        let keep = body.keep_seconds.map(Duration::from_secs);
        let record = state
            .with_conversation(&conv, Operation::Snapshot, async |opened| {
                state
                    .manager
                    .snapshot_of(opened.conv, &body.name, keep)
                    .await
            })
            .await??;
        Ok((StatusCode::CREATED, Json(SnapshotView::from(record))).into_response())
    })
    .await
}

/// Replaces the conversation's workspace with a snapshot of its tenant. Background commands
/// are not stopped: kill them first.
#[utoipa::path(post, path = "/v1/conversations/{id}/restore", tag = "snapshots",
    operation_id = "restore_conversation",
    params(("id" = String, Path, description = "conversation id")),
    request_body = RestoreBody,
    responses((status = 200, body = RestoredView), ConversationErrors))]
pub(crate) async fn restore(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    JsonBody(body): JsonBody<RestoreBody>,
) -> Response {
    on_conversation(&principal, "restore", &id, async |conv| {
        if principal.scope.conversations != ConversationScope::All {
            // Snapshots belong to the tenant: a key limited to some conversations may restore
            // only one taken of a conversation it reaches.
            let record = state
                .manager
                .snapshot_record(&principal.tenant, &body.snapshot)
                .await?;
            // One taken of another conversation, or imported, is answered as an absent one:
            // the key learns neither that it exists nor where it came from.
            if !record
                .origin
                .as_ref()
                .is_some_and(|o| principal.scope.conversations.covers(o))
            {
                return Err(Error::NotFound(format!(
                    "the tenant has no snapshot named {:?}",
                    body.snapshot
                ))
                .into());
            }
        }
        let stats = state
            .with_conversation(&conv, Operation::Restore, async |opened| {
                state
                    .manager
                    .restore_into(opened.conv, &body.snapshot)
                    .await
            })
            .await??;
        Ok(Json(RestoredView::of(&conv, stats)).into_response())
    })
    .await
}

/// Makes a new conversation (`to`) from this one as it is now: a copy of its workspace.
#[utoipa::path(post, path = "/v1/conversations/{id}/fork", tag = "snapshots",
    operation_id = "fork_conversation",
    params(("id" = String, Path, description = "conversation id")),
    request_body = ForkBody,
    responses((status = 201, body = RestoredView), ConversationErrors))]
pub(crate) async fn fork_conversation(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    JsonBody(body): JsonBody<ForkBody>,
) -> Response {
    on_conversation(&principal, "fork", &id, async |conv| {
        let to = target(&principal, &body.to)?;
        let stats = state
            .with_conversation(&conv, Operation::Snapshot, async |opened| {
                state.manager.fork_of(opened.conv, &to).await
            })
            .await??;
        Ok((StatusCode::CREATED, Json(RestoredView::of(&to, stats))).into_response())
    })
    .await
}

/// The new conversation of a fork: one the caller's key reaches.
fn target(principal: &Principal, id: &str) -> Result<ConversationRef, Error> {
    let id = ConversationId::new(id)?;
    principal.scope.check_conversation(&id)?;
    Ok(ConversationRef::new(principal.tenant.clone(), id))
}

/// The tenant's snapshots, oldest first.
#[utoipa::path(get, path = "/v1/snapshots", tag = "snapshots", operation_id = "list_snapshots",
    responses((status = 200, body = SnapshotList), ConversationErrors))]
pub(crate) async fn list(State(state): State<AppState>, principal: Principal) -> Response {
    let result = async {
        let snapshots = state.manager.snapshots(&principal.tenant).await?;
        Ok(Json(SnapshotList {
            snapshots: snapshots.into_iter().map(SnapshotView::from).collect(),
        })
        .into_response())
    }
    .await;
    audited(&principal, "snapshots", result)
}

/// One snapshot.
#[utoipa::path(get, path = "/v1/snapshots/{name}", tag = "snapshots", operation_id = "get_snapshot",
    params(("name" = String, Path, description = "snapshot name")),
    responses((status = 200, body = SnapshotView), ConversationErrors))]
pub(crate) async fn get(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(name): PathArgs<String>,
) -> Response {
    let result = async {
        let record = state
            .manager
            .snapshot_record(&principal.tenant, &name)
            .await?;
        Ok(Json(SnapshotView::from(record)).into_response())
    }
    .await;
    audited(&principal, "snapshot.get", result)
}

/// Deletes a snapshot: 204, also when absent; 409 while a template names it.
#[utoipa::path(delete, path = "/v1/snapshots/{name}", tag = "snapshots",
    operation_id = "delete_snapshot",
    params(("name" = String, Path, description = "snapshot name")),
    responses((status = 204, description = "deleted, or was absent"), ConversationErrors))]
pub(crate) async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(name): PathArgs<String>,
) -> Response {
    let result = async {
        state
            .manager
            .delete_snapshot(&principal.tenant, &name)
            .await?;
        Ok(StatusCode::NO_CONTENT.into_response())
    }
    .await;
    audited(&principal, "snapshot.delete", result)
}

/// The snapshot's archive: a zstd-compressed POSIX tar of the workspace, for `PUT` here or
/// on another installation.
#[utoipa::path(get, path = "/v1/snapshots/{name}/archive", tag = "snapshots",
    operation_id = "export_snapshot",
    params(("name" = String, Path, description = "snapshot name")),
    responses((status = 200, description = "the archive (application/zstd)", content_type = "application/zstd", body = Binary), ConversationErrors))]
pub(crate) async fn export(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(name): PathArgs<String>,
) -> Response {
    let result = async {
        let (record, file) = state
            .manager
            .snapshot_archive(&principal.tenant, &name)
            .await?;
        let file = tokio::fs::File::from_std(file);
        let body = Body::from_stream(tokio_util::io::ReaderStream::new(file));
        Ok((
            [
                (header::CONTENT_TYPE, "application/zstd".to_owned()),
                (header::CONTENT_LENGTH, record.stored_bytes.to_string()),
                (
                    header::CONTENT_DISPOSITION,
                    format!("attachment; filename=\"{}.tar.zst\"", record.name),
                ),
            ],
            body,
        )
            .into_response())
    }
    .await;
    audited(&principal, "snapshot.export", result)
}

/// Imports an archive (a POSIX tar, or one compressed with zstd) as a snapshot, checked
/// against the archive rules first. 201 with the snapshot.
#[utoipa::path(put, path = "/v1/snapshots/{name}/archive", tag = "snapshots",
    operation_id = "import_snapshot",
    params(("name" = String, Path, description = "snapshot name"),
           ("keep_seconds" = Option<u64>, Query, description = "how long to keep it; default the server's retention")),
    request_body(content = Binary, content_type = "application/octet-stream", description = "the archive: a POSIX tar, or one compressed with zstd"),
    responses((status = 201, body = SnapshotView), ConversationErrors))]
pub(crate) async fn import(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(name): PathArgs<String>,
    QueryArgs(query): QueryArgs<ImportQuery>,
    request: Request,
) -> Response {
    let result = async {
        sessionbox_core::validate_snapshot_name(&name)?;
        let keep = query.keep_seconds.map(Duration::from_secs);
        let config = state.manager.snapshot_config().cloned().ok_or_else(|| {
            ApiError::from(Error::InvalidRequest(
                "snapshots are not configured on this server".into(),
            ))
        })?;
        let _turn = Importing::take(&principal.tenant)?;
        let _slot = IMPORTS.try_acquire().map_err(|_| {
            ApiError::from(Error::Busy(
                "two imports are being written already; retry later".into(),
            ))
        })?;
        let max = config.max_archive_bytes;
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max) {
            return Err(too_large(max).into());
        }
        let path = sessionbox_core::temporary_archive(&config.dir, "upload");
        let _ = std::fs::create_dir_all(&config.dir);
        let scratch = Removed(path.clone());
        let mut file = tokio::fs::File::create(&path)
            .await
            .map_err(|e| Error::Backend(format!("cannot store the upload: {e}")))?;
        let mut stream = request.into_body().into_data_stream();
        let mut written = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk
                .map_err(|e| Error::InvalidRequest(format!("the upload could not be read: {e}")))?;
            written += chunk.len() as u64;
            if written > max {
                return Err(too_large(max).into());
            }
            file.write_all(&chunk)
                .await
                .map_err(|e| Error::Backend(format!("cannot store the upload: {e}")))?;
        }
        file.flush()
            .await
            .map_err(|e| Error::Backend(format!("cannot store the upload: {e}")))?;
        drop(file);
        let record = state
            .manager
            .import_snapshot(&principal.tenant, &name, &scratch.0, keep)
            .await?;
        Ok((StatusCode::CREATED, Json(SnapshotView::from(record))).into_response())
    }
    .await;
    audited(&principal, "snapshot.import", result)
}

/// A file removed when dropped.
struct Removed(std::path::PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn too_large(max: u64) -> Error {
    Error::TooLarge {
        what: "the archive".into(),
        limit: max,
    }
}

/// `PUT /v1/snapshots/{name}/archive`'s query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ImportQuery {
    keep_seconds: Option<u64>,
}

/// Makes a new conversation (`to`) from a snapshot.
#[utoipa::path(post, path = "/v1/snapshots/{name}/fork", tag = "snapshots",
    operation_id = "fork_snapshot",
    params(("name" = String, Path, description = "snapshot name")),
    request_body = ForkBody,
    responses((status = 201, body = RestoredView), ConversationErrors))]
pub(crate) async fn fork_snapshot(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(name): PathArgs<String>,
    JsonBody(body): JsonBody<ForkBody>,
) -> Response {
    on_conversation(&principal, "fork", &body.to, async |to| {
        principal.scope.check_conversation(&to.id)?;
        let stats = state
            .manager
            .fork(&ForkFrom::Snapshot(name.clone()), &to)
            .await?;
        Ok((StatusCode::CREATED, Json(RestoredView::of(&to, stats))).into_response())
    })
    .await
}

/// The tenant's templates, by name.
#[utoipa::path(get, path = "/v1/templates", tag = "snapshots", operation_id = "list_templates",
    responses((status = 200, body = TemplateList), ConversationErrors))]
pub(crate) async fn templates(State(state): State<AppState>, principal: Principal) -> Response {
    let result = async {
        let templates = state.manager.templates(&principal.tenant).await?;
        Ok(Json(TemplateList {
            templates: templates
                .into_iter()
                .map(|(name, snapshot)| TemplateView { name, snapshot })
                .collect(),
        })
        .into_response())
    }
    .await;
    audited(&principal, "templates", result)
}

/// Names a snapshot as a template (replacing one of that name). `default` is restored into
/// every new conversation of the tenant.
#[utoipa::path(put, path = "/v1/templates/{name}", tag = "snapshots", operation_id = "set_template",
    params(("name" = String, Path, description = "template name")),
    request_body = TemplateView,
    responses((status = 200, body = TemplateView), ConversationErrors))]
pub(crate) async fn set_template(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(name): PathArgs<String>,
    JsonBody(body): JsonBody<TemplateView>,
) -> Response {
    let result = async {
        if !body.name.is_empty() && body.name != name {
            return Err(Error::InvalidRequest(format!(
                "the body names template {:?} but the path {name:?}",
                body.name
            ))
            .into());
        }
        state
            .manager
            .set_template(&principal.tenant, &name, &body.snapshot)
            .await?;
        Ok(Json(TemplateView {
            name,
            snapshot: body.snapshot,
        })
        .into_response())
    }
    .await;
    audited(&principal, "template.set", result)
}

/// Removes a template (not its snapshot): 204, also when absent.
#[utoipa::path(delete, path = "/v1/templates/{name}", tag = "snapshots",
    operation_id = "delete_template",
    params(("name" = String, Path, description = "template name")),
    responses((status = 204, description = "removed, or was absent"), ConversationErrors))]
pub(crate) async fn delete_template(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(name): PathArgs<String>,
) -> Response {
    let result = async {
        state
            .manager
            .remove_template(&principal.tenant, &name)
            .await?;
        Ok(StatusCode::NO_CONTENT.into_response())
    }
    .await;
    audited(&principal, "template.delete", result)
}

/// Makes a new conversation (`to`) from a template.
#[utoipa::path(post, path = "/v1/templates/{name}/fork", tag = "snapshots",
    operation_id = "fork_template",
    params(("name" = String, Path, description = "template name")),
    request_body = ForkBody,
    responses((status = 201, body = RestoredView), ConversationErrors))]
pub(crate) async fn fork_template(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(name): PathArgs<String>,
    JsonBody(body): JsonBody<ForkBody>,
) -> Response {
    on_conversation(&principal, "fork", &body.to, async |to| {
        // The new conversation must be one the key reaches.
        principal.scope.check_conversation(&to.id)?;
        let stats = state.manager.create_from_template(&to, &name).await?;
        Ok((StatusCode::CREATED, Json(RestoredView::of(&to, stats))).into_response())
    })
    .await
}
