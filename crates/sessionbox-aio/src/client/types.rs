//! Request and response bodies of the `/v1` routes the client uses, as the wire spells them.

use serde::{Deserialize, Serialize};

/// `POST /v1/bash/exec` request body.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BashExecRequest {
    /// Shell command.
    pub command: String,
    /// Session to run in; a new one is made when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Absolute working directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec_dir: Option<String>,
    /// Extra environment variables for this command.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<std::collections::BTreeMap<String, String>>,
    /// Return at once with status `running`.
    pub async_mode: bool,
    /// Seconds to wait before answering `running` (sync mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// Seconds after which the server kills the command (`timed_out`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hard_timeout: Option<f64>,
    /// Characters per stream before middle truncation; 0 disables it.
    pub max_output_length: u64,
}

/// Lifecycle of a command (`data.status`). Not success or failure: see `exit_code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandStatus {
    /// Accepted, not started.
    Pending,
    /// Still executing.
    Running,
    /// Exited; `exit_code` is set.
    Completed,
    /// Killed after `hard_timeout`.
    TimedOut,
    /// Killed by `/v1/bash/kill`, session cleanup or an internal failure.
    Killed,
}

/// `data` of `POST /v1/bash/exec`.
#[derive(Debug, Clone, Deserialize)]
pub struct BashExecResult {
    /// The session it ran in.
    pub session_id: String,
    /// The command's id.
    pub command_id: String,
    /// Its status.
    pub status: CommandStatus,
    /// Stdout so far.
    #[serde(default)]
    pub stdout: Option<String>,
    /// Stderr so far.
    #[serde(default)]
    pub stderr: Option<String>,
    /// Exit code, once completed.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// Stdout byte offset for the next `/v1/bash/output`.
    #[serde(default)]
    pub offset: u64,
    /// Stderr byte offset for the next `/v1/bash/output`.
    #[serde(default)]
    pub stderr_offset: u64,
}

/// `POST /v1/bash/output` request body.
#[derive(Debug, Clone, Serialize)]
pub struct BashOutputRequest {
    /// The session.
    pub session_id: String,
    /// The command.
    pub command_id: Option<String>,
    /// Stdout byte offset to read from.
    pub offset: u64,
    /// Stderr byte offset to read from.
    pub stderr_offset: u64,
    /// Long-poll until there is news.
    pub wait: bool,
    /// Longest wait, in seconds.
    pub wait_timeout: f64,
}

/// `data.command` of `/v1/bash/output`.
#[derive(Debug, Clone, Deserialize)]
pub struct BashCommandInfo {
    /// The command's id.
    pub command_id: String,
    /// Its status.
    pub status: CommandStatus,
    /// Exit code, once completed.
    #[serde(default)]
    pub exit_code: Option<i32>,
}

/// `data` of `POST /v1/bash/output`.
#[derive(Debug, Clone, Deserialize)]
pub struct BashOutputResult {
    /// New stdout since the offset.
    #[serde(default)]
    pub stdout: String,
    /// New stderr since the offset.
    #[serde(default)]
    pub stderr: String,
    /// Next stdout offset.
    #[serde(default)]
    pub offset: u64,
    /// Next stderr offset.
    #[serde(default)]
    pub stderr_offset: u64,
    /// The command's status.
    #[serde(default)]
    pub command: Option<BashCommandInfo>,
}

/// One entry of `GET /v1/bash/sessions`.
#[derive(Debug, Clone, Deserialize)]
pub struct BashSessionInfo {
    /// Its id.
    pub session_id: String,
    /// `ready` or `closed`.
    #[serde(default)]
    pub status: String,
}

/// One entry of `/v1/file/list`.
#[derive(Debug, Clone, Deserialize)]
pub struct FileInfo {
    /// Name.
    pub name: String,
    /// Full path.
    #[serde(default)]
    pub path: String,
    /// Whether it is a directory.
    #[serde(default)]
    pub is_directory: bool,
    /// Size in bytes.
    #[serde(default)]
    pub size: Option<u64>,
    /// ISO 8601 modification time.
    #[serde(default)]
    pub modified_time: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct FileListResult {
    #[serde(default)]
    pub(super) files: Vec<FileInfo>,
}

/// One match of `/v1/file/glob`.
#[derive(Debug, Clone, Deserialize)]
pub struct GlobFileInfo {
    /// Full path.
    pub path: String,
    /// Whether it is a directory.
    #[serde(default)]
    pub is_directory: bool,
}

#[derive(Debug, Deserialize)]
pub(super) struct FileGlobResult {
    #[serde(default)]
    pub(super) files: Vec<GlobFileInfo>,
    #[serde(default)]
    pub(super) truncated: bool,
}

/// One match of `/v1/file/grep`.
#[derive(Debug, Clone, Deserialize)]
pub struct FileGrepMatch {
    /// File path.
    pub file: String,
    /// 1-based line number.
    pub line_number: u64,
    /// The line.
    pub line_content: String,
}

/// `data` of `/v1/file/grep`.
#[derive(Debug, Clone, Deserialize)]
pub struct FileGrepResult {
    /// Matches in order.
    #[serde(default)]
    pub matches: Vec<FileGrepMatch>,
    /// True when `max_results` cut the list.
    #[serde(default)]
    pub truncated: bool,
}

/// `/v1/file/grep` parameters sessionbox uses.
#[derive(Debug, Clone, Serialize)]
pub struct FileGrepRequest {
    /// File or directory (absolute).
    pub path: String,
    /// Regular expression.
    pub pattern: String,
    /// Case-insensitive.
    pub case_insensitive: bool,
    /// Most matches.
    pub max_results: u64,
    /// Skip larger files (`8M`, `500K`).
    pub max_file_size: String,
}

/// The server's context (`GET /v1/sandbox`).
#[derive(Debug, Clone, Deserialize)]
pub struct SandboxContext {
    /// Server version.
    #[serde(default)]
    pub version: String,
    /// Home directory of the sandbox user.
    #[serde(default)]
    pub home_dir: String,
}
