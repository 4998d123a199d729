//! The routes, one module per resource, and what every handler shares: the router, and
//! [`on_conversation`], which names a handler's conversation and audits the call.
//!
//! Handlers answer a [`Response`] that carries an [`Audited`] extension; the audit middleware
//! ([`crate::audit::track`]) writes the record, and the metrics middleware
//! ([`crate::metrics::track`]) counts it. Errors are [`sessionbox_core::Error`]s until the
//! response, where they become the JSON error body ([`ApiError`]).

pub(crate) mod account;
pub(crate) mod commands;
pub(crate) mod conversations;
pub(crate) mod doctor;
pub(crate) mod exec;
pub(crate) mod files;
pub(crate) mod fs;
pub(crate) mod health;
pub(crate) mod preview;
pub(crate) mod pty;
pub(crate) mod snapshots;
pub(crate) mod ui;
pub(crate) mod watch;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use axum::response::Response;
use axum::routing::{any, get, post, put};
use sessionbox_core::{ConversationId, ConversationRef};

use crate::audit::Audited;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::{AppState, metrics, policy, skills};

/// How long a request body may go without a byte before its request fails (408 or 400).
pub(crate) const BODY_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The application: every route, JSON errors for unknown routes and methods, body limits, and
/// the audit and metrics middleware.
pub fn router(state: AppState) -> Router {
    let file_limit = DefaultBodyLimit::max(state.config.max_file_bytes);
    let json_limit = DefaultBodyLimit::max(state.config.max_json_bytes);
    let conversation = "/v1/conversations/{id}";
    let at = |tail: &str| format!("{conversation}{tail}");
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/v1/openapi.json", get(crate::openapi::document))
        .route("/ui", get(ui::root))
        .route("/ui/", get(ui::file))
        .route("/ui/{*path}", get(ui::file))
        .route("/v1/whoami", get(account::whoami))
        .route("/v1/audit", get(account::audit))
        .route("/v1/installation", get(account::installation))
        .route("/v1/installation/doctor", get(doctor::doctor))
        .route("/v1/conversations", get(conversations::list))
        .route(
            conversation,
            get(conversations::get)
                .post(conversations::open)
                .delete(conversations::destroy),
        )
        .route(&at("/exec"), post(exec::exec))
        .route(&at("/previews"), post(preview::link))
        .route(&at("/ports/{port}"), any(preview::by_key))
        .route(&at("/ports/{port}/"), any(preview::by_key))
        .route(&at("/ports/{port}/{*rest}"), any(preview::by_key))
        .route("/v1/previews/{token}", any(preview::by_link))
        .route("/v1/previews/{token}/", any(preview::by_link))
        .route("/v1/previews/{token}/{*rest}", any(preview::by_link))
        .route(&at("/commands"), get(commands::list))
        .route(
            &at("/commands/{cmd}"),
            get(commands::status).delete(commands::kill),
        )
        .route(&at("/commands/{cmd}/logs"), get(commands::logs))
        .route(
            &at("/commands/{cmd}/stdin"),
            post(commands::write_stdin).delete(commands::close_stdin),
        )
        // A file body is read whole: counted in the tenant's budget while it is held.
        .route(
            &at("/files"),
            post(files::upload)
                .layer(file_limit)
                .layer(from_fn_with_state(state.clone(), crate::budget::received)),
        )
        .route(
            &at("/files/{*path}"),
            get(files::read)
                .put(files::write)
                .delete(files::remove)
                .layer(file_limit)
                .layer(from_fn_with_state(state.clone(), crate::budget::received)),
        )
        .route(&at("/edit"), post(files::edit))
        .route(&at("/mkdir"), post(files::mkdir))
        .route(&at("/ls"), get(fs::ls))
        .route(&at("/stat"), get(fs::stat))
        .route(&at("/glob"), get(fs::glob))
        .route(&at("/grep"), post(fs::grep))
        .route(&at("/pty"), get(pty::pty))
        .route(&at("/pty/tickets"), post(pty::ticket))
        .route(&at("/snapshots"), post(snapshots::take))
        .route(&at("/restore"), post(snapshots::restore))
        .route(&at("/fork"), post(snapshots::fork_conversation))
        .route("/v1/snapshots", get(snapshots::list))
        .route(
            "/v1/snapshots/{name}",
            get(snapshots::get).delete(snapshots::delete),
        )
        .route(
            "/v1/snapshots/{name}/archive",
            get(snapshots::export).put(snapshots::import),
        )
        .route("/v1/snapshots/{name}/fork", post(snapshots::fork_snapshot))
        .route("/v1/templates", get(snapshots::templates))
        .route(
            "/v1/templates/{name}",
            put(snapshots::set_template).delete(snapshots::delete_template),
        )
        .route("/v1/templates/{name}/fork", post(snapshots::fork_template))
        .route(&at("/watch"), get(watch::watch))
        .route(
            "/v1/policy",
            get(policy::get_tenant_policy)
                .put(policy::put_tenant_policy)
                .delete(policy::delete_tenant_policy),
        )
        .route(
            &at("/policy"),
            get(policy::get_conversation_policy)
                .put(policy::put_conversation_policy)
                .delete(policy::delete_conversation_policy),
        )
        .route("/v1/egress-log", get(policy::tenant_egress_log))
        .route(&at("/egress-log"), get(policy::conversation_egress_log))
        .route("/v1/skills", get(skills::list_skills))
        .route(&at("/skills/{name}"), get(skills::load_skill))
        .route("/metrics", get(metrics::metrics))
        .route("/mcp", crate::mcp::route(state.clone()))
        .route(crate::mcp::NEW_PATH, crate::mcp::route(state.clone()))
        .route("/mcp/conversations/{id}", crate::mcp::route(state.clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(json_limit)
        // A body that stops arriving ends its request: a client that sends all but the last
        // byte of a large upload would otherwise hold what was buffered for as long as it likes.
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
            BODY_IDLE_TIMEOUT,
        ))
        // Inside the audit and metrics layers, so a refusal is counted and timed like any
        // other answer.
        .layer(from_fn_with_state(state.clone(), crate::scope::authorize))
        .layer(from_fn_with_state(state.clone(), crate::audit::track))
        .layer(from_fn_with_state(state.clone(), metrics::track))
        .layer(cors(&state.config.cors_origins))
        .with_state(state)
}

