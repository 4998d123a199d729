//! Running one MCP tool call: its arguments checked before anything is opened, then the
//! operation on the conversation's session (in its turn, as a REST call), and the text the
//! model reads back.

use std::time::Duration;

use chrono::Utc;
use rmcp::model::JsonObject;
use sessionbox_core::{
    ConversationRef, EditRequest, Error, ExecRequest, FileKind, GrepRequest, OpenMode, Operation,
    Refusal, Session,
};

use super::schema::{
    BashArgs, DEFAULT_NETWORK_VERDICTS, EditArgs, GlobArgs, GrepArgs, LsArgs, MAX_NETWORK_VERDICTS,
    NetworkArgs, PreviewArgs, ReadArgs, SkillArgs, WriteArgs, args,
};
use super::{Caller, Tools};
use crate::AppState;

/// Most characters of `bash` output before it is cut.
const MAX_OUTPUT_CHARS: usize = 30_000;
/// Lines `read` returns by default.
const DEFAULT_READ_LINES: usize = 2000;
/// Characters of one line `read` returns.
const MAX_LINE_CHARS: usize = 2000;

/// With `expired` (the conversation's last incarnation expired then, and this call found it
/// gone or made it anew), `result` carries a note saying so first, so that the model never
/// takes an empty workspace for its old one.
fn expired_note(
    result: Result<String, Error>,
    expired: Option<chrono::DateTime<Utc>>,
) -> Result<String, Error> {
    let Some(at) = expired else {
        return result;
    };
    let note = format!(
        "Note: this conversation expired at {} and its files are gone; it starts again empty.",
        at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    match result {
        Ok(text) => Ok(format!("{note}\n{text}")),
        Err(Error::NotFound(m)) => Err(Error::NotFound(format!("{m}. {note}"))),
        Err(e) => Err(e),
    }
}

/// What the model can do about `bash` output that was cut.
const BASH_HINT: &str = "to see all of it, redirect the output to a file (`CMD > out.txt 2>&1`), \
                         then page through it with `read` (offset, limit) or search it with `grep`";
/// What the model can do about `grep` output that was cut.
const GREP_HINT: &str = "narrow the search with `path` or `glob`, or use output_mode \
                         files_with_matches or count";

/// Cuts `s` to `max` characters, saying so and what to do next (`hint`).
fn cut(s: &str, max: usize, hint: &str) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((i, _)) => format!(
            "{}\n... [output truncated: {} more characters; {hint}]",
            &s[..i],
            s[i..].chars().count()
        ),
    }
}

/// `content` as `cat -n` would number it, from line `offset` (1-based), `limit` lines.
/// `cat -n` of lines `offset..offset + limit` (1-based) of a file's `bytes`, of its `total`
/// lines, each cut at [`MAX_LINE_CHARS`]. Only the lines shown become text (invalid UTF-8
/// replaced), so a file is never copied whole; a line ends at `\n`, a `\r` before it dropped,
/// as [`str::lines`] does.
fn numbered_lines(bytes: &[u8], offset: usize, limit: usize, total: usize) -> String {
    let mut out = String::new();
    let shown = limit.min(total.saturating_sub(offset - 1));
    for (n, line) in bytes
        .split(|b| *b == b'\n')
        .enumerate()
        .skip(offset - 1)
        .take(shown)
    {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let text = String::from_utf8_lossy(line);
        let text = match text.char_indices().nth(MAX_LINE_CHARS) {
            Some((i, _)) => &text[..i],
            None => &text,
        };
        out.push_str(&format!("{:>6}\t{text}\n", n + 1));
    }
    out
}

