//! An open `opensandbox` conversation, and the operations in use through this process.

use super::*;

/// How many operations (commands, file operations) of each conversation are running through
/// this process's sessions right now; a conversation with any is not paused as idle.
#[derive(Debug, Clone, Default)]
pub(super) struct InUse(Arc<Mutex<HashMap<ConversationKey, usize>>>);

impl InUse {
    /// Counts one operation of `key` until the guard is dropped.
    pub(super) fn enter(&self, key: &ConversationKey) -> InUseGuard {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_insert(0) += 1;
        InUseGuard {
            map: self.clone(),
            key: key.clone(),
        }
    }

    pub(super) fn any(&self, key: &ConversationKey) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .is_some_and(|n| *n > 0)
    }
}

/// One running operation; see [`InUse::enter`].
pub(super) struct InUseGuard {
    map: InUse,
    key: ConversationKey,
}

impl Drop for InUseGuard {
    fn drop(&mut self) {
        let mut map = self.map.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// The policy in force for `conversation`, as the directory answers it (and the gateway reads
/// it): the egress crate's policy, from the canonical text the directory already decoded once.
pub(super) async fn policy_in_force(
    directory: &dyn Directory,
    conversation: &ConversationRef,
) -> Result<Policy> {
    let network = directory.network(conversation).await?;
    Policy::from_json(&network.json).map_err(|e| {
        Error::Backend(format!(
            "the network policy of conversation {} cannot be used: {e}; set it again",
            conversation.id
        ))
    })
}

/// An open `opensandbox` conversation: an execd client of its sandbox, direct or through the server
/// proxy.
pub(super) struct OpenSandboxSession {
    pub(super) key: ConversationKey,
    pub(super) conversation: ConversationRef,
    pub(super) sandbox_id: String,
    pub(super) client: ExecdClient,
    pub(super) state_lost: bool,
    pub(super) directory: Arc<dyn Directory>,
    pub(super) gateway: Option<GatewayAccess>,
    pub(super) in_use: InUse,
}

impl OpenSandboxSession {
    /// Runs a command through the agent's event stream (exact bytes), handing output to `sink`
    /// as it arrives when there is one.
    async fn run(&self, request: ExecRequest, sink: Option<ExecSink<'_>>) -> Result<ExecResult> {
        request.validate()?;
        let _in_use = self.in_use.enter(&self.key);
        let cwd = checked(request.cwd.as_deref().unwrap_or("."))?;
        // The caller's own variables win over the gateway's (as on the isolated runtime).
        let mut run = RunCommandRequest::for_exec(&request, cwd);
        if let Some(gateway) = &self.gateway {
            // The policy in force now; a fresh token for this command alone.
            let policy = policy_in_force(&*self.directory, &self.conversation).await?;
            let ttl = request.timeout + TOKEN_MARGIN;
            for (k, v) in gateway.command_env(self.key.as_str(), &policy, ttl) {
                run = run.env_default(k, v);
            }
        }
        let sink = sink.map(|s| std::sync::Mutex::new(CappedSink::new(s, request.output_limit)));
        let started = std::sync::atomic::AtomicBool::new(false);
        let out = self
            .client
            .run_command_with(&run, |event| {
                started.store(true, std::sync::atomic::Ordering::Relaxed);
                if let (Some(sink), Some((stream, bytes))) = (&sink, event.output_stream()) {
                    sink.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(stream, bytes);
                }
            })
            .await
            .map_err(|e| self.command_error(e, started.into_inner()))?;
        out.into_exec_result(
            request.output_limit,
            &format!(" in sandbox {}", self.sandbox_id),
        )
    }

    /// The error of a command whose call failed: when its connection broke (the server or a
    /// proxy between went away, or the agent's container stopped), said as such; `started`
    /// says whether the agent had sent the command's first event.
    fn command_error(&self, e: ExecdError, started: bool) -> Error {
        let broken = matches!(
            e,
            ExecdError::Transport { .. }
                | ExecdError::Stream(sessionbox_execd::StreamError::MissingTerminal { .. })
        );
        if !broken {
            return Error::from(e);
        }
        let id = &self.sandbox_id;
        Error::Backend(if started {
            format!(
                "the connection to the agent of sandbox {id} broke while the command ran ({e}): \
                 its result is lost, and the agent stops a command once its output stream is \
                 closed; the sandbox and its files are kept. Run it again, or run a long command \
                 in the background, whose output outlives a broken connection"
            )
        } else {
            format!(
                "the connection to the agent of sandbox {id} broke before the command was known \
                 to start ({e}): it may not have run, or have been stopped as its output stream \
                 closed; the sandbox and its files are kept. Run it again"
            )
        })
    }

    async fn send_fs(&self, request: FsRequest) -> Result<FsResponse> {
        let _in_use = self.in_use.enter(&self.key);
        let reads = matches!(
            request,
            FsRequest::Read { .. }
                | FsRequest::List { .. }
                | FsRequest::Glob { .. }
                | FsRequest::Grep { .. }
                | FsRequest::Stat { .. }
        );
        if reads {
            return again_if_cut(|| self.client.fs(&request)).await;
        }
        self.client.fs(&request).await.map_err(Error::from)
    }

    /// Starts a background command on the agent (see `sessionbox_execd::commands_ext`), with
    /// the same environment as a foreground one: the gateway's proxy with a token for this
    /// command, then the caller's variables.
    async fn spawn_background(
        &self,
        request: ExecRequest,
    ) -> Result<sessionbox_core::BackgroundCommand> {
        request.validate()?;
        let _in_use = self.in_use.enter(&self.key);
        let cwd = checked(request.cwd.as_deref().unwrap_or("."))?;
        let mut run = sessionbox_execd::commands_ext::run_request(&request, cwd);
        if let Some(gateway) = &self.gateway {
            let policy = policy_in_force(&*self.directory, &self.conversation).await?;
            let ttl = request.timeout + TOKEN_MARGIN;
            let mut env: BTreeMap<String, String> = gateway
                .command_env(self.key.as_str(), &policy, ttl)
                .into_iter()
                .collect();
            env.extend(request.env.clone());
            run.envs = Some(env);
        }
        self.client
            .spawn_background(&run)
            .await
            .map_err(Error::from)
    }
}

/// How many times a request that changes nothing is sent when connections keep breaking under
/// it (see [`again_if_cut`]).
const ATTEMPTS_WHEN_CUT: usize = 3;

/// Runs `call`, a request that changes nothing, and sends it again (up to
/// [`ATTEMPTS_WHEN_CUT`] times in all) when the connection broke under it: after the server
/// restarted, or a proxy between let go of its connections, the pool's idle connections are
/// dead, and one taken just as it closed fails the request that used it.
async fn again_if_cut<T, F>(call: impl Fn() -> F) -> Result<T>
where
    F: std::future::Future<Output = std::result::Result<T, ExecdError>>,
{
    let mut attempt = 1;
    loop {
        match call().await {
            Err(ExecdError::Transport { .. }) if attempt < ATTEMPTS_WHEN_CUT => attempt += 1,
            r => return r.map_err(Error::from),
        }
    }
}

/// Checks a path here, before anything is sent (the agent checks it again beneath its root).
fn checked(path: &str) -> Result<String> {
    WorkspacePath::resolve(WORKSPACE, path).map(|p| p.presented(WORKSPACE))
}

#[async_trait]
impl FsSession for OpenSandboxSession {
    fn presented_root(&self) -> &str {
        WORKSPACE
    }

    async fn fs(&self, request: FsRequest) -> Result<FsResponse> {
        self.send_fs(request).await
    }
}

#[async_trait]
impl Session for OpenSandboxSession {
    fn key(&self) -> &ConversationKey {
        &self.key
    }

    fn workspace_root(&self) -> &str {
        WORKSPACE
    }

    fn state_lost(&self) -> bool {
        self.state_lost
    }

    async fn agent(&self) -> Result<Option<sessionbox_core::AgentAccess>> {
        Ok(Some(self.client.access()))
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

    async fn spawn(&self, request: ExecRequest) -> Result<sessionbox_core::BackgroundCommand> {
        self.spawn_background(request).await
    }

    async fn commands(&self) -> Result<Vec<sessionbox_core::BackgroundCommand>> {
        let _in_use = self.in_use.enter(&self.key);
        again_if_cut(|| self.client.background_commands()).await
    }

    async fn command(&self, id: &str) -> Result<sessionbox_core::BackgroundCommand> {
        sessionbox_core::validate_command_id(id)?;
        let _in_use = self.in_use.enter(&self.key);
        again_if_cut(|| self.client.background_command(id)).await
    }

    async fn command_output(
        &self,
        id: &str,
        read: sessionbox_core::OutputRequest,
    ) -> Result<sessionbox_core::CommandOutput> {
        sessionbox_core::validate_command_id(id)?;
        read.validate()?;
        let _in_use = self.in_use.enter(&self.key);
        again_if_cut(|| self.client.background_output(id, read)).await
    }

    async fn kill_command(&self, id: &str) -> Result<sessionbox_core::BackgroundCommand> {
        sessionbox_core::validate_command_id(id)?;
        let _in_use = self.in_use.enter(&self.key);
        self.client.kill_background(id).await.map_err(Error::from)
    }

    async fn write_stdin(&self, id: &str, data: &[u8]) -> Result<sessionbox_core::StdinWrite> {
        sessionbox_core::validate_command_id(id)?;
        if data.len() > sessionbox_core::MAX_STDIN_BYTES {
            return Err(Error::TooLarge {
                what: "a write to stdin".into(),
                limit: sessionbox_core::MAX_STDIN_BYTES as u64,
            });
        }
        let _in_use = self.in_use.enter(&self.key);
        self.client.write_stdin(id, data).await.map_err(Error::from)
    }

    async fn close_stdin(&self, id: &str) -> Result<()> {
        sessionbox_core::validate_command_id(id)?;
        let _in_use = self.in_use.enter(&self.key);
        self.client.close_stdin(id).await.map_err(Error::from)
    }

    async fn archive_workspace(
        &self,
        to: &std::path::Path,
        max_bytes: u64,
    ) -> Result<sessionbox_core::ArchiveStats> {
        self.client
            .download_archive(to, max_bytes)
            .await
            .map_err(Error::from)
    }

    async fn restore_workspace(
        &self,
        from: &std::path::Path,
    ) -> Result<sessionbox_core::ArchiveStats> {
        self.client.upload_archive(from).await.map_err(Error::from)
    }

    async fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
