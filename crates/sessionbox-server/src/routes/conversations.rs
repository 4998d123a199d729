//! `/v1/conversations` and `/v1/conversations/{id}`: list, show, open (create) and destroy.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sessionbox_core::{MemoryMeasure, Operation, Session};
use sessionbox_store::ConversationRecord;

use super::{audited, on_conversation};
use crate::auth::Principal;
use crate::conversation::{conversation_not_found, notify_expired};
use crate::error::ApiError;
use crate::extract::{PathArgs, QueryArgs};
use crate::openapi::ConversationErrors;
use crate::views::ErrorBody;
use crate::{AppState, sessions};

/// A conversation as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Conversation)]
pub(crate) struct ConversationView {
    id: String,
    /// `active`, `expired` (past its expiry: its files are gone at its next use or garbage
    /// collection, whichever comes first; the next use makes a new conversation) or
    /// `destroying`.
    state: String,
    runtime: String,
    created_at: DateTime<Utc>,
    last_used_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    /// What the conversation has done since it was created (`GET /v1/conversations/{id}`
    /// only; absent in lists).
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageView>,
    /// The workspace's disk usage against its quota, as the kernel counts it
    /// (`GET /v1/conversations/{id}` only; absent in lists, and for a conversation without a
    /// disk quota: a runtime other than `isolated`, a server not running as root, the quota
    /// turned off, or a workspace not made yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    disk: Option<DiskView>,
    /// The sandbox's memory use now (`GET /v1/conversations/{id}` only; absent in lists, for
    /// a conversation whose sandbox is not running (stopped or paused: it is not started to be
    /// measured), and on the `aio` runtime, whose conversations share one container).
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<MemoryView>,
}

/// How long `GET /v1/conversations/{id}` waits for a runtime to tell a sandbox's memory use
/// (an OpenSandbox sandbox is asked through its server) before answering without it.
const MEMORY_READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

/// A sandbox's memory use now.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = MemoryUsage)]
pub(crate) struct MemoryView {
    /// Bytes in use.
    bytes_used: u64,
    /// The most the sandbox may hold (past it the kernel's out-of-memory killer ends a
    /// process); `null` when nothing bounds the sandbox as a whole (the `host` runtime, or
    /// `isolated` with rlimit-only limits).
    bytes_limit: Option<u64>,
    /// How `bytes_used` was measured.
    measured: MeasureView,
}

/// How a memory use was measured.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = MemoryMeasure)]
pub(crate) enum MeasureView {
    /// What the kernel charges the sandbox's memory cgroup against its limit: anonymous
    /// memory and the page cache of the files it touched.
    Cgroup,
    /// The sum of its processes' resident memory (`VmRSS`), where no cgroup bounds them.
    Processes,
}

/// A workspace's disk usage against its quota.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = DiskUsage)]
pub(crate) struct DiskView {
    /// Bytes in use (file data, directories and file-system metadata).
    bytes_used: u64,
    /// Bytes the workspace may hold: a write past it fails (`ENOSPC` inside the sandbox,
    /// `too_large` through the file API).
    bytes_limit: u64,
    /// Files, directories and links in use.
    inodes_used: u64,
    /// Files, directories and links the workspace may hold.
    inodes_limit: u64,
}

/// Operations run on a conversation since its creation, from the audit log.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Usage)]
pub(crate) struct UsageView {
    /// Every operation (open, exec, read, write, ...), refused ones included.
    operations: u64,
    /// Commands run: foreground, streamed and background.
    execs: u64,
    /// Count per operation name.
    by_operation: BTreeMap<String, u64>,
}

impl From<ConversationRecord> for ConversationView {
    fn from(record: ConversationRecord) -> Self {
        ConversationView {
            state: record.status(Utc::now()).to_owned(),
            id: record.conversation_id.into(),
            runtime: record.runtime,
            created_at: record.created_at,
            last_used_at: record.last_used_at,
            expires_at: record.expires_at,
            usage: None,
            disk: None,
            memory: None,
        }
    }
}

/// A page of conversations.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ConversationPage {
    conversations: Vec<ConversationView>,
    /// Pass as `cursor` for the next page; `null` on the last.
    next_cursor: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    limit: Option<usize>,
    cursor: Option<String>,
}

