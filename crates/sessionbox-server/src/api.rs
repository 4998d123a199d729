//! The routes and their JSON shapes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sessionbox_core::{
    ConversationId, ConversationKey, ConversationRef, DirEntry, EditRequest, Error, ExecRequest,
    ExitStatus, GrepMatch, GrepRequest, Refusal, Session,
};
use sessionbox_manager::Conversation;
use sessionbox_store::{AuditEntry, ConversationLock, ConversationRecord};

use crate::auth::Principal;
use crate::commands::{CommandListView, CommandLogsView, CommandView};
use crate::error::{ApiError, ErrorCode, rejection};
use crate::openapi::{
    BinaryDoc, DirEntryDoc, EditResultDoc, ErrorBody, ExitStatusDoc, FileStatDoc, GrepMatchDoc,
    GrepRequestDoc,
};
use crate::queue::Turn;
use crate::{AppState, blocking};

/// The application: every route, JSON errors for unknown routes and methods, body limits.
pub fn router(state: AppState) -> Router {
    let file_limit = DefaultBodyLimit::max(state.config.max_file_bytes);
    let json_limit = DefaultBodyLimit::max(state.config.max_json_bytes);
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/openapi.json", get(crate::openapi::document))
        .route("/v1/conversations", get(list_conversations))
        .route(
            "/v1/conversations/{id}",
            get(get_conversation)
                .post(open_conversation)
                .delete(destroy_conversation),
        )
        .route("/v1/conversations/{id}/exec", post(exec))
        .route("/v1/conversations/{id}/commands", get(list_commands))
        .route(
            "/v1/conversations/{id}/commands/{cmd}",
            get(command_status).delete(kill_command),
        )
        .route(
            "/v1/conversations/{id}/commands/{cmd}/logs",
            get(command_logs),
        )
        .route(
            "/v1/conversations/{id}/files",
            post(upload_files).layer(DefaultBodyLimit::max(state.config.max_file_bytes)),
        )
        .route(
            "/v1/conversations/{id}/files/{*path}",
            get(read_file)
                .put(write_file)
                .delete(remove_file)
                .layer(file_limit),
        )
        .route("/v1/conversations/{id}/edit", post(edit))
        .route("/v1/conversations/{id}/mkdir", post(mkdir))
        .route("/v1/conversations/{id}/ls", get(ls))
        .route("/v1/conversations/{id}/stat", get(stat))
        .route("/v1/conversations/{id}/glob", get(glob))
        .route("/v1/conversations/{id}/grep", post(grep))
        .route(
            "/v1/policy",
            get(crate::policy::get_tenant_policy)
                .put(crate::policy::put_tenant_policy)
                .delete(crate::policy::delete_tenant_policy),
        )
        .route(
            "/v1/conversations/{id}/policy",
            get(crate::policy::get_conversation_policy)
                .put(crate::policy::put_conversation_policy)
                .delete(crate::policy::delete_conversation_policy),
        )
        .route("/v1/egress-log", get(crate::policy::tenant_egress_log))
        .route(
            "/v1/conversations/{id}/egress-log",
            get(crate::policy::conversation_egress_log),
        )
        .route("/v1/skills", get(crate::skills::list_skills))
        .route(
            "/v1/conversations/{id}/skills/{name}",
            get(crate::skills::load_skill),
        )
        .route("/metrics", get(crate::metrics::metrics))
        .route("/mcp", crate::mcp::route(state.clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(json_limit)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::metrics::track,
        ))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}

// ---- Extractors whose rejections are the JSON error body. ----

pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(JsonBody(v)),
            Err(e) => Err(json_rejection(e)),
        }
    }
}

fn json_rejection(e: JsonRejection) -> ApiError {
    rejection(e.status(), e.body_text())
}

pub(crate) struct RawBody(Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        Bytes::from_request(req, state)
            .await
            .map(RawBody)
            .map_err(|e: BytesRejection| rejection(e.status(), e.body_text()))
    }
}

pub(crate) struct PathArgs<T>(pub(crate) T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for PathArgs<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| PathArgs(p.0))
            .map_err(|e: PathRejection| ApiError::bad_request(e.body_text()))
    }
}

pub(crate) struct QueryArgs<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryArgs<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| QueryArgs(q.0))
            .map_err(|e: QueryRejection| {
                // A parameter this route does not take is the wrong shape (422), as an unknown
                // field of a JSON body is; a value that does not parse is 400.
                let text = e.body_text();
                if text.contains("unknown field") {
                    rejection(StatusCode::UNPROCESSABLE_ENTITY, text)
                } else {
                    ApiError::bad_request(text)
                }
            })
    }
}

// ---- Conversations, turns and audit. ----

/// An open conversation and the turn that orders it.
pub(crate) struct Opened {
    pub(crate) conv: Conversation,
    /// True when this request created the conversation.
    created: bool,
    /// When this request created it because the last one of its id expired: when that one
    /// expired.
    previous_expired_at: Option<DateTime<Utc>>,
    touched: Instant,
    sessions: Arc<crate::sessions::Sessions>,
    /// The conversation held across processes and replicas (see `AppState::hold`).
    _held: ConversationLock,
    /// The session cache's generation before this session was opened or taken.
    generation: u64,
    /// The hash of the network policy in force when the session was opened (`None`: the
    /// profile `none`).
    policy: Option<String>,
    _turn: Turn,
}

impl Opened {
    /// When this request made the conversation anew because the last one of its id expired:
    /// when that one expired (its files are gone). See [`notify_expired`].
    pub(crate) fn previous_expired_at(&self) -> Option<DateTime<Utc>> {
        self.previous_expired_at
    }

    /// The session alone: the turn and the cross-process hold end here, so a long wait on the
    /// session (following a background command) does not hold up the conversation's other
    /// requests. The caller closes the session.
    pub(crate) fn detach(self) -> Conversation {
        self.conv
    }

    /// Keeps the session for the conversation's next request (closing one that the cache lets
    /// go), then ends the turn.
    pub(crate) async fn done(self) {
        let Opened {
            conv,
            touched,
            sessions,
            _held,
            generation,
            policy,
            _turn,
            ..
        } = self;
        let key = conv.conversation().key.clone();
        let cached = crate::sessions::Cached {
            conv,
            used: Instant::now(),
            touched,
            policy,
        };
        crate::sessions::close_all(sessions.put(key, cached, generation)).await;
    }
}

/// The hash of the network policy in force for `conv` (`None`: the profile `none`). A kept
/// session is used only while this is what it was opened under: a policy changed through
/// another replica, or with the CLI, reaches the runtime on the next request (the `isolated`
/// runtime relaunches a sandbox switched between `none` and an allowlist).
fn policy_hash(
    store: &sessionbox_store::Store,
    conv: &ConversationRef,
) -> sessionbox_core::Result<Option<String>> {
    Ok(store.effective_egress_policy(conv)?.map(|p| p.hash))
}

impl AppState {
    pub(crate) fn conversation(
        &self,
        p: &Principal,
        id: &str,
    ) -> Result<ConversationRef, ApiError> {
        let id = ConversationId::new(id)?;
        Ok(ConversationRef::new(p.tenant.clone(), id))
    }

