//! The MCP tools as the model sees them: names, descriptions, input schemas, and the argument
//! types those schemas describe.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sessionbox_core::Error;

/// Verdicts `network` shows by default, and at most.
pub(super) const DEFAULT_NETWORK_VERDICTS: usize = 20;
pub(super) const MAX_NETWORK_VERDICTS: usize = 100;

fn schema(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::default(),
    }
}

/// The tools and their input schemas.
pub(super) fn tools() -> Vec<Tool> {
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
            "preview",
            "Get a link that shows the user what a program in this sandbox serves on a port \
             (a web app, a dev server, a report): start the server with bash first (in the \
             background, listening on the port), then call this and give the user the link. \
             The link works without a key until it expires.",
            schema(json!({
                "type": "object",
                "properties": {
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535,
                             "description": "The port the program listens on inside the sandbox."},
                    "ttl_secs": {"type": "integer", "minimum": 1, "maximum": crate::routes::preview::MAX_LINK_TTL_SECS,
                                 "description": "How long the link works, in seconds (default 900)."}
                },
                "required": ["port"],
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
pub(super) struct BashArgs {
    pub(super) command: String,
    pub(super) timeout: Option<u64>,
    pub(super) cwd: Option<String>,
    #[serde(default, rename = "description")]
    pub(super) _description: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct ReadArgs {
    pub(super) path: String,
    pub(super) offset: Option<usize>,
    pub(super) limit: Option<usize>,
}

#[derive(Deserialize)]
pub(super) struct WriteArgs {
    pub(super) path: String,
    pub(super) content: String,
}

#[derive(Deserialize)]
pub(super) struct EditArgs {
    pub(super) path: String,
    pub(super) old_string: String,
    pub(super) new_string: String,
    #[serde(default)]
    pub(super) replace_all: bool,
}

#[derive(Deserialize)]
pub(super) struct LsArgs {
    pub(super) path: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct GlobArgs {
    pub(super) pattern: String,
}

#[derive(Deserialize)]
pub(super) struct SkillArgs {
    pub(super) name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NetworkArgs {
    pub(super) limit: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PreviewArgs {
    pub(super) port: u16,
    pub(super) ttl_secs: Option<u64>,
}

#[derive(Deserialize)]
pub(super) struct GrepArgs {
    pub(super) pattern: String,
    pub(super) path: Option<String>,
    pub(super) glob: Option<String>,
    pub(super) output_mode: Option<String>,
    #[serde(default)]
    pub(super) case_insensitive: bool,
}

pub(super) fn args<T: DeserializeOwned>(tool: &str, a: Option<JsonObject>) -> Result<T, Error> {
    serde_json::from_value(Value::Object(a.unwrap_or_default()))
        .map_err(|e| Error::InvalidRequest(format!("invalid arguments for `{tool}`: {e}")))
}
