//! The traits every isolation backend implements.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::agent::AgentAccess;
use crate::background::{BackgroundCommand, CommandOutput, OutputRequest, background_unsupported};
use crate::error::Result;
use crate::exec::{ExecRequest, ExecResult, ExecSink, OutputStream};
use crate::files::{DirEntry, EditRequest, EditResult, FileStat, GrepMatch, GrepRequest};
use crate::ids::{ConversationKey, ConversationRef, TenantId};

/// A conversation's disk usage against its quota, as the kernel counts it (the workspace's own
/// file system: see the `isolated` runtime's disk quota).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskUsage {
    /// Bytes in use (file data and the file system's blocks for directories and metadata).
    pub bytes_used: u64,
    /// Bytes the workspace may hold at most: a write past it fails with `ENOSPC`.
    pub bytes_limit: u64,
    /// Inodes in use (files, directories, links).
    pub inodes_used: u64,
    /// Inodes the workspace may hold at most.
    pub inodes_limit: u64,
}

/// A conversation's memory use now, as its runtime measures it ([`Runtime::memory_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryUsage {
    /// Bytes in use by the conversation's processes together.
    pub bytes_used: u64,
    /// The most its sandbox may hold (a process that asks for more is killed by the kernel's
    /// out-of-memory killer), `None` when no limit bounds the sandbox as a whole.
    pub bytes_limit: Option<u64>,
    /// How `bytes_used` was measured.
    pub measured: MemoryMeasure,
}

/// How a [`MemoryUsage`] was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryMeasure {
    /// The sandbox's memory cgroup: what the kernel charges it against its limit, anonymous
    /// memory and the page cache of the files it touched.
    Cgroup,
    /// The sum of its processes' resident memory (`VmRSS`): a page two of them share counts for
    /// each.
    Processes,
}

/// What a runtime says about itself, for reports and `doctor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeInfo {
    /// `host`, `isolated`, `aio` or `opensandbox`.
    pub name: String,
    /// The remote endpoint, for remote runtimes.
    pub endpoint: Option<String>,
    /// The remote server's version, where it reports one.
    pub version: Option<String>,
    /// One sentence on the security boundary it gives.
    pub boundary: String,
}

/// A conversation as a runtime sees it: its key and the processes it has running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeConversation {
    /// The conversation's key (its workspace's name).
    pub key: ConversationKey,
    /// Host process ids that belong to it now.
    pub processes: Vec<u32>,
}

/// What [`Runtime::destroy`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DestroyReport {
    /// Processes killed.
    pub processes_killed: usize,
    /// True when a workspace existed and was removed.
    pub workspace_removed: bool,
    /// True when a sandbox existed and was removed.
    pub sandbox_removed: bool,
}

/// An isolation backend: maps conversations to workspaces and sandboxes.
///
/// Implementations are cheap to share (`Arc<dyn Runtime>`) and safe to call concurrently, from
/// one process or several: two concurrent `open`s of one conversation give one workspace.
#[async_trait]
pub trait Runtime: Send + Sync {
    /// Name and boundary, for reports.
    fn info(&self) -> RuntimeInfo;

    /// The workspace root of `key` as commands and path arguments see it (`/workspace` in a
    /// sandbox, the host directory for `host`). Front ends check paths against it with
    /// [`crate::WorkspacePath::resolve`] before opening a conversation, so bad input creates
    /// nothing.
    fn presented_root(&self, key: &ConversationKey) -> String;

    /// Where this runtime presents a conversation's skills itself, read-only (`/skills` for
    /// `isolated` when skills are configured). `None`, the default, means it does not: skills
    /// are then copied into the workspace through the [`Session`] (see `sessionbox-skills`).
    fn mounted_skills(&self) -> Option<String> {
        None
    }