const MAX_PAGE: usize = 1000;
const DEFAULT_PAGE: usize = 100;

/// This tenant's conversations, by id, in pages.
#[utoipa::path(get, path = "/v1/conversations", tag = "conversations",
    operation_id = "list_conversations",
    params(("limit" = Option<usize>, Query, description = "1-1000, default 100"),
           ("cursor" = Option<String>, Query, description = "next_cursor of the previous page")),
    responses((status = 200, body = ConversationPage), ConversationErrors))]
pub(crate) async fn list(
    State(state): State<AppState>,
    principal: Principal,
    QueryArgs(query): QueryArgs<ListQuery>,
) -> Response {
    let result = async {
        let limit = query.limit.unwrap_or(DEFAULT_PAGE);
        if limit == 0 || limit > MAX_PAGE {
            return Err(ApiError::bad_request(format!(
                "limit must be between 1 and {MAX_PAGE}"
            )));
        }
        let mut records = state.manager.list(Some(&principal.tenant)).await?;
        // A key limited to some conversations sees only those.
        records.retain(|r| principal.scope.conversations.covers(&r.conversation_id));
        records.sort_by(|a, b| a.conversation_id.cmp(&b.conversation_id));
        let start = match &query.cursor {
            Some(cursor) => {
                records.partition_point(|r| r.conversation_id.as_str() <= cursor.as_str())
            }
            None => 0,
        };
        let mut page: Vec<ConversationView> = records
            .into_iter()
            .skip(start)
            .take(limit + 1)
            .map(ConversationView::from)
            .collect();
        let next_cursor = if page.len() > limit {
            page.truncate(limit);
            page.last().map(|c| c.id.clone())
        } else {
            None
        };
        Ok(Json(ConversationPage {
            conversations: page,
            next_cursor,
        })
        .into_response())
    }
    .await;
    audited(&principal, "list", result)
}

/// One conversation: state, runtime, created, last use, expiry.
#[utoipa::path(get, path = "/v1/conversations/{id}", tag = "conversations",
    operation_id = "get_conversation",
    params(("id" = String, Path, description = "conversation id")),
    responses((status = 200, body = ConversationView), ConversationErrors))]
pub(crate) async fn get(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
) -> Response {
    on_conversation(&principal, "get", &id, async |conv| {
        let Some(record) = stored_record(&state, &conv).await? else {
            return Err(conversation_not_found(&conv).into());
        };
        let (key, since) = (conv.key.clone(), record.created_at);
        let runtime = state.manager.runtime();
        let (disk, memory) = match record.runtime == runtime.info().name {
            // Memory is shown when it can be read within MEMORY_READ_LIMIT: a sandbox that
            // cannot be asked (its server restarting, its agent busy) still has its other facts
            // shown, without waiting for it.
            true => (
                runtime.disk_usage(&key).await?,
                match tokio::time::timeout(MEMORY_READ_LIMIT, runtime.memory_usage(&key)).await {
                    Ok(Ok(m)) => m,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "memory use not read");
                        None
                    }
                    Err(_) => None,
                },
            ),
            false => (None, None),
        };
        let counts = state
            .manager
            .store()
            .run(move |s| s.operation_counts(&key, since))
            .await?;
        let by_operation: BTreeMap<String, u64> = counts.into_iter().collect();
        let mut view = ConversationView::from(record);
        view.usage = Some(UsageView {
            operations: by_operation.values().sum(),
            // Foreground, streamed and background commands alike.
            execs: by_operation
                .iter()
                .filter(|(op, _)| *op == "exec" || op.starts_with("exec_"))
                .map(|(_, n)| n)
                .sum(),
            by_operation,
        });
        view.disk = disk.map(|d| DiskView {
            bytes_used: d.bytes_used,
            bytes_limit: d.bytes_limit,
            inodes_used: d.inodes_used,
            inodes_limit: d.inodes_limit,
        });
        view.memory = memory.map(|m| MemoryView {
            bytes_used: m.bytes_used,
            bytes_limit: m.bytes_limit,
            measured: match m.measured {
                MemoryMeasure::Cgroup => MeasureView::Cgroup,
                MemoryMeasure::Processes => MeasureView::Processes,
            },
        });
        Ok(Json(view).into_response())
    })
    .await
}

