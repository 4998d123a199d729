//! The conversation's egress gateway, beside its sandbox: the socket it listens on, its start
//! in the sandbox's cgroups, its end, and its start again when it ended on its own while the
//! sandbox runs (killed, crashed, out of memory in the sandbox's cgroup).
//!
//! Without its gateway a sandbox has no way out at all, by construction: its network namespace
//! has only loopback, and the agent's relay has nothing to relay to (it answers `502`). So a
//! dead gateway fails closed; what the runtime owes is to start it again. Whoever next uses the
//! sandbox does: an open that finds the sandbox running ([`IsolatedRuntime::ensure_agent`]),
//! and a held session before each command ([`GatewaySeen`], one `poll` of a pidfd while the
//! gateway runs). A restart happens under the conversation's lock, so two processes never
//! start two gateways, and it is recorded in `sandbox.json`.

use std::ffi::OsString;
use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use sessionbox_core::{ConversationKey, Error, Result};
use sessionbox_egress::GatewayArgs;

use super::launch::{RunDir, lock_file, read_record, write_atomic};
use super::{IsolatedRuntime, SandboxInfo};
use crate::host::create_private_dir_all;
use crate::log_relay;

/// What a session last saw of its conversation's gateway.
#[derive(Debug, Default)]
pub(super) enum GatewaySeen {
    /// Not looked at yet, or the sandbox was launched again since.
    #[default]
    Unknown,
    /// The sandbox has no gateway: it was launched without network.
    None,
    /// Running: a pidfd of it, readable once it exits.
    Running(OwnedFd),
}

impl GatewaySeen {
    /// True when nothing is to be done: no gateway, or one that still runs.
    pub(super) fn holds(&self) -> bool {
        match self {
            GatewaySeen::Unknown => false,
            GatewaySeen::None => true,
            GatewaySeen::Running(pidfd) => !exited(pidfd),
        }
    }
}

/// True once the process of `pidfd` has exited (its pidfd is readable then).
fn exited(pidfd: &OwnedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        pidfd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
}

/// A pidfd of the recorded gateway, when it runs and is still the process recorded.
fn running_gateway(record: &SandboxInfo, run: &Path) -> Option<OwnedFd> {
    let pid = record.gateway_pid?;
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(pid as i32)?,
        rustix::process::PidfdFlags::empty(),
    )
    .ok()?;
    // Checked after the pidfd is open: the pidfd names the process that was checked.
    (is_gateway(pid, run) && !exited(&pidfd)).then_some(pidfd)
}

impl IsolatedRuntime {
    /// What a session should see of the gateway of `key`'s sandbox (in `run_dir`), starting it
    /// again first when it ended while the sandbox runs. [`GatewaySeen::Unknown`] when there is
    /// no sandbox to look at (the session's next call launches one). Blocks.
    ///
    /// # Errors
    /// When a gateway that ended cannot be started again (as when a launch cannot start it).
    pub(super) fn keep_gateway(
        &self,
        key: &ConversationKey,
        run_dir: &RunDir,
    ) -> Result<GatewaySeen> {
        let run = self.run_dir(key);
        let Some(record) = read_record(&run) else {
            return Ok(GatewaySeen::Unknown);
        };
        if self.egress.is_none() || !record.network {
            return Ok(GatewaySeen::None);
        }
        if let Some(pidfd) = running_gateway(&record, &run) {
            return Ok(GatewaySeen::Running(pidfd));
        }
        // Gone meanwhile (destroyed): nothing to keep; the session's call finds out.
        let Ok(_lock) = lock_file(&run.join("lock")) else {
            return Ok(GatewaySeen::Unknown);
        };
        match read_record(&run) {
            Some(mut record) if run_dir.is(&run) => {
                self.restart_gateway(key, &run, run_dir, &mut record)
            }
            _ => Ok(GatewaySeen::Unknown),
        }
    }