    /// For a runtime that mounts skills: the names of the skills mounted in the conversation's
    /// running sandbox, which keeps the skills it started with. `None`, the default, when no
    /// sandbox runs (the next start mounts the tenant's skills as they are then), when the
    /// runtime copies skills, or when it does not know. Front ends announce only these, so a
    /// skill added while a sandbox runs is not announced before it is there.
    fn present_skills(&self, key: &ConversationKey) -> Option<Vec<String>> {
        let _ = key;
        None
    }

    /// Where the workspace of `key` lives from the runtime's side (a host directory, a path in a
    /// container). Used by the isolation experiment to aim one conversation at another's files.
    fn workspace_location(&self, key: &ConversationKey) -> String;

    /// Opens a conversation, creating its workspace (and sandbox) on first use and resuming it
    /// afterwards.
    ///
    /// # Errors
    /// [`crate::Error::RuntimeUnavailable`] when the backend cannot run here;
    /// [`crate::Error::Backend`] when it fails.
    async fn open(&self, conversation: &ConversationRef) -> Result<Box<dyn Session>>;

    /// Ends a conversation: kills its processes, removes its sandbox and workspace. Destroying a
    /// conversation that does not exist succeeds and reports that nothing was removed.
    async fn destroy(&self, key: &ConversationKey) -> Result<DestroyReport>;

    /// Every conversation this runtime holds state for (its inventory).
    async fn list(&self) -> Result<Vec<RuntimeConversation>>;

    /// Stops the sandbox of `key` because the conversation has been idle past its idle
    /// timeout, keeping its workspace: the next [`Runtime::open`] starts it again with the
    /// same files. Garbage collection calls it (see `sessionbox-manager`'s `gc` module) with
    /// the conversation's operation lock held, after checking in the store that the
    /// conversation is still idle; the runtime does not judge idleness itself.
    ///
    /// Returns `true` when this call stopped a running sandbox, `false` when there was
    /// nothing to stop (no sandbox, one already stopped, or a runtime that has no sandbox to
    /// stop or stops idle sandboxes by itself).
    ///
    /// The default returns `Ok(false)` and touches nothing. Who implements what: `opensandbox`
    /// pauses the sandbox on the server (and its `open` resumes it); `isolated` keeps the
    /// default, because its agent exits by itself after the conversation's idle timeout;
    /// `host` and `aio` keep it because they have no per-conversation sandbox to stop.
    ///
    /// # Errors
    /// [`crate::Error::Busy`] when the runtime sees the conversation in use and left it
    /// running (a later collection tries again); [`crate::Error::RuntimeUnavailable`] or
    /// [`crate::Error::Backend`] when the backend could not be asked or refused.
    async fn stop_idle(&self, key: &ConversationKey) -> Result<bool> {
        let _ = key;
        Ok(false)
    }

    /// True when [`Runtime::stop_idle`] would stop something for `key` now (a running
    /// sandbox, not in use). Changes nothing: garbage collection asks it first, to report
    /// candidates in a dry run and to leave conversations with nothing to stop alone (no lock
    /// is taken for them). The default is `Ok(false)`; a runtime that overrides `stop_idle`
    /// overrides this too.
    ///
    /// # Errors
    /// As [`Runtime::stop_idle`], except [`crate::Error::Busy`].
    async fn can_stop_idle(&self, key: &ConversationKey) -> Result<bool> {
        let _ = key;
        Ok(false)
    }

    /// The conversation's disk usage against its quota, or `None` when the runtime keeps no
    /// quota for it (the default; `isolated` without root or with the quota off; a
    /// conversation whose workspace was never made). Cheap (one `statvfs`): front ends show it
    /// with the conversation.
    ///
    /// # Errors
    /// [`crate::Error::Backend`] when the backend cannot be asked.
    async fn disk_usage(&self, key: &ConversationKey) -> Result<Option<DiskUsage>> {
        let _ = key;
        Ok(None)
    }

