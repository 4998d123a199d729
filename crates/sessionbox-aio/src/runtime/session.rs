//! An open `aio` conversation: [`AioSession`] and its [`Session`] operations (exec, files,
//! listing, search, background commands, archives).

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sessionbox_core::{
    ArchiveStats, BackgroundCommand, CommandOutput as BackgroundOutput, ConversationKey,
    ConversationRef, DirEntry, EditRequest, EditResult, Error, ExecRequest, ExecResult, ExitStatus,
    FileKind, FileStat, GrepMatch, GrepRequest, OutputRequest, Result, Session, WorkspacePath,
};

use crate::background::Commands;
use crate::client::{CommandStatus, FileGrepRequest};
use crate::scripts;

use super::command::{Trailer, cut, run_command, trailer_cap};
use super::{
    AioRuntime, Answer, MAX_COMMAND_BYTES, MAX_STDIN_BYTES, TOKEN_MARGIN, refusal, unique,
};

/// An open `aio` conversation.
pub(super) struct AioSession {
    pub(super) runtime: AioRuntime,
    pub(super) key: ConversationKey,
    pub(super) conversation: ConversationRef,
    pub(super) ws: String,
}

impl AioSession {
    fn resolve(&self, path: &str) -> Result<WorkspacePath> {
        WorkspacePath::resolve(&self.ws, path)
    }

    /// Checks a request and builds the wrapper's environment: the base environment, the
    /// gateway's proxy variables with a token for this command, the caller's variables, then
    /// `SB_WS`, `SB_CWD`, `SB_CMD` and `SB_STDIN` (base64) for [`scripts::EXEC`] and
    /// [`scripts::SPAWN`].
    async fn command_env(&self, request: &ExecRequest) -> Result<BTreeMap<String, String>> {
        request.validate()?;
        let cwd = match &request.cwd {
            Some(c) => self.resolve(c)?,
            None => WorkspacePath::root(),
        };
        if request.command.len() > MAX_COMMAND_BYTES {
            return Err(Error::InvalidRequest(format!(
                "the command is longer than {MAX_COMMAND_BYTES} bytes (the aio runtime's limit)"
            )));
        }
        let mut env = sessionbox_core::base_environment(&self.ws);
        if let Some(egress) = &self.runtime.egress {
            // The policy in force now; a token for this command alone.
            let network = egress.directory.network(&self.conversation).await?;
            let policy = sessionbox_egress::Policy::from_json(&network.json).map_err(|e| {
                Error::Backend(format!(
                    "the network policy of conversation {} cannot be used: {e}; set it again",
                    self.conversation.id
                ))
            })?;
            let ttl = request.timeout + TOKEN_MARGIN;
            env.extend(egress.gateway.command_env(self.key.as_str(), &policy, ttl));
        }
        // The caller's own variables come last and win (as on the other runtimes).
        env.extend(request.env.clone());
        env.insert("SB_WS".into(), self.ws.clone());
        env.insert("SB_CWD".into(), cwd.presented(&self.ws));
        env.insert("SB_CMD".into(), request.command.clone());
        if let Some(stdin) = &request.stdin {
            if stdin.len() > MAX_STDIN_BYTES {
                return Err(Error::InvalidRequest(format!(
                    "stdin is longer than {MAX_STDIN_BYTES} bytes (the aio runtime's limit)"
                )));
            }
            use base64::Engine as _;
            env.insert(
                "SB_STDIN".into(),
                base64::engine::general_purpose::STANDARD.encode(stdin),
            );
        }
        Ok(env)
    }