    /// Starts the gateway of the sandbox recorded in `record` again when it ended; call it with
    /// the conversation's lock held. Nothing is started for a sandbox without network or one
    /// that ended itself (its monitor is gone: its next use launches it again).
    pub(super) fn restart_gateway(
        &self,
        key: &ConversationKey,
        run: &Path,
        run_dir: &RunDir,
        record: &mut SandboxInfo,
    ) -> Result<GatewaySeen> {
        let Some(wiring) = self.egress.as_ref().filter(|_| record.network) else {
            return Ok(GatewaySeen::None);
        };
        if let Some(pidfd) = running_gateway(record, run) {
            return Ok(GatewaySeen::Running(pidfd));
        }
        let monitor = rustix::process::Pid::from_raw(record.monitor_pid as i32).and_then(|p| {
            rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()
        });
        if monitor.is_none_or(|m| exited(&m)) {
            return Ok(GatewaySeen::Unknown);
        }
        // The socket is the conversation's uid's, as its workspace is.
        let uid = {
            use std::os::unix::fs::MetadataExt;
            fs::metadata(self.workspace_dir(key))
                .map_err(|e| Error::Backend(format!("cannot inspect the workspace: {e}")))?
                .uid()
        };
        let listener = bind_gateway_socket(&run.join("egress"), run_dir, uid)?;
        let log = log_relay::spawn(
            &self.config.exe,
            &run.join("egress.log"),
            self.config.log_max_bytes,
        )?;
        let pid = spawn_gateway(
            &self.config.exe,
            &wiring.gateway_args,
            &wiring.gateway_env,
            listener,
            key,
            record.monitor_pid,
            log,
            &record.cgroups,
        )?;
        tracing::warn!(
            "the egress gateway of conversation {} had ended while its sandbox ran: started it again",
            key.short()
        );
        record.gateway_pid = Some(pid);
        write_atomic(
            &run.join("sandbox.json"),
            &serde_json::to_vec(&*record).map_err(Error::backend)?,
        )?;
        Ok(running_gateway(record, run).map_or(GatewaySeen::Unknown, GatewaySeen::Running))
    }
}

/// Binds the conversation's gateway socket: `dir` (root's, 0711, bound read-only into the
/// sandbox) holds `gateway.sock`, owned by the sandbox's uid with mode 0600, so only that uid
/// (and root) can connect. The host never connects to anything in it.
pub(super) fn bind_gateway_socket(dir: &Path, run_dir: &RunDir, uid: u32) -> Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    create_private_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o711))
        .map_err(|e| Error::Backend(format!("cannot set up the egress directory: {e}")))?;
    let path = run_dir
        .socket()
        .with_file_name("egress")
        .join("gateway.sock");
    let _ = fs::remove_file(&path);
    let listener = UnixListener::bind(&path)
        .map_err(|e| Error::Backend(format!("cannot bind the egress gateway socket: {e}")))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::Backend(format!("cannot set up the egress gateway socket: {e}")))?;
    if rustix::process::geteuid().is_root() {
        let id = rustix::process::Uid::from_raw(uid);
        let gid = rustix::process::Gid::from_raw(uid);
        rustix::fs::chown(&path, Some(id), Some(gid)).map_err(|e| {
            Error::Backend(format!("cannot give the egress socket to uid {uid}: {e}"))
        })?;
    }
    Ok(listener)
}

/// The file that moves the writing process into the cgroup `dir` when `0` is written to it:
/// `tasks` in cgroup v1 (the process is single-threaded then, as the monitor is when it joins),
/// `cgroup.procs` in v2 (which has no `tasks`).
fn cgroup_join_file(dir: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    let tasks = dir.join("tasks");
    let file = if tasks.exists() {
        tasks
    } else {
        dir.join("cgroup.procs")
    };
    // A path from the kernel's cgroup mounts and our cgroup name: no NUL byte.
    std::ffi::CString::new(file.as_os_str().as_bytes()).unwrap_or_default()
}