    /// The conversation's memory use now, or `None` when it has no running sandbox to measure
    /// (stopped, paused, never started) or the runtime cannot tell one conversation's memory
    /// from another's (the default; `aio`, whose conversations share one container). Cheap (a
    /// few files of `/proc` or the cgroup file system): front ends show it with the
    /// conversation. It never starts or resumes a sandbox.
    ///
    /// # Errors
    /// [`crate::Error::Backend`] when the backend cannot be asked.
    async fn memory_usage(&self, key: &ConversationKey) -> Result<Option<MemoryUsage>> {
        let _ = key;
        Ok(None)
    }

    /// Fills `tenant`'s warm pool (sandboxes launched ahead of the conversations that will
    /// take them) up to its configured size, and keeps the pooled ones alive. Returns how many
    /// it launched. Long-lived front ends call it after an open that took a pooled sandbox and
    /// periodically. The default has no pool: `Ok(0)`.
    ///
    /// # Errors
    /// The runtime's launch errors.
    async fn refill_pool(&self, tenant: &TenantId) -> Result<usize> {
        let _ = tenant;
        Ok(0)
    }

    /// Removes what the warm pool should not hold (dead, half-made or surplus sandboxes; all
    /// of them with `drain`), leaving those being bound. Returns how many it removed. The
    /// default has no pool: `Ok(0)`.
    ///
    /// # Errors
    /// [`crate::Error::Backend`] when the backend fails.
    async fn prune_pool(&self, drain: bool) -> Result<usize> {
        let _ = drain;
        Ok(0)
    }

    /// Copy-on-write workspace clones, where this runtime makes them: forks and template
    /// starts then take them instead of streaming an archive in. The default has none
    /// (`None`): `isolated` with a disk quota does.
    fn clones(&self) -> Option<&dyn WorkspaceClones> {
        None
    }
}

/// Workspace clones: a new conversation's workspace made as a copy of another's file system
/// or of a prepared *layer* (a snapshot laid out as a file system, kept by the runtime), at
/// block level rather than file by file. The manager decides when (forks, template starts)
/// and falls back to archives whenever a call answers `None`.
///
/// Every clone is the new conversation's alone: nothing writable is shared with its origin
/// (a reflink or a copy of the origin's blocks). The new conversation (`to`) has no
/// workspace yet; the caller holds it, and opens it afterwards.
#[async_trait]
pub trait WorkspaceClones: Send + Sync {
    /// How clones are made here, for `doctor` and `bench` (e.g. "reflink" or "copy").
    fn mechanism(&self) -> String;

    /// Makes `to`'s workspace a copy of `from`'s as it is now (the caller holds `from`: its
    /// file system is frozen while its blocks are copied, so the copy is consistent).
    /// `None` when no clone can be made of it here (the caller uses an archive).
    ///
    /// # Errors
    /// [`crate::Error::Conflict`] when `to` has a workspace; [`crate::Error::Backend`] when a
    /// step fails (nothing of `to` is left).
    async fn clone_conversation(
        &self,
        from: &ConversationKey,
        to: &ConversationKey,
    ) -> Result<Option<crate::ArchiveStats>>;

    /// Makes `to`'s workspace a copy of layer `layer`; false when there is no such layer (what
    /// it holds is what the layer was made from: the caller knows it).
    ///
    /// # Errors
    /// As [`WorkspaceClones::clone_conversation`].
    async fn clone_layer(&self, layer: &str, to: &ConversationKey) -> Result<bool>;

    /// Makes layer `layer` (a name of 1 to 64 ASCII letters, digits, `-` or `_`) from the
    /// plain tar archive `tar`, checked as a restore checks it. False when no layer can be
    /// made here. The runtime keeps a bounded number of layers, removing the least recently
    /// used.
    ///
    /// # Errors
    /// [`crate::Error::InvalidRequest`] for a bad name or archive; [`crate::Error::TooLarge`]
    /// when it does not fit a workspace's disk quota.
    async fn make_layer(&self, layer: &str, tar: &std::path::Path) -> Result<bool>;

    /// The layers kept, by name.
    ///
    /// # Errors
    /// [`crate::Error::Backend`] when they cannot be listed.
    async fn layers(&self) -> Result<Vec<String>>;