    fn background(&self) -> Commands<'_> {
        Commands::new(&self.runtime.client, &self.runtime.root, self.key.as_str())
    }

    /// Runs a check and returns its fields, or the refusal as an error naming `shown`.
    async fn check(
        &self,
        op: &str,
        path: &WorkspacePath,
        shown: &str,
        extra: &[(&str, &str)],
    ) -> Result<(Vec<String>, String)> {
        let (answer, rest) = self
            .runtime
            .file_op(&self.ws, op, &path.presented(&self.ws), extra)
            .await?;
        match answer {
            Answer::Ok(f) => Ok((f, rest)),
            Answer::Err { code, detail } => Err(refusal(&code, &detail, shown)),
        }
    }

    /// Writes `data` to the real path `real` in directory `dir` (from a `write` check):
    /// temporary file, then a checked rename.
    async fn write_checked(&self, path: &WorkspacePath, shown: &str, data: &[u8]) -> Result<()> {
        let (f, _) = self.check("write", path, shown, &[]).await?;
        let [real, dir] = f.as_slice() else {
            return Err(Error::Backend("the write check answered badly".into()));
        };
        let tmp = format!("{dir}/.sessionbox-tmp-{}", unique());
        self.runtime.client.write_file(&tmp, data).await?;
        let (answer, _) = self
            .runtime
            .file_op(&self.ws, "commit", real, &[("SB_TMP", &tmp)])
            .await?;
        match answer {
            Answer::Ok(_) => Ok(()),
            Answer::Err { code, detail } => Err(refusal(&code, &detail, shown)),
        }
    }

    async fn read_checked(&self, path: &WorkspacePath, shown: &str) -> Result<Vec<u8>> {
        let (f, _) = self.check("read", path, shown, &[]).await?;
        let [size, real] = f.as_slice() else {
            return Err(Error::Backend("the read check answered badly".into()));
        };
        let limit = self.runtime.limits.max_file_bytes;
        if size.parse::<u64>().unwrap_or(0) > limit {
            return Err(Error::TooLarge {
                what: format!("file {shown}"),
                limit,
            });
        }
        Ok(self.runtime.client.download(real, limit).await?)
    }

    /// Real path of a base directory (or file), the workspace's real path, and the symbolic
    /// links under it.
    async fn base(
        &self,
        path: &WorkspacePath,
        shown: &str,
    ) -> Result<(bool, String, String, HashSet<String>)> {
        let (f, rest) = self
            .check("base", path, shown, &[("SB_LINKS", "1")])
            .await?;
        let [kind, real, w] = f.as_slice() else {
            return Err(Error::Backend("the base check answered badly".into()));
        };
        let links = rest.lines().map(str::to_owned).collect();
        Ok((kind == "dir", real.clone(), w.clone(), links))
    }
}

/// True when `abs` (an absolute path under `base`) or one of its parents below `base` is in
/// `links`; `include_self` also tests `abs` itself.
fn through_link(abs: &str, base: &str, links: &HashSet<String>, include_self: bool) -> bool {
    if links.is_empty() {
        return false;
    }
    let mut cur = abs;
    if !include_self {
        match cur.rfind('/') {
            Some(i) => cur = &abs[..i],
            None => return false,
        }
    }
    while cur.len() > base.len() {
        if links.contains(cur) {
            return true;
        }
        match cur.rfind('/') {
            Some(i) => cur = &cur[..i],
            None => break,
        }
    }
    false
}

fn relative<'a>(abs: &'a str, w: &str) -> Option<&'a str> {
    abs.strip_prefix(w)?.strip_prefix('/')
}

fn compile_glob(pattern: &str) -> Result<globset::GlobMatcher> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| Error::InvalidRequest(format!("invalid glob pattern: {e}")))
}

fn parse_time(s: Option<&str>) -> i64 {
    let Some(s) = s else { return 0 };
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return t.timestamp();
    }
    chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f")
        .map(|t| t.and_utc().timestamp())
        .unwrap_or(0)
}

#[async_trait]
impl Session for AioSession {
    fn key(&self) -> &ConversationKey {
        &self.key
    }