/// Starts the conversation's gateway outside the sandbox's namespaces, in a session of its
/// own, with the listening socket as descriptor 3; it exits when the sandbox's monitor does.
/// Its stderr goes to `log`: the [`log_relay`] of `run/<key>/egress.log`, which rotates it at
/// its cap.
///
/// It runs in the sandbox's own `cgroups` (joined before it executes, so everything it ever
/// allocates is charged there): its memory counts against the sandbox's `memory_bytes`, its
/// threads against `pids`, its CPU against the sandbox's quota, and it ends with the sandbox's
/// cgroups (destroy kills every process in them). With rlimit-only limits there are no cgroups
/// and its own connection cap and descriptor limit are what bound it.
#[allow(clippy::too_many_arguments)]
pub(super) fn spawn_gateway(
    exe: &Path,
    args: &[String],
    env: &[(OsString, OsString)],
    listener: UnixListener,
    key: &ConversationKey,
    monitor_pid: u32,
    log: Stdio,
    cgroups: &[PathBuf],
) -> Result<u32> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let join: Vec<std::ffi::CString> = cgroups.iter().map(|d| cgroup_join_file(d)).collect();
    if join.iter().any(|f| f.as_bytes().is_empty()) {
        return Err(Error::Backend(format!(
            "cannot place the egress gateway in the sandbox cgroups {cgroups:?}"
        )));
    }
    // Above 3, so that the dup2 below never replaces its own source.
    let fd = rustix::io::fcntl_dupfd_cloexec(&listener, 10)
        .map_err(|e| Error::Backend(format!("cannot pass the egress socket: {e}")))?;
    let raw = fd.as_raw_fd();
    let gateway = GatewayArgs::conversation(3, key.as_str(), i32::try_from(monitor_pid).ok());
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args)
        .args(gateway.to_argv())
        .env_clear()
        .env(
            "SESSIONBOX_LOG",
            std::env::var("SESSIONBOX_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    // SAFETY: runs in the forked child before exec: only async-signal-safe calls (setsid,
    // dup2, open, write, close) on integers and on C strings built before the fork, read
    // through a reference and never freed in the child; `fd` stays open in the parent until
    // spawn returns. dup2 clears close-on-exec on descriptor 3. Writing `0` to a cgroup's
    // `tasks` or `cgroup.procs` moves the writer (this child, single-threaded) into it.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if libc::dup2(raw, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            for file in &join {
                let f = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if f < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let n = libc::write(f, b"0".as_ptr().cast(), 1);
                let e = std::io::Error::last_os_error();
                libc::close(f);
                if n != 1 {
                    return Err(e);
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| {
        Error::Backend(format!(
            "cannot start the egress gateway in the sandbox's cgroups: {e}"
        ))
    })?;
    drop(fd);
    drop(listener);
    let pid = child.id();
    // Collect it when it exits, so that a long-lived manager keeps no zombie.
    let _ = std::thread::Builder::new()
        .name("gateway-reaper".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut child = child;
            let _ = child.wait();
        });
    Ok(pid)
}

/// True when process `pid` runs with the conversation's key (the last component of `run`) on
/// its command line: it is the recorded gateway, not a process that took its pid since. A
/// gateway that exited (a zombie's command line is empty) is not.
fn is_gateway(pid: u32, run: &Path) -> bool {
    let Some(key) = run.file_name().and_then(|k| k.to_str()) else {
        return false;
    };
    fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == key.as_bytes()))
}

/// Kills the recorded gateway, if it is still the process recorded (its command line names
/// the conversation's key: a recycled pid is left alone).
pub(super) fn kill_gateway(record: &SandboxInfo, run: &Path) {
    let Some(pid) = record.gateway_pid else {
        return;
    };
    if is_gateway(pid, run)
        && let Some(p) = rustix::process::Pid::from_raw(pid as i32)
    {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
}