    /// Removes layer `layer`; false when there was none. Clones made from it are unaffected.
    ///
    /// # Errors
    /// [`crate::Error::Backend`] when it cannot be removed.
    async fn remove_layer(&self, layer: &str) -> Result<bool>;
}

/// An open conversation. Every path argument is a workspace path (see [`crate::WorkspacePath`]):
/// relative to the workspace root, or absolute inside the root as [`Session::workspace_root`]
/// presents it.
///
/// Dropping a session is the same as [`Session::close`] without waiting.
#[async_trait]
pub trait Session: Send + Sync {
    /// The conversation's key.
    fn key(&self) -> &ConversationKey;

    /// The workspace root as commands see it (`/workspace` in a sandbox, the host directory for
    /// the `host` runtime).
    fn workspace_root(&self) -> &str;

    /// Runs `/bin/sh -c COMMAND` in the workspace. A command that fails or times out is a
    /// successful call: see [`ExecResult`].
    ///
    /// # Errors
    /// [`crate::Error::InvalidRequest`] or a path error before anything runs.
    async fn exec(&self, request: ExecRequest) -> Result<ExecResult>;

    /// Runs a command like [`Session::exec`], handing its output to `sink` while it runs.
    ///
    /// Contract: `sink` is called from this future, never concurrently, with chunks of one
    /// stream at a time, in the order the command wrote them; the chunks of a stream
    /// concatenated are exactly that stream in the returned [`ExecResult`] (at most the
    /// request's `output_limit` bytes: nothing past the limit is handed over). The result is
    /// returned once the command has ended. Dropping the future kills the command's process
    /// group, as for `exec`.
    ///
    /// The default implementation is **not streaming**: it runs [`Session::exec`] and hands
    /// each stream over in one chunk at the end. It exists so that a runtime without a way to
    /// stream still serves the API; every runtime that can stream overrides it (`host` and
    /// `isolated` do).
    ///
    /// # Errors
    /// As [`Session::exec`].
    async fn exec_stream(&self, request: ExecRequest, sink: ExecSink<'_>) -> Result<ExecResult> {
        let result = self.exec(request).await?;
        if !result.stdout.is_empty() {
            sink(OutputStream::Stdout, &result.stdout);
        }
        if !result.stderr.is_empty() {
            sink(OutputStream::Stderr, &result.stderr);
        }
        Ok(result)
    }

    /// Reads a whole regular file.
    async fn read(&self, path: &str) -> Result<Vec<u8>>;

    /// Writes a whole file atomically (temporary file, then rename), creating parent
    /// directories. Refuses links that lead out and files with more than one hard link.
    async fn write(&self, path: &str, data: &[u8]) -> Result<()>;

    /// Replaces an exact string in a file, atomically.
    ///
    /// # Errors
    /// [`crate::Error::Conflict`] saying how many times `old` occurs when that is not exactly
    /// once (without `replace_all`) or zero (with it).
    async fn edit(&self, path: &str, edit: &EditRequest) -> Result<EditResult>;

    /// Lists a directory, sorted by name.
    async fn list(&self, path: &str) -> Result<Vec<DirEntry>>;

    /// Workspace-relative paths of files matching a glob (for example `src/**/*.rs`), sorted.
    async fn glob(&self, pattern: &str) -> Result<Vec<String>>;

    /// Searches file contents.
    async fn grep(&self, request: &GrepRequest) -> Result<Vec<GrepMatch>>;

    /// Metadata of one path (links inside the workspace are followed).
    async fn stat(&self, path: &str) -> Result<FileStat>;

    /// Removes a file, a link, or a directory (`recursive` for a non-empty one).
    async fn remove(&self, path: &str, recursive: bool) -> Result<()>;

    /// Creates a directory and its parents; succeeds when it exists.
    async fn mkdir(&self, path: &str) -> Result<()>;

