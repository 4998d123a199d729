//! The `host` runtime: one plain directory per conversation, commands run as the calling user.
//!
//! Boundary: directory separation only. File operations are confined to the workspace (paths go
//! through the workspace path policy and are resolved beneath a descriptor of the workspace with
//! `openat2`), but a shell command runs as the calling OS user and can reach whatever that user
//! can. For trusted local development only.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sessionbox_core::{BackgroundCommand, CommandOutput, OutputRequest};
use sessionbox_core::{
    CappedSink, ConversationKey, ConversationRef, DestroyReport, DirEntry, EditRequest, EditResult,
    Error, ExecRequest, ExecResult, ExecSink, FileStat, GrepMatch, GrepRequest, Limits,
    MemoryMeasure, MemoryUsage, OutputStream, Result, Runtime, RuntimeConversation, RuntimeInfo,
    Session,
};
use sessionbox_fs::Workspace;

use crate::supervise::CommandDir;
use sessionbox_process as process;

/// Settings of the `host` runtime.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The data directory; workspaces live in `<data_dir>/workspaces/<conversation key>`.
    pub data_dir: PathBuf,
    /// File operation limits.
    pub limits: Limits,
    /// Time between SIGTERM and SIGKILL when a command times out.
    pub kill_grace: Duration,
    /// The binary that runs background commands: started with
    /// [`crate::supervise::SUPERVISOR_ENV`], it must call
    /// [`crate::supervise::supervisor_main`] first thing (the `sessionbox` binary does). `None`:
    /// background commands are refused with a clear error.
    pub supervisor: Option<PathBuf>,
    /// Arguments given to `supervisor` (none for the `sessionbox` binary; a test binary may
    /// need some to reach its supervisor entry).
    pub supervisor_args: Vec<String>,
    /// The program, and the arguments that select its agent mode, started on a workspace for
    /// what front ends relay (terminals, previews, watches; see [`crate::host_agent`]): the
    /// `sessionbox` binary and `agent`. `None`: a host conversation has no agent, and those
    /// relays are refused with a clear error.
    pub agent: Option<Vec<std::ffi::OsString>>,
}

impl HostConfig {
    /// Defaults for `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        HostConfig {
            data_dir: data_dir.into(),
            limits: Limits::default(),
            kill_grace: Duration::from_secs(2),
            supervisor: None,
            supervisor_args: Vec::new(),
            agent: None,
        }
    }
}

/// The `host` runtime. See the module documentation for its boundary.
#[derive(Debug, Clone)]
pub struct HostRuntime {
    workspaces: PathBuf,
    /// `<data dir>/run`: each conversation's background commands, in `<key>/commands`.
    run: PathBuf,
    limits: Limits,
    kill_grace: Duration,
    supervisor: Option<PathBuf>,
    supervisor_args: Vec<String>,
    agents: Option<Arc<crate::host_agent::HostAgents>>,
}

impl HostRuntime {
    /// The boundary this runtime gives, in one sentence.
    pub const BOUNDARY: &'static str = "directory separation only: file operations stay in the workspace, but shell commands run as the calling OS user and can reach whatever it can";

    /// Creates `<data_dir>/workspaces` (mode 0700) if needed.
    ///
    /// # Errors
    /// [`Error::Backend`] when the directory cannot be created.
    pub fn new(config: HostConfig) -> Result<Self> {
        let workspaces = Self::workspaces_dir(&config.data_dir)?;
        create_private_dir_all(&workspaces)?;
        let run = workspaces.with_file_name("run");
        Ok(HostRuntime {
            workspaces,
            run,
            limits: config.limits,
            kill_grace: config.kill_grace,
            supervisor: config.supervisor,
            supervisor_args: config.supervisor_args,
            agents: config
                .agent
                .map(|program| Arc::new(crate::host_agent::HostAgents::new(program))),
        })
    }

    /// The workspace of `key` under `data_dir` as this runtime presents it (an absolute path),
    /// computed without touching the file system, so a front end can check paths before
    /// anything is created.
    pub fn workspace_path(data_dir: &Path, key: &ConversationKey) -> PathBuf {
        Self::workspaces_dir(data_dir)
            .unwrap_or_else(|_| data_dir.join("workspaces"))
            .join(key.as_str())
    }

    fn workspaces_dir(data_dir: &Path) -> Result<PathBuf> {
        std::path::absolute(data_dir.join("workspaces"))
            .map_err(|e| Error::Backend(format!("cannot resolve {}: {e}", data_dir.display())))
    }