/// CORS for the configured origins (none by default: no `Access-Control-*` header is sent, so
/// a browser hands no response to another origin's page). Credentials are the API key in
/// `Authorization`, never cookies, so `Access-Control-Allow-Credentials` is not sent.
fn cors(origins: &[String]) -> tower_http::cors::CorsLayer {
    use axum::http::{HeaderName, HeaderValue, Method, header};
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let allowed: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(allowed))
        .allow_methods([
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
        ])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::ACCEPT,
            header::RANGE,
            HeaderName::from_static(crate::mcp::CONVERSATION_HEADER),
            HeaderName::from_static("mcp-session-id"),
            HeaderName::from_static("mcp-protocol-version"),
            HeaderName::from_static("last-event-id"),
        ])
        .expose_headers([
            header::CONTENT_LENGTH,
            header::CONTENT_RANGE,
            header::RETRY_AFTER,
            HeaderName::from_static(crate::mcp::CONVERSATION_HEADER),
            HeaderName::from_static("mcp-session-id"),
        ])
        .max_age(std::time::Duration::from_secs(600))
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

/// The conversation `id` names in `principal`'s tenant.
pub(crate) fn conversation_of(
    principal: &Principal,
    id: &str,
) -> sessionbox_core::Result<ConversationRef> {
    Ok(ConversationRef::new(
        principal.tenant.clone(),
        ConversationId::new(id)?,
    ))
}

/// Runs `work` on the conversation `id` names, and audits the call as `operation` on that
/// conversation (on none when the id is invalid; then `work` does not run).
pub(crate) async fn on_conversation(
    principal: &Principal,
    operation: &'static str,
    id: &str,
    work: impl AsyncFnOnce(ConversationRef) -> Result<Response, ApiError>,
) -> Response {
    let conversation = conversation_of(principal, id);
    let key = conversation.as_ref().ok().map(|c| c.key.clone());
    let result = match conversation {
        Ok(conversation) => work(conversation).await,
        Err(error) => Err(error.into()),
    };
    Audited::new(operation, principal, key).respond(result)
}

/// Audits a call that names no conversation as `operation`.
pub(crate) fn audited(
    principal: &Principal,
    operation: &'static str,
    result: Result<Response, ApiError>,
) -> Response {
    Audited::new(operation, principal, None).respond(result)
}