    /// Starts `request` in the background and returns at once with its id. The command is
    /// owned where it runs (the sandbox's agent, or a supervisor of the runtime), not by this
    /// session or this process: it outlives both, and any later session of the conversation
    /// lists, reads and kills it. Its stdout and stderr are kept apart, each up to the
    /// request's `output_limit` bytes; its `timeout` ends it as for [`Session::exec`].
    ///
    /// The default refuses: a runtime that cannot run background commands says so.
    ///
    /// # Errors
    /// [`crate::Error::InvalidRequest`] or a path error before anything runs;
    /// [`crate::Error::Busy`] when [`crate::MAX_RUNNING_COMMANDS`] commands already run in the
    /// conversation (finished ones do not count); [`crate::Error::RuntimeUnavailable`] when
    /// the runtime cannot run background commands.
    async fn spawn(&self, request: ExecRequest) -> Result<BackgroundCommand> {
        let _ = request;
        Err(background_unsupported("of this conversation"))
    }

    /// The conversation's background commands, running ones and the most recent finished ones
    /// (runtimes keep a bounded number), oldest first.
    ///
    /// # Errors
    /// As [`Session::spawn`] for a runtime without background commands;
    /// [`crate::Error::Backend`] when the runtime cannot be asked.
    async fn commands(&self) -> Result<Vec<BackgroundCommand>> {
        Err(background_unsupported("of this conversation"))
    }

    /// One background command's status.
    ///
    /// # Errors
    /// [`crate::Error::NotFound`] for an id the conversation does not have (or no longer
    /// remembers); [`crate::Error::InvalidRequest`] for a malformed id.
    async fn command(&self, id: &str) -> Result<BackgroundCommand> {
        let _ = id;
        Err(background_unsupported("of this conversation"))
    }

    /// A background command's output from two byte offsets on, each stream apart, exactly as
    /// written. When there is nothing past both offsets and the command still runs, waits up to
    /// `read.wait` for new output or for its end, whichever comes first (a long poll): a caller
    /// follows a command live by calling again from [`CommandOutput::stdout_next`] and
    /// [`CommandOutput::stderr_next`] until [`CommandOutput::complete`].
    ///
    /// # Errors
    /// As [`Session::command`]; [`crate::Error::InvalidRequest`] when `read` is out of bounds
    /// ([`OutputRequest::validate`]).
    async fn command_output(&self, id: &str, read: OutputRequest) -> Result<CommandOutput> {
        let _ = (id, read);
        Err(background_unsupported("of this conversation"))
    }

    /// Kills a running background command's process group and returns its status once it has
    /// ended; a command that has already ended is returned as it is, at once.
    ///
    /// # Errors
    /// As [`Session::command`].
    async fn kill_command(&self, id: &str) -> Result<BackgroundCommand> {
        let _ = id;
        Err(background_unsupported("of this conversation"))
    }

    /// Writes `data` to the stdin of background command `id`, started with
    /// [`ExecRequest::keep_stdin_open`]: as much as the command reads within
    /// [`crate::STDIN_WRITE_WAIT`] (the pipe holds 64 KiB), from the start of `data`, in order.
    /// One write at a time per command; a later one waits for the one before.
    ///
    /// The default refuses: a runtime that cannot keep a stdin open says so.
    ///
    /// # Errors
    /// [`crate::Error::NotFound`] for an unknown id; [`crate::Error::Conflict`] when the command
    /// was not started with its stdin open, its stdin was closed, or it has ended;
    /// [`crate::Error::TooLarge`] for more than [`crate::MAX_STDIN_BYTES`] at once;
    /// [`crate::Error::RuntimeUnavailable`] when the runtime cannot do it.
    async fn write_stdin(&self, id: &str, data: &[u8]) -> Result<crate::StdinWrite> {
        let _ = (id, data);
        Err(crate::live_stdin_unsupported("of this conversation"))
    }

    /// Closes the stdin of background command `id` (the command reads end of file). Closing a
    /// stdin that is already closed, or of a command that has ended, does nothing.
    ///
    /// # Errors
    /// As [`Session::write_stdin`], but for a closed stdin or an ended command.
    async fn close_stdin(&self, id: &str) -> Result<()> {
        let _ = id;
        Err(crate::live_stdin_unsupported("of this conversation"))
    }