    fn dir_of(&self, key: &ConversationKey) -> PathBuf {
        self.workspaces.join(key.as_str())
    }

    fn commands_of(&self, key: &ConversationKey) -> PathBuf {
        self.run.join(key.as_str()).join("commands")
    }
}

/// Creates `dir` and its parents; the last component gets mode 0700.
pub(crate) fn create_private_dir_all(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| data_dir_error(&format!("cannot create {}", dir.display()), &e))
}

/// An I/O error `e` of the runtime's own files in the data directory (`what`: what could not be
/// done). A full disk there is [`Error::Unavailable`], saying so without the host path (the
/// caller may be a remote client); anything else is [`Error::Backend`] with `what`.
pub(crate) fn data_dir_error(what: &str, e: &std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(c)
            if c == rustix::io::Errno::NOSPC.raw_os_error()
                || c == rustix::io::Errno::DQUOT.raw_os_error() =>
        {
            Error::Unavailable(
                "the disk holding sessionbox's data directory is full; free space on it".into(),
            )
        }
        _ => Error::Backend(format!("{what}: {e}")),
    }
}

#[async_trait]
impl Runtime for HostRuntime {
    fn info(&self) -> RuntimeInfo {
        RuntimeInfo {
            name: "host".into(),
            endpoint: None,
            version: None,
            boundary: Self::BOUNDARY.into(),
        }
    }

    fn presented_root(&self, key: &ConversationKey) -> String {
        self.dir_of(key).to_string_lossy().into_owned()
    }

    fn workspace_location(&self, key: &ConversationKey) -> String {
        self.presented_root(key)
    }

    async fn open(&self, conversation: &ConversationRef) -> Result<Box<dyn Session>> {
        let dir = self.dir_of(&conversation.key);
        let root = dir.to_string_lossy().into_owned();
        let limits = self.limits;
        let ws = tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::DirBuilderExt;
            // Concurrent first opens race here; whoever loses sees AlreadyExists, which is fine:
            // the key names exactly one directory.
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(Error::Backend(format!("cannot create the workspace: {e}")));
                }
            }
            Workspace::open(&dir, &root, limits)
        })
        .await
        .map_err(Error::backend)??;
        Ok(Box::new(HostSession {
            agents: self.agents.clone(),
            key: conversation.key.clone(),
            workspace: Arc::new(ws),
            kill_grace: self.kill_grace,
            commands: self.supervisor.as_ref().map(|exe| CommandDir {
                dir: self.commands_of(&conversation.key),
                exe: exe.clone(),
                args: self.supervisor_args.clone(),
            }),
        }))
    }

    async fn destroy(&self, key: &ConversationKey) -> Result<DestroyReport> {
        if let Some(agents) = &self.agents {
            agents.stop(key).await;
        }
        let dir = self.dir_of(key);
        let run = self.run.join(key.as_str());
        let commands = CommandDir {
            dir: self.commands_of(key),
            exe: PathBuf::new(),
            args: Vec::new(),
        };
        let key = key.clone();
        tokio::task::spawn_blocking(move || {
            let mut report = DestroyReport::default();
            // Background commands: their supervisors first (without waiting for them to
            // record anything), then, below, every process in the workspace.
            report.processes_killed += commands.kill_all_supervisors();
            // Kill until none is left: a dying shell may have forked once more.
            for _ in 0..10 {
                let pids = process::processes_under(&dir);
                if pids.is_empty() {
                    break;
                }
                report.processes_killed += process::kill_all(&pids);
                std::thread::sleep(Duration::from_millis(20));
            }
            match std::fs::symlink_metadata(&dir) {
                Ok(_) => {
                    sessionbox_fs::remove_tree(&dir).map_err(|e| {
                        Error::Backend(format!("cannot remove the workspace of {key}: {e}"))
                    })?;
                    report.workspace_removed = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::Backend(format!("cannot inspect the workspace: {e}"))),
            }
            if run.exists() {
                sessionbox_fs::remove_tree(&run).map_err(|e| {
                    Error::Backend(format!("cannot remove the commands of {key}: {e}"))
                })?;
            }
            Ok(report)
        })
        .await
        .map_err(Error::backend)?
    }

    /// The resident memory of the processes working in the conversation's workspace (their
    /// working or root directory is in it: see [`process::processes_under`]); no limit bounds
    /// them. `None` when none runs.
    async fn memory_usage(&self, key: &ConversationKey) -> Result<Option<MemoryUsage>> {
        let dir = self.workspaces.join(key.as_str());
        tokio::task::spawn_blocking(move || {
            let pids = process::processes_under(&dir);
            (!pids.is_empty()).then(|| MemoryUsage {
                bytes_used: process::resident_bytes(&pids),
                bytes_limit: None,
                measured: MemoryMeasure::Processes,
            })
        })
        .await
        .map_err(Error::backend)
    }

    async fn list(&self) -> Result<Vec<RuntimeConversation>> {
        let dir = self.workspaces.clone();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let entries = std::fs::read_dir(&dir)
                .map_err(|e| Error::Backend(format!("cannot list {}: {e}", dir.display())))?;
            for entry in entries {
                let entry = entry.map_err(Error::backend)?;
                let Some(key) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| ConversationKey::parse(n).ok())
                else {
                    continue;
                };
                let processes = process::processes_under(&entry.path());
                out.push(RuntimeConversation { key, processes });
            }
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
        .await
        .map_err(Error::backend)?
    }
}

