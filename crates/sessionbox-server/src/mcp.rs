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

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, any_service};
use chrono::Utc;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sessionbox_core::{
    ConversationId, ConversationRef, EditRequest, Error, ExecRequest, FileKind, GrepRequest,
    Refusal, Session,
};
use sessionbox_store::AuditEntry;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::{AppState, blocking};

/// The header that names the conversation of an MCP request.
pub const CONVERSATION_HEADER: &str = "x-conversation-id";

/// Most characters of `bash` output before it is cut.
const MAX_OUTPUT_CHARS: usize = 30_000;
/// Lines `read` returns by default.
const DEFAULT_READ_LINES: usize = 2000;
/// Characters of one line `read` returns.
const MAX_LINE_CHARS: usize = 2000;
/// Verdicts `network` shows by default, and at most.
const DEFAULT_NETWORK_VERDICTS: usize = 20;
const MAX_NETWORK_VERDICTS: usize = 100;

/// The `/mcp` route: authentication and the conversation header, then rmcp's service.
pub fn route(state: AppState) -> MethodRouter<AppState> {
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
        Arc::default(),
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
            principal: Principal {
                tenant: conversation.tenant.clone(),
                key_id: None,
            },
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
    let id = match parts.headers.get(CONVERSATION_HEADER) {
        None => {
            return ApiError::bad_request(
                "MCP requests need an `X-Conversation-Id` header naming the conversation",
            )
            .into_response();
        }
        Some(v) => match v.to_str() {
            Ok(v) => v.to_owned(),
            Err(_) => {
                return ApiError::bad_request("the `X-Conversation-Id` header is not ASCII")
                    .into_response();
            }
        },
    };
    let id = match ConversationId::new(&id) {
        Ok(id) => id,
        Err(e) => {
            let mut e = ApiError::from(e);
            e.message = format!("X-Conversation-Id: {}", e.message);
            return e.into_response();
        }
    };
    let conversation = ConversationRef::new(principal.tenant.clone(), id);
    req = Request::from_parts(parts, body);
    req.extensions_mut().insert(Caller {
        principal,
        conversation,
    });
    let delete = req.method() == axum::http::Method::DELETE;
    let mut response = next.run(req).await;
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
pub struct Tools {
    state: AppState,
    fixed: Option<Caller>,
}

fn schema(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::default(),
    }
}

