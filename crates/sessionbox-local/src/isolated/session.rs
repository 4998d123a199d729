//! An open `isolated` conversation: an execd client of its agent, which launches the agent
//! again when it stopped while the session was held.

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sessionbox_core::{BackgroundCommand, CommandOutput, OutputRequest, validate_command_id};
use sessionbox_core::{
    CappedSink, ConversationKey, ConversationRef, DirEntry, EditRequest, EditResult, Error,
    ExecRequest, ExecResult, ExecSink, FileStat, GrepMatch, GrepRequest, Result, Session,
    WorkspacePath,
};
use sessionbox_execd::fs_ext::{FsRequest, FsResponse, FsSession};
use sessionbox_execd::{EventType, ExecdClient, ExecdError, RunCommandRequest};

use super::gateway::GatewaySeen;
use super::launch::{RunDir, agent_answers};
use super::{IsolatedRuntime, WORKSPACE};

/// An open `isolated` conversation: an execd client of its agent.
pub(super) struct IsolatedSession {
    /// The conversation (its key, and its tenant and id for the directory's network answer).
    pub(super) conversation: ConversationRef,
    pub(super) client: ExecdClient,
    /// Launches the agent again when it stopped (idle timeout, crash) while this session was
    /// held.
    pub(super) runtime: IsolatedRuntime,
    /// Keeps the socket's short path valid.
    pub(super) run_dir: RunDir,
    /// The conversation's egress gateway as last seen, started again before a command when it
    /// ended (see `gateway`).
    pub(super) gateway: Mutex<GatewaySeen>,
}

impl IsolatedSession {
    /// Runs a command through the agent's event stream, handing stdout and stderr events to
    /// `sink` as they arrive (capped at the request's output limit).
    async fn run(&self, request: ExecRequest, sink: Option<ExecSink<'_>>) -> Result<ExecResult> {
        request.validate()?;
        let cwd = checked(request.cwd.as_deref().unwrap_or("."))?;
        self.keep_gateway().await?;
        let run = RunCommandRequest::for_exec(&request, cwd);
        let taken = AtomicBool::new(false);
        // `relaunching` may build the call twice (the first never reached an agent, so nothing
        // was handed over): the sink is shared through a lock, uncontended.
        let sink = sink.map(|s| Mutex::new(CappedSink::new(s, request.output_limit)));
        // When this future is dropped mid-command (a caller that went away, a killed background
        // command), the agent is told to kill the command: closing the connection alone is
        // noticed only when the command next writes.
        let mut interrupt = InterruptOnDrop {
            client: self.client.clone(),
            id: Mutex::new(None),
            armed: true,
        };
        let out = self
            .relaunching(
                || {
                    self.client.run_command_with(&run, |event| {
                        taken.store(true, Ordering::SeqCst);
                        if event.kind == EventType::Init {
                            *interrupt.id.lock().unwrap_or_else(|e| e.into_inner()) =
                                event.text.clone();
                        }
                        if let (Some(sink), Some((stream, bytes))) = (&sink, event.output_stream())
                        {
                            sink.lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(stream, bytes);
                        }
                    })
                },
                || taken.load(Ordering::SeqCst),
            )
            .await;
        interrupt.armed = false;
        let out = out?;
        out.into_exec_result(request.output_limit, "")
    }

    /// Starts the conversation's egress gateway again when it ended while the sandbox runs,
    /// before a command that may need it (see `gateway`): while it runs, one `poll` of a pidfd.
    async fn keep_gateway(&self) -> Result<()> {
        if self
            .gateway
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .holds()
        {
            return Ok(());
        }
        let (runtime, key, run_dir) = (
            self.runtime.clone(),
            self.conversation.key.clone(),
            self.run_dir.clone(),
        );
        let seen = super::blocking(move || runtime.keep_gateway(&key, &run_dir)).await?;
        *self.gateway.lock().unwrap_or_else(|e| e.into_inner()) = seen;
        Ok(())
    }

    async fn send_fs(&self, request: FsRequest) -> Result<FsResponse> {
        self.relaunching(|| self.client.fs(&request), || false)
            .await
    }