/// An open `host` conversation.
struct HostSession {
    /// The runtime's agents, for relays; `None` when it has none.
    agents: Option<Arc<crate::host_agent::HostAgents>>,
    key: ConversationKey,
    workspace: Arc<Workspace>,
    kill_grace: Duration,
    /// Its background commands; `None` without a supervisor binary.
    commands: Option<CommandDir>,
}

impl HostSession {
    /// Runs a command in the workspace, handing output to `on_output` as it is read.
    async fn run(
        &self,
        request: ExecRequest,
        on_output: Option<process::OnOutput<'_>>,
    ) -> Result<ExecResult> {
        request.validate()?;
        let cwd = request.cwd.clone().unwrap_or_else(|| ".".to_owned());
        let cwd_fd = self.fs(move |ws| ws.open_dir(&cwd)).await?;
        let spawn = process::Spawn {
            request: &request,
            cwd: std::os::fd::AsFd::as_fd(&cwd_fd),
            home: self.workspace.presented_root(),
            kill_grace: self.kill_grace,
            group: None,
        };
        process::run(spawn, on_output).await
    }

    fn commands(&self) -> Result<&CommandDir> {
        self.commands
            .as_ref()
            .ok_or_else(|| Error::RuntimeUnavailable {
                runtime: "host".into(),
                reason: "no supervisor binary is configured for background commands".into(),
                hint: "run the command in the foreground, or serve through the sessionbox \
                       binary, which supervises them"
                    .into(),
            })
    }

    async fn fs<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Workspace) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let ws = self.workspace.clone();
        tokio::task::spawn_blocking(move || f(&ws))
            .await
            .map_err(Error::backend)?
    }
}

#[async_trait]
impl Session for HostSession {
    async fn agent(&self) -> Result<Option<sessionbox_core::AgentAccess>> {
        match &self.agents {
            Some(agents) => agents
                .access(&self.key, Path::new(self.workspace.presented_root()))
                .await
                .map(Some),
            None => Ok(None),
        }
    }

    fn key(&self) -> &ConversationKey {
        &self.key
    }

    fn workspace_root(&self) -> &str {
        self.workspace.presented_root()
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecResult> {
        self.run(request, None).await
    }

    async fn exec_stream(&self, request: ExecRequest, sink: ExecSink<'_>) -> Result<ExecResult> {
        let limit = request.output_limit;
        let mut capped = CappedSink::new(sink, limit);
        let mut forward = |stream: process::Stream, chunk: &[u8]| {
            let stream = match stream {
                process::Stream::Stdout => OutputStream::Stdout,
                process::Stream::Stderr => OutputStream::Stderr,
            };
            capped.push(stream, chunk);
        };
        self.run(request, Some(&mut forward)).await
    }

    async fn read(&self, path: &str) -> Result<Vec<u8>> {
        let path = path.to_owned();
        self.fs(move |ws| ws.read(&path)).await
    }

    async fn write(&self, path: &str, data: &[u8]) -> Result<()> {
        let path = path.to_owned();
        let data = data.to_vec();
        self.fs(move |ws| ws.write(&path, &data)).await
    }

    async fn edit(&self, path: &str, edit: &EditRequest) -> Result<EditResult> {
        let path = path.to_owned();
        let edit = edit.clone();
        self.fs(move |ws| ws.edit(&path, &edit)).await
    }

    async fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        let path = path.to_owned();
        self.fs(move |ws| ws.list(&path)).await
    }