    async fn turn(&self, key: &ConversationKey) -> Result<Turn, ApiError> {
        self.queues
            .turn(key, self.config.max_queue)
            .await
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "busy",
                    format!(
                        "more than {} requests are queued for this conversation; retry later",
                        self.config.max_queue
                    ),
                )
            })
    }

    /// Holds the conversation for one operation across processes and replicas sharing the
    /// store (after this server's own turn, which orders its requests fairly). With
    /// PostgreSQL this is an advisory lock: requests on one conversation at two replicas run one
    /// at a time.
    pub(crate) async fn hold(&self, key: &ConversationKey) -> Result<ConversationLock, ApiError> {
        let store = self.manager.store().clone();
        let key = key.clone();
        Ok(blocking(move || store.lock_conversation(&key)).await?)
    }

    /// Whether a cached session may still be used: its record must still be the one it opened
    /// (same generation: not destroyed, here or by another replica, and made again), active and
    /// unexpired. Renews the record at most once per `TOUCH_EVERY`. On `false` the session is
    /// closed and the conversation opened afresh.
    async fn still_valid(&self, c: &crate::sessions::Cached) -> Result<Option<Instant>, ApiError> {
        let store = self.manager.store().clone();
        let conv = c.conv.conversation().clone();
        let key = conv.key.clone();
        let generation = c.conv.record().generation;
        let policy = c.policy.clone();
        let touch = c.touched.elapsed() >= crate::sessions::TOUCH_EVERY;
        let ok = blocking(move || {
            let now = chrono::Utc::now();
            let valid = store.get(&key)?.is_some_and(|r| {
                r.generation == generation
                    && r.state == sessionbox_store::ConversationState::Active
                    && !r.is_expired(now)
            }) && policy_hash(&store, &conv)? == policy;
            if valid && touch {
                return Ok(store.touch(&key, now).is_ok());
            }
            Ok(valid)
        })
        .await?;
        Ok(ok.then(|| if touch { Instant::now() } else { c.touched }))
    }

    async fn record(&self, key: &ConversationKey) -> Result<Option<ConversationRecord>, ApiError> {
        let store = self.manager.store().clone();
        let key = key.clone();
        Ok(blocking(move || store.get(&key)).await?)
    }

    /// Waits for the conversation's turn, then opens it. With `create` false, a conversation
    /// that does not exist is 404 and is not created.
    pub(crate) async fn open(
        &self,
        conv: &ConversationRef,
        create: bool,
    ) -> Result<Opened, ApiError> {
        let turn = self.turn(&conv.key).await?;
        let held = self.hold(&conv.key).await?;
        let generation = self.sessions.generation();
        if let Some(c) = self.sessions.take(&conv.key) {
            // Kept from an earlier request: used only while its record is still the one it
            // opened (another process or replica may have destroyed it, or it expired).
            match self.still_valid(&c).await {
                Ok(Some(touched)) => {
                    return Ok(Opened {
                        conv: c.conv,
                        created: false,
                        previous_expired_at: None,
                        touched,
                        sessions: self.sessions.clone(),
                        _held: held,
                        generation,
                        policy: c.policy.clone(),
                        _turn: turn,
                    });
                }
                Ok(None) => crate::sessions::close_all(vec![c.conv]).await,
                Err(e) => {
                    crate::sessions::close_all(vec![c.conv]).await;
                    return Err(e);
                }
            }
        }
        if !create {
            match self.record(&conv.key).await? {
                None => return Err(conversation_not_found(conv)),
                Some(r) if r.is_expired(chrono::Utc::now()) => {
                    return Err(conversation_expired(conv, &r));
                }
                Some(_) => {}
            }
        }
        // Read before the runtime opens it: a change after this makes the next request
        // reopen, never keeps a session opened under another policy.
        let (store, c) = (self.manager.store().clone(), conv.clone());
        let policy = blocking(move || policy_hash(&store, &c)).await?;
        let opened = self.manager.open(conv).await?;
        Ok(Opened {
            created: opened.created(),
            previous_expired_at: opened.previous_expired().map(|n| n.expired_at),
            conv: opened,
            touched: Instant::now(),
            sessions: self.sessions.clone(),
            _held: held,
            generation,
            policy,
            _turn: turn,
        })
    }

    /// Audits one API call and turns its result into the response.
    pub(crate) async fn finish(
        &self,
        p: &Principal,
        operation: &'static str,
        key: Option<ConversationKey>,
        started: Instant,
        result: Result<Response, ApiError>,
    ) -> Response {
        let response = result.unwrap_or_else(ApiError::response);
        let status = response.status();
        let outcome = if status.is_success() {
            "ok".to_owned()
        } else {
            response
                .extensions()
                .get::<ErrorCode>()
                .map_or_else(|| status.as_u16().to_string(), |c| c.0.to_owned())
        };
        let entry = AuditEntry {
            at: Utc::now(),
            tenant: p.tenant.clone(),
            conversation_key: key,
            operation: format!("http.{operation}"),
            outcome,
            detail: Some(format!(
                "key={} status={} duration_ms={}",
                p.key_id.as_deref().unwrap_or("-"),
                status.as_u16(),
                started.elapsed().as_millis()
            )),
        };
        self.audit.record(entry);
        response
    }
}

/// The response header that tells a caller its request made the conversation anew because the
/// last one of its id expired (its files are gone): when that one expired, in RFC 3339.
pub(crate) const PREVIOUS_EXPIRED_HEADER: &str = "sessionbox-previous-expired-at";

/// Adds [`PREVIOUS_EXPIRED_HEADER`] to `r` when `at` is some.
pub(crate) fn notify_expired(mut r: Response, at: Option<DateTime<Utc>>) -> Response {
    if let Some(at) = at
        && let Ok(v) =
            HeaderValue::from_str(&at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    {
        r.headers_mut().insert(PREVIOUS_EXPIRED_HEADER, v);
    }
    r
}

fn conversation_not_found(conv: &ConversationRef) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("conversation {:?} does not exist", conv.id.as_str()),
    )
}

/// 404 for a conversation past its expiry, read by a request that does not create.
fn conversation_expired(conv: &ConversationRef, r: &ConversationRecord) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "conversation {:?} expired at {} and its files are gone; exec, write, mkdir or \
             POST /v1/conversations/{{id}} make a new one",
            conv.id.as_str(),
            r.expires_at
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_default()
        ),
    )
}

/// Runs `body` and audits it as `operation` on conversation `id` (when the id is valid).
macro_rules! audited {
    ($state:expr, $p:expr, $op:literal, $id:expr, |$conv:ident| $body:expr) => {{
        let started = Instant::now();
        let conv = $state.conversation(&$p, &$id);
        let key = conv.as_ref().ok().map(|c| c.key.clone());
        let result: Result<Response, ApiError> = async {
            let $conv = conv?;
            $body
        }
        .await;
        $state.finish(&$p, $op, key, started, result).await
    }};
}

impl ApiError {
    /// The response (it keeps the code for [`AppState::finish`]'s audit record).
    fn response(self) -> Response {
        self.into_response()
    }
}

// ---- Health. ----

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", security(),
    responses((status = 200, description = "alive", body = Object)))]
pub(crate) async fn healthz() -> Response {
    Json(serde_json::json!({ "status": "ok" })).into_response()
}

/// Readiness: the store and the runtime answer.
#[utoipa::path(get, path = "/readyz", tag = "health", security(),
    responses((status = 200, description = "ready", body = Object),
              (status = 503, description = "not ready", body = ErrorBody)))]
