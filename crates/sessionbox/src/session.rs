//! The commands that run one operation on a conversation (`exec`, `write`, `read`, `edit`,
//! `ls`, `stat`, `rm`, `mkdir`, `glob`, `grep`, `commands`, `logs`, `kill`, `watch`): their input checked
//! before anything is created, the conversation held and opened, the operation, its output.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use sessionbox_core::{
    ConversationRef, EditRequest, Error, ExecRequest, FileKind, GrepRequest, OpenMode, Operation,
    OutputStream, Refusal, Session,
};

use crate::cli::SessionCommand;
use crate::{App, UsageError};

/// What a session command needs, built and checked before anything is created.
pub(crate) struct Prepared {
    exec: Option<ExecRequest>,
    write_data: Option<Vec<u8>>,
    /// `exec --stdin` in the foreground: stdin is passed on as it is read, not read first.
    pass_stdin: bool,
}

/// Checks every input of `command` against the workspace root as the runtime presents it, and
/// reads what it needs from stdin (for `write`, at most `max_file_bytes`, the file limit of
/// `[limits]`: more is refused before anything is written). Runs before the store or the
/// runtime exists, so bad input creates nothing (not even the data directory). With
/// `live_stdin` (the runtime keeps a background command's stdin open), a foreground
/// `exec --stdin` is not read here but passed through as it is read ([`crate::stdin_pass`]).
pub(crate) fn prepare(
    root: &str,
    command: &SessionCommand,
    max_file_bytes: u64,
    live_stdin: bool,
) -> anyhow::Result<Prepared> {
    let check = |p: &str| sessionbox_core::WorkspacePath::resolve(root, p).map(|_| ());
    match command {
        SessionCommand::Exec { cwd: Some(cwd), .. } => check(cwd)?,
        SessionCommand::Write { path, .. }
        | SessionCommand::Read { path, .. }
        | SessionCommand::Ls { path, .. }
        | SessionCommand::Stat { path, .. }
        | SessionCommand::Rm { path, .. }
        | SessionCommand::Mkdir { path, .. }
        | SessionCommand::Watch { path, .. } => check(path)?,
        SessionCommand::Edit { path, old, .. } => {
            check(path)?;
            if old.is_empty() {
                return Err(UsageError("--old must not be empty".into()).into());
            }
        }
        SessionCommand::Glob { pattern, .. } => sessionbox_fs::check_glob(root, pattern)?,
        SessionCommand::Grep {
            pattern,
            path,
            glob,
            ignore_case,
            ..
        } => sessionbox_fs::check_grep(root, &grep_request(pattern, path, glob, *ignore_case))?,
        _ => {}
    }
    let exec = match command {
        SessionCommand::Exec {
            cwd,
            timeout,
            env,
            stdin,
            output_limit,
            command,
            background,
            ..
        } => Some(exec_request(
            command,
            cwd.clone(),
            *timeout,
            env,
            // Passed on as it is read instead (see `pass_stdin`).
            *stdin && (*background || !live_stdin),
            *output_limit,
        )?),
        _ => None,
    };
    let pass_stdin = live_stdin
        && matches!(
            command,
            SessionCommand::Exec {
                stdin: true,
                background: false,
                ..
            }
        );
    let write_data = match command {
        SessionCommand::Write { .. } => {
            let Some(data) = read_at_most(std::io::stdin().lock(), max_file_bytes)
                .context("cannot read stdin")?
            else {
                return Err(UsageError(format!(
                    "stdin is larger than {max_file_bytes} bytes, the largest file `write` takes \
                     (max_file_bytes in [limits] of sessionbox.toml); nothing was written: make \
                     the file inside the workspace with `sessionbox exec` (download or generate \
                     it there), or raise max_file_bytes"
                ))
                .into());
            };
            Some(data)
        }
        _ => None,
    };
    Ok(Prepared {
        exec,
        write_data,
        pass_stdin,
    })
}

