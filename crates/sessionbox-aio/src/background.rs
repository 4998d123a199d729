//! Background commands of the `aio` runtime, owned by the container (see
//! [`scripts::COMMANDS_DIR`] for the files, [`scripts::RUNNER`] for who writes them).
//!
//! Each command runs under a detached shell runner in the shared container (`setsid`, its own
//! session), with its stdout and stderr in files of a per-command directory
//! `<root>/.sessionbox-commands/<key>/<id>/`. Every operation is a fixed script run through
//! `/v1/bash/exec` that reads or signals those files and processes: nothing lives in this
//! process, so a restarted `serve` (a new [`crate::AioRuntime`]) lists, reads and kills the
//! commands a previous one started. Output comes back as base64 (exact bytes), read from two
//! byte offsets; a read that waits polls inside the container every 50 ms, so one long poll is
//! one HTTP request.
//!
//! Output cap: each stream goes through a named pipe into `dd bs=64K iflag=count_bytes
//! count=LIMIT+1` (each read written at once, so a follower sees output as it comes; `head -c`
//! buffers its writes), then `cat` drains and discards the rest, so a command writing without
//! end keeps at most one byte past its limit on the container's disk (truncating on read would
//! let it fill the disk) and is never stopped by a closed pipe; the extra byte tells a stream
//! that was cut from one that was exactly full, and reads never return it. This needs GNU
//! `dd` (AIO's image is Ubuntu).

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

use sessionbox_core::{
    BackgroundCommand, CommandOutput, Error, ExecRequest, ExitStatus, MAX_RUNNING_COMMANDS,
    OutputRequest, Result, validate_command_id,
};

use crate::client::{AioClient, CommandStatus};
use crate::runtime::{run_command, trailer_cap};
use crate::scripts;

/// Most finished background commands kept per conversation (the oldest are removed when one
/// starts).
pub const MAX_FINISHED_COMMANDS: usize = 64;

/// How long a kill waits for the runner to record the end.
const KILL_WAIT: Duration = Duration::from_secs(15);

/// Room for the status line (the command text as base64) on top of the output.
const LINE_ROOM: usize = 256 * 1024;

/// The background commands of one conversation in the container.
pub(crate) struct Commands<'a> {
    client: &'a AioClient,
    /// `<root>/.sessionbox-commands/<key>`.
    dir: String,
}