pub(crate) async fn readyz(State(s): State<AppState>) -> Response {
    let store = s.manager.store().clone();
    let store_ok = blocking(move || store.schema_version()).await;
    let runtime_ok = s.manager.runtime().list().await;
    match (store_ok, runtime_ok) {
        (Ok(_), Ok(_)) => Json(serde_json::json!({
            "status": "ready",
            "runtime": s.manager.runtime().info().name,
        }))
        .into_response(),
        (Err(e), _) | (_, Err(e)) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", e.to_string())
                .into_response()
        }
    }
}

// ---- Conversations. ----

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
}

/// Operations run on a conversation since its creation, from the audit log.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Usage)]
pub(crate) struct UsageView {
    /// Every operation (open, exec, read, write, ...), refused ones included.
    operations: u64,
    /// Commands run.
    execs: u64,
    /// Count per operation name.
    by_operation: BTreeMap<String, u64>,
}

impl From<ConversationRecord> for ConversationView {
    fn from(r: ConversationRecord) -> Self {
        ConversationView {
            state: r.status(Utc::now()).to_owned(),
            id: r.conversation_id.into(),
            runtime: r.runtime,
            created_at: r.created_at,
            last_used_at: r.last_used_at,
            expires_at: r.expires_at,
            usage: None,
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
    params(("limit" = Option<usize>, Query, description = "1-1000, default 100"),
           ("cursor" = Option<String>, Query, description = "next_cursor of the previous page")),
    responses((status = 200, body = ConversationPage), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 404, description = "no such conversation or file", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "JSON of the wrong shape", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn list_conversations(
    State(s): State<AppState>,
    p: Principal,
    QueryArgs(q): QueryArgs<ListQuery>,
) -> Response {
    let started = Instant::now();
    let result = async {
        let limit = q.limit.unwrap_or(DEFAULT_PAGE);
        if limit == 0 || limit > MAX_PAGE {
            return Err(ApiError::bad_request(format!(
                "limit must be between 1 and {MAX_PAGE}"
            )));
        }
        let mut records = s.manager.list(Some(&p.tenant)).await?;
        records.sort_by(|a, b| a.conversation_id.cmp(&b.conversation_id));
        let start = match &q.cursor {
            Some(c) => records.partition_point(|r| r.conversation_id.as_str() <= c.as_str()),
            None => 0,
        };
        let page: Vec<ConversationView> = records
            .into_iter()
            .skip(start)
            .take(limit + 1)
            .map(ConversationView::from)
            .collect();
        let (page, next) = if page.len() > limit {
            let mut page = page;
            page.truncate(limit);
            let next = page.last().map(|c| c.id.clone());
            (page, next)
        } else {
            (page, None)
        };
        Ok(Json(ConversationPage {
            conversations: page,
            next_cursor: next,
        })
        .into_response())
    }
    .await;
    s.finish(&p, "list", None, started, result).await
}

/// One conversation: state, runtime, created, last use, expiry.
#[utoipa::path(get, path = "/v1/conversations/{id}", tag = "conversations", params(("id" = String, Path, description = "conversation id")),
    responses((status = 200, body = ConversationView), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 404, description = "no such conversation or file", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "JSON of the wrong shape", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn get_conversation(
    State(s): State<AppState>,
    p: Principal,
    PathArgs(id): PathArgs<String>,
) -> Response {
    audited!(s, p, "get", id, |conv| {
        match s.record(&conv.key).await? {
            Some(r) => {
                let store = s.manager.store().clone();
                let (key, since) = (conv.key.clone(), r.created_at);
                let counts = blocking(move || store.operation_counts(&key, since)).await?;
                let by_operation: BTreeMap<String, u64> = counts.into_iter().collect();
                let mut view = ConversationView::from(r);
                view.usage = Some(UsageView {
                    operations: by_operation.values().sum(),
                    execs: by_operation.get("exec").copied().unwrap_or(0),
                    by_operation,
                });
                Ok(Json(view).into_response())
            }
            None => Err(conversation_not_found(&conv)),
        }
    })
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
#[utoipa::path(post, path = "/v1/conversations/{id}", tag = "conversations", params(("id" = String, Path, description = "conversation id")),
    responses((status = 200, description = "it existed", body = OpenedView), (status = 201, description = "created", body = OpenedView),
              (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn open_conversation(
    State(s): State<AppState>,
    p: Principal,
    PathArgs(id): PathArgs<String>,
) -> Response {
    audited!(s, p, "open", id, |conv| {
        let o = s.open(&conv, true).await?;
        let created = o.created;
        let previous_expired_at = o.previous_expired_at();
        let workspace_root = o.conv.workspace_root().to_owned();
        o.done().await;
        let record = s
            .record(&conv.key)
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
}

/// Destroys a conversation: processes, sandbox, workspace, record. 204 also when absent.
#[utoipa::path(delete, path = "/v1/conversations/{id}", tag = "conversations", params(("id" = String, Path, description = "conversation id")),
    responses((status = 204, description = "destroyed, or was absent"), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 404, description = "no such conversation or file", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "JSON of the wrong shape", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn destroy_conversation(
    State(s): State<AppState>,
    p: Principal,
    PathArgs(id): PathArgs<String>,
) -> Response {
    audited!(s, p, "destroy", id, |conv| {
        let _turn = s.turn(&conv.key).await?;
        let _held = s.hold(&conv.key).await?;
        s.commands.end_conversation(&conv.key);
        if let Some(c) = s.sessions.take(&conv.key) {
            crate::sessions::close_all(vec![c.conv]).await;
        }
        s.manager.destroy(&conv).await?;
        Ok(StatusCode::NO_CONTENT.into_response())
    })
}

// ---- Exec. ----

/// `POST /v1/conversations/{id}/exec`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecBody {
    /// The command line, run as `/bin/sh -c COMMAND`.
    command: String,
    /// Working directory, a workspace path; default the workspace root.
    #[serde(default)]
    cwd: Option<String>,
    /// Variables added to the base environment.
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// 1-600000; default 120000.
    #[serde(default)]
    timeout_ms: Option<u64>,
    /// Text for stdin.
    #[serde(default)]
    stdin: Option<String>,
    /// Bytes for stdin, base64 (standard alphabet, padded).
    #[serde(default)]
    stdin_base64: Option<String>,
    /// Cap on each of stdout and stderr, in bytes (1-16777216; default 1048576).
    #[serde(default)]
    output_limit: Option<usize>,
    /// Run in the background: answer 202 with a command id at once (see
    /// `.../commands/{cmd}`). The command does not hold the conversation's turn.
    #[serde(default)]
    background: bool,
}

/// What a command did. `stdout`/`stderr` are text (invalid UTF-8 replaced by U+FFFD); when the
/// bytes were not valid UTF-8, `stdout_base64`/`stderr_base64` hold them exactly.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ExecResult)]
pub(crate) struct ExecView {
    /// As a shell reports it: the code, 128 + signal, 124 after a timeout.
    exit_code: i32,
    #[schema(value_type = ExitStatusDoc)]
    status: ExitStatus,
    stdout: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    stdout_base64: Option<String>,
    stderr: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    stderr_base64: Option<String>,
    stdout_truncated: bool,
    stderr_truncated: bool,
    timed_out: bool,
    duration_ms: u64,
    /// Set when this request created the conversation because the last one of its id expired:
    /// when that one expired. Its files are gone; this one started empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_expired_at: Option<DateTime<Utc>>,
}

fn text_and_base64(bytes: Vec<u8>) -> (String, Option<String>) {
    match String::from_utf8(bytes) {
        Ok(s) => (s, None),
        Err(e) => {
            let b = e.into_bytes();
            (
                String::from_utf8_lossy(&b).into_owned(),
                Some(BASE64.encode(&b)),
            )
        }
    }
}

fn exec_request(s: &AppState, conv: &ConversationRef, b: ExecBody) -> Result<ExecRequest, Error> {
    let mut req = ExecRequest::new(b.command);
    if let Some(cwd) = b.cwd {
        s.manager.check_path(conv, &cwd)?;
        req.cwd = Some(cwd);
    }
    req.env = b.env;
    if let Some(ms) = b.timeout_ms {
        req.timeout = Duration::from_millis(ms);
    }
    if let Some(limit) = b.output_limit {
        req.output_limit = limit;
    }
    req.stdin = match (b.stdin, b.stdin_base64) {
        (Some(_), Some(_)) => {
            return Err(Error::InvalidRequest(
                "give stdin or stdin_base64, not both".into(),
            ));
        }
        (Some(t), None) => Some(t.into_bytes()),
        (None, Some(b64)) => Some(
            BASE64
                .decode(b64.as_bytes())
                .map_err(|e| Error::InvalidRequest(format!("stdin_base64 is not base64: {e}")))?,
        ),
        (None, None) => None,
    };
    req.validate()?;
    Ok(req)
}

/// Runs a shell command in the conversation's workspace (creating the conversation).
///
/// Three ways to get its result:
/// - JSON (default): `200` with the whole result once the command has ended.
/// - `Accept: text/event-stream`: `200` with server-sent events as the command runs: `stdout`
///   and `stderr` (data: `OutputText`, chunks in the order written, never split inside a
///   character), then one `exit` (data: `ExecExit`), or one `error` (data: `Error`) when it
///   could not run. Closing the stream kills the command.
/// - `"background": true`: `202` with the command's status (`BackgroundCommand`) at once; poll
///   `.../commands/{cmd}` and `.../commands/{cmd}/logs`, kill with `DELETE .../commands/{cmd}`.
#[utoipa::path(post, path = "/v1/conversations/{id}/exec", tag = "exec", params(("id" = String, Path, description = "conversation id"),
           ("Accept" = Option<String>, Header, description = "text/event-stream: stream the output as server-sent events")),
    request_body = ExecBody,
    responses((status = 200, description = "the command ran (whatever its exit code); with Accept: text/event-stream, the events `stdout`/`stderr` (OutputText), `exit` (ExecExit) or `error` (Error)",
               content((ExecView = "application/json"), (String = "text/event-stream"))),
              (status = 202, description = "started in the background", body = CommandView),
              (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 404, description = "no such conversation or file", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "JSON of the wrong shape", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full, or too many background commands run in it", body = ErrorBody)))]
pub(crate) async fn exec(
    State(s): State<AppState>,
    p: Principal,
    PathArgs(id): PathArgs<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<ExecBody>,
) -> Response {
    let background = body.background;
    let stream = !background && wants_event_stream(&headers);
    audited!(s, p, "exec", id, |conv| {
        let req = exec_request(&s, &conv, body)?;
        let o = s.open(&conv, true).await?;
        let previous_expired_at = o.previous_expired_at();
        if background {
            s.metrics.execs.with_label_values(&["background"]).inc();
            // The runtime owns the command from here; it does not hold the conversation's turn.
            let cmd = o.conv.spawn(req).await;
            o.done().await;
            let cmd = cmd?;
            crate::commands::started(&s, &conv, &cmd);
            return Ok(notify_expired(
                (StatusCode::ACCEPTED, Json(CommandView::from(&cmd))).into_response(),
                previous_expired_at,
            ));
        }
        if stream {
            s.metrics.execs.with_label_values(&["stream"]).inc();
            return Ok(notify_expired(
                crate::api::event_stream(o, req),
                previous_expired_at,
            ));
        }
        s.metrics.execs.with_label_values(&["json"]).inc();
        let r = o.conv.exec(req).await;
        o.done().await;
        let r = r?;
        let (stdout, stdout_base64) = text_and_base64(r.stdout.clone());
        let (stderr, stderr_base64) = text_and_base64(r.stderr.clone());
        Ok(Json(ExecView {
            exit_code: r.shell_exit_code(),
            status: r.status,
            stdout,
            stdout_base64,
            stderr,
            stderr_base64,
            stdout_truncated: r.stdout_truncated,
            stderr_truncated: r.stderr_truncated,
            timed_out: r.timed_out,
            duration_ms: u64::try_from(r.duration.as_millis()).unwrap_or(u64::MAX),
            previous_expired_at,
        })
        .into_response())
        .map(|r| notify_expired(r, previous_expired_at))
    })
}

/// True when the client asked for server-sent events.
fn wants_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| {
            m.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

/// How a streamed command ended: the `exit` event's data.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ExecExit {
    /// As a shell reports it: the code, 128 + signal, 124 after a timeout.
    exit_code: i32,
    #[schema(value_type = ExitStatusDoc)]
    status: ExitStatus,
    /// True when stdout went past the output limit and the rest was discarded.
    stdout_truncated: bool,
    /// True when stderr went past the output limit and the rest was discarded.
    stderr_truncated: bool,
    /// True when the timeout ended it.
    timed_out: bool,
    /// Wall time from spawn to the end of its output, in milliseconds.
    duration_ms: u64,
}

/// How often an exec event stream carries a `: keepalive` comment while nothing else is sent.
pub(crate) const SSE_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(5);

/// `events` as a server-sent event stream, with a `: keepalive`
/// comment every [`SSE_KEEPALIVE`] while the command is quiet (for proxies in front of the
/// server that give up on a silent response; the OpenSandbox server's own waits 180 s).
fn sse_response(
    events: impl futures::Stream<Item = axum::response::sse::Event> + Send + 'static,
) -> Response {
    use axum::response::sse::{KeepAlive, Sse};
    use futures::StreamExt;
    let events = events.map(Ok::<_, std::convert::Infallible>);
    let mut r = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(SSE_KEEPALIVE).text("keepalive"))
        .into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// Runs the command of `opened` in a task that sends its output as server-sent events; the
/// turn is held until the command ends. When the client goes away, the exec future is dropped,
/// which kills the command's process group.
fn event_stream(opened: Opened, request: ExecRequest) -> Response {
    use axum::response::sse::Event;
    use sessionbox_core::OutputStream;

    use crate::output::Utf8Chunker;

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
    tokio::spawn(async move {
        let mut chunkers = [Utf8Chunker::default(), Utf8Chunker::default()];
        let names = ["stdout", "stderr"];
        fn send(tx: &tokio::sync::mpsc::UnboundedSender<Event>, name: &str, data: impl Serialize) {
            if let Ok(e) = Event::default().event(name).json_data(data) {
                let _ = tx.send(e);
            }
        }
        let outcome = {
            let sink_tx = tx.clone();
            let chunkers = &mut chunkers;
            // Memory stays bounded: the runtime hands over at most `output_limit` bytes of
            // each stream (16 MiB at most), whatever the client's pace.
            let mut sink = move |stream: OutputStream, bytes: &[u8]| {
                let i = stream as usize;
                if let Some(text) = chunkers[i].push(bytes) {
                    send(&sink_tx, names[i], text);
                }
            };
            let run = opened.conv.exec_stream(request, &mut sink);
            tokio::select! {
                r = run => Some(r),
                () = tx.closed() => None,
            }
        };
        for (i, c) in chunkers.iter_mut().enumerate() {
            if let Some(text) = c.finish() {
                send(&tx, names[i], text);
            }
        }
        match outcome {
            Some(Ok(r)) => send(
                &tx,
                "exit",
                ExecExit {
                    exit_code: r.shell_exit_code(),
                    status: r.status,
                    stdout_truncated: r.stdout_truncated,
                    stderr_truncated: r.stderr_truncated,
                    timed_out: r.timed_out,
                    duration_ms: u64::try_from(r.duration.as_millis()).unwrap_or(u64::MAX),
                },
            ),
            Some(Err(e)) => {
                let e = ApiError::from(e);
                send(
                    &tx,
                    "error",
                    serde_json::json!({"code": e.code, "message": e.message}),
                );
            }
            None => tracing::debug!("the client closed the event stream; the command was killed"),
        }
        // The session is closed and the turn given back before the stream ends.
        opened.done().await;
        drop(tx);
    });
    sse_response(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (e, rx))
    }))
}

// ---- Background commands. ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LogsQuery {
    #[serde(default)]
    stdout_offset: Option<u64>,
    #[serde(default)]
    stderr_offset: Option<u64>,
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// Most bytes of each stream one logs answer (or one event-stream step) carries.
const LOGS_CHUNK: usize = 1024 * 1024;
/// How long one step of a followed stream waits for output.
const FOLLOW_WAIT: Duration = Duration::from_secs(15);
/// Events a follower may have read ahead of its client.
const FOLLOW_BUFFER: usize = 4;

/// Checks a command id before anything is opened.
fn command_id(cmd: &str) -> Result<(), ApiError> {
    Ok(sessionbox_core::validate_command_id(cmd)?)
}

/// Lists a conversation's background commands: running ones and the most recent finished
/// ones, oldest first. They belong to the runtime that runs them, so a restarted server lists
/// the commands an earlier one started.
#[utoipa::path(get, path = "/v1/conversations/{id}/commands", tag = "exec",
    params(("id" = String, Path, description = "conversation id")),
    responses((status = 200, body = CommandListView), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 404, description = "no such conversation", body = ErrorBody),
              (status = 503, description = "the runtime cannot run background commands", body = ErrorBody)))]
pub(crate) async fn list_commands(
    State(s): State<AppState>,
    p: Principal,
    PathArgs(id): PathArgs<String>,
) -> Response {
    audited!(s, p, "commands", id, |conv| {
        let o = s.open(&conv, false).await?;
        let all = o.conv.commands().await;
        o.done().await;
        let all = all?;
        s.commands.observe(&s, &conv, &all);
        Ok(Json(CommandListView::of(&all)).into_response())
    })
}

/// A background command's status: running, or how it ended.
#[utoipa::path(get, path = "/v1/conversations/{id}/commands/{cmd}", tag = "exec",
    params(("id" = String, Path, description = "conversation id"), ("cmd" = String, Path, description = "command id from the 202 of exec")),
    responses((status = 200, body = CommandView), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 404, description = "no such conversation or command", body = ErrorBody)))]
pub(crate) async fn command_status(
    State(s): State<AppState>,
    p: Principal,
    PathArgs((id, cmd)): PathArgs<(String, String)>,
) -> Response {
    audited!(s, p, "command_status", id, |conv| {
        command_id(&cmd)?;
        let o = s.open(&conv, false).await?;
        let c = o.conv.command(&cmd).await;
        o.done().await;
        let c = c?;
        s.commands.observe(&s, &conv, std::slice::from_ref(&c));
        Ok(Json(CommandView::from(&c)).into_response())
    })
}

/// A background command's output from byte offsets on, stdout and stderr apart.
///
/// - JSON (default): the output past the offsets (at most 1 MiB of each stream; poll again from
///   the `*_next_offset` of the answer). With `wait_ms` (at most 30000), waits that long for
///   new output or the end when there is none yet (a long poll).
/// - `Accept: text/event-stream`: follows the command live from the offsets: `stdout` and
///   `stderr` events (data: `OutputText`, never split inside a character) as the command
///   writes, then one `exit` event (data: `BackgroundCommand`) once it has ended and all its
///   output was sent, or one `error` (data: `Error`). Keepalive comments while it is quiet.
///   Closing the stream leaves the command running.
///
/// Neither holds the conversation's turn while it waits.
#[utoipa::path(get, path = "/v1/conversations/{id}/commands/{cmd}/logs", tag = "exec",
    params(("id" = String, Path, description = "conversation id"), ("cmd" = String, Path, description = "command id"),
           ("stdout_offset" = Option<u64>, Query, description = "bytes of stdout already read; default 0"),
           ("stderr_offset" = Option<u64>, Query, description = "bytes of stderr already read; default 0"),
           ("wait_ms" = Option<u64>, Query, description = "JSON only: wait up to this long (at most 30000) for new output; default 0"),
           ("Accept" = Option<String>, Header, description = "text/event-stream: follow the output as server-sent events until the command ends")),
    responses((status = 200, description = "the output, or with Accept: text/event-stream the events `stdout`/`stderr` (OutputText), `exit` (BackgroundCommand) or `error` (Error)",
               content((CommandLogsView = "application/json"), (String = "text/event-stream"))),
              (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 404, description = "no such conversation or command", body = ErrorBody),
              (status = 422, description = "an unknown query parameter", body = ErrorBody),
              (status = 429, description = "too many requests already follow or wait on command output", body = ErrorBody)))]