    /// Runs `call`. When nothing accepts the connection, the request reached no agent (it
    /// stopped while this session was held): launch it again, unless the conversation was
    /// destroyed meanwhile, and retry once.
    ///
    /// When the connection broke under the request, the agent either failed it (it still
    /// answers: the error stands) or died (killed, crashed) and its sandbox with it. `taken`
    /// says whether the agent is known to have taken the request (a command whose first event
    /// arrived): then the command was ended with the sandbox, which is said as such, and it is
    /// not sent again. Otherwise the request is sent again to a new sandbox: whatever the dead
    /// agent had begun of it ended with it (a file write is never left half done: see
    /// `sessionbox_fs`); a background command whose start went unanswered runs again from its
    /// start.
    async fn relaunching<T, F>(&self, call: impl Fn() -> F, taken: impl Fn() -> bool) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<T, ExecdError>>,
    {
        match call().await {
            // A command's event stream cut short: the agent ended under it, or it is broken.
            Err(e @ ExecdError::Stream(_)) => Err(match agent_gone(&self.run_dir.socket()).await {
                true => ended_during_command(&self.conversation),
                false => Error::from(e),
            }),
            // Nothing accepted the connection, or a connection was closed under the request.
            Err(e @ (ExecdError::Connect { .. } | ExecdError::Transport { .. }))
                if self.runtime.workspace_dir(&self.conversation.key).is_dir() =>
            {
                if matches!(e, ExecdError::Transport { .. }) {
                    if !agent_gone(&self.run_dir.socket()).await {
                        return Err(Error::from(e));
                    }
                    if taken() {
                        return Err(ended_during_command(&self.conversation));
                    }
                }
                self.runtime
                    .ensure_agent(&self.conversation, false, true)
                    .await?;
                // A new sandbox, with a gateway of its own when it has network.
                *self.gateway.lock().unwrap_or_else(|e| e.into_inner()) = GatewaySeen::Unknown;
                call().await.map_err(Error::from)
            }
            r => r.map_err(Error::from),
        }
    }
}

/// How long an agent that broke a connection is given to be seen gone: killed, it closes its
/// connections moments before its listening socket (the kernel releases them one by one).
const GONE_WITHIN: Duration = Duration::from_millis(250);

/// True when the agent at `socket` no longer accepts connections, or stops within
/// [`GONE_WITHIN`]: it ended (an agent that answers still serves).
async fn agent_gone(socket: &Path) -> bool {
    let until = Instant::now() + GONE_WITHIN;
    loop {
        if !agent_answers(socket) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The error of a command whose agent ended while it ran.
fn ended_during_command(conversation: &ConversationRef) -> Error {
    Error::Backend(format!(
        "the sandbox agent of conversation {} ended while the command ran (it was killed or \
         crashed): the command was stopped with the sandbox, and its output past what was \
         received is lost; the workspace is kept, and the next call starts a new sandbox",
        conversation.id
    ))
}

/// Asks the agent to kill a command when dropped while armed (see `IsolatedSession::run`).
struct InterruptOnDrop {
    client: ExecdClient,
    /// The command's id, from its `init` event.
    id: Mutex<Option<String>>,
    armed: bool,
}

impl Drop for InterruptOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let id = self.id.lock().unwrap_or_else(|e| e.into_inner()).take();
        let (Some(id), Ok(rt)) = (id, tokio::runtime::Handle::try_current()) else {
            return;
        };
        let client = self.client.clone();
        rt.spawn(async move {
            if let Err(e) = client.interrupt_command(&id).await {
                tracing::debug!(error = %e, "could not interrupt an abandoned command");
            }
        });
    }
}

/// Checks a path here, before anything is sent (the agent checks it again beneath its root).
fn checked(path: &str) -> Result<String> {
    WorkspacePath::resolve(WORKSPACE, path).map(|p| p.presented(WORKSPACE))
}

#[async_trait]
impl FsSession for IsolatedSession {
    fn presented_root(&self) -> &str {
        WORKSPACE
    }

    async fn fs(&self, request: FsRequest) -> Result<FsResponse> {
        self.send_fs(request).await
    }
}

#[async_trait]
impl Session for IsolatedSession {
    async fn agent(&self) -> Result<Option<sessionbox_core::AgentAccess>> {
        // The agent stops when idle: a ping through the relaunching path starts it again
        // before its address is handed out (a terminal's shell reaches the network as
        // commands do: through the gateway).
        self.relaunching(|| self.client.ping(), || false).await?;
        self.keep_gateway().await?;
        Ok(Some(self.client.access()))
    }

