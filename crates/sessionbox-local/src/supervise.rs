//! Background commands of the `host` runtime: each runs under a small detached *supervisor*, a
//! re-execution of a binary that calls [`supervisor_main`] first thing in `main` when
//! [`is_supervisor_invocation`] says so (the `sessionbox` binary does).
//!
//! The supervisor is started in a session of its own, so it outlives the process that started
//! it (a killed `serve`, a CLI call). It runs the command through [`sessionbox_process::run`] (a new
//! process group, the base environment, output capped while it streams, the timeout), keeps
//! everything in the command's directory, `<data dir>/run/<key>/commands/<id>/` (0700):
//!
//! - `spec.json`: what to run (written before the supervisor starts);
//! - `supervisor.json`: the supervisor's pid and start time (written by the launcher, so a
//!   recycled pid is never taken for it);
//! - `stdout`, `stderr`: each stream's first `output_limit` bytes, appended as read;
//! - `end.json`: how it ended, written once, atomically (temporary file, then rename).
//!
//! A command is running while `end.json` is absent and its supervisor lives; one whose
//! supervisor died without writing `end.json` (killed with `SIGKILL`) is reported ended, with an
//! error saying so. `SIGTERM` to the supervisor kills the command's process group and records
//! it as killed. The working directory reaches the supervisor as descriptor 3, opened beneath
//! the workspace by the runtime: the confinement of `cwd` is the runtime's, not re-done here.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sessionbox_core::{
    BackgroundCommand, CommandOutput, Error, ExecRequest, ExitStatus, MAX_RUNNING_COMMANDS,
    OutputRequest, Result, validate_command_id,
};

/// The variable that makes a process the supervisor of the command directory it names.
pub const SUPERVISOR_ENV: &str = "SESSIONBOX_COMMAND_SUPERVISOR";

/// The descriptor the working directory arrives on.
const CWD_FD: i32 = 3;

/// Most finished commands kept per conversation (oldest removed first when one starts).
pub const MAX_FINISHED_COMMANDS: usize = 64;

/// Most bytes of output the finished commands of one conversation keep together (256 MiB).
pub const MAX_FINISHED_BYTES: u64 = 256 * 1024 * 1024;

/// How often a waiting read looks for new output.
const POLL: Duration = Duration::from_millis(25);

/// How long a kill waits for the supervisor to record the end.
const KILL_WAIT: Duration = Duration::from_secs(15);

/// True when this process was started as a supervisor: call [`supervisor_main`] then.
pub fn is_supervisor_invocation() -> bool {
    std::env::var_os(SUPERVISOR_ENV).is_some()
}

/// What the supervisor runs (`spec.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Spec {
    id: String,
    request: ExecRequest,
    /// `HOME` of the command: the workspace as it is presented.
    home: String,
    kill_grace_ms: u64,
    started_at_ms: u64,
}

/// How it ended (`end.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct End {
    status: Option<ExitStatus>,
    timed_out: bool,
    killed: bool,
    finished_at_ms: u64,
    stdout_truncated: bool,
    stderr_truncated: bool,
    error: Option<String>,
}

/// The supervisor's identity (`supervisor.json`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Supervisor {
    pid: u32,
    /// Field 22 of `/proc/PID/stat`: tells a recycled pid apart.
    start_ticks: u64,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn backend(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Backend(format!("{what}: {e}"))
}

/// Writes `value` as JSON to `path` atomically. Errors name the record's file, not its host
/// path; a full disk is [`Error::Unavailable`].
fn write_atomic<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let data = serde_json::to_vec(value).map_err(|e| backend("cannot encode a record", e))?;
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let failed = |e: std::io::Error| {
        let _ = std::fs::remove_file(&tmp);
        crate::host::data_dir_error(&format!("cannot write the command's {name}"), &e)
    };
    let mut f = std::fs::File::create(&tmp).map_err(failed)?;
    f.write_all(&data)
        .and_then(|()| f.sync_data())
        .map_err(failed)?;
    std::fs::rename(&tmp, path).map_err(failed)
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Start time of `pid` (field 22 of its stat line), `None` when it is gone or a zombie.
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state).
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Runs the supervisor of the command directory in [`SUPERVISOR_ENV`] and exits. Call it
/// first thing in `main` (before any thread), when [`is_supervisor_invocation`] says so.
pub fn supervisor_main() -> ! {
    let code = match supervise() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sessionbox command supervisor: {e}");
            1
        }
    };
    std::process::exit(code)
}

