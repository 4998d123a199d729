//! The `aio` runtime: one directory per conversation in one shared AIO Sandbox container.
//!
//! Boundary: directory separation inside a container shared by every conversation, all running
//! as the same OS user. File operations are confined (path policy first, then a real-path check
//! inside the container), but a shell command can read and write every other conversation's
//! workspace. For trusted users only.
//!
//! Order of every operation: the path policy ([`WorkspacePath::resolve`]) first, with no HTTP
//! call for a refused path; then, for file operations, a check script run through
//! `/v1/bash/exec` that resolves the target's real path (`realpath`) and refuses it unless it is
//! inside the workspace's real path; then the operation itself (`/v1/file/download`,
//! `/v1/file/write` with base64, `/v1/file/list`, `/v1/file/glob`, `/v1/file/grep`, or a fixed
//! script), aimed at the real path the check returned.
//!
//! Race that remains: between the check and the operation (two HTTP requests), a command running
//! in the same container could replace a directory on the path with a symbolic link. The AIO API
//! has no descriptor-relative operations, so this cannot be closed from outside; the window is
//! one round trip, and the only party able to use it is code that already runs in the shared
//! container as the same user (who can reach every workspace anyway).
//!
//! Workspace archives: see the `archive` module (GNU tar in the container, background commands
//! paused, the archive streamed and rewritten on this side by
//! [`sessionbox_archive::rewrite_archive`]).
//!
//! Network: the container's, shared by every conversation. With an egress gateway
//! ([`AioRuntime::with_egress`]), each command of a conversation whose policy is an allowlist
//! gets the proxy variables with a token of its own (conversation, policy hash, expiry), so the
//! gateway decides and logs per conversation. That only guides programs that honour the
//! variables: nothing in a shared container stops a direct connection.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sessionbox_core::{
    ConversationKey, ConversationRef, DestroyReport, Directory, Error, Limits, Result, Runtime,
    RuntimeConversation, RuntimeInfo, Session,
};

use crate::client::{AioClient, CommandStatus, Endpoint};
use crate::scripts;

mod archive;
mod command;
mod session;

pub(crate) use command::{run_command, trailer_cap};
use session::AioSession;

/// Default directory holding the workspaces inside the container.
pub const DEFAULT_ROOT: &str = "/home/gem/workspace/conversations";

/// Largest command text accepted (it travels in an environment variable of the wrapper).
pub const MAX_COMMAND_BYTES: usize = 100 * 1024;
/// Largest stdin accepted (base64 in an environment variable of the wrapper).
pub const MAX_STDIN_BYTES: usize = 64 * 1024;

/// Default largest workspace archive taken or restored, in bytes (1 GiB): see
/// [`AioConfig::max_archive_bytes`].
pub const DEFAULT_MAX_ARCHIVE_BYTES: u64 = 1 << 30;

/// How long a command's proxy token outlives the command's own timeout.
pub const TOKEN_MARGIN: Duration = Duration::from_secs(60);

/// The egress gateway commands are pointed at, and where each conversation's policy comes from.
#[derive(Clone)]
pub struct AioEgress {
    /// The gateway as the container reaches it, and the key that signs tokens.
    pub gateway: sessionbox_egress::token::GatewayAccess,
    /// Asked for the policy in force for a conversation ([`Directory::network`]) before each
    /// command: the manager's `StoreDirectory` over the store.
    pub directory: Arc<dyn Directory>,
}

impl std::fmt::Debug for AioEgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AioEgress")
            .field("gateway", &self.gateway.address())
            .finish_non_exhaustive()
    }
}

/// Settings of the `aio` runtime.
#[derive(Debug, Clone)]
pub struct AioConfig {
    /// The AIO server and credentials.
    pub endpoint: Endpoint,
    /// Directory inside the container holding one workspace per conversation
    /// (default [`DEFAULT_ROOT`]).
    pub root: String,
    /// File operation limits.
    pub limits: Limits,
    /// Largest workspace archive, in bytes, that [`Session::archive_workspace`] downloads
    /// or [`Session::restore_workspace`] uploads (default [`DEFAULT_MAX_ARCHIVE_BYTES`]); an
    /// archive past it is refused with [`Error::TooLarge`] before it is sent.
    pub max_archive_bytes: u64,
}

impl AioConfig {
    /// Defaults for `endpoint`.
    pub fn new(endpoint: Endpoint) -> Self {
        AioConfig {
            endpoint,
            root: DEFAULT_ROOT.to_owned(),
            limits: Limits::default(),
            max_archive_bytes: DEFAULT_MAX_ARCHIVE_BYTES,
        }
    }
}

