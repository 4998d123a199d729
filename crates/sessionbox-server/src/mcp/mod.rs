//! MCP over streamable HTTP at `/mcp` (rmcp): the agent tools `bash`, `read`, `write`, `edit`,
//! `ls`, `glob`, `grep` on one conversation's workspace, `skill` (list the tenant's skills,
//! or load one: its instructions and its base directory in the conversation), and `network`
//! (the conversation's network policy and its recent egress verdicts).
//!
//! `network` is read-only, and no tool changes a network policy: the model is the party a
//! policy restrains, and a prompt-injected model that could widen its own allowlist would make
//! the policy worthless. Policies are set by the operator (REST with an API key, or the CLI).
//!
//! Every request carries the same API key as the REST API (it names the tenant) and an
//! `X-Conversation-Id` header naming the conversation; a missing or invalid one is refused with
//! the JSON error body before MCP sees the request. Tool failures come back as tool results
//! with `isError` (text the model can read), not as protocol errors. Each call goes through the
//! [`Manager`](sessionbox_manager::Manager) (audited per operation), waits for the
//! conversation's turn like a REST call, and is audited once more as `mcp.TOOL` with the key id.
//!
//! An MCP session (`Mcp-Session-Id`) belongs to the tenant whose key opened it ([`owners`]):
//! a request of another tenant naming it is answered 404, as for an unknown id, before rmcp
//! sees it; a tenant has at most `max_mcp_sessions_per_tenant` sessions open (429 past it).

mod owners;
mod resources;
mod run;
mod schema;

pub(crate) use owners::Owners;

use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, any_service};
use chrono::Utc;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeRequestParams, InitializeResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use sessionbox_core::{ConversationId, ConversationRef, ConversationScope, Error};
use sessionbox_store::AuditEntry;

use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiError;

/// The header that names the conversation of an MCP request.
pub(crate) const CONVERSATION_HEADER: &str = "x-conversation-id";
/// The header of the streamable HTTP transport that names the MCP session.
const SESSION_HEADER: &str = "mcp-session-id";
/// The MCP route whose every session gets a conversation of its own.
pub(crate) const NEW_PATH: &str = "/mcp/new";
/// The MCP route that names the conversation in its path: `/mcp/conversations/{id}`.
pub(crate) const PATH_PREFIX: &str = "/mcp/conversations/";

/// `%XX` escapes of a path segment decoded; `None` when the result is not UTF-8.
pub(super) fn percent_decoded(raw: &str) -> Option<String> {
    let b = raw.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).and_then(|&c| hex(c)),
                b.get(i + 2).and_then(|&c| hex(c)),
            )
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(0));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A new conversation id for an MCP session opened at [`NEW_PATH`]: `prefix` (the key's id
/// prefix, or nothing), `mcp-` and 16 random hex digits.
fn new_conversation_id(prefix: &str) -> sessionbox_core::Result<ConversationId> {
    ConversationId::new(format!("{prefix}mcp-{}", crate::scope::nonce()?))
}

/// Every tool's name (the audit log records no other).
const TOOL_NAMES: &[&str] = &[
    "bash", "read", "write", "edit", "ls", "glob", "grep", "skill", "network", "preview",
];

/// The tools that change the workspace, run something in it or reach its programs: a
/// read-only key is neither shown nor allowed them. (`skill` may run a skill's bootstrap.)
const WRITING_TOOLS: &[&str] = &["bash", "write", "edit", "preview", "skill"];

/// The `/mcp` route: authentication and the conversation header, then rmcp's service.
pub(crate) fn route(state: AppState) -> MethodRouter<AppState> {
    let mut config = StreamableHttpServerConfig::default();
    if state.config.open_tenant.is_none() {
        // Every request needs a key, so a DNS-rebinding page gains nothing: accept any Host.
        config.allowed_hosts = Vec::new();
    }
    let handler_state = state.clone();
    let service: StreamableHttpService<Tools, LocalSessionManager> = StreamableHttpService::new(
        move || {
            Ok(Tools {
                state: handler_state.clone(),
                fixed: None,
            })
        },
        state.mcp_sessions.manager.clone(),
        config,
    );
    any_service(service).layer(axum::middleware::from_fn_with_state(state, admit))
}

/// Serves the MCP tools on one conversation over stdin and stdout (newline-delimited JSON-RPC,
/// the MCP stdio transport) until the client closes stdin.
///
/// The caller is `tenant` with no key id: a local process that can run this already owns the
/// data directory. Calls are audited as `mcp.TOOL` like the HTTP ones and wait for the
/// conversation's turn in this process (other processes on the same data directory are ordered
/// by the runtime's own locks).
///
/// # Errors
/// [`Error::Backend`] when the transport fails to start or ends with an error.
pub async fn serve_stdio(
    state: AppState,
    conversation: ConversationRef,
) -> sessionbox_core::Result<()> {
    use rmcp::ServiceExt;
    let tools = Tools {
        state,
        fixed: Some(Caller {
            principal: Principal::unrestricted(conversation.tenant.clone()),
            conversation,
        }),
    };
    let running = tools
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| Error::Backend(format!("MCP stdio transport did not start: {e}")))?;
    running
        .waiting()
        .await
        .map_err(|e| Error::Backend(format!("MCP stdio transport failed: {e}")))?;
    Ok(())
}