/// `POST /v1/conversations/{id}`: the conversation, opened (and created when new).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = OpenedConversation)]
pub(crate) struct OpenedView {
    /// True when this call created the conversation (status 201), false when it existed (200).
    created: bool,
    /// Set when this call created the conversation because the last one of its id expired:
    /// when that one expired. Its files are gone; this one starts empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_expired_at: Option<DateTime<Utc>>,
    /// The workspace root as the conversation's commands see it (`/workspace` on the isolated
    /// runtime; a host directory on the host runtime). Paths may be given relative to it.
    workspace_root: String,
    /// The conversation key: hex SHA-256 of tenant and id, the name of its workspace and
    /// record (the same as the audit log's `conversation_key`).
    key: String,
    conversation: ConversationView,
}

/// Opens a conversation, creating it (workspace and sandbox) when it does not exist: 201 when
/// created, 200 when it existed. Idempotent; concurrent first calls create it once.
#[utoipa::path(post, path = "/v1/conversations/{id}", tag = "conversations",
    operation_id = "open_conversation",
    params(("id" = String, Path, description = "conversation id")),
    responses((status = 200, description = "it existed", body = OpenedView), (status = 201, description = "created", body = OpenedView),
              (status = 400, description = "invalid input", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn open(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
) -> Response {
    on_conversation(&principal, "open", &id, async |conv| {
        let (created, previous_expired_at, workspace_root) = state
            .with_conversation(&conv, Operation::Open, async |opened| {
                (
                    opened.created(),
                    opened.previous_expired_at(),
                    opened.conv.workspace_root().to_owned(),
                )
            })
            .await?;
        // Read again: the record as the open renewed it.
        let record = stored_record(&state, &conv)
            .await?
            .ok_or_else(|| conversation_not_found(&conv))?;
        let status = if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        let view = OpenedView {
            created,
            previous_expired_at,
            workspace_root,
            key: conv.key.to_string(),
            conversation: record.into(),
        };
        Ok(notify_expired(
            (status, Json(view)).into_response(),
            previous_expired_at,
        ))
    })
    .await
}

/// The stored record of `conv`, if any.
async fn stored_record(
    state: &AppState,
    conv: &sessionbox_core::ConversationRef,
) -> sessionbox_core::Result<Option<ConversationRecord>> {
    let key = conv.key.clone();
    state.manager.store().run(move |s| s.get(&key)).await
}

/// Destroys a conversation: processes, sandbox, workspace, record. 204 also when absent.
#[utoipa::path(delete, path = "/v1/conversations/{id}", tag = "conversations",
    operation_id = "destroy_conversation",
    params(("id" = String, Path, description = "conversation id")),
    responses((status = 204, description = "destroyed, or was absent"), ConversationErrors))]
pub(crate) async fn destroy(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
) -> Response {
    on_conversation(&principal, "destroy", &id, async |conv| {
        if principal.scope.conversations != sessionbox_core::ConversationScope::All {
            // Destroying drops the conversation's own network policy, and using the id again
            // would start it under the tenant's: a narrowed key must not get around the policy
            // set for it that way.
            let scope = sessionbox_store::PolicyScope::Conversation(conv.clone());
            let own = state
                .manager
                .store()
                .run(move |s| s.egress_policy(&scope))
                .await?;
            if own.is_some() {
                return Err(sessionbox_core::Error::Forbidden(format!(
                    "conversation {:?} has a network policy of its own, which destroying it \
                     would drop; this API key is limited to {}: destroy it with a key that is \
                     not",
                    conv.id.as_str(),
                    principal.scope.conversations
                ))
                .into());
            }
        }
        let _turn = state.turn(&conv.key).await?;
        let _held = state.manager.hold(&conv).await?;
        state.commands.end_conversation(&conv.key);
        if let Some(cached) = state.sessions.take(&conv.key) {
            sessions::close_all(vec![cached.conv]).await;
        }
        state.manager.destroy(&conv).await?;
        Ok(StatusCode::NO_CONTENT.into_response())
    })
    .await
}