/// The tools and their input schemas.
fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "bash",
            "Run a shell command (/bin/sh -c) in this conversation's workspace. Output is \
             stdout then stderr, cut at 30000 characters, then the exit code.",
            schema(json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command line."},
                    "timeout": {"type": "integer", "minimum": 1, "maximum": 600000,
                                "description": "Milliseconds before it is killed (default 120000, max 600000)."},
                    "cwd": {"type": "string", "description": "Working directory, a workspace path (default the workspace root)."},
                    "description": {"type": "string", "description": "What the command does, in a few words (ignored)."}
                },
                "required": ["command"]
            })),
        ),
        Tool::new(
            "read",
            "Read a text file, as numbered lines (cat -n). By default up to 2000 lines from the \
             start; lines longer than 2000 characters are cut.",
            schema(json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Workspace path of the file."},
                    "offset": {"type": "integer", "minimum": 1, "description": "First line to read, 1-based."},
                    "limit": {"type": "integer", "minimum": 1, "description": "How many lines to read (default 2000)."}
                },
                "required": ["path"]
            })),
        ),
        Tool::new(
            "write",
            "Write a file (created or replaced whole; parent directories are created).",
            schema(json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Workspace path of the file."},
                    "content": {"type": "string", "description": "The whole new content."}
                },
                "required": ["path", "content"]
            })),
        ),
        Tool::new(
            "edit",
            "Replace exact text in a file. old_string must occur exactly once unless replace_all \
             is true.",
            schema(json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Workspace path of the file."},
                    "old_string": {"type": "string", "description": "The text to replace (not empty)."},
                    "new_string": {"type": "string", "description": "Its replacement."},
                    "replace_all": {"type": "boolean", "default": false, "description": "Replace every occurrence."}
                },
                "required": ["path", "old_string", "new_string"]
            })),
        ),
        Tool::new(
            "ls",
            "List a directory; directories end with `/`.",
            schema(json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Workspace path (default the workspace root)."}
                }
            })),
        ),
        Tool::new(
            "glob",
            "Find files whose workspace-relative path matches a glob such as `**/*.rs`.",
            schema(json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "The glob."}
                },
                "required": ["pattern"]
            })),
        ),
        Tool::new(
            "skill",
            "Agent Skills: without `name`, list the available skills (name: description); with \
             `name`, load that skill: its instructions (SKILL.md) and its base directory in this \
             conversation, where its scripts and files are (read-only or a managed copy: do not \
             edit them).",
            schema(json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "The skill to load (omit to list them)."}
                }
            })),
        ),
        Tool::new(
            "network",
            "Show this conversation's network policy (read-only): the profile (`none`: no \
             network at all; `allowlist`: only the listed hosts, through the egress proxy that \
             commands get in HTTP_PROXY/HTTPS_PROXY), its rules and hash, and the most recent \
             connections the egress gateway allowed or refused, with the rule or reason. The \
             policy is set by the operator; no tool can change it, so do not try to work around \
             a refusal: report it.",
            schema(json!({
                "type": "object",
                "properties": {
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_NETWORK_VERDICTS,
                              "description": "How many recent verdicts to show (default 20, max 100)."}
                },
                "additionalProperties": false
            })),
        ),
        Tool::new(
            "grep",
            "Search file contents with a regular expression (Rust regex syntax).",
            schema(json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "The regular expression."},
                    "path": {"type": "string", "description": "File or directory to search (default the workspace)."},
                    "glob": {"type": "string", "description": "Only files matching this glob, e.g. `**/*.md`."},
                    "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"],
                                    "default": "files_with_matches",
                                    "description": "content: path:line:text; files_with_matches: paths; count: path:N."},
                    "case_insensitive": {"type": "boolean", "default": false}
                },
                "required": ["pattern"]
            })),
        ),
    ]
}

#[derive(Deserialize)]
struct BashArgs {
    command: String,
    timeout: Option<u64>,
    cwd: Option<String>,
    #[serde(default, rename = "description")]
    _description: Option<String>,
}

#[derive(Deserialize)]
struct ReadArgs {
    path: String,
    offset: Option<usize>,
    limit: Option<usize>,
}

#[derive(Deserialize)]
struct WriteArgs {
    path: String,
    content: String,
}

#[derive(Deserialize)]
struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

#[derive(Deserialize)]
struct LsArgs {
    path: Option<String>,
}

#[derive(Deserialize)]
struct GlobArgs {
    pattern: String,
}

#[derive(Deserialize)]
struct SkillArgs {
    name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkArgs {
    limit: Option<usize>,
}

#[derive(Deserialize)]
struct GrepArgs {
    pattern: String,
    path: Option<String>,
    glob: Option<String>,
    output_mode: Option<String>,
    #[serde(default)]
    case_insensitive: bool,
}

fn args<T: DeserializeOwned>(tool: &str, a: Option<JsonObject>) -> Result<T, Error> {
    serde_json::from_value(Value::Object(a.unwrap_or_default()))
        .map_err(|e| Error::InvalidRequest(format!("invalid arguments for `{tool}`: {e}")))
}

/// With `expired` (the conversation's last incarnation expired then, and this call found it
/// gone or made it anew), `result` carries a note saying so first, so that the model never
/// takes an empty workspace for its old one.
fn expired_note(
    result: Result<String, Error>,
    expired: Option<chrono::DateTime<Utc>>,
) -> Result<String, Error> {
    let Some(at) = expired else {
        return result;
    };
    let note = format!(
        "Note: this conversation expired at {} and its files are gone; it starts again empty.",
        at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    match result {
        Ok(text) => Ok(format!("{note}\n{text}")),
        Err(Error::NotFound(m)) => Err(Error::NotFound(format!("{m}. {note}"))),
        Err(e) => Err(e),
    }
}

/// Cuts `s` to `max` characters, saying so.
fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((i, _)) => format!(
            "{}\n... [output truncated: {} more characters]",
            &s[..i],
            s[i..].chars().count()
        ),
    }
}

