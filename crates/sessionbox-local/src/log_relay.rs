//! Host logs that cannot grow without bound: a conversation's `agent.log` (the sandboxed
//! agent's stderr) and `egress.log` (its gateway's) are written by a small *log relay*, a
//! re-execution of a binary that calls [`log_relay_main`] first thing in `main` when
//! [`is_log_relay_invocation`] says so (the `sessionbox` binary does).
//!
//! The writer's stderr is the write end of a pipe; the relay, on the host, reads the other end
//! and appends to the file; when the file would pass `max_bytes`, it is renamed to `FILE.1`
//! (replacing the previous one) and a new file is started. So a log takes at most
//! `2 × max_bytes` on the host, whatever is written to it, and the newest lines are kept.
//!
//! Why a process of its own rather than a thread of the launcher or a writer in the agent: the
//! sandbox outlives the process that launched it (a CLI call, a restarted `serve`), so a thread
//! there would leave the agent writing into a pipe nobody reads; and the agent runs inside the
//! sandbox, where the host file cannot be renamed (it is not in its mount namespace), and is
//! not where a host-side bound should be enforced. The relay is started in a session of its own
//! (it outlives its launcher too), holds no descriptor but the pipe and the file, and exits when
//! every writer has closed the pipe (the sandbox or the gateway ended).

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use sessionbox_core::{Error, Result};

/// The variable that makes a process the relay of the log file it names.
pub const LOG_RELAY_ENV: &str = "SESSIONBOX_LOG_RELAY";

/// The variable carrying the relay's `max_bytes`.
pub const LOG_RELAY_MAX_ENV: &str = "SESSIONBOX_LOG_RELAY_MAX";

/// The smallest `max_bytes` a relay takes (smaller values are raised to it): 64 KiB, one read.
pub const MIN_MAX_BYTES: u64 = 64 * 1024;

const CHUNK: usize = 64 * 1024;

/// True when this process was started as a log relay: call [`log_relay_main`] then.
pub fn is_log_relay_invocation() -> bool {
    std::env::var_os(LOG_RELAY_ENV).is_some()
}

/// Runs the relay of the log in [`LOG_RELAY_ENV`] from standard input and exits (0 at the end
/// of input). Call it first thing in `main`, when [`is_log_relay_invocation`] says so.
pub fn log_relay_main() -> ! {
    let path = PathBuf::from(std::env::var_os(LOG_RELAY_ENV).unwrap_or_default());
    let max = std::env::var(LOG_RELAY_MAX_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(crate::isolated::IsolatedConfig::DEFAULT_LOG_MAX_BYTES);
    let code = match relay(std::io::stdin().lock(), &path, max) {
        Ok(()) => 0,
        Err(_) => 1, // nowhere to say it: stderr is /dev/null
    };
    std::process::exit(code)
}

/// The rotated copy of `path`: `path` with `.1` appended.
pub fn rotated(path: &Path) -> PathBuf {
    let mut s: OsString = path.as_os_str().to_owned();
    s.push(".1");
    PathBuf::from(s)
}

/// Opens (creating, 0600) the log `name` in the directory held by `dir`.
fn open(dir: &OwnedFd, name: &Path, truncate: bool) -> std::io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::WRONLY
        | OFlags::CREATE
        | OFlags::CLOEXEC
        | OFlags::NOFOLLOW
        | if truncate {
            OFlags::TRUNC
        } else {
            OFlags::APPEND
        };
    Ok(File::from(rustix::fs::openat(
        dir,
        name,
        flags,
        Mode::from_raw_mode(0o600),
    )?))
}

/// Copies `input` to the log at `path` until its end, rotating to [`rotated`]`(path)` whenever
/// the file would pass `max_bytes` (raised to [`MIN_MAX_BYTES`]). Blocks.
///
/// The log's directory is held open from the start and the file is reopened and rotated
/// relative to it, so a relay keeps writing into its directory when that directory is renamed
/// (a warm pool's sandbox becoming a conversation's: its run directory moves).
///
/// # Errors
/// When the file cannot be opened, written or rotated (its directory was removed: the
/// conversation was destroyed), or `input` fails.
pub fn relay(mut input: impl Read, path: &Path, max_bytes: u64) -> std::io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    let max = max_bytes.max(MIN_MAX_BYTES);
    let (parent, name) = match (path.parent(), path.file_name()) {
        (Some(p), Some(n)) => (
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            },
            Path::new(n),
        ),
        _ => return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput)),
    };
    let dir = rustix::fs::open(
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let old = rotated(name);
    let mut file = open(&dir, name, false)?;
    let mut size = file.metadata()?.len();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if size > 0 && size + n as u64 > max {
            rustix::fs::renameat(&dir, name, &dir, &old)?;
            file = open(&dir, name, true)?;
            size = 0;
        }
        file.write_all(&buf[..n])?;
        size += n as u64;
    }
}