    /// True when opening found the conversation's sandbox gone (expired, or deleted by
    /// someone else) and started a fresh, empty one in its place: the files from before are
    /// lost. Runtimes whose state cannot vanish always say false.
    fn state_lost(&self) -> bool {
        false
    }

    /// How to reach the agent serving this conversation, for what a front end relays to it
    /// (terminals, previews, file watching; see [`AgentAccess`]), with the agent running: one
    /// that stopped when idle is started again first. `None` (the default) for runtimes whose
    /// conversations have no agent.
    ///
    /// # Errors
    /// When the agent cannot be started again.
    async fn agent(&self) -> Result<Option<AgentAccess>> {
        Ok(None)
    }

    /// Writes an archive of the whole workspace (see the crate's snapshot rules:
    /// [`crate::ArchiveStats`]) to the local file `to`, created or truncated, on the machine
    /// this process runs on, at most `max_bytes` of it: an archive comes from inside a
    /// sandbox, and one past the limit stops with [`crate::Error::TooLarge`] (the file then
    /// holds what came before). The conversation's background commands are paused while it is
    /// taken, so none writes during it; the caller holds the conversation for the archive's
    /// length, so no other operation runs.
    ///
    /// The default refuses: a runtime that cannot archive says so.
    ///
    /// # Errors
    /// [`crate::Error::RuntimeUnavailable`] when the runtime cannot; an I/O failure writing `to`
    /// or reading the workspace.
    async fn archive_workspace(
        &self,
        to: &std::path::Path,
        max_bytes: u64,
    ) -> Result<crate::ArchiveStats> {
        let _ = (to, max_bytes);
        Err(crate::archive_unsupported("of this conversation"))
    }

    /// Replaces the workspace's whole contents with the archive in the local file `from`. The
    /// archive is checked before anything is removed (see the snapshot rules); background
    /// commands should not be running (they are not stopped).
    ///
    /// The default refuses.
    ///
    /// # Errors
    /// [`crate::Error::InvalidRequest`] for an archive that breaks a rule (nothing changed);
    /// [`crate::Error::TooLarge`] when it does not fit the conversation's disk quota;
    /// [`crate::Error::RuntimeUnavailable`] when the runtime cannot.
    async fn restore_workspace(&self, from: &std::path::Path) -> Result<crate::ArchiveStats> {
        let _ = from;
        Err(crate::archive_unsupported("of this conversation"))
    }

    /// Releases this handle. All state (files, sandbox) is kept for the next `open`.
    async fn close(self: Box<Self>) -> Result<()>;
}

/// How many warm sandboxes each tenant's pool keeps: `default` for every tenant, `tenants`
/// for those named. 0 turns a pool off. Shared by the runtimes that keep a warm pool
/// (`isolated`, `opensandbox`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSizes {
    /// The size for a tenant not named in `tenants`.
    pub default: usize,
    /// Sizes of named tenants (by tenant id).
    pub tenants: std::collections::BTreeMap<String, usize>,
}

impl PoolSizes {
    /// The most any one tenant's pool may hold: each warm sandbox holds resources (a uid and a
    /// volume for `isolated`, a container on the server for `opensandbox`) until it is used.
    pub const MAX: usize = 64;

    /// The pool size of `tenant`.
    pub fn of(&self, tenant: &str) -> usize {
        self.tenants
            .get(tenant)
            .copied()
            .unwrap_or(self.default)
            .min(Self::MAX)
    }