    async fn glob(&self, pattern: &str) -> Result<Vec<String>> {
        let pattern = pattern.to_owned();
        self.fs(move |ws| ws.glob(&pattern)).await
    }

    async fn grep(&self, request: &GrepRequest) -> Result<Vec<GrepMatch>> {
        let request = request.clone();
        self.fs(move |ws| ws.grep(&request)).await
    }

    async fn stat(&self, path: &str) -> Result<FileStat> {
        let path = path.to_owned();
        self.fs(move |ws| ws.stat(&path)).await
    }

    async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        let path = path.to_owned();
        self.fs(move |ws| ws.remove(&path, recursive)).await
    }

    async fn mkdir(&self, path: &str) -> Result<()> {
        let path = path.to_owned();
        self.fs(move |ws| ws.mkdir(&path)).await
    }

    async fn spawn(&self, request: ExecRequest) -> Result<BackgroundCommand> {
        request.validate()?;
        if request.keep_stdin_open {
            // The supervisor gives its command stdin bytes or nothing; nothing here holds a
            // pipe open between calls.
            return Err(sessionbox_core::live_stdin_unsupported("host"));
        }
        let commands = self.commands()?.clone();
        let cwd = request.cwd.clone().unwrap_or_else(|| ".".to_owned());
        let ws = self.workspace.clone();
        let grace = self.kill_grace;
        tokio::task::spawn_blocking(move || {
            let cwd_fd = ws.open_dir(&cwd)?;
            commands.spawn(&request, cwd_fd, ws.presented_root(), grace)
        })
        .await
        .map_err(Error::backend)?
    }

    async fn commands(&self) -> Result<Vec<BackgroundCommand>> {
        let commands = self.commands()?.clone();
        tokio::task::spawn_blocking(move || Ok(commands.load_all()))
            .await
            .map_err(Error::backend)?
    }

    async fn command(&self, id: &str) -> Result<BackgroundCommand> {
        let commands = self.commands()?.clone();
        let id = id.to_owned();
        tokio::task::spawn_blocking(move || commands.get(&id))
            .await
            .map_err(Error::backend)?
    }

    async fn command_output(&self, id: &str, read: OutputRequest) -> Result<CommandOutput> {
        self.commands()?.output(id, read).await
    }

    async fn kill_command(&self, id: &str) -> Result<BackgroundCommand> {
        self.commands()?.kill(id).await
    }

    async fn archive_workspace(
        &self,
        to: &Path,
        max_bytes: u64,
    ) -> Result<sessionbox_core::ArchiveStats> {
        let ws = self.workspace.clone();
        let commands = self.commands.clone();
        let to = to.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let file = std::fs::File::create(&to).map_err(|e| {
                Error::InvalidRequest(format!("cannot create {}: {e}", to.display()))
            })?;
            let _paused = commands.as_ref().map(CommandDir::pause_all);
            let over = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let capped = Capped {
                inner: file,
                left: max_bytes,
                over: over.clone(),
            };
            let r = ws.archive(std::io::BufWriter::with_capacity(256 * 1024, capped));
            if over.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(Error::TooLarge {
                    what: "the workspace archive".into(),
                    limit: max_bytes,
                });
            }
            r
        })
        .await
        .map_err(Error::backend)?
    }

    async fn restore_workspace(&self, from: &Path) -> Result<sessionbox_core::ArchiveStats> {
        let ws = self.workspace.clone();
        let from = from.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let mut file = std::fs::File::open(&from).map_err(|e| {
                Error::InvalidRequest(format!("cannot open {}: {e}", from.display()))
            })?;
            ws.restore(&mut file)
        })
        .await
        .map_err(Error::backend)?
    }

    async fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

/// A writer that takes at most `left` more bytes, then fails (setting `over`): an archive is
/// cut at its limit instead of filling the disk.
struct Capped<W> {
    inner: W,
    left: u64,
    over: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl<W: std::io::Write> std::io::Write for Capped<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.left {
            self.over.store(true, std::sync::atomic::Ordering::Relaxed);
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "the archive is past its limit",
            ));
        }
        let n = self.inner.write(buf)?;
        self.left -= n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