/// Starts a relay (`exe` with [`LOG_RELAY_ENV`] set) for the log at `path`, rotated at
/// `max_bytes`; returns the write end of its pipe, to give a process as its stderr. The relay
/// runs in a session of its own and is collected by a thread of this process if it ends first.
///
/// # Errors
/// [`Error::Backend`] when the pipe or the process cannot be made.
pub fn spawn(exe: &Path, path: &Path, max_bytes: u64) -> Result<Stdio> {
    use std::os::unix::process::CommandExt;
    let (reader, writer) = std::io::pipe()
        .map_err(|e| Error::Backend(format!("cannot make a pipe for {}: {e}", path.display())))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.env_clear()
        .env(LOG_RELAY_ENV, path)
        .env(LOG_RELAY_MAX_ENV, max_bytes.to_string())
        .current_dir("/")
        .stdin(Stdio::from(reader))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: runs in the forked child before exec: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| {
        Error::Backend(format!(
            "cannot start the log relay for {}: {e}",
            path.display()
        ))
    })?;
    let _ = std::thread::Builder::new()
        .name("log-relay-reaper".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut child = child;
            let _ = child.wait();
        });
    Ok(Stdio::from(writer))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 5 MiB written through a relay capped at 1 MiB: the file and its rotated copy each stay
    /// at or under the cap, and the newest bytes are kept.
    #[test]
    fn a_log_is_rotated_at_its_cap_and_keeps_the_newest_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.log");
        let mut data = Vec::new();
        for i in 0..80_000u32 {
            data.extend_from_slice(format!("line {i:08} of the agent's log\n").as_bytes());
        }
        assert!(data.len() > 2_500_000);
        relay(&data[..], &path, 1 << 20).unwrap();
        let now = std::fs::read(&path).unwrap();
        let old = std::fs::read(rotated(&path)).unwrap();
        assert!(now.len() as u64 <= 1 << 20 && old.len() as u64 <= 1 << 20);
        assert!(data.ends_with(&now), "the newest bytes are in the file");
        assert!(data[..data.len() - now.len()].ends_with(&old));
    }

    /// The log's directory renamed while the relay writes (a pool sandbox bound to a
    /// conversation): the lines written after the rename, and the rotation, land in the
    /// directory under its new name.
    #[test]
    fn a_relay_follows_its_directory_when_it_is_renamed() {
        let top = tempfile::tempdir().unwrap();
        let (before, after) = (
            top.path().join("pool-slot"),
            top.path().join("conversation"),
        );
        std::fs::create_dir(&before).unwrap();
        let (reader, mut writer) = std::io::pipe().unwrap();
        let path = before.join("agent.log");
        let relay = std::thread::spawn(move || relay(reader, &path, MIN_MAX_BYTES));
        writer.write_all(b"first\n").unwrap();
        // Wait until the relay has opened the file (it holds the directory from then on).
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read(before.join("agent.log")).map_or(true, |d| d.is_empty()) {
            assert!(std::time::Instant::now() < until);
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::fs::rename(&before, &after).unwrap();
        let big = vec![b'x'; MIN_MAX_BYTES as usize];
        writer.write_all(&big).unwrap();
        writer.write_all(b"last\n").unwrap();
        drop(writer);
        relay.join().unwrap().unwrap();
        assert!(!before.exists(), "nothing was made under the old name");
        // More than the cap was written after the rename: it rotated there at least once.
        assert!(
            after.join("agent.log.1").exists(),
            "rotated in the renamed directory"
        );
        let now = std::fs::read(after.join("agent.log")).unwrap();
        assert!(now.ends_with(b"last\n"));
    }
}