/// The `aio` runtime. See the module documentation for its boundary.
#[derive(Debug, Clone)]
pub struct AioRuntime {
    client: AioClient,
    root: String,
    limits: Limits,
    max_archive_bytes: u64,
    egress: Option<AioEgress>,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A name unique to this process and call, for session ids and temporary files.
fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{:x}{:08x}{:x}",
        std::process::id(),
        nanos,
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// What one check script said.
enum Answer {
    Ok(Vec<String>),
    Err { code: String, detail: String },
}

impl AioRuntime {
    /// The boundary this runtime gives, in one sentence.
    pub const BOUNDARY: &'static str = "one shared AIO Sandbox container, the same OS user for every conversation: file operations stay in the workspace, but shell commands can reach every workspace; trusted users only";

    /// Builds the runtime. Makes no request.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a root that is not an absolute, normalised path other than
    /// `/`; [`Error::RuntimeUnavailable`] for an unusable endpoint.
    pub fn new(config: AioConfig) -> Result<Self> {
        let root = config.root.trim_end_matches('/').to_owned();
        let normal = root.starts_with('/')
            && root.len() > 1
            && root[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..")
            && !root.contains('\0');
        if !normal {
            return Err(Error::InvalidRequest(format!(
                "the aio conversations root {:?} must be an absolute, normalised path other than /",
                config.root
            )));
        }
        let client = AioClient::new(&config.endpoint)?;
        Ok(AioRuntime {
            client,
            root,
            limits: config.limits,
            max_archive_bytes: config.max_archive_bytes,
            egress: None,
        })
    }

    /// The same runtime, pointing each command of a conversation whose policy is an allowlist
    /// at `egress`'s gateway with a fresh token (see the module documentation for what that
    /// does and does not stop).
    #[must_use]
    pub fn with_egress(mut self, egress: AioEgress) -> Self {
        self.egress = Some(egress);
        self
    }

    /// The client, for probes.
    pub fn client(&self) -> &AioClient {
        &self.client
    }

    /// The conversations root inside the container.
    pub fn root(&self) -> &str {
        &self.root
    }

    fn ws(&self, key: &ConversationKey) -> String {
        format!("{}/{}", self.root, key.as_str())
    }

    /// Runs a fixed script in a fresh session (closed afterwards) and returns stdout, stderr and
    /// the exit code.
    async fn run_script(
        &self,
        script: &str,
        env: BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<(String, String, Option<i32>)> {
        let out = run_command(
            &self.client,
            None,
            script,
            "/",
            env,
            timeout,
            self.limits.max_entries.saturating_mul(4096).max(1 << 20),
        )
        .await?;
        if out.status != CommandStatus::Completed {
            return Err(Error::Backend(format!(
                "a sessionbox check script did not complete ({:?})",
                out.status
            )));
        }
        Ok((
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            out.exit_code,
        ))
    }

    async fn file_op(
        &self,
        ws: &str,
        op: &str,
        path: &str,
        extra: &[(&str, &str)],
    ) -> Result<(Answer, String)> {
        let mut env = BTreeMap::from([
            ("SB_OP".to_owned(), op.to_owned()),
            ("SB_WS".to_owned(), ws.to_owned()),
            ("SB_PATH".to_owned(), path.to_owned()),
        ]);
        for (k, v) in extra {
            env.insert((*k).to_owned(), (*v).to_owned());
        }
        let (stdout, stderr, code) = self
            .run_script(scripts::FILE_OP, env, Duration::from_secs(60))
            .await?;
        let mut lines = stdout.splitn(2, '\n');
        let first = lines.next().unwrap_or("");
        let rest = lines.next().unwrap_or("").to_owned();
        let mut fields = first.split('\t');
        match fields.next() {
            Some("ok") => Ok((Answer::Ok(fields.map(str::to_owned).collect()), rest)),
            Some("err") => Ok((
                Answer::Err {
                    code: fields.next().unwrap_or("").to_owned(),
                    detail: fields.next().unwrap_or("").to_owned(),
                },
                rest,
            )),
            _ => Err(Error::Backend(format!(
                "the file check script failed (exit {code:?}): {}",
                stderr.trim().chars().take(300).collect::<String>()
            ))),
        }
    }
}

/// Maps a check script's refusal to the error of `shown` (the caller's path).
fn refusal(code: &str, detail: &str, shown: &str) -> Error {
    match code {
        "outside" => Error::OutsideWorkspace {
            path: shown.to_owned(),
            reason: detail.to_owned(),
        },
        "not_found" => Error::NotFound(format!("{shown}: {detail}")),
        "exists" => Error::AlreadyExists(format!("{shown}: {detail}")),
        "not_empty" => Error::Conflict(format!("{shown} {}", sessionbox_core::DIRECTORY_NOT_EMPTY)),
        "is_dir" | "not_file" | "not_dir" | "hardlink" | "root" => {
            Error::Conflict(format!("{shown}: {detail}"))
        }
        _ => Error::Backend(format!("{shown}: {detail}")),
    }
}

#[async_trait]
impl Runtime for AioRuntime {
    fn info(&self) -> RuntimeInfo {
        RuntimeInfo {
            name: "aio".into(),
            endpoint: Some(self.client.endpoint().to_owned()),
            version: None,
            boundary: Self::BOUNDARY.into(),
        }
    }

    fn presented_root(&self, key: &ConversationKey) -> String {
        self.ws(key)
    }

    fn workspace_location(&self, key: &ConversationKey) -> String {
        self.ws(key)
    }

    async fn open(&self, conversation: &ConversationRef) -> Result<Box<dyn Session>> {
        let ws = self.ws(&conversation.key);
        let env = BTreeMap::from([
            ("SB_ROOT".to_owned(), self.root.clone()),
            ("SB_WS".to_owned(), ws.clone()),
        ]);
        let (stdout, stderr, _) = self
            .run_script(scripts::OPEN, env, Duration::from_secs(60))
            .await?;
        let mut f = stdout.lines().next().unwrap_or("").split('\t');
        match f.next() {
            Some("ok") => {}
            Some("err") => {
                let code = f.next().unwrap_or("");
                let detail = f.next().unwrap_or("");
                return Err(refusal(code, detail, &ws));
            }
            _ => {
                return Err(Error::Backend(format!(
                    "cannot create the workspace: {}",
                    stderr.trim()
                )));
            }
        }
        Ok(Box::new(AioSession {
            runtime: self.clone(),
            key: conversation.key.clone(),
            conversation: conversation.clone(),
            ws,
        }))
    }

    async fn destroy(&self, key: &ConversationKey) -> Result<DestroyReport> {
        let prefix = format!("sb-{}-", key.as_str());
        let mut report = DestroyReport::default();
        for s in self.client.bash_sessions().await? {
            if s.session_id.starts_with(&prefix) {
                let _ = self.client.bash_kill(&s.session_id, "SIGKILL").await;
                self.client.bash_close(&s.session_id).await?;
                report.processes_killed += 1;
            }
        }
        let env = BTreeMap::from([
            ("SB_WS".to_owned(), self.ws(key)),
            ("SB_REMOVE".to_owned(), "1".to_owned()),
        ]);
        let (stdout, stderr, _) = self
            .run_script(scripts::DESTROY, env, Duration::from_secs(60))
            .await?;
        let f: Vec<&str> = stdout.lines().next().unwrap_or("").split('\t').collect();
        match f.as_slice() {
            ["ok", killed, removed] => {
                report.processes_killed += killed.parse::<usize>().unwrap_or(0);
                report.workspace_removed = *removed == "1";
                Ok(report)
            }
            ["err", _, detail] => Err(Error::Backend(format!(
                "cannot destroy the workspace of {key}: {detail}"
            ))),
            _ => Err(Error::Backend(format!(
                "the destroy script failed: {}",
                stderr.trim()
            ))),
        }
    }

    async fn list(&self) -> Result<Vec<RuntimeConversation>> {
        let env = BTreeMap::from([("SB_ROOT".to_owned(), self.root.clone())]);
        let (stdout, _, _) = self
            .run_script(scripts::INVENTORY, env, Duration::from_secs(60))
            .await?;
        let mut map: BTreeMap<ConversationKey, Vec<u32>> = BTreeMap::new();
        let mut procs = Vec::new();
        for line in stdout.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            match f.as_slice() {
                ["D", name] => {
                    if let Ok(k) = ConversationKey::parse(name) {
                        map.entry(k).or_default();
                    }
                }
                ["P", pid, name] => procs.push((pid.parse::<u32>(), name.to_string())),
                _ => {}
            }
        }
        for (pid, name) in procs {
            if let (Ok(pid), Ok(k)) = (pid, ConversationKey::parse(&name))
                && let Some(v) = map.get_mut(&k)
            {
                v.push(pid);
            }
        }
        Ok(map
            .into_iter()
            .map(|(key, processes)| RuntimeConversation { key, processes })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_must_be_absolute_and_normal() {
        for bad in ["", "/", "rel", "/a/../b", "/a//b", "/a/./b"] {
            let mut c = AioConfig::new(Endpoint::new("http://127.0.0.1:1"));
            c.root = bad.into();
            assert!(AioRuntime::new(c).is_err(), "{bad:?}");
        }
    }
}