    fn workspace_root(&self) -> &str {
        &self.ws
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecResult> {
        let mut env = self.command_env(&request).await?;
        // The command's output goes to files in a directory of its own and comes back as
        // base64 (see scripts::EXEC): AIO's JSON text cannot carry bytes that are not UTF-8.
        let out_dir = format!(
            "{}/{}/{}.{}",
            self.runtime.root,
            scripts::EXEC_OUTPUT_DIR,
            self.key.as_str(),
            unique()
        );
        let limit = request.output_limit;
        // One byte past the limit tells a stream that was cut from one that was exactly full.
        let read_limit = limit.saturating_add(1).to_string();
        env.insert("SB_OUT".into(), out_dir.clone());
        env.insert("SB_LIMIT".into(), read_limit.clone());
        let started = Instant::now();
        let out = run_command(
            &self.runtime.client,
            Some(&self.key),
            scripts::EXEC,
            &self.ws,
            env,
            request.timeout,
            trailer_cap(limit),
        )
        .await?;
        if out.exit_code == Some(scripts::EXEC_REFUSED) {
            let err = String::from_utf8_lossy(&out.stderr);
            let shown = request.cwd.as_deref().unwrap_or(".");
            match err.trim() {
                "sessionbox-aio:cwd-missing" => {
                    return Err(Error::NotFound(format!("working directory {shown}")));
                }
                "sessionbox-aio:cwd-outside" => {
                    return Err(Error::OutsideWorkspace {
                        path: shown.to_owned(),
                        reason: "a symbolic link leads out of the workspace".into(),
                    });
                }
                "sessionbox-aio:no-workspace" => {
                    return Err(Error::NotFound("the workspace no longer exists".into()));
                }
                "sessionbox-aio:no-output-dir" => {
                    return Err(Error::Backend(format!(
                        "cannot create the command's output directory {out_dir}"
                    )));
                }
                _ => {}
            }
        }
        let output = match Trailer::parse(&out.stdout) {
            Some(t) => t,
            // The wrapper was killed before it printed the output (timeout, kill): read what
            // the command left in its files.
            None => {
                let env = BTreeMap::from([
                    ("SB_OUT".to_owned(), out_dir),
                    ("SB_LIMIT".to_owned(), read_limit),
                ]);
                let c = run_command(
                    &self.runtime.client,
                    None,
                    scripts::COLLECT,
                    "/",
                    env,
                    Duration::from_secs(60),
                    trailer_cap(limit),
                )
                .await?;
                if c.stdout.starts_with(b"sessionbox-aio:gone") {
                    Trailer::default()
                } else {
                    Trailer::parse(&c.stdout).ok_or_else(|| {
                        Error::Backend(format!(
                            "the command's output could not be read back (exit {:?}): {}",
                            c.exit_code,
                            String::from_utf8_lossy(&c.stderr)
                                .trim()
                                .chars()
                                .take(300)
                                .collect::<String>()
                        ))
                    })?
                }
            }
        };
        let duration = started.elapsed();
        let timed_out = out.client_timed_out || out.status == CommandStatus::TimedOut;
        let status = match (out.status, out.exit_code) {
            _ if timed_out => ExitStatus::Signal(9),
            // The wrapper's shell reports a command killed by signal N as 128+N (it cannot tell
            // that from `exit 128+N`); the other runtimes report the signal, and so does this.
            (_, Some(c)) if (129..=192).contains(&c) => ExitStatus::Signal(c - 128),
            (_, Some(c)) => ExitStatus::Code(c),
            (_, None) => ExitStatus::Signal(9),
        };
        let (stdout, stdout_truncated) = cut(output.stdout, limit);
        let (stderr, stderr_truncated) = cut(output.stderr, limit);
        Ok(ExecResult {
            status,
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
            timed_out,
            duration,
        })
    }

    async fn read(&self, path: &str) -> Result<Vec<u8>> {
        let p = self.resolve(path)?;
        self.read_checked(&p, path).await
    }

    async fn write(&self, path: &str, data: &[u8]) -> Result<()> {
        let p = self.resolve(path)?;
        if p.is_root() {
            return Err(Error::Conflict(format!("{path}: is the workspace root")));
        }
        let limit = self.runtime.limits.max_file_bytes;
        if data.len() as u64 > limit {
            return Err(Error::TooLarge {
                what: "file data".into(),
                limit,
            });
        }
        self.write_checked(&p, path, data).await
    }

    async fn edit(&self, path: &str, edit: &EditRequest) -> Result<EditResult> {
        let p = self.resolve(path)?;
        if edit.old.is_empty() {
            return Err(Error::InvalidRequest(sessionbox_core::EDIT_EMPTY.into()));
        }
        let bytes = self.read_checked(&p, path).await?;
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::Conflict(format!("{path}: is not UTF-8 text")))?;
        let count = text.matches(&edit.old).count();
        if count == 0 {
            return Err(Error::Conflict(format!(
                "{} in {path}",
                sessionbox_core::EDIT_ABSENT
            )));
        }
        if count > 1 && !edit.replace_all {
            return Err(Error::Conflict(format!(
                "{} {count} times in {path}",
                sessionbox_core::EDIT_AMBIGUOUS
            )));
        }
        let new = if edit.replace_all {
            text.replace(&edit.old, &edit.new)
        } else {
            text.replacen(&edit.old, &edit.new, 1)
        };
        self.write_checked(&p, path, new.as_bytes()).await?;
        Ok(EditResult {
            replacements: if edit.replace_all { count } else { 1 },
        })
    }