/// A fresh, unguessable command id (128 random bits, hex).
fn new_id() -> Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::Backend(format!("cannot make a command id: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn bad(what: &str, text: &[u8]) -> Error {
    Error::Backend(format!(
        "the aio background-command script answered badly ({what}): {}",
        String::from_utf8_lossy(text)
            .chars()
            .take(300)
            .collect::<String>()
    ))
}

/// Parses one status line (`C ID STARTED LIMIT STATE OUT ERR CMD64 END`, see `scripts`).
fn parse_line(line: &str) -> Option<BackgroundCommand> {
    use base64::Engine as _;
    let f: Vec<&str> = line.split('\t').collect();
    let ["C", id, started, limit, state, out, err, cmd, end] = f.as_slice() else {
        return None;
    };
    let limit: u64 = limit.parse().ok()?;
    let (out, err): (u64, u64) = (out.parse().ok()?, err.parse().ok()?);
    let cmd = base64::engine::general_purpose::STANDARD.decode(cmd).ok()?;
    let mut c = BackgroundCommand::started(
        *id,
        String::from_utf8_lossy(&cmd).into_owned(),
        started.parse().ok()?,
    );
    c.stdout_bytes = out.min(limit);
    c.stderr_bytes = err.min(limit);
    c.stdout_truncated = out > limit;
    c.stderr_truncated = err > limit;
    match *state {
        "running" => {}
        "ended" => {
            let e: Vec<&str> = end.split(' ').collect();
            let [kind, value, finished, timed_out, killed] = e.as_slice() else {
                return None;
            };
            let value: i32 = value.parse().ok()?;
            c.running = false;
            c.status = Some(match *kind {
                "signal" => ExitStatus::Signal(value),
                "code" => ExitStatus::Code(value),
                _ => return None,
            });
            c.finished_at_ms = Some(finished.parse().ok()?);
            c.timed_out = *timed_out == "1";
            c.killed = *killed == "1";
        }
        "lost" => {
            c.running = false;
            c.finished_at_ms = Some(now_ms().max(c.started_at_ms));
            c.error = Some(
                "the command's runner in the container ended without recording how the command \
                 ended (it was killed, or the container restarted); its output so far is kept"
                    .into(),
            );
        }
        _ => return None,
    }
    Some(c)
}

impl<'a> Commands<'a> {
    /// The commands of the conversation whose workspace is `<root>/<key>`.
    pub(crate) fn new(client: &'a AioClient, root: &str, key: &str) -> Self {
        Commands {
            client,
            dir: format!("{root}/{}/{key}", scripts::COMMANDS_DIR),
        }
    }

    /// Runs a fixed script and returns its stdout.
    async fn script(
        &self,
        script: &str,
        env: BTreeMap<String, String>,
        timeout: Duration,
        cap: usize,
    ) -> Result<Vec<u8>> {
        let out = run_command(self.client, None, script, "/", env, timeout, cap).await?;
        if out.status != CommandStatus::Completed {
            return Err(Error::Backend(format!(
                "a sessionbox background-command script did not complete ({:?}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .chars()
                    .take(300)
                    .collect::<String>()
            )));
        }
        Ok(out.stdout)
    }

    fn of(&self, id: &str) -> Result<String> {
        validate_command_id(id)?;
        Ok(format!("{}/{id}", self.dir))
    }

    /// Starts a command. `env` is the command's environment with the wrapper's `SB_WS`,
    /// `SB_CWD`, `SB_CMD` and optional `SB_STDIN` already set, as for a foreground command.
    pub(crate) async fn spawn(
        &self,
        mut env: BTreeMap<String, String>,
        request: &ExecRequest,
    ) -> Result<BackgroundCommand> {
        let id = new_id()?;
        let limit = request.output_limit;
        for (k, v) in [
            ("SB_CMDS", self.dir.clone()),
            ("SB_ID", id.clone()),
            ("SB_MAX_RUNNING", MAX_RUNNING_COMMANDS.to_string()),
            ("SB_KEEP", MAX_FINISHED_COMMANDS.to_string()),
            ("SB_OUTPUT_LIMIT", limit.to_string()),
            ("SB_LIMIT", limit.saturating_add(1).to_string()),
            (
                "SB_TIMEOUT",
                format!("{:.3}", request.timeout.as_secs_f64().max(0.001)),
            ),
            ("SB_RUNNER", scripts::RUNNER.to_owned()),
        ] {
            env.insert(k.to_owned(), v);
        }
        let out = self
            .script(scripts::SPAWN, env, Duration::from_secs(60), 64 * 1024)
            .await?;
        let text = String::from_utf8_lossy(&out);
        let f: Vec<&str> = text.lines().next().unwrap_or("").split('\t').collect();
        let shown = request.cwd.as_deref().unwrap_or(".");
        match f.as_slice() {
            ["ok", started] => Ok(BackgroundCommand::started(
                id,
                request.command.clone(),
                started.parse().map_err(|_| bad("spawn", &out))?,
            )),
            ["err", "busy", _] => Err(Error::Busy(format!(
                "{MAX_RUNNING_COMMANDS} background commands already run in this conversation; \
                 wait for one to end or kill one (finished commands do not count)"
            ))),
            ["err", "not_found", _] => {
                Err(Error::NotFound("the workspace no longer exists".into()))
            }
            ["err", "cwd_missing", _] => Err(Error::NotFound(format!("working directory {shown}"))),
            ["err", "outside", detail] => Err(Error::OutsideWorkspace {
                path: shown.to_owned(),
                reason: (*detail).to_owned(),
            }),
            ["err", _, detail] => Err(Error::Backend(format!(
                "cannot start the background command: {detail}"
            ))),
            _ => Err(bad("spawn", &out)),
        }
    }

    /// Every command, oldest first.
    pub(crate) async fn list(&self) -> Result<Vec<BackgroundCommand>> {
        let env = BTreeMap::from([("SB_CMDS".to_owned(), self.dir.clone())]);
        let out = self
            .script(scripts::STATUS, env, Duration::from_secs(60), 64 << 20)
            .await?;
        let text = String::from_utf8_lossy(&out);
        let mut all = text
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| parse_line(l).ok_or_else(|| bad("list", l.as_bytes())))
            .collect::<Result<Vec<_>>>()?;
        all.sort_by(|a, b| (a.started_at_ms, &a.id).cmp(&(b.started_at_ms, &b.id)));
        Ok(all)
    }

    fn one(id: &str, out: &[u8], what: &str) -> Result<BackgroundCommand> {
        if out.starts_with(b"sessionbox-aio:gone") {
            return Err(Error::NotFound(format!("no background command {id:?}")));
        }
        let text = String::from_utf8_lossy(out);
        parse_line(text.lines().next().unwrap_or("")).ok_or_else(|| bad(what, out))
    }

    /// One command's status.
    pub(crate) async fn get(&self, id: &str) -> Result<BackgroundCommand> {
        validate_command_id(id)?;
        let env = BTreeMap::from([
            ("SB_CMDS".to_owned(), self.dir.clone()),
            ("SB_ID".to_owned(), id.to_owned()),
        ]);
        let out = self
            .script(scripts::STATUS, env, Duration::from_secs(60), LINE_ROOM)
            .await?;
        Self::one(id, &out, "status")
    }

    /// Output from two offsets, waiting up to `read.wait` (inside the container) for something
    /// new.
    pub(crate) async fn output(&self, id: &str, read: OutputRequest) -> Result<CommandOutput> {
        use base64::Engine as _;
        read.validate()?;
        let env = BTreeMap::from([
            ("SB_D".to_owned(), self.of(id)?),
            ("SB_ID".to_owned(), id.to_owned()),
            ("SB_OF".to_owned(), read.stdout_from.to_string()),
            ("SB_EF".to_owned(), read.stderr_from.to_string()),
            ("SB_MAX".to_owned(), read.max_bytes.to_string()),
            ("SB_WAIT_MS".to_owned(), read.wait.as_millis().to_string()),
        ]);
        let out = self
            .script(
                scripts::OUTPUT,
                env,
                read.wait + Duration::from_secs(60),
                trailer_cap(read.max_bytes).saturating_add(LINE_ROOM),
            )
            .await?;
        let command = Self::one(id, &out, "output")?;
        for (name, from, len) in [
            ("stdout", read.stdout_from, command.stdout_bytes),
            ("stderr", read.stderr_from, command.stderr_bytes),
        ] {
            if from > len {
                return Err(Error::InvalidRequest(format!(
                    "{name}_offset {from} is past the {len} bytes written so far"
                )));
            }
        }
        let text = std::str::from_utf8(&out).map_err(|_| bad("output", &out))?;
        let lines: Vec<&str> = text.split('\n').collect();
        let b64 = base64::engine::general_purpose::STANDARD;
        let (Some(o), Some(e), Some(&"sessionbox-aio:end")) =
            (lines.get(1), lines.get(2), lines.get(3))
        else {
            return Err(bad("output", &out));
        };
        let stdout = b64.decode(o).map_err(|_| bad("output", &out))?;
        let stderr = b64.decode(e).map_err(|_| bad("output", &out))?;
        Ok(CommandOutput {
            command,
            stdout_offset: read.stdout_from,
            stdout,
            stderr_offset: read.stderr_from,
            stderr,
        })
    }

    /// Kills a running command's process group and waits for its end; an ended one is
    /// answered at once.
    pub(crate) async fn kill(&self, id: &str) -> Result<BackgroundCommand> {
        let env = BTreeMap::from([
            ("SB_D".to_owned(), self.of(id)?),
            ("SB_ID".to_owned(), id.to_owned()),
            (
                "SB_KILL_WAIT_MS".to_owned(),
                KILL_WAIT.as_millis().to_string(),
            ),
        ]);
        let out = self
            .script(
                scripts::KILL,
                env,
                KILL_WAIT + Duration::from_secs(30),
                LINE_ROOM,
            )
            .await?;
        Self::one(id, &out, "kill")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_parse() {
        let c = parse_line("C\tab\t10\t4\trunning\t2\t9\tZWNobw==\t").unwrap();
        assert!(c.running);
        assert_eq!((c.stdout_bytes, c.stderr_bytes), (2, 4));
        assert!(!c.stdout_truncated && c.stderr_truncated);
        assert_eq!(c.command, "echo");
        let c = parse_line("C\tab\t10\t4\tended\t0\t0\t\tsignal 9 20 0 1").unwrap();
        assert!(!c.running && c.killed && !c.timed_out);
        assert_eq!(c.status, Some(ExitStatus::Signal(9)));
        assert_eq!(c.finished_at_ms, Some(20));
        let c = parse_line("C\tab\t10\t4\tlost\t0\t0\t\t").unwrap();
        assert!(!c.running && c.error.is_some());
        for bad in [
            "",
            "C\tab",
            "C\tab\t10\t4\tended\t0\t0\t\tcode x 1 0 0",
            "C\tab\t10\t4\tweird\t0\t0\t\t",
        ] {
            assert!(parse_line(bad).is_none(), "{bad:?}");
        }
    }
}
