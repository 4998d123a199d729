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
//! Network: the container's, shared by every conversation. With an egress gateway
//! ([`AioRuntime::with_egress`]), each command of a conversation whose policy is an allowlist
//! gets the proxy variables with a token of its own (conversation, policy hash, expiry), so the
//! gateway decides and logs per conversation. That only guides programs that honour the
//! variables: nothing in a shared container stops a direct connection.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sessionbox_core::{
    BackgroundCommand, CommandOutput as BackgroundOutput, ConversationKey, ConversationRef,
    DestroyReport, DirEntry, Directory, EditRequest, EditResult, Error, ExecRequest, ExecResult,
    ExitStatus, FileKind, FileStat, GrepMatch, GrepRequest, Limits, OutputRequest, Result, Runtime,
    RuntimeConversation, RuntimeInfo, Session, WorkspacePath,
};

use crate::background::Commands;
use crate::client::{
    AioClient, AioError, BashExecRequest, BashOutputRequest, CommandStatus, Endpoint,
    FileGrepRequest,
};
use crate::scripts;

/// Default directory holding the workspaces inside the container.
pub const DEFAULT_ROOT: &str = "/home/gem/workspace/conversations";

/// Largest command text accepted (it travels in an environment variable of the wrapper).
pub const MAX_COMMAND_BYTES: usize = 100 * 1024;
/// Largest stdin accepted (base64 in an environment variable of the wrapper).
pub const MAX_STDIN_BYTES: usize = 64 * 1024;

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
}

impl AioConfig {
    /// Defaults for `endpoint`.
    pub fn new(endpoint: Endpoint) -> Self {
        AioConfig {
            endpoint,
            root: DEFAULT_ROOT.to_owned(),
            limits: Limits::default(),
        }
    }
}