    async fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        let p = self.resolve(path)?;
        let (is_dir, real, _, _) = self.base(&p, path).await?;
        if !is_dir {
            return Err(Error::Conflict(format!("{path}: is not a directory")));
        }
        let files = self.runtime.client.list(&real).await?;
        if files.len() > self.runtime.limits.max_entries {
            return Err(Error::TooLarge {
                what: format!(
                    "the listing of {path} is too large: more than {} entries",
                    self.runtime.limits.max_entries
                ),
                limit: u64::MAX,
            });
        }
        let mut out: Vec<DirEntry> = files
            .into_iter()
            .map(|f| DirEntry {
                name: f.name,
                kind: if f.is_directory {
                    FileKind::Directory
                } else {
                    FileKind::File
                },
                size: f.size.unwrap_or(0),
                modified_unix: parse_time(f.modified_time.as_deref()),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn glob(&self, pattern: &str) -> Result<Vec<String>> {
        sessionbox_core::check_glob(&self.ws, pattern)?;
        let norm = WorkspacePath::resolve(&self.ws, pattern)?;
        let matcher = compile_glob(norm.as_str())?;
        let (_, real, w, links) = self.base(&WorkspacePath::root(), ".").await?;
        let max = self.runtime.limits.max_entries;
        let (files, truncated) = self
            .runtime
            .client
            .glob(&real, norm.as_str(), max as u64 + 1)
            .await?;
        let mut out: Vec<String> = files
            .iter()
            .filter(|f| !f.is_directory)
            .filter(|f| !through_link(&f.path, &w, &links, false))
            .filter_map(|f| relative(&f.path, &w))
            .filter(|rel| matcher.is_match(rel))
            .map(str::to_owned)
            .collect();
        if truncated || out.len() > max {
            return Err(Error::TooLarge {
                what: format!("the matches of {pattern:?}"),
                limit: max as u64,
            });
        }
        out.sort();
        Ok(out)
    }

    async fn grep(&self, request: &GrepRequest) -> Result<Vec<GrepMatch>> {
        sessionbox_core::check_grep(&self.ws, request)?;
        let p = match &request.path {
            Some(path) => self.resolve(path)?,
            None => WorkspacePath::root(),
        };
        let filter = match &request.glob {
            Some(g) => Some(compile_glob(WorkspacePath::resolve(&self.ws, g)?.as_str())?),
            None => None,
        };
        let shown = request.path.as_deref().unwrap_or(".");
        let (_, real, w, links) = self.base(&p, shown).await?;
        let limits = self.runtime.limits;
        let max = request
            .max_matches
            .unwrap_or(limits.max_matches)
            .min(limits.max_matches);
        let result = self
            .runtime
            .client
            .grep(&FileGrepRequest {
                path: real,
                pattern: request.pattern.clone(),
                case_insensitive: request.case_insensitive,
                max_results: (max as u64).clamp(1, 10_000),
                max_file_size: format!("{}K", limits.max_grep_file_bytes.div_ceil(1024)),
            })
            .await?;
        let mut out = Vec::new();
        for m in result.matches {
            if through_link(&m.file, &w, &links, true) {
                continue;
            }
            let Some(rel) = relative(&m.file, &w) else {
                continue;
            };
            if let Some(f) = &filter
                && !f.is_match(rel)
            {
                continue;
            }
            let mut line = m.line_content;
            if line.len() > 4096 {
                let mut cut = 4096;
                while !line.is_char_boundary(cut) {
                    cut -= 1;
                }
                line.truncate(cut);
            }
            out.push(GrepMatch {
                path: rel.to_owned(),
                line_number: m.line_number,
                line,
            });
            if out.len() >= max {
                break;
            }
        }
        Ok(out)
    }

    async fn stat(&self, path: &str) -> Result<FileStat> {
        let p = self.resolve(path)?;
        let (f, _) = self.check("stat", &p, path, &[]).await?;
        let fields: Vec<&str> = f
            .first()
            .map(|s| s.split('|').collect())
            .unwrap_or_default();
        let [kind, size, mode, mtime] = fields.as_slice() else {
            return Err(Error::Backend("the stat check answered badly".into()));
        };
        let kind = match *kind {
            "regular file" | "regular empty file" => FileKind::File,
            "directory" => FileKind::Directory,
            "symbolic link" => FileKind::Symlink,
            _ => FileKind::Other,
        };
        Ok(FileStat {
            path: p.presented(&self.ws),
            kind,
            size: size.parse().unwrap_or(0),
            mode: u32::from_str_radix(mode, 8).unwrap_or(0),
            modified_unix: mtime.parse().unwrap_or(0),
        })
    }

    async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        let p = self.resolve(path)?;
        if p.is_root() {
            return Err(Error::Conflict(
                "the workspace root cannot be removed; destroy the conversation".into(),
            ));
        }
        let r = if recursive { "1" } else { "0" };
        self.check("remove", &p, path, &[("SB_RECURSIVE", r)])
            .await
            .map(drop)
    }

    async fn mkdir(&self, path: &str) -> Result<()> {
        let p = self.resolve(path)?;
        self.check("mkdir", &p, path, &[]).await.map(drop)
    }

    async fn spawn(&self, request: ExecRequest) -> Result<BackgroundCommand> {
        if request.keep_stdin_open {
            return Err(sessionbox_core::live_stdin_unsupported("aio"));
        }
        let env = self.command_env(&request).await?;
        self.background().spawn(env, &request).await
    }

    async fn commands(&self) -> Result<Vec<BackgroundCommand>> {
        self.background().list().await
    }

    async fn command(&self, id: &str) -> Result<BackgroundCommand> {
        self.background().get(id).await
    }

    async fn command_output(&self, id: &str, read: OutputRequest) -> Result<BackgroundOutput> {
        self.background().output(id, read).await
    }

    async fn kill_command(&self, id: &str) -> Result<BackgroundCommand> {
        self.background().kill(id).await
    }

    async fn archive_workspace(
        &self,
        to: &std::path::Path,
        max_bytes: u64,
    ) -> Result<ArchiveStats> {
        self.archive(to, max_bytes).await
    }

    async fn restore_workspace(&self, from: &std::path::Path) -> Result<ArchiveStats> {
        self.restore(from).await
    }

    async fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_through_links_are_found() {
        let links: HashSet<String> = ["/w/l".to_owned()].into();
        assert!(through_link("/w/l/secret", "/w", &links, false));
        assert!(!through_link("/w/l", "/w", &links, false));
        assert!(through_link("/w/l", "/w", &links, true));
        assert!(!through_link("/w/lx/a", "/w", &links, true));
    }

    #[test]
    fn iso_times_parse() {
        assert_eq!(parse_time(Some("1970-01-01T00:01:00")), 60);
        assert_eq!(parse_time(Some("1970-01-01T00:01:00.5+00:00")), 60);
        assert_eq!(parse_time(None), 0);
    }
}