impl Tools {
    /// Runs tool `name` on the caller's conversation, holding its turn.
    pub(super) async fn run(
        &self,
        caller: &Caller,
        name: &str,
        a: Option<JsonObject>,
    ) -> Result<String, Error> {
        let state = &self.state;
        let conv = &caller.conversation;
        // Parse and check everything before opening: bad input creates nothing.
        if name == "skill" {
            // Reads the host's skills catalog: no turn, no conversation opened.
            return Self::skill(state, conv, args(name, a)?).await;
        }
        if name == "network" {
            // Reads the store: no turn, no conversation opened, nothing written.
            let a: NetworkArgs = args(name, a).map_err(|_| {
                Error::InvalidRequest(
                    "`network` is read-only and takes only `limit`: the network policy is set \
                     by the operator, and no tool can change it"
                        .into(),
                )
            })?;
            return Self::network(state, conv, a).await;
        }
        if name == "preview" {
            // Issues a link: the conversation is opened only to learn that it exists and
            // runs an agent; nothing in it changes.
            let a: PreviewArgs = args(name, a)?;
            let link = crate::routes::preview::issue_link(
                state,
                &caller.principal,
                conv,
                a.port,
                a.ttl_secs,
            )
            .await?;
            return Ok(format!(
                "Port {} of this sandbox is reachable at this server's path {} (open it in a \
                 browser, no key needed; relative links work, absolute ones (/...) do not) until \
                 {}. Whoever has the link can see what that port serves: give it only to the \
                 user. Nothing answers until a command in the sandbox listens on the port (on \
                 127.0.0.1 or 0.0.0.0), e.g. run `python3 -m http.server {} &` with bash.",
                link.port,
                link.path,
                link.expires_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                link.port
            ));
        }
        let op = match name {
            "bash" => {
                let b: BashArgs = args(name, a)?;
                let mut req = ExecRequest::new(b.command);
                if let Some(cwd) = b.cwd {
                    state.manager.check_path(conv, &cwd)?;
                    req.cwd = Some(cwd);
                }
                req.timeout = Duration::from_millis(b.timeout.unwrap_or(120_000));
                req.validate()?;
                Run::Bash(req)
            }
            "read" => {
                let r: ReadArgs = args(name, a)?;
                state.manager.check_path(conv, &r.path)?;
                Run::Read(r)
            }
            "write" => {
                let w: WriteArgs = args(name, a)?;
                state.manager.check_path(conv, &w.path)?;
                Run::Write(w)
            }
            "edit" => {
                let e: EditArgs = args(name, a)?;
                state.manager.check_path(conv, &e.path)?;
                Run::Edit(e)
            }
            "ls" => {
                let l: LsArgs = args(name, a)?;
                let p = l.path.unwrap_or_else(|| ".".to_owned());
                let root = state.manager.check_path(conv, &p)?.is_root();
                Run::Ls(p, root)
            }
            "glob" => Run::Glob(args::<GlobArgs>(name, a)?.pattern),
            "grep" => {
                let g: GrepArgs = args(name, a)?;
                if let Some(p) = &g.path {
                    state.manager.check_path(conv, p)?;
                }
                let mode = g
                    .output_mode
                    .unwrap_or_else(|| "files_with_matches".to_owned());
                if !matches!(mode.as_str(), "content" | "files_with_matches" | "count") {
                    return Err(Error::InvalidRequest(format!(
                        "output_mode must be content, files_with_matches or count, not {mode:?}"
                    )));
                }
                let mut req = GrepRequest::new(g.pattern);
                req.path = g.path;
                req.glob = g.glob;
                req.case_insensitive = g.case_insensitive;
                Run::Grep(req, mode)
            }
            other => {
                return Err(Error::InvalidRequest(format!(
                    "no tool named {other:?}; the tools are bash, read, write, edit, ls, glob, grep, skill, network, preview"
                )));
            }
        };
        // The output's budget, before anything is opened (only `bash` runs a command).
        let _reservation = match &op {
            Run::Bash(req) => Some(state.budget.reserve(&conv.tenant, req.output_limit)?),
            _ => None,
        };
        let operation = op.operation();
        // What the model sees when the conversation does not exist yet: an empty workspace
        // (nothing is created until bash or write).
        let if_absent = (operation.open_mode() == OpenMode::ExistingOnly).then(|| Self::empty(&op));
        // The conversation's turn, then its session (kept between calls, as for REST).
        let outcome = state
            .with_conversation(conv, operation, async |opened| {
                let expired = opened.previous_expired_at();
                let budget = (&state.budget, &conv.tenant);
                expired_note(Self::apply(opened.conv, op, budget).await, expired)
            })
            .await;
        match (outcome, if_absent) {
            (Ok(result), _) => result,
            (Err(error), Some(empty)) if error.code() == "not_found" => {
                // An expired conversation is empty too, and the model is told why.
                let expired = Self::expired_at(state, conv).await;
                expired_note(empty, expired)
            }
            (Err(error), _) => Err(error),
        }
    }