pub(crate) async fn command_logs(
    State(s): State<AppState>,
    p: Principal,
    PathArgs((id, cmd)): PathArgs<(String, String)>,
    headers: HeaderMap,
    QueryArgs(q): QueryArgs<LogsQuery>,
) -> Response {
    let follow = wants_event_stream(&headers);
    audited!(s, p, "command_logs", id, |conv| {
        command_id(&cmd)?;
        let read = sessionbox_core::OutputRequest {
            stdout_from: q.stdout_offset.unwrap_or(0),
            stderr_from: q.stderr_offset.unwrap_or(0),
            max_bytes: LOGS_CHUNK,
            wait: Duration::from_millis(q.wait_ms.unwrap_or(0)),
        };
        read.validate()?;
        if follow && q.wait_ms.is_some() {
            return Err(ApiError::bad_request(
                "wait_ms is for JSON polls; an event stream follows the command by itself",
            ));
        }
        // Waiting requests hold no turn of the conversation: they are counted instead.
        let waiter = if follow || !read.wait.is_zero() {
            Some(s.waiters.enter(&conv.key)?)
        } else {
            None
        };
        let o = s.open(&conv, false).await?;
        // Check the command exists before answering 200 (an event stream cannot say 404).
        let first = match o.conv.command(&cmd).await {
            Ok(c) => c,
            Err(e) => {
                o.done().await;
                return Err(e.into());
            }
        };
        s.commands.observe(&s, &conv, std::slice::from_ref(&first));
        if follow {
            return Ok(follow_command(o.detach(), cmd, read, waiter));
        }
        if read.wait.is_zero() {
            let out = o.conv.command_output(&cmd, read).await;
            o.done().await;
            return Ok(Json(CommandLogsView::of(&out?)).into_response());
        }
        let session = o.detach();
        let out = session.command_output(&cmd, read).await;
        let _ = Box::new(session).close().await;
        drop(waiter);
        Ok(Json(CommandLogsView::of(&out?)).into_response())
    })
}

