//! What a caller may learn about its key, its tenant's audit trail and the installation:
//! `GET /v1/whoami`, `GET /v1/audit`, `GET /v1/installation` (the dashboard's views, and any
//! client's).

use std::collections::HashMap;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sessionbox_core::{ConversationId, ConversationRef, KeyScope};
use sessionbox_store::AuditFilter;
use utoipa::ToSchema;

use super::audited;
use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::QueryArgs;

/// The caller's key.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WhoamiView {
    /// The tenant the key acts in.
    tenant: String,
    /// The key's id (`keys list`); `null` on a server open without keys.
    key_id: Option<String>,
    /// What the key reaches: `conversations` (`{"kind": "all"}`, `{"kind": "one", "value":
    /// ID}` or `{"kind": "prefix", "value": TEXT}`) and `read_only`.
    #[schema(value_type = Object)]
    scope: KeyScope,
    /// When the key stops being accepted; `null` for never.
    expires_at: Option<DateTime<Utc>>,
}

/// The caller: its tenant, its key's id, scope and expiry.
#[utoipa::path(get, path = "/v1/whoami", tag = "account", operation_id = "whoami",
    responses((status = 200, body = WhoamiView)))]
pub(crate) async fn whoami(principal: Principal) -> Response {
    let result: Result<Response, ApiError> = Ok(Json(WhoamiView {
        tenant: principal.tenant.as_str().to_owned(),
        key_id: principal.key_id.clone(),
        scope: principal.scope.clone(),
        expires_at: principal.expires_at,
    })
    .into_response());
    audited(&principal, "whoami", result)
}

/// The query of `GET /v1/audit`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuditQuery {
    conversation: Option<String>,
    limit: Option<usize>,
}

/// One audit record.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AuditRecordView {
    /// When.
    at: DateTime<Utc>,
    /// What (`exec`, `write`, `http.exec`, `mcp.bash`, `http.refused`, ...).
    operation: String,
    /// `ok` or an error code.
    outcome: String,
    /// The conversation's id, when it names one that still exists (or the one asked for).
    conversation: Option<String>,
    /// Who and how long (`key=ID duration_ms=N`); never contents or secrets.
    detail: Option<String>,
}

/// Audit records, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AuditView {
    records: Vec<AuditRecordView>,
}

const MAX_AUDIT: usize = 1000;

/// The tenant's audit trail, newest first, or one conversation's.
///
/// A key limited to some conversations may read only one of theirs (`conversation`).
#[utoipa::path(get, path = "/v1/audit", tag = "account", operation_id = "audit_log",
    params(("conversation" = Option<String>, Query, description = "only this conversation's records"),
           ("limit" = Option<usize>, Query, description = "1-1000, default 100")),
    responses((status = 200, body = AuditView),
              (status = 400, description = "invalid input", body = crate::views::ErrorBody),
              (status = 422, description = "a query parameter this route does not take", body = crate::views::ErrorBody),
              (status = 403, description = "the key's scope does not reach it", body = crate::views::ErrorBody)))]
pub(crate) async fn audit(
    State(state): State<AppState>,
    principal: Principal,
    QueryArgs(query): QueryArgs<AuditQuery>,
) -> Response {
    let result = async {
        let limit = query.limit.unwrap_or(100);
        if limit == 0 || limit > MAX_AUDIT {
            return Err(ApiError::bad_request(format!(
                "limit must be between 1 and {MAX_AUDIT}"
            )));
        }
        let one = match &query.conversation {
            Some(id) => {
                let id = ConversationId::new(id)?;
                principal.scope.check_conversation(&id)?;
                Some(ConversationRef::new(principal.tenant.clone(), id))
            }
            None => {
                principal
                    .scope
                    .check_tenant_wide("GET /v1/audit (the whole tenant's)")?;
                None
            }
        };
        // Records name conversations by key: the ids of those that exist.
        let ids: HashMap<String, String> = match &one {
            Some(c) => HashMap::from([(c.key.as_str().to_owned(), c.id.as_str().to_owned())]),
            None => state
                .manager
                .list(Some(&principal.tenant))
                .await?
                .into_iter()
                .map(|r| {
                    (
                        r.key.as_str().to_owned(),
                        r.conversation_id.as_str().to_owned(),
                    )
                })
                .collect(),
        };
        let filter = AuditFilter {
            tenant: Some(principal.tenant.clone()),
            key: one.map(|c| c.key),
            since: None,
            limit: Some(limit),
        };
        let records = state
            .manager
            .store()
            .run(move |s| s.audit_log(&filter))
            .await?
            .into_iter()
            .map(|r| AuditRecordView {
                at: r.entry.at,
                conversation: r
                    .entry
                    .conversation_key
                    .and_then(|k| ids.get(k.as_str()).cloned()),
                operation: r.entry.operation,
                outcome: r.entry.outcome,
                detail: r.entry.detail,
            })
            .collect();
        Ok(Json(AuditView { records }).into_response())
    }
    .await;
    audited(&principal, "audit", result)
}