    /// When `conv`'s record expired, if it is past its expiry (not yet destroyed).
    async fn expired_at(state: &AppState, conv: &ConversationRef) -> Option<chrono::DateTime<Utc>> {
        let key = conv.key.clone();
        let record = state
            .manager
            .store()
            .run(move |s| s.get(&key))
            .await
            .ok()??;
        record
            .is_expired(state.manager.store().now())
            .then_some(record.expires_at)
            .flatten()
    }

    /// What `op` finds in an empty workspace: a conversation that does not exist yet.
    fn empty(op: &Run) -> Result<String, Error> {
        let missing = |path: &str| Err(Error::NotFound(path.to_owned()));
        match op {
            Run::Ls(p, true) => Ok(format!("{p} is empty")),
            Run::Ls(p, false) => missing(p),
            Run::Read(a) => missing(&a.path),
            Run::Edit(e) => missing(&e.path),
            Run::Glob(_) => Ok("No files found".to_owned()),
            Run::Grep(req, _) => match &req.path {
                Some(p) => missing(p),
                None => Ok("No matches found".to_owned()),
            },
            // They create the conversation, so they never get here.
            Run::Bash(_) | Run::Write(_) => Err(Error::Backend(
                "a creating operation found no conversation".into(),
            )),
        }
    }

    async fn skill(
        state: &AppState,
        conv: &ConversationRef,
        a: SkillArgs,
    ) -> Result<String, Error> {
        match a.name {
            None => {
                let skills = crate::skills::list_for(state, conv).await?;
                if skills.is_empty() {
                    return Ok("No skills are available.".to_owned());
                }
                let mut out = String::from("Available skills (load one with `name`):\n");
                for k in skills {
                    out.push_str(&format!("- {}: {}\n", k.name, k.description));
                }
                Ok(out)
            }
            Some(name) => {
                let k = crate::skills::load(state, conv, &name).await?;
                Ok(format!(
                    "Skill: {}\nBase directory: {}\n(Paths in these instructions are relative to it.)\n\n{}",
                    k.name, k.base_path, k.body
                ))
            }
        }
    }

    async fn network(
        state: &AppState,
        conv: &ConversationRef,
        a: NetworkArgs,
    ) -> Result<String, Error> {
        let limit = a.limit.unwrap_or(DEFAULT_NETWORK_VERDICTS);
        if limit == 0 || limit > MAX_NETWORK_VERDICTS {
            return Err(Error::InvalidRequest(format!(
                "limit must be between 1 and {MAX_NETWORK_VERDICTS}"
            )));
        }
        let (policy, view) = crate::policy::in_force(state, conv).await?;
        let source = match view.source {
            crate::policy::PolicySource::Conversation => "set for this conversation",
            crate::policy::PolicySource::Tenant => "set for the tenant",
            crate::policy::PolicySource::Default => "the default",
        };
        let mut out = format!(
            "Network policy: {} ({source}), hash {}\n",
            policy.profile(),
            view.hash
        );
        if policy.is_none() {
            out.push_str("No network at all: nothing outside this sandbox can be reached.\n");
        } else {
            out.push_str(&format!("Allowed: {}\n", view.allow.join(", ")));
            if !view.deny.is_empty() {
                out.push_str(&format!("Denied: {}\n", view.deny.join(", ")));
            }
            out.push_str(
                "Connections go through the egress proxy in HTTP_PROXY/HTTPS_PROXY; loopback, \
                 link-local (cloud metadata) and private addresses stay blocked unless a rule \
                 names them.\n",
            );
        }
        out.push_str("The operator sets this policy; no tool can change it.\n");
        let verdicts =
            crate::policy::verdicts(state, &conv.tenant, Some(conv), None, limit).await?;
        if verdicts.is_empty() {
            out.push_str("\nNo connections recorded yet.");
            return Ok(out);
        }
        out.push_str(&format!(
            "\nRecent connections (newest first, {}):\n",
            verdicts.len()
        ));
        for v in verdicts {
            let mut line = format!(
                "{} {} {} {} ({})",
                v.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                v.verdict,
                v.method,
                v.target,
                v.rule
            );
            if v.verdict == "allowed" {
                line.push_str(&format!(", {} B up, {} B down", v.bytes_up, v.bytes_down));
                if let Some(end) = &v.end {
                    line.push_str(&format!(", {end}"));
                }
            }
            out.push_str(&line);
            out.push('\n');
        }
        Ok(out)
    }