/// Follows command `id` on `session` from the offsets of `from` as server-sent events, until it
/// has ended and its output was sent, or the client goes away; then closes the session and
/// gives `waiter`'s place back.
///
/// The output is read only as fast as the client takes it: the channel to the response holds
/// a few events, and the next read waits for room, so a slow follower costs the server at most
/// a few chunks.
fn follow_command(
    session: Conversation,
    id: String,
    from: sessionbox_core::OutputRequest,
    waiter: Option<crate::commands::WaiterGuard>,
) -> Response {
    use axum::response::sse::Event;

    use crate::output::Utf8Chunker;

    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(FOLLOW_BUFFER);
    tokio::spawn(async move {
        let _waiter = waiter;
        async fn send(tx: &tokio::sync::mpsc::Sender<Event>, name: &str, data: impl Serialize) {
            if let Ok(e) = Event::default().event(name).json_data(data) {
                let _ = tx.send(e).await;
            }
        }
        let mut chunkers = [Utf8Chunker::default(), Utf8Chunker::default()];
        let mut read = from;
        read.wait = FOLLOW_WAIT;
        loop {
            let step = tokio::select! {
                r = session.command_output(&id, read) => r,
                () = tx.closed() => break,
            };
            match step {
                Ok(out) => {
                    for (i, (name, bytes)) in [("stdout", &out.stdout), ("stderr", &out.stderr)]
                        .into_iter()
                        .enumerate()
                    {
                        if let Some(text) = chunkers[i].push(bytes) {
                            send(&tx, name, text).await;
                        }
                    }
                    read.stdout_from = out.stdout_next();
                    read.stderr_from = out.stderr_next();
                    if out.complete() {
                        for (i, name) in ["stdout", "stderr"].into_iter().enumerate() {
                            if let Some(text) = chunkers[i].finish() {
                                send(&tx, name, text).await;
                            }
                        }
                        send(&tx, "exit", CommandView::from(&out.command)).await;
                        break;
                    }
                }
                Err(e) => {
                    let e = ApiError::from(e);
                    send(
                        &tx,
                        "error",
                        serde_json::json!({"code": e.code, "message": e.message}),
                    )
                    .await;
                    break;
                }
            }
        }
        let _ = Box::new(session).close().await;
        drop(tx);
    });
    sse_response(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (e, rx))
    }))
}

