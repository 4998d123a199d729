//! Running one command through `/v1/bash/exec` and `/v1/bash/output`: polling, output caps,
//! and the exact-output trailer the exec script writes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sessionbox_core::{ConversationKey, Result};

use crate::client::{AioClient, AioError, BashExecRequest, BashOutputRequest, CommandStatus};

use super::unique;

/// The end of a command run through `/v1/bash/exec` and `/v1/bash/output`.
pub(crate) struct CommandOutput {
    pub(crate) status: CommandStatus,
    pub(crate) exit_code: Option<i32>,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    pub(crate) stdout_truncated: bool,
    pub(crate) stderr_truncated: bool,
    pub(crate) client_timed_out: bool,
}

fn append_capped(buf: &mut Vec<u8>, data: &str, cap: usize, truncated: &mut bool) {
    let room = cap.saturating_sub(buf.len());
    let bytes = data.as_bytes();
    if bytes.len() > room {
        *truncated = true;
        buf.extend_from_slice(&bytes[..room]);
    } else {
        buf.extend_from_slice(bytes);
    }
}

/// Runs `command` in a fresh session named `sb-<key>-<unique>` (or `sb-x-<unique>`), polls its
/// output until it ends, and closes the session (which ends whatever it left running).
pub(crate) async fn run_command(
    client: &AioClient,
    key: Option<&ConversationKey>,
    command: &str,
    exec_dir: &str,
    env: BTreeMap<String, String>,
    timeout: Duration,
    output_limit: usize,
) -> Result<CommandOutput> {
    let session_id = format!("sb-{}-{}", key.map_or("x", |k| k.as_str()), unique());
    let secs = timeout.as_secs_f64();
    let started = Instant::now();
    // The server kills the command at `hard_timeout`; the client gives up a little later.
    let deadline = started + timeout + Duration::from_secs(10);
    let req = BashExecRequest {
        command: command.to_owned(),
        session_id: Some(session_id.clone()),
        exec_dir: Some(exec_dir.to_owned()),
        env: Some(env),
        async_mode: false,
        timeout: Some(secs.min(30.0)),
        hard_timeout: Some(secs),
        max_output_length: 0,
    };
    let result = async {
        let first = client.bash_exec(&req).await?;
        let mut out = CommandOutput {
            status: first.status,
            exit_code: first.exit_code,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            client_timed_out: false,
        };
        append_capped(
            &mut out.stdout,
            first.stdout.as_deref().unwrap_or(""),
            output_limit,
            &mut out.stdout_truncated,
        );
        append_capped(
            &mut out.stderr,
            first.stderr.as_deref().unwrap_or(""),
            output_limit,
            &mut out.stderr_truncated,
        );
        let (mut offset, mut stderr_offset) = (first.offset, first.stderr_offset);
        while matches!(out.status, CommandStatus::Running | CommandStatus::Pending) {
            let now = Instant::now();
            if now >= deadline {
                let _ = client.bash_kill(&session_id, "SIGKILL").await;
                out.client_timed_out = true;
                break;
            }
            let wait = (deadline - now).as_secs_f64().clamp(0.1, 10.0);
            let o = client
                .bash_output(&BashOutputRequest {
                    session_id: session_id.clone(),
                    command_id: Some(first.command_id.clone()),
                    offset,
                    stderr_offset,
                    wait: true,
                    wait_timeout: wait,
                })
                .await?;
            append_capped(
                &mut out.stdout,
                &o.stdout,
                output_limit,
                &mut out.stdout_truncated,
            );
            append_capped(
                &mut out.stderr,
                &o.stderr,
                output_limit,
                &mut out.stderr_truncated,
            );
            offset = o.offset.max(offset);
            stderr_offset = o.stderr_offset.max(stderr_offset);
            if let Some(c) = o.command {
                out.status = c.status;
                out.exit_code = c.exit_code;
            }
        }
        Ok::<_, AioError>(out)
    }
    .await;
    // Close the session whatever happened: it ends what the command left behind and keeps the
    // server's session table small.
    if let Err(e) = client.bash_close(&session_id).await {
        tracing::debug!(session = %session_id, error = %e, "closing an aio bash session failed");
    }
    Ok(result?)
}

/// The most wrapper output a command with this output limit can give: both streams as base64
/// (one byte past the limit each) and the marker lines.
pub(crate) fn trailer_cap(limit: usize) -> usize {
    limit
        .saturating_add(1)
        .div_ceil(3)
        .saturating_mul(8)
        .saturating_add(1024)
}

/// Keeps at most `limit` bytes; true when some were cut.
pub(super) fn cut(mut data: Vec<u8>, limit: usize) -> (Vec<u8>, bool) {
    if data.len() > limit {
        data.truncate(limit);
        (data, true)
    } else {
        (data, false)
    }
}

/// A command's exact output as [`scripts::EXEC`] and [`scripts::COLLECT`] print it.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Trailer {
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: Vec<u8>,
}

impl Trailer {
    /// `None` unless `text` is the whole format, end marker included.
    pub(super) fn parse(text: &[u8]) -> Option<Trailer> {
        use base64::Engine as _;
        let text = std::str::from_utf8(text).ok()?;
        let mut lines = text.split('\n');
        let head = lines.next()?;
        let status = head.strip_prefix("sessionbox-aio:1 ")?;
        if status != "-" && status.parse::<i32>().is_err() {
            return None;
        }
        let b64 = base64::engine::general_purpose::STANDARD;
        let stdout = b64.decode(lines.next()?).ok()?;
        let stderr = b64.decode(lines.next()?).ok()?;
        if lines.next()? != "sessionbox-aio:end" || lines.any(|l| !l.is_empty()) {
            return None;
        }
        Some(Trailer { stdout, stderr })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailers_parse_only_when_whole() {
        let t = Trailer::parse(b"sessionbox-aio:1 3\nAP8=\n\nsessionbox-aio:end\n").unwrap();
        assert_eq!((t.stdout, t.stderr), (vec![0, 255], vec![]));
        assert!(Trailer::parse(b"sessionbox-aio:1 -\n\nZQ==\nsessionbox-aio:end\n").is_some());
        for bad in [
            &b""[..],
            b"sessionbox-aio:1 3\nAP8=\n",
            b"sessionbox-aio:1 3\nAP8=\n\n",
            b"sessionbox-aio:1 x\n\n\nsessionbox-aio:end\n",
            b"sessionbox-aio:1 0\n!!\n\nsessionbox-aio:end\n",
            b"noise\nsessionbox-aio:1 0\n\n\nsessionbox-aio:end\n",
        ] {
            assert!(Trailer::parse(bad).is_none(), "{bad:?}");
        }
        assert_eq!(cut(b"abc".to_vec(), 2), (b"ab".to_vec(), true));
        assert_eq!(cut(b"ab".to_vec(), 2), (b"ab".to_vec(), false));
        assert!(trailer_cap(1 << 20) > 2 * (((1 << 20) + 1) / 3 + 1) * 4);
    }
}