fn supervise() -> Result<()> {
    let dir = PathBuf::from(std::env::var_os(SUPERVISOR_ENV).unwrap_or_default());
    let spec: Spec = read_json(&dir.join("spec.json"))
        .ok_or_else(|| Error::Backend(format!("no readable spec in {}", dir.display())))?;
    // SAFETY: the launcher passes the working directory as descriptor 3 and nothing else in
    // this fresh process uses it.
    let cwd = unsafe { OwnedFd::from_raw_fd(CWD_FD) };
    rustix::io::fcntl_setfd(&cwd, rustix::io::FdFlags::CLOEXEC).map_err(|e| backend("fd 3", e))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| backend("cannot start the supervisor's runtime", e))?;
    let end = rt.block_on(run(&dir, &spec, cwd));
    write_atomic(&dir.join("end.json"), &end)
}

async fn run(dir: &Path, spec: &Spec, cwd: OwnedFd) -> End {
    use tokio::signal::unix::{SignalKind, signal};
    let open = |name: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(name))
    };
    let (mut out, mut err) = match (open("stdout"), open("stderr")) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => {
            return End {
                status: None,
                timed_out: false,
                killed: false,
                finished_at_ms: now_ms(),
                stdout_truncated: false,
                stderr_truncated: false,
                error: Some(format!("cannot open the output files: {e}")),
            };
        }
    };
    let limit = spec.request.output_limit;
    let mut kept = [0usize; 2];
    let mut cut = [false; 2];
    let mut write_error: Option<String> = None;
    let mut term = signal(SignalKind::terminate()).ok();
    let outcome = {
        let mut on_output = |s: sessionbox_process::Stream, data: &[u8]| {
            let i = s as usize;
            let room = limit - kept[i];
            if data.len() > room {
                cut[i] = true;
            }
            let data = &data[..data.len().min(room)];
            if data.is_empty() {
                return;
            }
            kept[i] += data.len();
            let f = if i == 0 { &mut out } else { &mut err };
            if let Err(e) = f.write_all(data) {
                write_error.get_or_insert_with(|| format!("cannot keep the output: {e}"));
            }
        };
        let spawn = sessionbox_process::Spawn {
            request: &spec.request,
            cwd: std::os::fd::AsFd::as_fd(&cwd),
            home: &spec.home,
            kill_grace: Duration::from_millis(spec.kill_grace_ms),
            group: None,
        };
        let run = sessionbox_process::run(spawn, Some(&mut on_output));
        tokio::select! {
            r = run => Some(r),
            // Dropping `run` kills the command's process group.
            Some(()) = async { match term.as_mut() { Some(t) => t.recv().await, None => std::future::pending().await } } => None,
        }
    };
    let mut end = End {
        status: None,
        timed_out: false,
        killed: false,
        finished_at_ms: now_ms(),
        stdout_truncated: cut[0],
        stderr_truncated: cut[1],
        error: write_error,
    };
    match outcome {
        None => {
            end.killed = true;
            end.status = Some(ExitStatus::Signal(9));
        }
        Some(Ok(r)) => {
            end.status = Some(r.status);
            end.timed_out = r.timed_out;
            end.stdout_truncated |= r.stdout_truncated;
            end.stderr_truncated |= r.stderr_truncated;
        }
        Some(Err(e)) => end.error = Some(format!("the command could not start: {e}")),
    }
    end
}