/// Kills a background command's process group and answers its final status once it has
/// ended; a command that had already ended is answered as it was, at once.
#[utoipa::path(delete, path = "/v1/conversations/{id}/commands/{cmd}", tag = "exec",
    params(("id" = String, Path, description = "conversation id"), ("cmd" = String, Path, description = "command id")),
    responses((status = 200, description = "killed, or had ended", body = CommandView), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 404, description = "no such conversation or command", body = ErrorBody)))]
pub(crate) async fn kill_command(
    State(s): State<AppState>,
    p: Principal,
    PathArgs((id, cmd)): PathArgs<(String, String)>,
) -> Response {
    audited!(s, p, "command_kill", id, |conv| {
        command_id(&cmd)?;
        let o = s.open(&conv, false).await?;
        let c = o.conv.kill_command(&cmd).await;
        o.done().await;
        let c = c?;
        s.commands.observe(&s, &conv, std::slice::from_ref(&c));
        Ok(Json(CommandView::from(&c)).into_response())
    })
}

// ---- Files. ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadQuery {
    #[serde(default)]
    download: Option<String>,
}

fn truthy(v: &Option<String>) -> bool {
    matches!(v.as_deref(), Some("1" | "true" | "yes" | ""))
}

/// A single `bytes=` range of a `len`-byte body: `Ok(None)` for none or one this server does
/// not handle (then the whole body is sent), `Err` when unsatisfiable.
fn byte_range(headers: &HeaderMap, len: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(v) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    let Some(spec) = v.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.split_once('-') else {
        return Ok(None);
    };
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = if a.is_empty() {
        let Ok(n) = b.parse::<u64>() else {
            return Ok(None);
        };
        if n == 0 {
            return Err(());
        }
        (len.saturating_sub(n), len.saturating_sub(1))
    } else {
        let Ok(start) = a.parse::<u64>() else {
            return Ok(None);
        };
        let end = if b.is_empty() {
            len.saturating_sub(1)
        } else {
            match b.parse::<u64>() {
                Ok(e) if e >= start => e.min(len.saturating_sub(1)),
                _ => return Ok(None),
            }
        };
        (start, end)
    };
    if len == 0 || start >= len {
        return Err(());
    }
    Ok(Some((start, end)))
}

/// A content type from the file name's extension; `application/octet-stream` otherwise.
fn content_type(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("txt" | "log" | "md" | "rs" | "py" | "sh" | "toml" | "yaml" | "yml") => {
            "text/plain; charset=utf-8"
        }
        Some("csv") => "text/csv; charset=utf-8",
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("json") => "application/json",
        Some("pdf") => "application/pdf",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("svg") => "image/svg+xml",
        Some("zip") => "application/zip",
        Some("gz" | "tgz") => "application/gzip",
        _ => "application/octet-stream",
    }
}

/// `attachment; filename="..."` with the base name, non-ASCII and quotes replaced.
fn disposition(path: &str) -> HeaderValue {
    let base = path.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    let safe: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let safe = if safe.is_empty() {
        "download".to_owned()
    } else {
        safe
    };
    HeaderValue::from_str(&format!("attachment; filename=\"{safe}\""))
        .unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

/// Reads a file: raw bytes, one byte range, or an attachment with `download=1`.
#[utoipa::path(get, path = "/v1/conversations/{id}/files/{path}", tag = "files",
    params(("id" = String, Path, description = "conversation id"),
           ("path" = String, Path, description = "workspace path"),
           ("download" = Option<String>, Query, description = "1: Content-Disposition attachment"),
           ("Range" = Option<String>, Header, description = "bytes=START-END, one range")),
    responses((status = 200, description = "the file, typed by its name (application/octet-stream when unknown)", content_type = "*/*", body = BinaryDoc),
              (status = 206, description = "the range", content_type = "*/*", body = BinaryDoc),
              (status = 416, description = "range not satisfiable", body = ErrorBody), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 404, description = "no such conversation or file", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "JSON of the wrong shape", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn read_file(
    State(s): State<AppState>,
    p: Principal,
    PathArgs((id, path)): PathArgs<(String, String)>,
    QueryArgs(q): QueryArgs<ReadQuery>,
    headers: HeaderMap,
) -> Response {
    audited!(s, p, "read", id, |conv| {
        s.manager.check_path(&conv, &path)?;
        let o = s.open(&conv, false).await?;
        let data = o.conv.read(&path).await;
        o.done().await;
        let data = data?;
        let len = data.len() as u64;
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(&path)),
        );
        h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        // A workspace file is untrusted content served from the API's own origin: a browser
        // must neither guess it is HTML nor run its scripts there (a model may have written
        // it, or a page may have uploaded it).
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("sandbox; default-src 'none'"),
        );
        if truthy(&q.download) {
            h.insert(header::CONTENT_DISPOSITION, disposition(&path));
        }
        match byte_range(&headers, len) {
            Ok(None) => Ok((StatusCode::OK, h, data).into_response()),
            Ok(Some((start, end))) => {
                let cr = format!("bytes {start}-{end}/{len}");
                if let Ok(v) = HeaderValue::from_str(&cr) {
                    h.insert(header::CONTENT_RANGE, v);
                }
                let part = data[start as usize..=end as usize].to_vec();
                Ok((StatusCode::PARTIAL_CONTENT, h, part).into_response())
            }
            Err(()) => {
                let mut r = ApiError::new(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    "range_not_satisfiable",
                    format!("the file has {len} bytes"),
                )
                .response();
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                    r.headers_mut().insert(header::CONTENT_RANGE, v);
                }
                Ok(r)
            }
        }
    })
}