/// The `aio` runtime. See the module documentation for its boundary.
#[derive(Debug, Clone)]
pub struct AioRuntime {
    client: AioClient,
    root: String,
    limits: Limits,
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

/// The end of a command run through `/v1/bash/exec` and `/v1/bash/output`.
pub(crate) struct CommandOutput {
    pub(crate) status: CommandStatus,
    exit_code: Option<i32>,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    stdout_truncated: bool,
    stderr_truncated: bool,
    client_timed_out: bool,
}

fn append_capped(buf: &mut Vec<u8>, data: &str, cap: usize, truncated: &mut bool) {
    let room = cap.saturating_sub(buf.len());
    let bytes = data.as_bytes();
    if bytes.len() > room {
        *truncated = true;
        buf.extend_from_slice(&bytes[..room]);
    } else {
        buf.extend_from_slice(bytes);
    }
}

/// Runs `command` in a fresh session named `sb-<key>-<unique>` (or `sb-x-<unique>`), polls its
/// output until it ends, and closes the session (which ends whatever it left running).
pub(crate) async fn run_command(
    client: &AioClient,
    key: Option<&ConversationKey>,
    command: &str,
    exec_dir: &str,
    env: BTreeMap<String, String>,
    timeout: Duration,
    output_limit: usize,
) -> Result<CommandOutput> {
    let session_id = format!("sb-{}-{}", key.map_or("x", |k| k.as_str()), unique());
    let secs = timeout.as_secs_f64();
    let started = Instant::now();
    // The server kills the command at `hard_timeout`; the client gives up a little later.
    let deadline = started + timeout + Duration::from_secs(10);
    let req = BashExecRequest {
        command: command.to_owned(),
        session_id: Some(session_id.clone()),
        exec_dir: Some(exec_dir.to_owned()),
        env: Some(env),
        async_mode: false,
        timeout: Some(secs.min(30.0)),
        hard_timeout: Some(secs),
        max_output_length: 0,
    };
    let result = async {
        let first = client.bash_exec(&req).await?;
        let mut out = CommandOutput {
            status: first.status,
            exit_code: first.exit_code,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            client_timed_out: false,
        };
        append_capped(
            &mut out.stdout,
            first.stdout.as_deref().unwrap_or(""),
            output_limit,
            &mut out.stdout_truncated,
        );
        append_capped(
            &mut out.stderr,
            first.stderr.as_deref().unwrap_or(""),
            output_limit,
            &mut out.stderr_truncated,
        );
        let (mut offset, mut stderr_offset) = (first.offset, first.stderr_offset);
        while matches!(out.status, CommandStatus::Running | CommandStatus::Pending) {
            let now = Instant::now();
            if now >= deadline {
                let _ = client.bash_kill(&session_id, "SIGKILL").await;
                out.client_timed_out = true;
                break;
            }
            let wait = (deadline - now).as_secs_f64().clamp(0.1, 10.0);
            let o = client
                .bash_output(&BashOutputRequest {
                    session_id: session_id.clone(),
                    command_id: Some(first.command_id.clone()),
                    offset,
                    stderr_offset,
                    wait: true,
                    wait_timeout: wait,
                })
                .await?;
            append_capped(
                &mut out.stdout,
                &o.stdout,
                output_limit,
                &mut out.stdout_truncated,
            );
            append_capped(
                &mut out.stderr,
                &o.stderr,
                output_limit,
                &mut out.stderr_truncated,
            );
            offset = o.offset.max(offset);
            stderr_offset = o.stderr_offset.max(stderr_offset);
            if let Some(c) = o.command {
                out.status = c.status;
                out.exit_code = c.exit_code;
            }
        }
        Ok::<_, AioError>(out)
    }
    .await;
    // Close the session whatever happened: it ends what the command left behind and keeps the
    // server's session table small.
    if let Err(e) = client.bash_close(&session_id).await {
        tracing::debug!(session = %session_id, error = %e, "closing an aio bash session failed");
    }
    Ok(result?)
}

/// The most wrapper output a command with this output limit can give: both streams as base64
/// (one byte past the limit each) and the marker lines.
pub(crate) fn trailer_cap(limit: usize) -> usize {
    limit
        .saturating_add(1)
        .div_ceil(3)
        .saturating_mul(8)
        .saturating_add(1024)
}

/// Keeps at most `limit` bytes; true when some were cut.
fn cut(mut data: Vec<u8>, limit: usize) -> (Vec<u8>, bool) {
    if data.len() > limit {
        data.truncate(limit);
        (data, true)
    } else {
        (data, false)
    }
}

/// A command's exact output as [`scripts::EXEC`] and [`scripts::COLLECT`] print it.
#[derive(Debug, Default, PartialEq)]
struct Trailer {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Trailer {
    /// `None` unless `text` is the whole format, end marker included.
    fn parse(text: &[u8]) -> Option<Trailer> {
        use base64::Engine as _;
        let text = std::str::from_utf8(text).ok()?;
        let mut lines = text.split('\n');
        let head = lines.next()?;
        let status = head.strip_prefix("sessionbox-aio:1 ")?;
        if status != "-" && status.parse::<i32>().is_err() {
            return None;
        }
        let b64 = base64::engine::general_purpose::STANDARD;
        let stdout = b64.decode(lines.next()?).ok()?;
        let stderr = b64.decode(lines.next()?).ok()?;
        if lines.next()? != "sessionbox-aio:end" || lines.any(|l| !l.is_empty()) {
            return None;
        }
        Some(Trailer { stdout, stderr })
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

/// An open `aio` conversation.
struct AioSession {
    runtime: AioRuntime,
    key: ConversationKey,
    conversation: ConversationRef,
    ws: String,
}

impl AioSession {
    fn resolve(&self, path: &str) -> Result<WorkspacePath> {
        WorkspacePath::resolve(&self.ws, path)
    }

    /// Checks a request and builds the wrapper's environment: the base environment, the
    /// gateway's proxy variables with a token for this command, the caller's variables, then
    /// `SB_WS`, `SB_CWD`, `SB_CMD` and `SB_STDIN` (base64) for [`scripts::EXEC`] and
    /// [`scripts::SPAWN`].
    async fn command_env(&self, request: &ExecRequest) -> Result<BTreeMap<String, String>> {
        request.validate()?;
        let cwd = match &request.cwd {
            Some(c) => self.resolve(c)?,
            None => WorkspacePath::root(),
        };
        if request.command.len() > MAX_COMMAND_BYTES {
            return Err(Error::InvalidRequest(format!(
                "the command is longer than {MAX_COMMAND_BYTES} bytes (the aio runtime's limit)"
            )));
        }
        let mut env = sessionbox_core::base_environment(&self.ws);
        if let Some(egress) = &self.runtime.egress {
            // The policy in force now; a token for this command alone.
            let network = egress.directory.network(&self.conversation).await?;
            let policy = sessionbox_egress::Policy::from_json(&network.json).map_err(|e| {
                Error::Backend(format!(
                    "the network policy of conversation {} cannot be used: {e}; set it again",
                    self.conversation.id
                ))
            })?;
            let ttl = request.timeout + TOKEN_MARGIN;
            env.extend(egress.gateway.command_env(self.key.as_str(), &policy, ttl));
        }
        // The caller's own variables come last and win (as on the other runtimes).
        env.extend(request.env.clone());
        env.insert("SB_WS".into(), self.ws.clone());
        env.insert("SB_CWD".into(), cwd.presented(&self.ws));
        env.insert("SB_CMD".into(), request.command.clone());
        if let Some(stdin) = &request.stdin {
            if stdin.len() > MAX_STDIN_BYTES {
                return Err(Error::InvalidRequest(format!(
                    "stdin is longer than {MAX_STDIN_BYTES} bytes (the aio runtime's limit)"
                )));
            }
            use base64::Engine as _;
            env.insert(
                "SB_STDIN".into(),
                base64::engine::general_purpose::STANDARD.encode(stdin),
            );
        }
        Ok(env)
    }

    fn background(&self) -> Commands<'_> {
        Commands::new(&self.runtime.client, &self.runtime.root, self.key.as_str())
    }

    /// Runs a check and returns its fields, or the refusal as an error naming `shown`.
    async fn check(
        &self,
        op: &str,
        path: &WorkspacePath,
        shown: &str,
        extra: &[(&str, &str)],
    ) -> Result<(Vec<String>, String)> {
        let (answer, rest) = self
            .runtime
            .file_op(&self.ws, op, &path.presented(&self.ws), extra)
            .await?;
        match answer {
            Answer::Ok(f) => Ok((f, rest)),
            Answer::Err { code, detail } => Err(refusal(&code, &detail, shown)),
        }
    }

    /// Writes `data` to the real path `real` in directory `dir` (from a `write` check):
    /// temporary file, then a checked rename.
    async fn write_checked(&self, path: &WorkspacePath, shown: &str, data: &[u8]) -> Result<()> {
        let (f, _) = self.check("write", path, shown, &[]).await?;
        let [real, dir] = f.as_slice() else {
            return Err(Error::Backend("the write check answered badly".into()));
        };
        let tmp = format!("{dir}/.sessionbox-tmp-{}", unique());
        self.runtime.client.write_file(&tmp, data).await?;
        let (answer, _) = self
            .runtime
            .file_op(&self.ws, "commit", real, &[("SB_TMP", &tmp)])
            .await?;
        match answer {
            Answer::Ok(_) => Ok(()),
            Answer::Err { code, detail } => Err(refusal(&code, &detail, shown)),
        }
    }

    async fn read_checked(&self, path: &WorkspacePath, shown: &str) -> Result<Vec<u8>> {
        let (f, _) = self.check("read", path, shown, &[]).await?;
        let [size, real] = f.as_slice() else {
            return Err(Error::Backend("the read check answered badly".into()));
        };
        let limit = self.runtime.limits.max_file_bytes;
        if size.parse::<u64>().unwrap_or(0) > limit {
            return Err(Error::TooLarge {
                what: format!("file {shown}"),
                limit,
            });
        }
        Ok(self.runtime.client.download(real, limit).await?)
    }

    /// Real path of a base directory (or file), the workspace's real path, and the symbolic
    /// links under it.
    async fn base(
        &self,
        path: &WorkspacePath,
        shown: &str,
    ) -> Result<(bool, String, String, HashSet<String>)> {
        let (f, rest) = self
            .check("base", path, shown, &[("SB_LINKS", "1")])
            .await?;
        let [kind, real, w] = f.as_slice() else {
            return Err(Error::Backend("the base check answered badly".into()));
        };
        let links = rest.lines().map(str::to_owned).collect();
        Ok((kind == "dir", real.clone(), w.clone(), links))
    }
}

/// True when `abs` (an absolute path under `base`) or one of its parents below `base` is in
/// `links`; `include_self` also tests `abs` itself.
fn through_link(abs: &str, base: &str, links: &HashSet<String>, include_self: bool) -> bool {
    if links.is_empty() {
        return false;
    }
    let mut cur = abs;
    if !include_self {
        match cur.rfind('/') {
            Some(i) => cur = &abs[..i],
            None => return false,
        }
    }
    while cur.len() > base.len() {
        if links.contains(cur) {
            return true;
        }
        match cur.rfind('/') {
            Some(i) => cur = &cur[..i],
            None => break,
        }
    }
    false
}

fn relative<'a>(abs: &'a str, w: &str) -> Option<&'a str> {
    abs.strip_prefix(w)?.strip_prefix('/')
}

fn compile_glob(pattern: &str) -> Result<globset::GlobMatcher> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| Error::InvalidRequest(format!("invalid glob pattern: {e}")))
}