/// The background commands of one conversation of the `host` runtime: its directory of command
/// directories, and how to start a supervisor.
#[derive(Debug, Clone)]
pub(crate) struct CommandDir {
    /// `<data dir>/run/<key>/commands`.
    pub dir: PathBuf,
    /// The binary that becomes a supervisor with [`SUPERVISOR_ENV`].
    pub exe: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

/// A fresh, unguessable command id (128 random bits, hex).
fn new_id() -> Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| backend("cannot make a command id", e))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl CommandDir {
    fn of(&self, id: &str) -> Result<PathBuf> {
        validate_command_id(id)?;
        Ok(self.dir.join(id))
    }

    /// Starts `request` (working directory `cwd`, already opened beneath the workspace).
    pub(crate) fn spawn(
        &self,
        request: &ExecRequest,
        cwd: OwnedFd,
        home: &str,
        kill_grace: Duration,
    ) -> Result<BackgroundCommand> {
        crate::host::create_private_dir_all(&self.dir)?;
        let _lock = lock(&self.dir.join("lock"))?;
        let all = self.load_all();
        let running = all.iter().filter(|c| c.running).count();
        if running >= MAX_RUNNING_COMMANDS {
            return Err(Error::Busy(format!(
                "{MAX_RUNNING_COMMANDS} background commands already run in this conversation; \
                 wait for one to end or kill one (finished commands do not count)"
            )));
        }
        self.prune(&all);
        let id = new_id()?;
        let dir = self.dir.join(&id);
        crate::host::create_private_dir_all(&dir)?;
        // A command that could not be started leaves nothing: not listed, not counted.
        self.start(request, cwd, home, kill_grace, id, &dir)
            .inspect_err(|_| {
                let _ = std::fs::remove_dir_all(&dir);
            })
    }

    fn start(
        &self,
        request: &ExecRequest,
        cwd: OwnedFd,
        home: &str,
        kill_grace: Duration,
        id: String,
        dir: &Path,
    ) -> Result<BackgroundCommand> {
        let spec = Spec {
            id: id.clone(),
            request: request.clone(),
            home: home.to_owned(),
            kill_grace_ms: u64::try_from(kill_grace.as_millis()).unwrap_or(u64::MAX),
            started_at_ms: now_ms(),
        };
        write_atomic(&dir.join("spec.json"), &spec)?;
        let pid = self.launch(dir, &cwd)?;
        let ticks = start_ticks(pid).unwrap_or(0);
        let recorded = write_atomic(
            &dir.join("supervisor.json"),
            &Supervisor {
                pid,
                start_ticks: ticks,
            },
        );
        if let Err(e) = recorded {
            // Running but unrecorded: stopped (on SIGTERM the supervisor kills the command's
            // process group), since nothing could follow or kill it later.
            if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
            }
            return Err(e);
        }
        Ok(BackgroundCommand::started(
            id,
            request.command.clone(),
            spec.started_at_ms,
        ))
    }

    fn launch(&self, dir: &Path, cwd: &OwnedFd) -> Result<u32> {
        use std::os::unix::process::CommandExt;
        let log = std::fs::File::create(dir.join("supervisor.log"))
            .map_err(|e| crate::host::data_dir_error("cannot create the supervisor's log", &e))?;
        // Above 3, so that the dup2 below never replaces its own source.
        let fd = rustix::io::fcntl_dupfd_cloexec(cwd, 10)
            .map_err(|e| backend("cannot pass the working directory", e))?;
        let raw = fd.as_raw_fd();
        let mut cmd = std::process::Command::new(&self.exe);
        cmd.args(&self.args)
            .env_clear()
            .env(SUPERVISOR_ENV, dir)
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::from(log));
        // SAFETY: runs in the forked child before exec: only async-signal-safe calls (setsid,
        // dup2) on integers captured by value; `fd` stays open in the parent until spawn
        // returns. dup2 clears close-on-exec on descriptor 3.
        unsafe {
            cmd.pre_exec(move || {
                libc::setsid();
                if libc::dup2(raw, CWD_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            backend(
                &format!("cannot start the command supervisor {}", self.exe.display()),
                e,
            )
        })?;
        drop(fd);
        let pid = child.id();
        // Collect it when it exits, so that a long-lived server keeps no zombie; when this
        // process dies first, the supervisor lives on.
        let _ = std::thread::Builder::new()
            .name("supervisor-reaper".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                let mut child = child;
                let _ = child.wait();
            });
        Ok(pid)
    }

    /// Removes the oldest finished commands past the bounds (count and bytes).
    fn prune(&self, all: &[BackgroundCommand]) {
        let mut finished: Vec<&BackgroundCommand> = all.iter().filter(|c| !c.running).collect();
        let mut bytes: u64 = finished
            .iter()
            .map(|c| c.stdout_bytes + c.stderr_bytes)
            .sum();
        // Room for the one about to start.
        while !finished.is_empty()
            && (finished.len() >= MAX_FINISHED_COMMANDS || bytes > MAX_FINISHED_BYTES)
        {
            let old = finished.remove(0);
            bytes -= old.stdout_bytes + old.stderr_bytes;
            let _ = std::fs::remove_dir_all(self.dir.join(&old.id));
        }
    }

    /// Every command, oldest first.
    pub(crate) fn load_all(&self) -> Vec<BackgroundCommand> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut all: Vec<BackgroundCommand> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let id = name.to_str()?;
                validate_command_id(id).ok()?;
                load(&e.path()).ok()
            })
            .collect();
        all.sort_by(|a, b| (a.started_at_ms, &a.id).cmp(&(b.started_at_ms, &b.id)));
        all
    }

    /// One command's status.
    pub(crate) fn get(&self, id: &str) -> Result<BackgroundCommand> {
        load(&self.of(id)?)
    }

    /// Output from two offsets, waiting up to `read.wait` for something new.
    pub(crate) async fn output(&self, id: &str, read: OutputRequest) -> Result<CommandOutput> {
        read.validate()?;
        let dir = self.of(id)?;
        let deadline = tokio::time::Instant::now() + read.wait;
        loop {
            let d = dir.clone();
            let (c, more) = tokio::task::spawn_blocking(move || {
                let c = load(&d)?;
                let more = c.stdout_bytes > read.stdout_from || c.stderr_bytes > read.stderr_from;
                Ok::<_, Error>((c, more))
            })
            .await
            .map_err(Error::backend)??;
            for (name, from, len) in [
                ("stdout", read.stdout_from, c.stdout_bytes),
                ("stderr", read.stderr_from, c.stderr_bytes),
            ] {
                if from > len {
                    return Err(Error::InvalidRequest(format!(
                        "{name}_offset {from} is past the {len} bytes written so far"
                    )));
                }
            }
            if more || !c.running || tokio::time::Instant::now() >= deadline {
                let d = dir.clone();
                return tokio::task::spawn_blocking(move || {
                    let piece = |name: &str, from: u64, len: u64| -> Result<Vec<u8>> {
                        let n = (len - from).min(read.max_bytes as u64);
                        let mut buf = vec![0u8; usize::try_from(n).unwrap_or(0)];
                        if n > 0 {
                            let mut f = std::fs::File::open(d.join(name))
                                .map_err(|e| backend("cannot read the output", e))?;
                            f.seek(SeekFrom::Start(from))
                                .and_then(|_| f.read_exact(&mut buf))
                                .map_err(|e| backend("cannot read the output", e))?;
                        }
                        Ok(buf)
                    };
                    Ok(CommandOutput {
                        stdout_offset: read.stdout_from,
                        stdout: piece("stdout", read.stdout_from, c.stdout_bytes)?,
                        stderr_offset: read.stderr_from,
                        stderr: piece("stderr", read.stderr_from, c.stderr_bytes)?,
                        command: c,
                    })
                })
                .await
                .map_err(Error::backend)?;
            }
            tokio::time::sleep(POLL.min(deadline - tokio::time::Instant::now())).await;
        }
    }

    /// Kills a running command (`SIGTERM` to its supervisor, which kills the group and records
    /// the end) and waits for the end; a finished one is answered at once.
    pub(crate) async fn kill(&self, id: &str) -> Result<BackgroundCommand> {
        let dir = self.of(id)?;
        let c = load(&dir)?;
        if !c.running {
            return Ok(c);
        }
        if let Some(s) = live_supervisor(&dir) {
            signal(s.pid, rustix::process::Signal::TERM);
        }
        let deadline = tokio::time::Instant::now() + KILL_WAIT;
        loop {
            let c = load(&dir)?;
            if !c.running || tokio::time::Instant::now() >= deadline {
                return Ok(c);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Kills every live supervisor with `SIGKILL` (the conversation is being destroyed; its
    /// commands' processes are killed by the caller). Returns how many were signalled.
    pub(crate) fn kill_all_supervisors(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut n = 0;
        for e in entries.flatten() {
            if let Some(s) = live_supervisor(&e.path()) {
                signal(s.pid, rustix::process::Signal::KILL);
                n += 1;
            }
        }
        n
    }

    /// Stops (`SIGSTOP`) the process group of every command a live supervisor runs (the
    /// supervisor's child, the command's shell, leads it) until the returned guard is dropped,
    /// which continues them (`SIGCONT`).
    pub(crate) fn pause_all(&self) -> Paused {
        let supervisors: Vec<u32> = std::fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| live_supervisor(&e.path()).map(|s| s.pid))
                    .collect()
            })
            .unwrap_or_default();
        let mut groups = Vec::new();
        if supervisors.is_empty() {
            return Paused(groups);
        }
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return Paused(groups);
        };
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // After the command name: state, ppid, pgrp.
            let mut f = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .skip(1);
            let ppid = f.next().and_then(|s| s.parse::<u32>().ok());
            let pgrp = f.next().and_then(|s| s.parse::<i32>().ok());
            if ppid.is_some_and(|pp| supervisors.contains(&pp))
                && pgrp == Some(pid)
                && let Some(g) = rustix::process::Pid::from_raw(pid)
                && rustix::process::kill_process_group(g, rustix::process::Signal::STOP).is_ok()
            {
                groups.push(g);
            }
        }
        Paused(groups)
    }
}