/// All of `input` if it is at most `limit` bytes, else `None` as soon as more arrives: read in
/// chunks, so memory stays bounded by the limit (about) whatever the input's size.
pub(crate) fn read_at_most(mut input: impl Read, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    const CHUNK: usize = 64 * 1024;
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut data = Vec::new();
    let mut chunk = vec![0; CHUNK];
    loop {
        let n = match input.read(&mut chunk) {
            Ok(0) => return Ok(Some(data)),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let len = data.len() + n;
        if len > limit {
            return Ok(None);
        }
        if data.capacity() < len {
            // Doubling, but never past the limit.
            let want = (data.capacity() * 2).max(len).min(limit);
            data.reserve_exact(want - data.len());
        }
        data.extend_from_slice(&chunk[..n]);
    }
}

fn grep_request(
    pattern: &str,
    path: &Option<String>,
    glob: &Option<String>,
    ignore_case: bool,
) -> GrepRequest {
    let mut req = GrepRequest::new(pattern.to_owned());
    req.path = path.clone();
    req.glob = glob.clone();
    req.case_insensitive = ignore_case;
    req
}

fn exec_request(
    command: &[String],
    cwd: Option<String>,
    timeout: f64,
    env: &[String],
    stdin: bool,
    output_limit: usize,
) -> anyhow::Result<ExecRequest> {
    let line = match command {
        [one] => one.clone(),
        many => shell_words::join(many),
    };
    let timeout = Duration::try_from_secs_f64(timeout).map_err(|_| {
        UsageError(format!(
            "--timeout {timeout}: give a number of seconds from 0.001 to 600"
        ))
    })?;
    if output_limit == 0 || output_limit > sessionbox_core::MAX_OUTPUT_LIMIT {
        return Err(UsageError(format!(
            "--output-limit {output_limit}: give a number of bytes from 1 to {}",
            sessionbox_core::MAX_OUTPUT_LIMIT
        ))
        .into());
    }
    let mut req = ExecRequest::new(line)
        .timeout(timeout)
        .output_limit(output_limit);
    req.cwd = cwd;
    for kv in env {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(UsageError(format!("--env {kv:?}: expected NAME=VALUE")).into());
        };
        req = req.env(k, v);
    }
    if stdin {
        // One byte over the limit is enough for `validate` to refuse it naming the limit.
        let max = sessionbox_core::MAX_STDIN_BYTES as u64 + 1;
        let mut buf = Vec::new();
        std::io::stdin()
            .lock()
            .take(max)
            .read_to_end(&mut buf)
            .context("cannot read stdin")?;
        req = req.stdin(buf);
    }
    req.validate()?;
    Ok(req)
}