fn parse_time(s: Option<&str>) -> i64 {
    let Some(s) = s else { return 0 };
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return t.timestamp();
    }
    chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f")
        .map(|t| t.and_utc().timestamp())
        .unwrap_or(0)
}

#[async_trait]
impl Session for AioSession {
    fn key(&self) -> &ConversationKey {
        &self.key
    }

    fn workspace_root(&self) -> &str {
        &self.ws
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecResult> {
        let mut env = self.command_env(&request).await?;
        // The command's output goes to files in a directory of its own and comes back as
        // base64 (see scripts::EXEC): AIO's JSON text cannot carry bytes that are not UTF-8.
        let out_dir = format!(
            "{}/{}/{}.{}",
            self.runtime.root,
            scripts::EXEC_OUTPUT_DIR,
            self.key.as_str(),
            unique()
        );
        let limit = request.output_limit;
        // One byte past the limit tells a stream that was cut from one that was exactly full.
        let read_limit = limit.saturating_add(1).to_string();
        env.insert("SB_OUT".into(), out_dir.clone());
        env.insert("SB_LIMIT".into(), read_limit.clone());
        let started = Instant::now();
        let out = run_command(
            &self.runtime.client,
            Some(&self.key),
            scripts::EXEC,
            &self.ws,
            env,
            request.timeout,
            trailer_cap(limit),
        )
        .await?;
        if out.exit_code == Some(scripts::EXEC_REFUSED) {
            let err = String::from_utf8_lossy(&out.stderr);
            let shown = request.cwd.as_deref().unwrap_or(".");
            match err.trim() {
                "sessionbox-aio:cwd-missing" => {
                    return Err(Error::NotFound(format!("working directory {shown}")));
                }
                "sessionbox-aio:cwd-outside" => {
                    return Err(Error::OutsideWorkspace {
                        path: shown.to_owned(),
                        reason: "a symbolic link leads out of the workspace".into(),
                    });
                }
                "sessionbox-aio:no-workspace" => {
                    return Err(Error::NotFound("the workspace no longer exists".into()));
                }
                "sessionbox-aio:no-output-dir" => {
                    return Err(Error::Backend(format!(
                        "cannot create the command's output directory {out_dir}"
                    )));
                }
                _ => {}
            }
        }
        let output = match Trailer::parse(&out.stdout) {
            Some(t) => t,
            // The wrapper was killed before it printed the output (timeout, kill): read what
            // the command left in its files.
            None => {
                let env = BTreeMap::from([
                    ("SB_OUT".to_owned(), out_dir),
                    ("SB_LIMIT".to_owned(), read_limit),
                ]);
                let c = run_command(
                    &self.runtime.client,
                    None,
                    scripts::COLLECT,
                    "/",
                    env,
                    Duration::from_secs(60),
                    trailer_cap(limit),
                )
                .await?;
                if c.stdout.starts_with(b"sessionbox-aio:gone") {
                    Trailer::default()
                } else {
                    Trailer::parse(&c.stdout).ok_or_else(|| {
                        Error::Backend(format!(
                            "the command's output could not be read back (exit {:?}): {}",
                            c.exit_code,
                            String::from_utf8_lossy(&c.stderr)
                                .trim()
                                .chars()
                                .take(300)
                                .collect::<String>()
                        ))
                    })?
                }
            }
        };
        let duration = started.elapsed();
        let timed_out = out.client_timed_out || out.status == CommandStatus::TimedOut;
        let status = match (out.status, out.exit_code) {
            _ if timed_out => ExitStatus::Signal(9),
            // The wrapper's shell reports a command killed by signal N as 128+N (it cannot tell
            // that from `exit 128+N`); the other runtimes report the signal, and so does this.
            (_, Some(c)) if (129..=192).contains(&c) => ExitStatus::Signal(c - 128),
            (_, Some(c)) => ExitStatus::Code(c),
            (_, None) => ExitStatus::Signal(9),
        };
        let (stdout, stdout_truncated) = cut(output.stdout, limit);
        let (stderr, stderr_truncated) = cut(output.stderr, limit);
        Ok(ExecResult {
            status,
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
            timed_out,
            duration,
        })
    }

    async fn read(&self, path: &str) -> Result<Vec<u8>> {
        let p = self.resolve(path)?;
        self.read_checked(&p, path).await
    }

    async fn write(&self, path: &str, data: &[u8]) -> Result<()> {
        let p = self.resolve(path)?;
        if p.is_root() {
            return Err(Error::Conflict(format!("{path}: is the workspace root")));
        }
        let limit = self.runtime.limits.max_file_bytes;
        if data.len() as u64 > limit {
            return Err(Error::TooLarge {
                what: "file data".into(),
                limit,
            });
        }
        self.write_checked(&p, path, data).await
    }

    async fn edit(&self, path: &str, edit: &EditRequest) -> Result<EditResult> {
        let p = self.resolve(path)?;
        if edit.old.is_empty() {
            return Err(Error::InvalidRequest(sessionbox_core::EDIT_EMPTY.into()));
        }
        let bytes = self.read_checked(&p, path).await?;
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::Conflict(format!("{path}: is not UTF-8 text")))?;
        let count = text.matches(&edit.old).count();
        if count == 0 {
            return Err(Error::Conflict(format!(
                "{} in {path}",
                sessionbox_core::EDIT_ABSENT
            )));
        }
        if count > 1 && !edit.replace_all {
            return Err(Error::Conflict(format!(
                "{} {count} times in {path}",
                sessionbox_core::EDIT_AMBIGUOUS
            )));
        }
        let new = if edit.replace_all {
            text.replace(&edit.old, &edit.new)
        } else {
            text.replacen(&edit.old, &edit.new, 1)
        };
        self.write_checked(&p, path, new.as_bytes()).await?;
        Ok(EditResult {
            replacements: if edit.replace_all { count } else { 1 },
        })
    }