/// `content` as `cat -n` would number it, from line `offset` (1-based), `limit` lines.
fn numbered(content: &str, offset: usize, limit: usize) -> String {
    let mut out = String::new();
    for (n, line) in content.lines().enumerate().skip(offset - 1).take(limit) {
        let line = match line.char_indices().nth(MAX_LINE_CHARS) {
            Some((i, _)) => &line[..i],
            None => line,
        };
        out.push_str(&format!("{:>6}\t{line}\n", n + 1));
    }
    out
}

impl Tools {
    /// Runs tool `name` on the caller's conversation, holding its turn.
    async fn run(
        &self,
        caller: &Caller,
        name: &str,
        a: Option<JsonObject>,
    ) -> Result<String, Error> {
        let s = &self.state;
        let conv = &caller.conversation;
        // Parse and check everything before opening: bad input creates nothing.
        if name == "skill" {
            // Reads the host's skills catalog: no turn, no conversation opened.
            return Self::skill(s, conv, args(name, a)?).await;
        }
        if name == "network" {
            // Reads the store: no turn, no conversation opened, nothing written.
            let a: NetworkArgs = args(name, a).map_err(|_| {
                Error::InvalidRequest(
                    "`network` is read-only and takes only `limit`: the network policy is set \
                     by the operator, and no tool can change it"
                        .into(),
                )
            })?;
            return Self::network(s, conv, a).await;
        }
        let op = match name {
            "bash" => {
                let b: BashArgs = args(name, a)?;
                let mut req = ExecRequest::new(b.command);
                if let Some(cwd) = b.cwd {
                    s.manager.check_path(conv, &cwd)?;
                    req.cwd = Some(cwd);
                }
                req.timeout = Duration::from_millis(b.timeout.unwrap_or(120_000));
                req.validate()?;
                Run::Bash(req)
            }
            "read" => {
                let r: ReadArgs = args(name, a)?;
                s.manager.check_path(conv, &r.path)?;
                Run::Read(r)
            }
            "write" => {
                let w: WriteArgs = args(name, a)?;
                s.manager.check_path(conv, &w.path)?;
                Run::Write(w)
            }
            "edit" => {
                let e: EditArgs = args(name, a)?;
                s.manager.check_path(conv, &e.path)?;
                Run::Edit(e)
            }
            "ls" => {
                let l: LsArgs = args(name, a)?;
                let p = l.path.unwrap_or_else(|| ".".to_owned());
                let root = s.manager.check_path(conv, &p)?.is_root();
                Run::Ls(p, root)
            }
            "glob" => Run::Glob(args::<GlobArgs>(name, a)?.pattern),
            "grep" => {
                let g: GrepArgs = args(name, a)?;
                if let Some(p) = &g.path {
                    s.manager.check_path(conv, p)?;
                }
                let mode = g
                    .output_mode
                    .unwrap_or_else(|| "files_with_matches".to_owned());
                if !matches!(mode.as_str(), "content" | "files_with_matches" | "count") {
                    return Err(Error::InvalidRequest(format!(
                        "output_mode must be content, files_with_matches or count, not {mode:?}"
                    )));
                }
                let mut req = GrepRequest::new(g.pattern);
                req.path = g.path;
                req.glob = g.glob;
                req.case_insensitive = g.case_insensitive;
                Run::Grep(req, mode)
            }
            other => {
                return Err(Error::InvalidRequest(format!(
                    "no tool named {other:?}; the tools are bash, read, write, edit, ls, glob, grep, skill, network"
                )));
            }
        };
        let creates = matches!(op, Run::Bash(_) | Run::Write(_));
        // The conversation's turn, then its session (kept between calls, as for REST).
        let opened = match s.open(conv, creates).await {
            Ok(o) => o,
            // A conversation that does not exist yet has an empty workspace, and the model
            // sees it so: nothing is created until bash or write.
            Err(e) if e.code == "not_found" && !creates => {
                // An expired conversation is empty too, and the model is told why.
                let expired = Self::expired_at(s, conv).await;
                return expired_note(Self::empty(op), expired);
            }
            Err(e) => return Err(Error::from_code(e.code, &e.message)),
        };
        let expired = opened.previous_expired_at();
        let result = Self::apply(&opened.conv, op).await;
        opened.done().await;
        expired_note(result, expired)
    }