/// Writes a file atomically from the raw body, creating parents (and the conversation).
#[utoipa::path(put, path = "/v1/conversations/{id}/files/{path}", tag = "files", params(("id" = String, Path, description = "conversation id"),
           ("path" = String, Path, description = "workspace path")),
    request_body(content = BinaryDoc, content_type = "application/octet-stream"),
    responses((status = 204, description = "written"), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 404, description = "no such conversation or file", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "JSON of the wrong shape", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn write_file(
    State(s): State<AppState>,
    p: Principal,
    PathArgs((id, path)): PathArgs<(String, String)>,
    RawBody(body): RawBody,
) -> Response {
    audited!(s, p, "write", id, |conv| {
        s.manager.check_path(&conv, &path)?;
        let o = s.open(&conv, true).await?;
        let previous_expired_at = o.previous_expired_at();
        let r = o.conv.write(&path, &body).await;
        o.done().await;
        r?;
        Ok(notify_expired(
            StatusCode::NO_CONTENT.into_response(),
            previous_expired_at,
        ))
    })
}

/// Most files in one multipart upload.
pub(crate) const MAX_UPLOAD_FILES: usize = 1000;

/// One file an upload wrote.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct UploadedFile {
    /// The workspace path, as given.
    path: String,
    /// Bytes written.
    bytes: usize,
}

/// What an upload wrote, in the order of the parts.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct UploadView {
    files: Vec<UploadedFile>,
}

/// The multipart body of an upload, for the schema.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // Only read by the schema generator.
pub(crate) struct UploadForm {
    /// Optional, repeatable: the workspace path of the next file part (default: that part's
    /// filename).
    path: Option<String>,
    /// The files: parts with a filename.
    #[schema(value_type = Vec<BinaryDoc>)]
    file: Vec<Vec<u8>>,
}

/// Reads the multipart body: every file part with the workspace path it goes to.
async fn upload_parts(req: Request, s: &AppState) -> Result<Vec<(String, Bytes)>, ApiError> {
    use axum::extract::Multipart;
    let mut form = Multipart::from_request(req, s)
        .await
        .map_err(|e| rejection(e.status(), e.body_text()))?;
    let field_error =
        |e: axum::extract::multipart::MultipartError| rejection(e.status(), e.body_text());
    let mut files = Vec::new();
    let mut next_path: Option<String> = None;
    while let Some(field) = form.next_field().await.map_err(field_error)? {
        let name = field.name().unwrap_or("").to_owned();
        match field.file_name().map(str::to_owned) {
            None if name == "path" => {
                if next_path.is_some() {
                    return Err(ApiError::bad_request(
                        "two `path` fields in a row: each names the file part after it",
                    ));
                }
                next_path = Some(field.text().await.map_err(field_error)?);
            }
            None => {
                return Err(ApiError::bad_request(format!(
                    "unexpected form field {name:?}: send files as parts with a filename, each \
                     optionally after a `path` field"
                )));
            }
            Some(file_name) => {
                let path = next_path.take().unwrap_or(file_name);
                let data = field.bytes().await.map_err(field_error)?;
                if files.len() == MAX_UPLOAD_FILES {
                    return Err(ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "too_large",
                        format!("at most {MAX_UPLOAD_FILES} files per upload"),
                    ));
                }
                files.push((path, data));
            }
        }
    }
    if next_path.is_some() {
        return Err(ApiError::bad_request(
            "the last `path` field has no file part after it",
        ));
    }
    if files.is_empty() {
        return Err(ApiError::bad_request(
            "the upload has no file part (a part with a filename)",
        ));
    }
    Ok(files)
}