    async fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        let p = self.resolve(path)?;
        let (is_dir, real, _, _) = self.base(&p, path).await?;
        if !is_dir {
            return Err(Error::Conflict(format!("{path}: is not a directory")));
        }
        let files = self.runtime.client.list(&real).await?;
        if files.len() > self.runtime.limits.max_entries {
            return Err(Error::TooLarge {
                what: format!("the listing of {path} (entries)"),
                limit: self.runtime.limits.max_entries as u64,
            });
        }
        let mut out: Vec<DirEntry> = files
            .into_iter()
            .map(|f| DirEntry {
                name: f.name,
                kind: if f.is_directory {
                    FileKind::Directory
                } else {
                    FileKind::File
                },
                size: f.size.unwrap_or(0),
                modified_unix: parse_time(f.modified_time.as_deref()),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn glob(&self, pattern: &str) -> Result<Vec<String>> {
        sessionbox_core::check_glob(&self.ws, pattern)?;
        let norm = WorkspacePath::resolve(&self.ws, pattern)?;
        let matcher = compile_glob(norm.as_str())?;
        let (_, real, w, links) = self.base(&WorkspacePath::root(), ".").await?;
        let max = self.runtime.limits.max_entries;
        let (files, truncated) = self
            .runtime
            .client
            .glob(&real, norm.as_str(), max as u64 + 1)
            .await?;
        let mut out: Vec<String> = files
            .iter()
            .filter(|f| !f.is_directory)
            .filter(|f| !through_link(&f.path, &w, &links, false))
            .filter_map(|f| relative(&f.path, &w))
            .filter(|rel| matcher.is_match(rel))
            .map(str::to_owned)
            .collect();
        if truncated || out.len() > max {
            return Err(Error::TooLarge {
                what: format!("the matches of {pattern:?}"),
                limit: max as u64,
            });
        }
        out.sort();
        Ok(out)
    }

    async fn grep(&self, request: &GrepRequest) -> Result<Vec<GrepMatch>> {
        sessionbox_core::check_grep(&self.ws, request)?;
        let p = match &request.path {
            Some(path) => self.resolve(path)?,
            None => WorkspacePath::root(),
        };
        let filter = match &request.glob {
            Some(g) => Some(compile_glob(WorkspacePath::resolve(&self.ws, g)?.as_str())?),
            None => None,
        };
        let shown = request.path.as_deref().unwrap_or(".");
        let (_, real, w, links) = self.base(&p, shown).await?;
        let limits = self.runtime.limits;
        let max = request
            .max_matches
            .unwrap_or(limits.max_matches)
            .min(limits.max_matches);
        let result = self
            .runtime
            .client
            .grep(&FileGrepRequest {
                path: real,
                pattern: request.pattern.clone(),
                case_insensitive: request.case_insensitive,
                max_results: (max as u64).clamp(1, 10_000),
                max_file_size: format!("{}K", limits.max_grep_file_bytes.div_ceil(1024)),
            })
            .await?;
        let mut out = Vec::new();
        for m in result.matches {
            if through_link(&m.file, &w, &links, true) {
                continue;
            }
            let Some(rel) = relative(&m.file, &w) else {
                continue;
            };
            if let Some(f) = &filter
                && !f.is_match(rel)
            {
                continue;
            }
            let mut line = m.line_content;
            if line.len() > 4096 {
                let mut cut = 4096;
                while !line.is_char_boundary(cut) {
                    cut -= 1;
                }
                line.truncate(cut);
            }
            out.push(GrepMatch {
                path: rel.to_owned(),
                line_number: m.line_number,
                line,
            });
            if out.len() >= max {
                break;
            }
        }
        Ok(out)
    }

    async fn stat(&self, path: &str) -> Result<FileStat> {
        let p = self.resolve(path)?;
        let (f, _) = self.check("stat", &p, path, &[]).await?;
        let fields: Vec<&str> = f
            .first()
            .map(|s| s.split('|').collect())
            .unwrap_or_default();
        let [kind, size, mode, mtime] = fields.as_slice() else {
            return Err(Error::Backend("the stat check answered badly".into()));
        };
        let kind = match *kind {
            "regular file" | "regular empty file" => FileKind::File,
            "directory" => FileKind::Directory,
            "symbolic link" => FileKind::Symlink,
            _ => FileKind::Other,
        };
        Ok(FileStat {
            path: p.presented(&self.ws),
            kind,
            size: size.parse().unwrap_or(0),
            mode: u32::from_str_radix(mode, 8).unwrap_or(0),
            modified_unix: mtime.parse().unwrap_or(0),
        })
    }

    async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        let p = self.resolve(path)?;
        if p.is_root() {
            return Err(Error::Conflict(
                "the workspace root cannot be removed; destroy the conversation".into(),
            ));
        }
        let r = if recursive { "1" } else { "0" };
        self.check("remove", &p, path, &[("SB_RECURSIVE", r)])
            .await
            .map(drop)
    }

    async fn mkdir(&self, path: &str) -> Result<()> {
        let p = self.resolve(path)?;
        self.check("mkdir", &p, path, &[]).await.map(drop)
    }

    async fn spawn(&self, request: ExecRequest) -> Result<BackgroundCommand> {
        let env = self.command_env(&request).await?;
        self.background().spawn(env, &request).await
    }

    async fn commands(&self) -> Result<Vec<BackgroundCommand>> {
        self.background().list().await
    }

    async fn command(&self, id: &str) -> Result<BackgroundCommand> {
        self.background().get(id).await
    }

    async fn command_output(&self, id: &str, read: OutputRequest) -> Result<BackgroundOutput> {
        self.background().output(id, read).await
    }

    async fn kill_command(&self, id: &str) -> Result<BackgroundCommand> {
        self.background().kill(id).await
    }

    async fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_through_links_are_found() {
        let links: HashSet<String> = ["/w/l".to_owned()].into();
        assert!(through_link("/w/l/secret", "/w", &links, false));
        assert!(!through_link("/w/l", "/w", &links, false));
        assert!(through_link("/w/l", "/w", &links, true));
        assert!(!through_link("/w/lx/a", "/w", &links, true));
    }

    #[test]
    fn roots_must_be_absolute_and_normal() {
        for bad in ["", "/", "rel", "/a/../b", "/a//b", "/a/./b"] {
            let mut c = AioConfig::new(Endpoint::new("http://127.0.0.1:1"));
            c.root = bad.into();
            assert!(AioRuntime::new(c).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn trailers_parse_only_when_whole() {
        let t = Trailer::parse(b"sessionbox-aio:1 3\nAP8=\n\nsessionbox-aio:end\n").unwrap();
        assert_eq!((t.stdout, t.stderr), (vec![0, 255], vec![]));
        assert!(Trailer::parse(b"sessionbox-aio:1 -\n\nZQ==\nsessionbox-aio:end\n").is_some());
        for bad in [
            &b""[..],
            b"sessionbox-aio:1 3\nAP8=\n",
            b"sessionbox-aio:1 3\nAP8=\n\n",
            b"sessionbox-aio:1 x\n\n\nsessionbox-aio:end\n",
            b"sessionbox-aio:1 0\n!!\n\nsessionbox-aio:end\n",
            b"noise\nsessionbox-aio:1 0\n\n\nsessionbox-aio:end\n",
        ] {
            assert!(Trailer::parse(bad).is_none(), "{bad:?}");
        }
        assert_eq!(cut(b"abc".to_vec(), 2), (b"ab".to_vec(), true));
        assert_eq!(cut(b"ab".to_vec(), 2), (b"ab".to_vec(), false));
        assert!(trailer_cap(1 << 20) > 2 * (((1 << 20) + 1) / 3 + 1) * 4);
    }

    #[test]
    fn iso_times_parse() {
        assert_eq!(parse_time(Some("1970-01-01T00:01:00")), 60);
        assert_eq!(parse_time(Some("1970-01-01T00:01:00.5+00:00")), 60);
        assert_eq!(parse_time(None), 0);
    }
}