/// Runs `command` on conversation `conv`: opens it for the command's [`Operation`] (held for
/// the operation, but for `logs`), runs the operation, closes it. `prepared` is what [`prepare`] built from the command's input.
pub(crate) async fn run(
    app: &App,
    conv: &ConversationRef,
    command: SessionCommand,
    prepared: Prepared,
) -> anyhow::Result<ExitCode> {
    let operation = command.operation();
    let mode = operation.open_mode();
    // Held for the whole operation, as the server does: one operation at a time per
    // conversation across processes (and, with PostgreSQL, machines).
    // Except a read of background output, which may wait long (`logs --follow`): it changes
    // nothing, and the command it reads belongs to the runtime.
    // So is a watch, which runs until interrupted and only reads.
    let opened = if matches!(operation, Operation::CommandOutput | Operation::Attach) {
        app.manager.open_unheld(conv, mode).await.map(|c| (c, None))
    } else {
        app.manager.open_for(conv, mode).await.map(|held| {
            let (c, lock) = held.into_parts();
            (c, Some(lock))
        })
    };
    let (session, _held) = opened.map_err(|e| in_cli_words(e, conv, mode))?;
    if let Some(n) = session.previous_expired() {
        warn!(
            "conversation {} expired at {} and its files are gone; this is a new, empty \
             conversation",
            conv.id,
            n.expired_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
    }
    if session.state_lost() {
        warn!(
            "the sandbox of conversation {} had vanished (expired or deleted elsewhere); a \
             fresh one replaced it and the files from before are lost",
            conv.id
        );
    }
    let result = run_on_session(&session, command, prepared).await;
    let closed = Box::new(session).close().await;
    let code = result?;
    closed?;
    Ok(code)
}

/// `error`, from opening `conv` in `mode`, in this CLI's words: the manager's refusal of a
/// conversation that does not exist, or expired, says which commands make one (the library's
/// texts name no command).
fn in_cli_words(error: Error, conv: &ConversationRef, mode: OpenMode) -> Error {
    let Error::NotFound(message) = &error else {
        return error;
    };
    if mode != OpenMode::ExistingOnly {
        return error;
    }
    // The manager's texts (`sessionbox_manager`'s `open.rs`), matched whole.
    let id = format!("conversation {:?}", conv.id.as_str());
    if *message == format!("{id} does not exist") {
        return Error::NotFound(format!(
            "conversation {} does not exist in tenant {}; exec, write or mkdir create one",
            conv.id, conv.tenant
        ));
    }
    let expired_at = message
        .strip_prefix(&id)
        .and_then(|m| m.strip_prefix(" expired at "))
        .and_then(|m| m.strip_suffix(" and its files are gone"));
    match expired_at {
        Some(at) => Error::NotFound(format!(
            "conversation {} expired at {at} and its files are gone; exec, write or mkdir \
             create a new one",
            conv.id
        )),
        None => error,
    }
}

/// A library refusal with what to do in this CLI's flags (the library names none).
fn with_flags(e: Error) -> Error {
    let advice = match e.refusal() {
        Some(Refusal::EditEmpty) => "give the exact text to replace in --old",
        Some(Refusal::EditAbsent) => "read the file and give its exact text in --old",
        Some(Refusal::EditAmbiguous) => {
            "give more context in --old, or pass --all to replace every occurrence"
        }
        Some(Refusal::DirectoryNotEmpty) => {
            "pass --recursive (-r) to remove it and everything in it"
        }
        _ => return e,
    };
    e.with_advice(advice)
}

async fn run_on_session(
    s: &sessionbox_manager::Conversation,
    command: SessionCommand,
    prepared: Prepared,
) -> anyhow::Result<ExitCode> {
    let Prepared {
        exec,
        write_data,
        pass_stdin,
    } = prepared;
    let mut out = std::io::stdout().lock();
    let names = crate::shown::Names::for_stdout();
    match command {
        SessionCommand::Exec {
            background: true, ..
        } => {
            let c = s.spawn(exec.expect("built above")).await?;
            writeln!(out, "{}", c.id)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Commands { json, .. } => {
            let all = s.commands().await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&all)?)?;
            } else {
                for c in &all {
                    let state = if c.running { "running" } else { "ended" };
                    let code = c
                        .shell_exit_code()
                        .map_or_else(|| "-".to_owned(), |c| c.to_string());
                    writeln!(out, "{}  {state:<7}  {code:>4}  {}", c.id, c.command)?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Logs { id, follow, .. } => {
            drop(out);
            let mut read = sessionbox_core::OutputRequest::from_start();
            if follow {
                read.wait = std::time::Duration::from_secs(20);
            }
            loop {
                let o = s.command_output(&id, read).await?;
                let mut so = std::io::stdout();
                so.write_all(&o.stdout).and_then(|()| so.flush())?;
                std::io::stderr().write_all(&o.stderr)?;
                read.stdout_from = o.stdout_next();
                read.stderr_from = o.stderr_next();
                if o.complete() {
                    let code = o.command.shell_exit_code().unwrap_or(1);
                    return Ok(ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1)));
                }
                let more = o.stdout.len() + o.stderr.len() >= sessionbox_core::MAX_OUTPUT_CHUNK;
                if !follow && !more {
                    return Ok(ExitCode::SUCCESS);
                }
            }
        }
        SessionCommand::Watch { path, .. } => {
            drop(out);
            watch(s, &path).await
        }
        SessionCommand::Kill { id, .. } => {
            let c = s.kill_command(&id).await?;
            writeln!(out, "{}", serde_json::to_string_pretty(&c)?)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Exec { .. } => {
            drop(out);
            let mut exec = exec.expect("built above");
            if pass_stdin {
                match crate::stdin_pass::exec(s, &exec).await? {
                    Some(code) => return Ok(code),
                    // The runtime cannot keep a stdin open: read it all first, as before.
                    None => {
                        exec.stdin = Some(crate::stdin_pass::read_all()?);
                        exec.validate()?;
                    }
                }
            }
            // The output as it comes, byte for byte: each chunk is written (and flushed) when
            // the runtime hands it over. The first write error (a reader that went away) is
            // kept and returned once the command has ended.
            let mut failed: Option<std::io::Error> = None;
            let mut sink = |stream: OutputStream, data: &[u8]| {
                if failed.is_some() {
                    return;
                }
                let written = match stream {
                    OutputStream::Stdout => {
                        let mut o = std::io::stdout();
                        o.write_all(data).and_then(|()| o.flush())
                    }
                    OutputStream::Stderr => std::io::stderr().write_all(data),
                };
                if let Err(e) = written {
                    failed = Some(e);
                }
            };
            let r_limit = exec.output_limit;
            let r = s.exec_stream(exec, &mut sink).await?;
            if let Some(e) = failed {
                return Err(e.into());
            }
            for (cut, name) in [
                (r.stdout_truncated, "stdout"),
                (r.stderr_truncated, "stderr"),
            ] {
                if cut {
                    warn!(
                        "the command's {name} was cut at {limit} bytes (--output-limit; \
                         at most {max}) and the rest discarded; for more, write it to a file in \
                         the workspace and `sessionbox read` it",
                        limit = r_limit,
                        max = sessionbox_core::MAX_OUTPUT_LIMIT
                    );
                }
            }
            if r.timed_out {
                warn!(
                    "the command timed out after {:.1} s and was killed",
                    r.duration.as_secs_f64()
                );
            }
            Ok(ExitCode::from(
                u8::try_from(r.shell_exit_code() & 0xff).unwrap_or(1),
            ))
        }
        SessionCommand::Write { path, .. } => {
            let data = write_data.expect("read above");
            s.write(&path, &data).await?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Read { path, .. } => {
            out.write_all(&s.read(&path).await?)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Edit {
            path,
            old,
            new,
            all,
            ..
        } => {
            let r = s
                .edit(
                    &path,
                    &EditRequest {
                        old,
                        new,
                        replace_all: all,
                    },
                )
                .await
                .map_err(with_flags)?;
            eprintln!("{} replacement(s)", r.replacements);
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Ls { path, .. } => {
            for e in s.list(&path).await? {
                let kind = match e.kind {
                    FileKind::File => "-",
                    FileKind::Directory => "d",
                    FileKind::Symlink => "l",
                    FileKind::Other => "?",
                };
                writeln!(out, "{kind} {:>12} {}", e.size, names.show(&e.name))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Stat { path, .. } => {
            writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&s.stat(&path).await?)?
            )?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Rm {
            path, recursive, ..
        } => {
            s.remove(&path, recursive).await.map_err(with_flags)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Mkdir { path, .. } => {
            s.mkdir(&path).await?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Glob { pattern, .. } => {
            for p in s.glob(&pattern).await? {
                writeln!(out, "{}", names.show(&p))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Grep {
            pattern,
            path,
            glob,
            ignore_case,
            ..
        } => {
            let req = grep_request(&pattern, &path, &glob, ignore_case);
            let matches = s.grep(&req).await?;
            for m in &matches {
                writeln!(out, "{}:{}:{}", names.show(&m.path), m.line_number, m.line)?;
            }
            Ok(if matches.is_empty() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}

/// `watch`: the agent's events of `path`, one JSON line each, flushed as they come; ends with
/// the stream (after an `ended` event), or with an error when the agent goes away.
async fn watch(s: &sessionbox_manager::Conversation, path: &str) -> anyhow::Result<ExitCode> {
    let Some(access) = s.agent().await? else {
        return Err(sessionbox_core::no_agent(&s.record().runtime, "file watching").into());
    };
    let link = sessionbox_execd::AgentLink::new(access).map_err(Error::from)?;
    let mut events = link.watch(path).await.map_err(Error::from)?;
    let mut out = std::io::stdout();
    while let Some(event) = events.next().await.map_err(Error::from)? {
        writeln!(out, "{}", serde_json::to_string(&event)?)?;
        out.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv() -> ConversationRef {
        ConversationRef::new(
            sessionbox_core::TenantId::new("t1").unwrap(),
            "c1".parse().unwrap(),
        )
    }

    #[test]
    fn stdin_is_read_up_to_its_limit_and_no_further() {
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        assert_eq!(read_at_most(&data[..], 200_000).unwrap().unwrap(), data);
        assert_eq!(read_at_most(&b""[..], 0).unwrap().unwrap(), b"");
        assert!(read_at_most(&data[..], 199_999).unwrap().is_none());
        // It stops at the first chunk past the limit: an endless input ends.
        assert!(read_at_most(std::io::repeat(0), 100_000).unwrap().is_none());
        // What it holds never grows past the limit.
        let held = read_at_most(&data[..150_000], 150_000).unwrap().unwrap();
        assert!(held.capacity() <= 150_000, "{}", held.capacity());
    }

    #[test]
    fn the_managers_refusals_are_said_in_the_clis_words() {
        let c = conv();
        let absent = Error::NotFound("conversation \"c1\" does not exist".into());
        assert_eq!(
            in_cli_words(absent.clone(), &c, OpenMode::ExistingOnly).to_string(),
            Error::NotFound(
                "conversation c1 does not exist in tenant t1; exec, write or mkdir create one"
                    .into()
            )
            .to_string()
        );
        let expired = Error::NotFound(
            "conversation \"c1\" expired at 2026-01-02T03:04:05Z and its files are gone".into(),
        );
        assert_eq!(
            in_cli_words(expired, &c, OpenMode::ExistingOnly).to_string(),
            Error::NotFound(
                "conversation c1 expired at 2026-01-02T03:04:05Z and its files are gone; exec, \
                 write or mkdir create a new one"
                    .into()
            )
            .to_string()
        );
        // Any other error, or an open that creates, is left as it is.
        let raced =
            Error::NotFound("conversation c1 was destroyed while it was being opened".into());
        assert_eq!(
            in_cli_words(raced.clone(), &c, OpenMode::ExistingOnly).to_string(),
            raced.to_string()
        );
        assert_eq!(
            in_cli_words(absent.clone(), &c, OpenMode::CreateIfAbsent).to_string(),
            absent.to_string()
        );
    }
}