/// Process groups stopped by [`CommandDir::pause_all`], continued on drop.
#[derive(Debug)]
pub(crate) struct Paused(Vec<rustix::process::Pid>);

impl Drop for Paused {
    fn drop(&mut self) {
        for g in &self.0 {
            let _ = rustix::process::kill_process_group(*g, rustix::process::Signal::CONT);
        }
    }
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(p) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(p, sig);
    }
}

/// The supervisor recorded in `dir`, when it still runs (same pid, same start time).
fn live_supervisor(dir: &Path) -> Option<Supervisor> {
    let s: Supervisor = read_json(&dir.join("supervisor.json"))?;
    (start_ticks(s.pid)? == s.start_ticks).then_some(s)
}

/// Reads one command directory.
fn load(dir: &Path) -> Result<BackgroundCommand> {
    let Some(spec) = read_json::<Spec>(&dir.join("spec.json")) else {
        let id = dir.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        return Err(Error::NotFound(format!("no background command {id:?}")));
    };
    let size = |name: &str| std::fs::metadata(dir.join(name)).map_or(0, |m| m.len());
    let mut c =
        BackgroundCommand::started(spec.id, spec.request.command.clone(), spec.started_at_ms);
    let limit = spec.request.output_limit as u64;
    c.stdout_bytes = size("stdout").min(limit);
    c.stderr_bytes = size("stderr").min(limit);
    if let Some(end) = read_json::<End>(&dir.join("end.json")) {
        c.running = false;
        c.status = end.status;
        c.timed_out = end.timed_out;
        c.killed = end.killed;
        c.finished_at_ms = Some(end.finished_at_ms);
        c.stdout_truncated = end.stdout_truncated;
        c.stderr_truncated = end.stderr_truncated;
        c.error = end.error;
    } else if live_supervisor(dir).is_none() {
        // Launched moments ago (its record not written yet), or gone without a word.
        let recorded = dir.join("supervisor.json").exists();
        let young = now_ms().saturating_sub(c.started_at_ms) < 5_000;
        if recorded || !young {
            // A final look: it may have written its end just now.
            if dir.join("end.json").exists() {
                return load(dir);
            }
            c.running = false;
            c.finished_at_ms = Some(now_ms());
            c.error = Some(
                "the command's supervisor ended without recording how the command ended (it \
                 was killed); its output so far is kept"
                    .into(),
            );
        }
    }
    Ok(c)
}

/// An exclusive `flock` on `path`, released when dropped.
fn lock(path: &Path) -> Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| backend("cannot open the commands lock", e))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| backend("cannot lock the commands directory", e))?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_process_has_a_start_time_and_a_dead_one_none() {
        assert!(start_ticks(std::process::id()).is_some());
        assert!(start_ticks(u32::MAX).is_none());
    }

    #[test]
    fn records_are_written_whole() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("end.json");
        let end = End {
            status: Some(ExitStatus::Code(3)),
            timed_out: false,
            killed: false,
            finished_at_ms: 5,
            stdout_truncated: true,
            stderr_truncated: false,
            error: None,
        };
        write_atomic(&p, &end).unwrap();
        let back: End = read_json(&p).unwrap();
        assert_eq!(back.status, Some(ExitStatus::Code(3)));
        assert!(!d.path().join("end.tmp").exists());
    }
}