    async fn apply(
        session: &dyn Session,
        op: Run,
        budget: (
            &std::sync::Arc<crate::budget::OutputBudget>,
            &sessionbox_core::TenantId,
        ),
    ) -> Result<String, Error> {
        match op {
            Run::Bash(req) => {
                let timeout_ms = req.timeout.as_millis();
                let r = session.exec(req).await?;
                let mut text = model_text("stdout", &r.stdout);
                let stderr = model_text("stderr", &r.stderr);
                if !stderr.is_empty() {
                    if !text.is_empty() && !text.ends_with('\n') {
                        text.push('\n');
                    }
                    text.push_str(&stderr);
                }
                let mut text = cut(&text, MAX_OUTPUT_CHARS, BASH_HINT);
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                if r.stdout_truncated || r.stderr_truncated {
                    // The runtime kept only the first bytes of a stream.
                    text.push_str(&format!(
                        "[the command printed more than this server keeps of its output; \
                         {BASH_HINT}]\n"
                    ));
                }
                if r.timed_out {
                    text.push_str(&format!("Command timed out after {timeout_ms} ms\n"));
                }
                text.push_str(&format!("Exit code: {}", r.shell_exit_code()));
                Ok(text)
            }
            Run::Read(a) => {
                // The whole file is in memory while its lines are picked: counted in the
                // tenant's budget first (a file that cannot be stat-ed is refused by the read).
                let size = session.stat(&a.path).await.map_or(0, |s| s.size);
                let (budget, tenant) = budget;
                let _held =
                    budget.reserve_body(tenant, usize::try_from(size).unwrap_or(usize::MAX))?;
                let bytes = session.read(&a.path).await?;
                let offset = a.offset.unwrap_or(1).max(1);
                let limit = a.limit.unwrap_or(DEFAULT_READ_LINES).max(1);
                // Only the lines shown become text (a lossy copy of the whole file could be
                // three times its size).
                let total = bytes.split(|b| *b == b'\n').count()
                    - usize::from(bytes.is_empty() || bytes.ends_with(b"\n"));
                if total == 0 {
                    return Ok(format!("{} is empty", a.path));
                }
                if offset > total {
                    return Err(Error::InvalidRequest(format!(
                        "offset {offset} is past the end of {} ({total} lines)",
                        a.path
                    )));
                }
                let mut out = numbered_lines(&bytes, offset, limit, total);
                let last = (offset - 1 + limit).min(total);
                if last < total {
                    out.push_str(&format!(
                        "... [{} more lines; read on with offset {}]\n",
                        total - last,
                        last + 1
                    ));
                }
                Ok(out)
            }
            Run::Write(w) => {
                session.write(&w.path, w.content.as_bytes()).await?;
                Ok(format!("Wrote {} bytes to {}", w.content.len(), w.path))
            }
            Run::Edit(e) => {
                let r = session
                    .edit(
                        &e.path,
                        &EditRequest {
                            old: e.old_string,
                            new: e.new_string,
                            replace_all: e.replace_all,
                        },
                    )
                    .await
                    .map_err(|e| {
                        let advice = match e.refusal() {
                            Some(Refusal::EditAbsent) => {
                                "read the file and copy its exact text into old_string"
                            }
                            Some(Refusal::EditAmbiguous) => {
                                "give more context in old_string, or set replace_all to true"
                            }
                            Some(Refusal::EditEmpty) => "give the exact text in old_string",
                            _ => return e,
                        };
                        e.with_advice(advice)
                    })?;
                Ok(format!(
                    "Replaced {} occurrence{} in {}",
                    r.replacements,
                    if r.replacements == 1 { "" } else { "s" },
                    e.path
                ))
            }
            Run::Ls(p, _) => {
                let mut entries = session.list(&p).await?;
                entries.sort_by(|a, b| a.name.cmp(&b.name));
                if entries.is_empty() {
                    return Ok(format!("{p} is empty"));
                }
                Ok(entries
                    .iter()
                    .map(|e| match e.kind {
                        FileKind::Directory => format!("{}/", e.name),
                        _ => e.name.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join("\n"))
            }
            Run::Glob(pattern) => {
                let found = session.glob(&pattern).await?;
                if found.is_empty() {
                    return Ok("No files found".to_owned());
                }
                Ok(found.join("\n"))
            }
            Run::Grep(req, mode) => {
                let matches = session.grep(&req).await?;
                if matches.is_empty() {
                    return Ok("No matches found".to_owned());
                }
                let text = match mode.as_str() {
                    "content" => matches
                        .iter()
                        .map(|m| format!("{}:{}:{}", m.path, m.line_number, m.line))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    "count" => {
                        let mut counts: Vec<(String, usize)> = Vec::new();
                        for m in &matches {
                            match counts.last_mut() {
                                Some((p, n)) if *p == m.path => *n += 1,
                                _ => counts.push((m.path.clone(), 1)),
                            }
                        }
                        counts
                            .iter()
                            .map(|(p, n)| format!("{p}:{n}"))
                            .collect::<Vec<_>>()
                            .join("\n")
                    }
                    _ => {
                        let mut paths: Vec<&str> = Vec::new();
                        for m in &matches {
                            if paths.last() != Some(&m.path.as_str()) {
                                paths.push(&m.path);
                            }
                        }
                        paths.join("\n")
                    }
                };
                Ok(cut(&text, MAX_OUTPUT_CHARS, GREP_HINT))
            }
        }
    }
}

/// A checked operation, ready to run on an open session.
enum Run {
    Bash(ExecRequest),
    Read(ReadArgs),
    Write(WriteArgs),
    Edit(EditArgs),
    /// The path as given, and whether it is the workspace root.
    Ls(String, bool),
    Glob(String),
    Grep(GrepRequest, String),
}

impl Run {
    /// The operation this tool call is: whether it may create the conversation follows.
    fn operation(&self) -> Operation {
        match self {
            Run::Bash(_) => Operation::Exec,
            Run::Read(_) => Operation::Read,
            Run::Write(_) => Operation::Write,
            Run::Edit(_) => Operation::Edit,
            Run::Ls(..) => Operation::List,
            Run::Glob(_) => Operation::Glob,
            Run::Grep(..) => Operation::Grep,
        }
    }
}

/// A command's output stream as the model reads it: the text when the bytes are valid UTF-8;
/// otherwise a line saying so, with the exact bytes in base64 (standard alphabet) so that
/// nothing is lost, or only the line when the base64 would not fit in a tool result.
fn model_text(name: &str, bytes: &[u8]) -> String {
    use base64::Engine;
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => {
            let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
            if encoded.len() <= MAX_OUTPUT_CHARS / 2 {
                format!(
                    "[{name} is not valid UTF-8: {} bytes, shown as base64]\n{encoded}\n",
                    bytes.len()
                )
            } else {
                format!(
                    "[{name} is not valid UTF-8: {} bytes, too many to show; redirect it to a \
                     file and read that]\n",
                    bytes.len()
                )
            }
        }
    }
}