    fn key(&self) -> &ConversationKey {
        &self.conversation.key
    }

    fn workspace_root(&self) -> &str {
        WORKSPACE
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecResult> {
        self.run(request, None).await
    }

    async fn exec_stream(&self, request: ExecRequest, sink: ExecSink<'_>) -> Result<ExecResult> {
        self.run(request, Some(sink)).await
    }

    async fn read(&self, path: &str) -> Result<Vec<u8>> {
        self.fs_read(path).await
    }

    async fn write(&self, path: &str, data: &[u8]) -> Result<()> {
        self.fs_write(path, data).await
    }

    async fn edit(&self, path: &str, edit: &EditRequest) -> Result<EditResult> {
        self.fs_edit(path, edit).await
    }

    async fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        self.fs_list(path).await
    }

    async fn glob(&self, pattern: &str) -> Result<Vec<String>> {
        self.fs_glob(pattern).await
    }

    async fn grep(&self, request: &GrepRequest) -> Result<Vec<GrepMatch>> {
        self.fs_grep(request).await
    }

    async fn stat(&self, path: &str) -> Result<FileStat> {
        self.fs_stat(path).await
    }

    async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        self.fs_remove(path, recursive).await
    }

    async fn mkdir(&self, path: &str) -> Result<()> {
        self.fs_mkdir(path).await
    }

    // Background commands are the agent's (see `sessionbox_execd::commands_ext`): they live
    // as long as the sandbox, whoever opened it.

    async fn spawn(&self, request: ExecRequest) -> Result<BackgroundCommand> {
        request.validate()?;
        let cwd = checked(request.cwd.as_deref().unwrap_or("."))?;
        self.keep_gateway().await?;
        let run = sessionbox_execd::commands_ext::run_request(&request, cwd);
        self.relaunching(|| self.client.spawn_background(&run), || false)
            .await
    }

    async fn commands(&self) -> Result<Vec<BackgroundCommand>> {
        self.relaunching(|| self.client.background_commands(), || false)
            .await
    }

    async fn command(&self, id: &str) -> Result<BackgroundCommand> {
        validate_command_id(id)?;
        self.relaunching(|| self.client.background_command(id), || false)
            .await
    }

    async fn command_output(&self, id: &str, read: OutputRequest) -> Result<CommandOutput> {
        validate_command_id(id)?;
        read.validate()?;
        self.relaunching(|| self.client.background_output(id, read), || false)
            .await
    }

    async fn kill_command(&self, id: &str) -> Result<BackgroundCommand> {
        validate_command_id(id)?;
        self.relaunching(|| self.client.kill_background(id), || false)
            .await
    }

    async fn write_stdin(&self, id: &str, data: &[u8]) -> Result<sessionbox_core::StdinWrite> {
        validate_command_id(id)?;
        check_stdin_write(data)?;
        self.relaunching(|| self.client.write_stdin(id, data), || false)
            .await
    }

    async fn close_stdin(&self, id: &str) -> Result<()> {
        validate_command_id(id)?;
        self.relaunching(|| self.client.close_stdin(id), || false)
            .await
    }

    async fn archive_workspace(
        &self,
        to: &std::path::Path,
        max_bytes: u64,
    ) -> Result<sessionbox_core::ArchiveStats> {
        self.relaunching(|| self.client.download_archive(to, max_bytes), || false)
            .await
    }

    async fn restore_workspace(
        &self,
        from: &std::path::Path,
    ) -> Result<sessionbox_core::ArchiveStats> {
        self.relaunching(|| self.client.upload_archive(from), || false)
            .await
    }

    async fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

/// One write to a stdin is at most [`sessionbox_core::MAX_STDIN_BYTES`].
fn check_stdin_write(data: &[u8]) -> Result<()> {
    if data.len() > sessionbox_core::MAX_STDIN_BYTES {
        return Err(sessionbox_core::Error::TooLarge {
            what: "a write to stdin".into(),
            limit: sessionbox_core::MAX_STDIN_BYTES as u64,
        });
    }
    Ok(())
}