    /// When `conv`'s record expired, if it is past its expiry (not yet destroyed).
    async fn expired_at(s: &AppState, conv: &ConversationRef) -> Option<chrono::DateTime<Utc>> {
        let store = s.manager.store().clone();
        let key = conv.key.clone();
        let record = tokio::task::spawn_blocking(move || store.get(&key))
            .await
            .ok()?
            .ok()??;
        record
            .is_expired(Utc::now())
            .then_some(record.expires_at)
            .flatten()
    }

    /// What `op` finds in an empty workspace: a conversation that does not exist yet.
    fn empty(op: Run) -> Result<String, Error> {
        let missing = |path: &str| Err(Error::NotFound(path.to_owned()));
        match op {
            Run::Ls(p, true) => Ok(format!("{p} is empty")),
            Run::Ls(p, false) => missing(&p),
            Run::Read(a) => missing(&a.path),
            Run::Edit(e) => missing(&e.path),
            Run::Glob(_) => Ok("No files found".to_owned()),
            Run::Grep(req, _) => match &req.path {
                Some(p) => missing(p),
                None => Ok("No matches found".to_owned()),
            },
            // They create the conversation, so they never get here.
            Run::Bash(_) | Run::Write(_) => Err(Error::Backend(
                "a creating operation found no conversation".into(),
            )),
        }
    }

    async fn skill(s: &AppState, conv: &ConversationRef, a: SkillArgs) -> Result<String, Error> {
        match a.name {
            None => {
                let skills = crate::skills::list_for(s, conv).await?;
                if skills.is_empty() {
                    return Ok("No skills are available.".to_owned());
                }
                let mut out = String::from("Available skills (load one with `name`):\n");
                for k in skills {
                    out.push_str(&format!("- {}: {}\n", k.name, k.description));
                }
                Ok(out)
            }
            Some(name) => {
                let k = crate::skills::load(s, conv, &name).await?;
                Ok(format!(
                    "Skill: {}\nBase directory: {}\n(Paths in these instructions are relative to it.)\n\n{}",
                    k.name, k.base_path, k.body
                ))
            }
        }
    }

    async fn network(
        s: &AppState,
        conv: &ConversationRef,
        a: NetworkArgs,
    ) -> Result<String, Error> {
        let limit = a.limit.unwrap_or(DEFAULT_NETWORK_VERDICTS);
        if limit == 0 || limit > MAX_NETWORK_VERDICTS {
            return Err(Error::InvalidRequest(format!(
                "limit must be between 1 and {MAX_NETWORK_VERDICTS}"
            )));
        }
        let (policy, view) = crate::policy::in_force(s, conv).await?;
        let source = match view.source {
            crate::policy::PolicySource::Conversation => "set for this conversation",
            crate::policy::PolicySource::Tenant => "set for the tenant",
            crate::policy::PolicySource::Default => "the default",
        };
        let mut out = format!(
            "Network policy: {} ({source}), hash {}\n",
            policy.profile(),
            view.hash
        );
        if policy.is_none() {
            out.push_str("No network at all: nothing outside this sandbox can be reached.\n");
        } else {
            out.push_str(&format!("Allowed: {}\n", view.allow.join(", ")));
            if !view.deny.is_empty() {
                out.push_str(&format!("Denied: {}\n", view.deny.join(", ")));
            }
            out.push_str(
                "Connections go through the egress proxy in HTTP_PROXY/HTTPS_PROXY; loopback, \
                 link-local (cloud metadata) and private addresses stay blocked unless a rule \
                 names them.\n",
            );
        }
        out.push_str("The operator sets this policy; no tool can change it.\n");
        let verdicts = crate::policy::verdicts(s, &conv.tenant, Some(conv), None, limit).await?;
        if verdicts.is_empty() {
            out.push_str("\nNo connections recorded yet.");
            return Ok(out);
        }
        out.push_str(&format!(
            "\nRecent connections (newest first, {}):\n",
            verdicts.len()
        ));
        for v in verdicts {
            let mut line = format!(
                "{} {} {} {} ({})",
                v.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                v.verdict,
                v.method,
                v.target,
                v.rule
            );
            if v.verdict == "allowed" {
                line.push_str(&format!(", {} B up, {} B down", v.bytes_up, v.bytes_down));
                if let Some(end) = &v.end {
                    line.push_str(&format!(", {end}"));
                }
            }
            out.push_str(&line);
            out.push('\n');
        }
        Ok(out)
    }

