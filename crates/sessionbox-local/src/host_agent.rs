//! The agents of `host` conversations: what relays (terminals, previews, watches) reach, since
//! a host workspace has no sandbox with an agent in it.
//!
//! On the first relay a conversation needs, the runtime starts the agent program (the
//! `sessionbox` binary's `agent` mode, given by the binary) on the workspace, listening on a
//! Unix socket in a private directory of its own (mode 0700, so only this user reaches it: no
//! token), with its working directory in the workspace. It runs as the calling user, like the
//! host runtime's commands: no boundary beyond theirs. It stops itself after
//! [`IDLE_TIMEOUT_SECS`] without a request or an attached terminal; the next relay starts it
//! again. Destroying the conversation kills it (it is a process in the workspace, and the
//! runtime also stops it by name).

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sessionbox_core::{AgentAccess, AgentEndpoint, ConversationKey, Error, Result};
use sessionbox_execd::agent_args::AgentArgs;

/// Seconds without a request or an attached terminal after which a host agent stops itself.
pub const IDLE_TIMEOUT_SECS: u64 = 60;

/// How long a started agent may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// One conversation's agent process and its socket.
#[derive(Debug)]
struct Running {
    child: Child,
    socket: PathBuf,
    /// Its private directory, removed (socket and all) when the agent is forgotten.
    dir: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A new private directory (0700) under the system's temporary directory, with a random
/// name: a Unix socket's path must stay short, and nobody else may reach it.
fn private_dir() -> std::io::Result<PathBuf> {
    use std::io::Read;
    use std::os::unix::fs::DirBuilderExt;
    let mut random = [0u8; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut random)?;
    let name: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let dir = std::env::temp_dir().join(format!("sessionbox-agent-{name}"));
    // `create` fails when anything is there already: the directory is ours alone.
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// The host runtime's agents, one per conversation that needed one.
#[derive(Debug)]
pub(crate) struct HostAgents {
    /// The program and the arguments that select its agent mode (`sessionbox agent`).
    program: Vec<OsString>,
    /// Held across a start, so that two relays of one conversation start one agent.
    running: tokio::sync::Mutex<HashMap<ConversationKey, Running>>,
}

impl HostAgents {
    pub(crate) fn new(program: Vec<OsString>) -> Self {
        HostAgents {
            program,
            running: tokio::sync::Mutex::default(),
        }
    }

    /// The agent of `key` serving `workspace`, started (and waited for) when it is not
    /// running.
    ///
    /// # Errors
    /// [`Error::Backend`] when it cannot be started or does not listen within 10 s.
    pub(crate) async fn access(
        &self,
        key: &ConversationKey,
        workspace: &Path,
    ) -> Result<AgentAccess> {
        let mut running = self.running.lock().await;
        if let Some(r) = running.get_mut(key) {
            if matches!(r.child.try_wait(), Ok(None)) {
                return Ok(access_of(&r.socket));
            }
            // It stopped (idle): reaped and forgotten with its directory, then started anew.
            running.remove(key);
        }
        let started = self.start(workspace).await?;
        let access = access_of(&started.socket);
        running.insert(key.clone(), started);
        Ok(access)
    }

    /// Stops `key`'s agent, if it runs (the conversation is destroyed).
    pub(crate) async fn stop(&self, key: &ConversationKey) {
        let gone = self.running.lock().await.remove(key);
        if let Some(mut gone) = gone {
            // Killed and reaped off the async threads.
            let _ = tokio::task::spawn_blocking(move || {
                let _ = gone.child.kill();
                let _ = gone.child.wait();
            })
            .await;
        }
    }

    async fn start(&self, workspace: &Path) -> Result<Running> {
        let backend = |what: &str, e: &dyn std::fmt::Display| {
            Error::Backend(format!(
                "cannot start the conversation's agent: {what}: {e}"
            ))
        };
        let Some((program, mode)) = self.program.split_first() else {
            return Err(Error::Backend("no agent program is configured".into()));
        };
        let dir = private_dir().map_err(|e| backend("a private directory for its socket", &e))?;
        let socket = dir.join("agent.sock");
        let args = AgentArgs {
            listen: format!("unix:{}", socket.display()),
            root: workspace.to_path_buf(),
            idle_timeout: IDLE_TIMEOUT_SECS,
            ..AgentArgs::default()
        };
        let child = Command::new(program)
            .args(mode)
            .args(args.to_argv())
            .current_dir(workspace)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .env_remove("EXECD_ACCESS_TOKEN")
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(backend("spawn", &e));
            }
        };
        let deadline = Instant::now() + START_TIMEOUT;
        let mut running = Running { child, socket, dir };
        while tokio::net::UnixStream::connect(&running.socket)
            .await
            .is_err()
        {
            if let Ok(Some(status)) = running.child.try_wait() {
                return Err(backend("it exited at once", &status));
            }
            if Instant::now() > deadline {
                return Err(backend("it did not listen", &"within 10 s"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(running)
    }
}

fn access_of(socket: &Path) -> AgentAccess {
    AgentAccess::new(AgentEndpoint::Unix(socket.to_path_buf()), None)
}