/// Who calls and on which conversation, as [`admit`] found them.
#[derive(Clone)]
struct Caller {
    principal: Principal,
    conversation: ConversationRef,
}

/// Checks the key and the conversation header; refuses with the JSON error body.
async fn admit(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let principal =
        match <Principal as axum::extract::FromRequestParts<AppState>>::from_request_parts(
            &mut parts, &s,
        )
        .await
        {
            Ok(p) => p,
            Err(e) => return e.into_response(),
        };
    let path = parts.uri.path().to_owned();
    let per_session = path == NEW_PATH;
    let header = match parts.headers.get(CONVERSATION_HEADER).map(|v| v.to_str()) {
        None => None,
        Some(Ok(v)) => Some(v.to_owned()),
        Some(Err(_)) => {
            return ApiError::bad_request("the `X-Conversation-Id` header is not ASCII")
                .into_response();
        }
    };
    // Named in the path (`/mcp/conversations/{id}`, for connectors that take a URL alone), in
    // the header, or made for the session (`/mcp/new`, below).
    let in_path = match path.strip_prefix(PATH_PREFIX) {
        Some(raw) => match percent_decoded(raw) {
            Some(id) => Some(id),
            None => {
                return ApiError::bad_request("the conversation id in the path is not UTF-8")
                    .into_response();
            }
        },
        None => None,
    };
    let named = match (in_path, header) {
        (Some(p), Some(h)) if p != h => {
            return ApiError::bad_request(
                "the path and the `X-Conversation-Id` header name different conversations",
            )
            .into_response();
        }
        (Some(p), _) => Some(p),
        (None, h) if !per_session => Some(h.unwrap_or_default()),
        (None, Some(_)) => {
            return ApiError::bad_request(
                "/mcp/new makes the conversation of each session itself: drop the \
                 `X-Conversation-Id` header, or name the conversation at \
                 /mcp/conversations/{id}",
            )
            .into_response();
        }
        (None, None) => None,
    };
    let named = match named {
        Some(id) if id.is_empty() => {
            return ApiError::bad_request(
                "MCP requests need a conversation: an `X-Conversation-Id` header, the path \
                 /mcp/conversations/{id}, or /mcp/new for a conversation of each session's own",
            )
            .into_response();
        }
        Some(id) => match ConversationId::new(&id) {
            Ok(id) => Some(id),
            Err(e) => {
                let mut e = ApiError::from(e);
                e.message = format!("the conversation id: {}", e.message);
                return e.into_response();
            }
        },
        None => None,
    };
    // The session must be this tenant's: another tenant's id is answered as an unknown one.
    let session = match parts.headers.get(SESSION_HEADER) {
        None => None,
        Some(v) => match v.to_str() {
            Ok(id) if s.mcp_sessions.owned_by(id, &principal.tenant) => Some(id.to_owned()),
            _ => {
                return ApiError::new(
                    axum::http::StatusCode::NOT_FOUND,
                    "not_found",
                    "no such MCP session (Mcp-Session-Id): it ended, or this key did not open \
                     it; start a new session with `initialize`",
                )
                .into_response();
            }
        },
    };
    // A request without a session may open one: it takes one of the tenant's places.
    let opening = match &session {
        Some(_) => None,
        None if parts.method == axum::http::Method::POST => {
            let narrowed = if principal.scope.is_full() {
                None
            } else {
                principal.key_id.as_deref()
            };
            match s.mcp_sessions.open(&principal.tenant, narrowed).await {
                Ok(o) => Some(o),
                Err(e) => return ApiError::from(e).into_response(),
            }
        }
        None => None,
    };
    // A session stays on the conversation it was opened on.
    let bound = session
        .as_deref()
        .and_then(|sid| s.mcp_sessions.conversation_of(sid));
    if let (Some(b), Some(n)) = (&bound, &named)
        && b != n
    {
        return ApiError::bad_request(format!(
            "this MCP session belongs to conversation {:?}, not {:?}: open a new session to \
             use another conversation",
            b.as_str(),
            n.as_str()
        ))
        .into_response();
    }
    // `/mcp/new`: the session's own conversation, made when the session opens.
    let (id, made) = match named {
        Some(id) => (id, None),
        None => match bound {
            Some(id) => (id, None),
            None if session.is_some() => {
                return ApiError::bad_request(
                    "this MCP session was not opened at /mcp/new: name its conversation",
                )
                .into_response();
            }
            None => {
                let prefix = match &principal.scope.conversations {
                    ConversationScope::All => "",
                    ConversationScope::Prefix(p) => p.as_str(),
                    ConversationScope::One(one) => {
                        let e = Error::Forbidden(format!(
                            "this API key is limited to conversation {:?}, so it cannot make \
                             one for each session: connect to /mcp/conversations/{} instead",
                            one.as_str(),
                            one.as_str()
                        ));
                        crate::scope::refused(&s, &principal, None, "POST /mcp/new");
                        return ApiError::from(e).into_response();
                    }
                };
                match new_conversation_id(prefix) {
                    Ok(id) => (id.clone(), Some(id)),
                    Err(e) => return ApiError::from(e).into_response(),
                }
            }
        },
    };
    if let Err(e) = principal.scope.check_conversation(&id) {
        let key = ConversationRef::new(principal.tenant.clone(), id).key;
        crate::scope::refused(
            &s,
            &principal,
            Some(key),
            &format!("{} {path}", parts.method),
        );
        return ApiError::from(e).into_response();
    }
    let conversation_id = id.clone();
    let conversation = ConversationRef::new(principal.tenant.clone(), id);
    req = Request::from_parts(parts, body);
    req.extensions_mut().insert(Caller {
        principal,
        conversation,
    });
    let delete = req.method() == axum::http::Method::DELETE;
    let mut response = next.run(req).await;
    match (session, opening) {
        (Some(id), _) => {
            // Ended by this DELETE, or unknown to rmcp (closed after its keep-alive).
            let status = response.status();
            if (delete && status.is_success()) || status == axum::http::StatusCode::NOT_FOUND {
                s.mcp_sessions.forget(&id);
            }
        }
        (None, Some(opening)) => {
            if let Some(id) = response
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
            {
                let sid = id.to_owned();
                opening.bind(&sid, conversation_id.clone());
            }
            // The client learns the conversation made for its session.
            if let Some(made) = &made
                && let Ok(v) = axum::http::HeaderValue::from_str(made.as_str())
            {
                response.headers_mut().insert(CONVERSATION_HEADER, v);
            }
        }
        (None, None) => {}
    }
    // rmcp answers a session's termination with 202, which the specification does not name
    // and clients log as a failure (the Python SDK wants 200 or 204): the session is gone, so
    // say so with 204.
    if delete && response.status() == axum::http::StatusCode::ACCEPTED {
        *response.status_mut() = axum::http::StatusCode::NO_CONTENT;
    }
    response
}