    async fn apply(session: &dyn Session, op: Run) -> Result<String, Error> {
        match op {
            Run::Bash(req) => {
                let timeout_ms = req.timeout.as_millis();
                let r = session.exec(req).await?;
                let mut text = model_text("stdout", &r.stdout);
                let stderr = model_text("stderr", &r.stderr);
                if !stderr.is_empty() {
                    if !text.is_empty() && !text.ends_with('\n') {
                        text.push('\n');
                    }
                    text.push_str(&stderr);
                }
                let mut text = cut(&text, MAX_OUTPUT_CHARS);
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                if r.timed_out {
                    text.push_str(&format!("Command timed out after {timeout_ms} ms\n"));
                }
                text.push_str(&format!("Exit code: {}", r.shell_exit_code()));
                Ok(text)
            }
            Run::Read(a) => {
                let bytes = session.read(&a.path).await?;
                let content = String::from_utf8_lossy(&bytes);
                let offset = a.offset.unwrap_or(1).max(1);
                let limit = a.limit.unwrap_or(DEFAULT_READ_LINES).max(1);
                let total = content.lines().count();
                if total == 0 {
                    return Ok(format!("{} is empty", a.path));
                }
                if offset > total {
                    return Err(Error::InvalidRequest(format!(
                        "offset {offset} is past the end of {} ({total} lines)",
                        a.path
                    )));
                }
                let mut out = numbered(&content, offset, limit);
                let last = (offset - 1 + limit).min(total);
                if last < total {
                    out.push_str(&format!(
                        "... [{} more lines; read on with offset {}]\n",
                        total - last,
                        last + 1
                    ));
                }
                Ok(out)
            }
            Run::Write(w) => {
                session.write(&w.path, w.content.as_bytes()).await?;
                Ok(format!("Wrote {} bytes to {}", w.content.len(), w.path))
            }
            Run::Edit(e) => {
                let r = session
                    .edit(
                        &e.path,
                        &EditRequest {
                            old: e.old_string,
                            new: e.new_string,
                            replace_all: e.replace_all,
                        },
                    )
                    .await
                    .map_err(|e| {
                        let advice = match e.refusal() {
                            Some(Refusal::EditAbsent) => {
                                "read the file and copy its exact text into old_string"
                            }
                            Some(Refusal::EditAmbiguous) => {
                                "give more context in old_string, or set replace_all to true"
                            }
                            Some(Refusal::EditEmpty) => "give the exact text in old_string",
                            _ => return e,
                        };
                        e.with_advice(advice)
                    })?;
                Ok(format!(
                    "Replaced {} occurrence{} in {}",
                    r.replacements,
                    if r.replacements == 1 { "" } else { "s" },
                    e.path
                ))
            }
            Run::Ls(p, _) => {
                let mut entries = session.list(&p).await?;
                entries.sort_by(|a, b| a.name.cmp(&b.name));
                if entries.is_empty() {
                    return Ok(format!("{p} is empty"));
                }
                Ok(entries
                    .iter()
                    .map(|e| match e.kind {
                        FileKind::Directory => format!("{}/", e.name),
                        _ => e.name.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join("\n"))
            }
            Run::Glob(pattern) => {
                let found = session.glob(&pattern).await?;
                if found.is_empty() {
                    return Ok("No files found".to_owned());
                }
                Ok(found.join("\n"))
            }
            Run::Grep(req, mode) => {
                let matches = session.grep(&req).await?;
                if matches.is_empty() {
                    return Ok("No matches found".to_owned());
                }
                let text = match mode.as_str() {
                    "content" => matches
                        .iter()
                        .map(|m| format!("{}:{}:{}", m.path, m.line_number, m.line))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    "count" => {
                        let mut counts: Vec<(String, usize)> = Vec::new();
                        for m in &matches {
                            match counts.last_mut() {
                                Some((p, n)) if *p == m.path => *n += 1,
                                _ => counts.push((m.path.clone(), 1)),
                            }
                        }
                        counts
                            .iter()
                            .map(|(p, n)| format!("{p}:{n}"))
                            .collect::<Vec<_>>()
                            .join("\n")
                    }
                    _ => {
                        let mut paths: Vec<&str> = Vec::new();
                        for m in &matches {
                            if paths.last() != Some(&m.path.as_str()) {
                                paths.push(&m.path);
                            }
                        }
                        paths.join("\n")
                    }
                };
                Ok(cut(&text, MAX_OUTPUT_CHARS))
            }
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
        let store = self.state.manager.store().clone();
        if let Err(e) = blocking(move || store.audit(&entry)).await {
            tracing::warn!(error = %e, "audit record not written");
        }
    }
}

/// A checked operation, ready to run on an open session.
enum Run {
    Bash(ExecRequest),
    Read(ReadArgs),
    Write(WriteArgs),
    Edit(EditArgs),
    /// The path as given, and whether it is the workspace root.
    Ls(String, bool),
    Glob(String),
    Grep(GrepRequest, String),
}

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("sessionbox", env!("CARGO_PKG_VERSION")))
            .with_instructions(instructions(
                !self.state.manager.skills().is_empty(),
                self.state.manager.runtime().mounted_skills(),
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = match &self.fixed {
            Some(c) => c.clone(),
            None => context
                .extensions
                .get::<axum::http::request::Parts>()
                .and_then(|p| p.extensions.get::<Caller>())
                .cloned()
                .ok_or_else(|| ErrorData::internal_error("the request has no caller", None))?,
        };
        let started = Instant::now();
        let result = self.run(&caller, &request.name, request.arguments).await;
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
        self.audit(&caller, &request.name, outcome, started).await;
        Ok(out.into())
    }
}

/// What the model is told about this server when a session starts: what a conversation is,
/// that its files stay between turns, and where skills are (`mounted`: the runtime's read-only
/// mount root; `None`: copies in the workspace).
/// The server's instructions to the model. `any_skills`: this server has skills configured
/// for some tenant; `mounted`: where the runtime mounts them (else they are copied into the
/// workspace at `.skills/NAME`).
fn instructions(any_skills: bool, mounted: Option<String>) -> String {
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
         `network` shows the network policy, which no tool can change."
    )
}

/// A command's output stream as the model reads it: the text when the bytes are valid UTF-8;
/// otherwise a line saying so, with the exact bytes in base64 (standard alphabet) so that
/// nothing is lost, or only the line when the base64 would not fit in a tool result.
fn model_text(name: &str, bytes: &[u8]) -> String {
    use base64::Engine;
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => {
            let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
            if encoded.len() <= MAX_OUTPUT_CHARS / 2 {
                format!(
                    "[{name} is not valid UTF-8: {} bytes, shown as base64]\n{encoded}\n",
                    bytes.len()
                )
            } else {
                format!(
                    "[{name} is not valid UTF-8: {} bytes, too many to show; redirect it to a \
                     file and read that]\n",
                    bytes.len()
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::instructions;

    #[test]
    fn the_instructions_name_a_skill_directory_only_where_skills_exist() {
        let none = instructions(false, Some("/skills".into()));
        assert!(
            none.contains("none are configured") && !none.contains("/skills/NAME"),
            "{none}"
        );
        let mounted = instructions(true, Some("/skills/".into()));
        assert!(mounted.contains("/skills/NAME, read-only"), "{mounted}");
        let copied = instructions(true, None);
        assert!(copied.contains(".skills/NAME in the workspace"), "{copied}");
        for text in [none, mounted, copied] {
            assert!(text.contains("persist across turns"), "{text}");
        }
    }
}