/// The last garbage collection of this server, in counts.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct GcSummary {
    /// When it ran.
    pub(crate) at: DateTime<Utc>,
    /// Expired conversations destroyed.
    pub(crate) expired: usize,
    /// Conversations stuck in `destroying`, finished.
    pub(crate) stuck: usize,
    /// Sandboxes or workspaces without a record, removed.
    pub(crate) orphans: usize,
    /// Records without a sandbox, removed.
    pub(crate) dangling: usize,
    /// Idle sandboxes stopped.
    pub(crate) idle_stopped: usize,
    /// Snapshots past their retention, deleted.
    pub(crate) snapshots_expired: usize,
    /// The error, when it failed.
    pub(crate) error: Option<String>,
}

/// This installation as one key sees it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct InstallationView {
    /// sessionbox's version.
    version: String,
    /// The runtime: its name and the boundary it keeps.
    runtime: String,
    /// What isolates conversations, in words.
    boundary: String,
    /// `sqlite` or `postgresql`.
    store: String,
    /// This tenant's sandboxes with processes running.
    live_sandboxes: usize,
    /// This tenant's conversations.
    conversations: usize,
    /// The last garbage collection (counts over the whole installation, no ids); `null`
    /// before the first, or when it is off.
    gc: Option<GcSummary>,
    /// What was checked now: the store and the runtime answer.
    checks: Vec<CheckView>,
}

/// One check of the installation.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CheckView {
    /// What was checked.
    check: String,
    /// Whether it holds.
    ok: bool,
    /// What was found.
    detail: String,
}

/// The installation: version, runtime, store, live sandboxes, the last garbage collection,
/// and checks of the store and the runtime. Tenant-wide: a key limited to conversations is
/// refused.
#[utoipa::path(get, path = "/v1/installation", tag = "account", operation_id = "installation",
    responses((status = 200, body = InstallationView)))]
pub(crate) async fn installation(State(state): State<AppState>, principal: Principal) -> Response {
    let result = async {
        let runtime = state.manager.runtime();
        let info = runtime.info();
        let store = state.manager.store();
        let mut checks = Vec::new();
        match store.run(|s| s.schema_version()).await {
            Ok(v) => checks.push(CheckView {
                check: "store".into(),
                ok: true,
                detail: format!("answers, schema version {v}"),
            }),
            Err(e) => checks.push(CheckView {
                check: "store".into(),
                ok: false,
                detail: e.to_string(),
            }),
        }
        let mine: std::collections::HashSet<String> = state
            .manager
            .list(Some(&principal.tenant))
            .await?
            .into_iter()
            .map(|r| r.key.as_str().to_owned())
            .collect();
        let live = match runtime.list().await {
            Ok(list) => {
                checks.push(CheckView {
                    check: "runtime".into(),
                    ok: true,
                    detail: format!("{} answers", info.name),
                });
                // This tenant's: another tenant's activity is not this key's to see.
                list.iter()
                    .filter(|c| !c.processes.is_empty() && mine.contains(c.key.as_str()))
                    .count()
            }
            Err(e) => {
                checks.push(CheckView {
                    check: "runtime".into(),
                    ok: false,
                    detail: e.to_string(),
                });
                0
            }
        };
        let conversations = mine.len();
        Ok(Json(InstallationView {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            runtime: info.name.clone(),
            boundary: info.boundary.clone(),
            store: if store.is_shared() {
                "postgresql"
            } else {
                "sqlite"
            }
            .to_owned(),
            live_sandboxes: live,
            conversations,
            gc: state.last_gc(),
            checks,
        })
        .into_response())
    }
    .await;
    audited(&principal, "installation", result)
}