/// Uploads several files at once (`multipart/form-data`), creating parents (and the
/// conversation). Each file part goes to the path of the `path` field before it, or else to its
/// filename. Every path is checked before anything is written; each file is written atomically.
#[utoipa::path(post, path = "/v1/conversations/{id}/files", tag = "files", params(("id" = String, Path, description = "conversation id")),
    request_body(content = UploadForm, content_type = "multipart/form-data"),
    responses((status = 200, description = "every file written", body = UploadView), (status = 400, description = "invalid input (not multipart, no file, a bad path)", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large, or too many files", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn upload_files(
    State(s): State<AppState>,
    p: Principal,
    PathArgs(id): PathArgs<String>,
    req: Request,
) -> Response {
    audited!(s, p, "upload", id, |conv| {
        let files = upload_parts(req, &s).await?;
        for (path, _) in &files {
            s.manager.check_path(&conv, path)?;
        }
        let o = s.open(&conv, true).await?;
        let previous_expired_at = o.previous_expired_at();
        let mut written = Vec::with_capacity(files.len());
        let mut failed = None;
        for (path, data) in files {
            if let Err(e) = o.conv.write(&path, &data).await {
                failed = Some(e);
                break;
            }
            written.push(UploadedFile {
                path,
                bytes: data.len(),
            });
        }
        o.done().await;
        if let Some(e) = failed {
            return Err(e.into());
        }
        Ok(notify_expired(
            Json(UploadView { files: written }).into_response(),
            previous_expired_at,
        ))
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RemoveQuery {
    #[serde(default)]
    recursive: Option<String>,
}

/// Removes a file, link or directory (`recursive=1` for a non-empty one).
#[utoipa::path(delete, path = "/v1/conversations/{id}/files/{path}", tag = "files",
    params(("id" = String, Path, description = "conversation id"),
           ("path" = String, Path, description = "workspace path"), ("recursive" = Option<String>, Query, description = "1: remove a directory tree")),
    responses((status = 204, description = "removed"), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 404, description = "no such conversation or file", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "JSON of the wrong shape", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn remove_file(
    State(s): State<AppState>,
    p: Principal,
    PathArgs((id, path)): PathArgs<(String, String)>,
    QueryArgs(q): QueryArgs<RemoveQuery>,
) -> Response {
    audited!(s, p, "remove", id, |conv| {
        s.manager.check_path(&conv, &path)?;
        let o = s.open(&conv, false).await?;
        let r = o.conv.remove(&path, truthy(&q.recursive)).await;
        o.done().await;
        r.map_err(with_fields)?;
        Ok(StatusCode::NO_CONTENT.into_response())
    })
}

/// `POST /v1/conversations/{id}/edit`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EditBody {
    path: String,
    old: String,
    new: String,
    #[serde(default)]
    replace_all: bool,
}

/// Replaces an exact string in a file; it must occur once unless `replace_all`.
#[utoipa::path(post, path = "/v1/conversations/{id}/edit", tag = "files", params(("id" = String, Path, description = "conversation id")),
    request_body = EditBody,
    responses((status = 200, body = EditResultDoc), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 404, description = "no such conversation or file", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "JSON of the wrong shape", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn edit(
    State(s): State<AppState>,
    p: Principal,
    PathArgs(id): PathArgs<String>,
    JsonBody(b): JsonBody<EditBody>,
) -> Response {
    audited!(s, p, "edit", id, |conv| {
        s.manager.check_path(&conv, &b.path)?;
        if b.old.is_empty() {
            return Err(ApiError::bad_request("old must not be empty"));
        }
        let req = EditRequest {
            old: b.old,
            new: b.new,
            replace_all: b.replace_all,
        };
        let o = s.open(&conv, false).await?;
        let r = o.conv.edit(&b.path, &req).await;
        o.done().await;
        Ok(Json(r.map_err(with_fields)?).into_response())
    })
}

/// A library refusal with what to do in this API's fields (the library names none).
fn with_fields(e: Error) -> Error {
    let advice = match e.refusal() {
        Some(Refusal::EditEmpty) => "send the exact text to replace in `old`",
        Some(Refusal::EditAbsent) => "read the file and send its exact text in `old`",
        Some(Refusal::EditAmbiguous) => {
            "give more context in `old`, or set `replace_all` to replace every occurrence"
        }
        Some(Refusal::DirectoryNotEmpty) => "add `?recursive=1` to remove it and everything in it",
        _ => return e,
    };
    e.with_advice(advice)
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PathBody {
    path: String,
}

/// Creates a directory and its parents (and the conversation).
#[utoipa::path(post, path = "/v1/conversations/{id}/mkdir", tag = "files", params(("id" = String, Path, description = "conversation id")),
    request_body = PathBody,
    responses((status = 204, description = "created or existed"), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 404, description = "no such conversation or file", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "JSON of the wrong shape", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn mkdir(
    State(s): State<AppState>,
    p: Principal,
    PathArgs(id): PathArgs<String>,
    JsonBody(b): JsonBody<PathBody>,
) -> Response {
    audited!(s, p, "mkdir", id, |conv| {
        s.manager.check_path(&conv, &b.path)?;
        let o = s.open(&conv, true).await?;
        let previous_expired_at = o.previous_expired_at();
        let r = o.conv.mkdir(&b.path).await;
        o.done().await;
        r?;
        Ok(notify_expired(
            StatusCode::NO_CONTENT.into_response(),
            previous_expired_at,
        ))
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PathQuery {
    #[serde(default)]
    path: Option<String>,
}

/// Lists a directory, sorted by name.
#[utoipa::path(get, path = "/v1/conversations/{id}/ls", tag = "files",
    params(("id" = String, Path, description = "conversation id"), ("path" = Option<String>, Query, description = "default the workspace root")),
    responses((status = 200, body = LsView), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 404, description = "no such conversation or file", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "JSON of the wrong shape", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn ls(
    State(s): State<AppState>,
    p: Principal,
    PathArgs(id): PathArgs<String>,
    QueryArgs(q): QueryArgs<PathQuery>,
) -> Response {
    audited!(s, p, "ls", id, |conv| {
        let path = q.path.unwrap_or_else(|| ".".to_owned());
        s.manager.check_path(&conv, &path)?;
        let o = s.open(&conv, false).await?;
        let r = o.conv.list(&path).await;
        o.done().await;
        Ok(Json(LsView { entries: r? }).into_response())
    })
}

/// Metadata of a path.
#[utoipa::path(get, path = "/v1/conversations/{id}/stat", tag = "files",
    params(("id" = String, Path, description = "conversation id"), ("path" = Option<String>, Query, description = "default the workspace root")),
    responses((status = 200, body = FileStatDoc), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 404, description = "no such conversation or file", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "JSON of the wrong shape", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn stat(
    State(s): State<AppState>,
    p: Principal,
    PathArgs(id): PathArgs<String>,
    QueryArgs(q): QueryArgs<PathQuery>,
) -> Response {
    audited!(s, p, "stat", id, |conv| {
        let path = q.path.unwrap_or_else(|| ".".to_owned());
        s.manager.check_path(&conv, &path)?;
        let o = s.open(&conv, false).await?;
        let r = o.conv.stat(&path).await;
        o.done().await;
        Ok(Json(r?).into_response())
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GlobQuery {
    pattern: String,
}

/// Workspace-relative paths of files matching a glob, sorted.
#[utoipa::path(get, path = "/v1/conversations/{id}/glob", tag = "files",
    params(("id" = String, Path, description = "conversation id"), ("pattern" = String, Query, description = "for example **/*.rs")),
    responses((status = 200, body = GlobView), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 404, description = "no such conversation or file", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "JSON of the wrong shape", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn glob(
    State(s): State<AppState>,
    p: Principal,
    PathArgs(id): PathArgs<String>,
    QueryArgs(q): QueryArgs<GlobQuery>,
) -> Response {
    audited!(s, p, "glob", id, |conv| {
        let o = s.open(&conv, false).await?;
        let r = o.conv.glob(&q.pattern).await;
        o.done().await;
        Ok(Json(GlobView { paths: r? }).into_response())
    })
}

/// `POST /v1/conversations/{id}/grep` (documented as `GrepRequestDoc`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GrepBody {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    glob: Option<String>,
    #[serde(default)]
    case_insensitive: bool,
    #[serde(default)]
    max_matches: Option<usize>,
}

/// Searches file contents with a regular expression.
#[utoipa::path(post, path = "/v1/conversations/{id}/grep", tag = "files", params(("id" = String, Path, description = "conversation id")),
    request_body = GrepRequestDoc,
    responses((status = 200, body = GrepView), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 401, description = "no valid API key", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 404, description = "no such conversation or file", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "JSON of the wrong shape", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn grep(
    State(s): State<AppState>,
    p: Principal,
    PathArgs(id): PathArgs<String>,
    JsonBody(b): JsonBody<GrepBody>,
) -> Response {
    let req = GrepRequest {
        pattern: b.pattern,
        path: b.path,
        glob: b.glob,
        case_insensitive: b.case_insensitive,
        max_matches: b.max_matches,
    };
    audited!(s, p, "grep", id, |conv| {
        if let Some(path) = &req.path {
            s.manager.check_path(&conv, path)?;
        }
        let o = s.open(&conv, false).await?;
        let r = o.conv.grep(&req).await;
        o.done().await;
        Ok(Json(GrepView { matches: r? }).into_response())
    })
}

/// A directory listing.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct LsView {
    #[schema(value_type = Vec<DirEntryDoc>)]
    entries: Vec<DirEntry>,
}

/// Paths matching a glob.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct GlobView {
    paths: Vec<String>,
}

/// Matching lines.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct GrepView {
    #[schema(value_type = Vec<GrepMatchDoc>)]
    matches: Vec<GrepMatch>,
}