/// The MCP server of one session: over HTTP the caller comes with each request; over stdio it
/// is fixed for the life of the process.
#[derive(Clone)]
pub(crate) struct Tools {
    state: AppState,
    fixed: Option<Caller>,
}

impl Tools {
    /// The caller of this request: fixed over stdio, else what [`admit`] found.
    fn caller(&self, context: &RequestContext<RoleServer>) -> Result<Caller, ErrorData> {
        match &self.fixed {
            Some(c) => Ok(c.clone()),
            None => context
                .extensions
                .get::<axum::http::request::Parts>()
                .and_then(|p| p.extensions.get::<Caller>())
                .cloned()
                .ok_or_else(|| ErrorData::internal_error("the request has no caller", None)),
        }
    }

    async fn audit(&self, caller: &Caller, tool: &str, outcome: String, started: Instant) {
        let entry = AuditEntry {
            at: Utc::now(),
            tenant: caller.principal.tenant.clone(),
            conversation_key: Some(caller.conversation.key.clone()),
            operation: format!("mcp.{tool}"),
            outcome,
            detail: Some(format!(
                "key={} duration_ms={}",
                caller.principal.key_id.as_deref().unwrap_or("-"),
                started.elapsed().as_millis()
            )),
        };
        let store = self.state.manager.store();
        if let Err(e) = store.run(move |s| s.audit(&entry)).await {
            tracing::warn!(error = %e, "audit record not written");
        }
    }
}

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("sessionbox", env!("CARGO_PKG_VERSION")))
        .with_instructions(instructions(
            !self.state.manager.skills().is_empty(),
            self.state.manager.runtime().mounted_skills(),
            self.fixed.as_ref().map(|c| c.conversation.id.as_str()),
        ))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let mut result = self.negotiate_initialize(&request)?;
        // Over HTTP the conversation comes with the request: name it to the model too (a
        // session of /mcp/new has no other way to learn it).
        if self.fixed.is_none()
            && let Ok(caller) = self.caller(&context)
        {
            result.instructions = Some(instructions(
                !self.state.manager.skills().is_empty(),
                self.state.manager.runtime().mounted_skills(),
                Some(caller.conversation.id.as_str()),
            ));
        }
        Ok(result)
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let caller = self.caller(&context)?;
        let started = Instant::now();
        let cursor = request.and_then(|r| r.cursor);
        let result = self.list_files(&caller, cursor.as_deref()).await;
        let outcome = result
            .as_ref()
            .map_or_else(|e| e.code().to_owned(), |_| "ok".into());
        self.audit(&caller, "resources_list", outcome, started)
            .await;
        result.map_err(resource_error)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let caller = self.caller(&context)?;
        let started = Instant::now();
        let result = self.read_file(&caller, &request.uri).await;
        let outcome = result
            .as_ref()
            .map_or_else(|e| e.code().to_owned(), |_| "ok".into());
        self.audit(&caller, "resources_read", outcome, started)
            .await;
        result.map(Into::into).map_err(resource_error)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // A preview link is a path on an HTTP server: MCP over stdio (no server, no preview
        // key) has no `preview` to offer.
        let mut tools = schema::tools();
        if self.state.config.preview_key.is_none() {
            tools.retain(|t| t.name != "preview");
        }
        if self.caller(&context)?.principal.scope.read_only {
            tools.retain(|t| !WRITING_TOOLS.contains(&t.name.as_ref()));
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = self.caller(&context)?;
        let started = Instant::now();
        let result = if WRITING_TOOLS.contains(&request.name.as_ref()) {
            caller
                .principal
                .scope
                .check_write(&format!("the tool `{}`", request.name))
        } else {
            Ok(())
        };
        let result = match result {
            Ok(()) => self.run(&caller, &request.name, request.arguments).await,
            Err(e) => Err(e),
        };
        let (outcome, out) = match result {
            Ok(text) => (
                "ok".to_owned(),
                CallToolResult::success(vec![ContentBlock::text(text)]),
            ),
            Err(e) => (
                e.code().to_owned(),
                CallToolResult::error(vec![ContentBlock::text(format!(
                    "error ({}): {e}",
                    e.code()
                ))]),
            ),
        };
        // The name is the client's: only a tool of this server is recorded by its name, so a
        // name with line breaks or control characters never reaches the audit log.
        let tool = if TOOL_NAMES.contains(&request.name.as_ref()) {
            request.name.as_ref()
        } else {
            "unknown"
        };
        self.audit(&caller, tool, outcome, started).await;
        Ok(out.into())
    }
}