    /// True when no tenant has a pool.
    pub fn is_off(&self) -> bool {
        self.default == 0 && self.tenants.values().all(|&n| n == 0)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::exec::ExitStatus;

    /// A session whose `exec` returns fixed output; every other operation is refused.
    struct Fixed(ConversationKey);

    fn unused<T>() -> Result<T> {
        Err(crate::error::Error::InvalidRequest(
            "only exec is used by these tests".into(),
        ))
    }

    #[async_trait]
    impl Session for Fixed {
        fn key(&self) -> &ConversationKey {
            &self.0
        }
        fn workspace_root(&self) -> &str {
            "/w"
        }
        async fn exec(&self, _: ExecRequest) -> Result<ExecResult> {
            Ok(ExecResult {
                status: ExitStatus::Code(0),
                stdout: b"out".to_vec(),
                stderr: vec![],
                stdout_truncated: false,
                stderr_truncated: false,
                timed_out: false,
                duration: Duration::ZERO,
            })
        }
        async fn read(&self, _: &str) -> Result<Vec<u8>> {
            unused()
        }
        async fn write(&self, _: &str, _: &[u8]) -> Result<()> {
            unused()
        }
        async fn edit(&self, _: &str, _: &EditRequest) -> Result<EditResult> {
            unused()
        }
        async fn list(&self, _: &str) -> Result<Vec<DirEntry>> {
            unused()
        }
        async fn glob(&self, _: &str) -> Result<Vec<String>> {
            unused()
        }
        async fn grep(&self, _: &GrepRequest) -> Result<Vec<GrepMatch>> {
            unused()
        }
        async fn stat(&self, _: &str) -> Result<FileStat> {
            unused()
        }
        async fn remove(&self, _: &str, _: bool) -> Result<()> {
            unused()
        }
        async fn mkdir(&self, _: &str) -> Result<()> {
            unused()
        }
        async fn close(self: Box<Self>) -> Result<()> {
            Ok(())
        }
    }

    /// A runtime that overrides nothing optional.
    struct Plain;

    #[async_trait]
    impl Runtime for Plain {
        fn info(&self) -> RuntimeInfo {
            RuntimeInfo {
                name: "plain".into(),
                endpoint: None,
                version: None,
                boundary: "none".into(),
            }
        }
        fn presented_root(&self, _: &ConversationKey) -> String {
            "/w".into()
        }
        fn workspace_location(&self, _: &ConversationKey) -> String {
            "/w".into()
        }
        async fn open(&self, c: &ConversationRef) -> Result<Box<dyn Session>> {
            Ok(Box::new(Fixed(c.key.clone())))
        }
        async fn destroy(&self, _: &ConversationKey) -> Result<DestroyReport> {
            Ok(DestroyReport::default())
        }
        async fn list(&self) -> Result<Vec<RuntimeConversation>> {
            Ok(Vec::new())
        }
    }

    #[tokio::test]
    async fn by_default_a_session_refuses_background_commands_with_a_clear_error() {
        let s = Fixed(ConversationKey::parse(&"c".repeat(64)).unwrap());
        let e = s.spawn(ExecRequest::new("true")).await.unwrap_err();
        assert_eq!(e.code(), "runtime_unavailable");
        assert!(
            e.to_string().contains("cannot run background commands"),
            "{e}"
        );
        assert!(s.commands().await.is_err());
        assert!(s.kill_command("a").await.is_err());
    }

    #[tokio::test]
    async fn by_default_a_runtime_has_no_idle_sandbox_to_stop() {
        let key = ConversationKey::parse(&"b".repeat(64)).unwrap();
        assert!(!Plain.can_stop_idle(&key).await.unwrap());
        assert!(!Plain.stop_idle(&key).await.unwrap());
    }

    #[tokio::test]
    async fn the_default_exec_stream_hands_each_nonempty_stream_over_once_at_the_end() {
        let key = ConversationKey::parse(&"a".repeat(64)).unwrap();
        let mut seen = Vec::new();
        let mut sink = |s: OutputStream, b: &[u8]| seen.push((s, b.to_vec()));
        let r = Fixed(key)
            .exec_stream(ExecRequest::new("x"), &mut sink)
            .await
            .unwrap();
        assert_eq!(r.stdout, b"out");
        assert_eq!(seen, [(OutputStream::Stdout, b"out".to_vec())]);
    }
}