/// A resource request's failure as the protocol error MCP names for it: -32002 for a file
/// that does not exist, invalid params for a bad URI, an internal error otherwise; the message
/// is the error's text with its code.
fn resource_error(e: Error) -> ErrorData {
    let message = format!("error ({}): {e}", e.code());
    match e.code() {
        "not_found" => ErrorData::resource_not_found(message, None),
        code if e.is_invalid_input() || code == "too_large" => {
            ErrorData::invalid_params(message, None)
        }
        _ => ErrorData::internal_error(message, None),
    }
}

/// What the model is told about this server when a session starts: what a conversation is,
/// that its files stay between turns, and where skills are (`mounted`: the runtime's read-only
/// mount root; `None`: copies in the workspace).
/// The server's instructions to the model. `any_skills`: this server has skills configured
/// for some tenant; `mounted`: where the runtime mounts them (else they are copied into the
/// workspace at `.skills/NAME`).
fn instructions(any_skills: bool, mounted: Option<String>, conversation: Option<&str>) -> String {
    let named = match conversation {
        Some(id) => format!(" This session's conversation is `{id}`."),
        None => String::new(),
    };
    let skills = match (any_skills, mounted) {
        (false, _) => {
            "Agent Skills: none are configured on this server (`skill` says so).".to_owned()
        }
        (true, Some(root)) => format!(
            "Agent Skills: `skill` lists them and loads one (its instructions and its directory, \
             {}/NAME, read-only).",
            root.trim_end_matches('/')
        ),
        (true, None) => "Agent Skills: `skill` lists them and loads one (its instructions and \
                         its directory, .skills/NAME in the workspace, a managed copy: do not \
                         edit it)."
            .to_owned(),
    };
    format!(
        "sessionbox gives this conversation a workspace of its own: a directory no other \
         conversation can see. The tools bash, read, write, edit, ls, glob and grep work in it \
         (relative paths start at its root). Its files persist across turns: a later turn of \
         the same conversation finds them again; a new conversation starts empty. {skills} \
         `network` shows the network policy, which no tool can change. The workspace's files \
         are also MCP resources (file:///PATH), read-only.{named}"
    )
}

#[cfg(test)]
mod tests {
    use super::instructions;

    #[test]
    fn every_tool_offered_is_named_in_the_audit_list() {
        let offered: Vec<String> = super::schema::tools()
            .iter()
            .map(|t| t.name.to_string())
            .collect();
        let mut named: Vec<String> = super::TOOL_NAMES.iter().map(|n| (*n).to_owned()).collect();
        let mut offered_sorted = offered.clone();
        offered_sorted.sort();
        named.sort();
        assert_eq!(offered_sorted, named);
        for w in super::WRITING_TOOLS {
            assert!(offered.iter().any(|o| o == w), "{w}");
        }
    }

    #[test]
    fn the_instructions_name_a_skill_directory_only_where_skills_exist() {
        let none = instructions(false, Some("/skills".into()), None);
        assert!(
            none.contains("none are configured") && !none.contains("/skills/NAME"),
            "{none}"
        );
        let mounted = instructions(true, Some("/skills/".into()), None);
        assert!(mounted.contains("/skills/NAME, read-only"), "{mounted}");
        let copied = instructions(true, None, None);
        assert!(copied.contains(".skills/NAME in the workspace"), "{copied}");
        for text in [none, mounted, copied] {
            assert!(text.contains("persist across turns"), "{text}");
            assert!(!text.contains("This session's conversation"), "{text}");
        }
        let named = instructions(false, None, Some("mcp-0a1b"));
        assert!(
            named.contains("This session's conversation is `mcp-0a1b`."),
            "{named}"
        );
    }
}
