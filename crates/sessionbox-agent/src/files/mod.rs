//! The file and directory endpoints, each a thin layer over [`sessionbox_fs::Workspace`].
//!
//! Every path passes the workspace path policy and is resolved beneath the root descriptor; the
//! only thing done here besides calling the workspace is reading metadata for `FileInfo`
//! (`fstatat(AT_SYMLINK_NOFOLLOW)` of one name in a parent directory that the workspace opened
//! beneath the root). Every path is validated before anything is changed, so a request with one
//! bad path changes nothing.
//!
//! Paths are read as upstream reads them for `~`: a leading `~` or `~/` is the workspace root
//! (commands' `HOME`), by [`Workspace::with_home_expansion`]; `$NAME` stays literal. Once a
//! path is resolved it is handed back to the workspace presented (absolute), never relative, so
//! an entry literally named `~` is not read as the root a second time.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use rustix::fs::{AtFlags, FileType as RawType};
use sessionbox_core::{EditRequest, Error, FileKind, WorkspacePath};
use sessionbox_execd::wire::query;
use sessionbox_execd::{
    FileInfo, FileType, RenameFileItem, ReplaceFileContentItem, ReplaceFileContentResult,
    mode_from_wire, mode_to_wire,
};
use sessionbox_fs::Workspace;

use crate::server::{
    ApiError, AppState, blocking, json_body, ok_empty, query_all, query_one, query_pairs,
};

mod transfer;

pub(crate) use transfer::{download, upload};

/// User and group names by id, read from `/etc/passwd` and `/etc/group` once per request.
#[derive(Default)]
struct Names {
    users: Option<HashMap<u32, String>>,
    groups: Option<HashMap<u32, String>>,
}

impl Names {
    fn user(&mut self, uid: u32) -> String {
        self.users
            .get_or_insert_with(|| read_id_file("/etc/passwd"))
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    fn group(&mut self, gid: u32) -> String {
        self.groups
            .get_or_insert_with(|| read_id_file("/etc/group"))
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

/// `name:x:id:...` lines of a passwd-style file.
fn read_id_file(path: &str) -> HashMap<u32, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let id = f.nth(1)?.parse().ok()?;
            Some((id, name.to_owned()))
        })
        .collect()
}

/// Metadata of `rel` itself (a final link is not followed), found beneath the root.
fn lstat(ws: &Workspace, rel: &WorkspacePath) -> Result<rustix::fs::Stat, Error> {
    let shown = rel.as_relative();
    let map = |e: rustix::io::Errno| match e {
        rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR => {
            Error::NotFound(format!("file {shown}"))
        }
        e => Error::Backend(format!("cannot stat {shown}: {e}")),
    };
    match (rel.parent(), rel.file_name()) {
        (Some(parent), Some(name)) => {
            let dir = ws.open_dir(&at(ws, &parent))?;
            rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(map)
        }
        _ => {
            let dir = ws.open_dir(ws.presented_root())?;
            rustix::fs::fstat(&dir).map_err(map)
        }
    }
}

/// `rel` as an absolute presented path, to hand a resolved path back to the workspace.
fn at(ws: &Workspace, rel: &WorkspacePath) -> String {
    rel.presented(ws.presented_root())
}

fn time_of(secs: i64, nanos: i64) -> String {
    DateTime::<Utc>::from_timestamp(secs, u32::try_from(nanos).unwrap_or(0))
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// `FileInfo` of `rel` as upstream builds it: the entry itself (links not followed), permission
/// bits as octal digits, owner and group by name (the number when unknown).
#[allow(clippy::unnecessary_cast)] // the stat field types differ between architectures
fn file_info(ws: &Workspace, rel: &WorkspacePath, names: &mut Names) -> Result<FileInfo, Error> {
    let st = lstat(ws, rel)?;
    let kind = match RawType::from_raw_mode(st.st_mode as _) {
        RawType::RegularFile => FileType::File,
        RawType::Directory => FileType::Directory,
        RawType::Symlink => FileType::Symlink,
        _ => FileType::Other,
    };
    Ok(FileInfo {
        path: rel.presented(ws.presented_root()),
        kind: Some(kind),
        size: st.st_size.max(0) as u64,
        modified_at: time_of(st.st_mtime as i64, st.st_mtime_nsec as i64),
        created_at: time_of(st.st_ctime as i64, st.st_ctime_nsec as i64),
        owner: names.user(st.st_uid as u32),
        group: names.group(st.st_gid as u32),
        mode: mode_to_wire((st.st_mode as u32) & 0o777),
    })
}

/// Resolves every path first, so one bad path fails the request before anything changes.
fn resolve_all(ws: &Workspace, paths: &[String]) -> Result<Vec<WorkspacePath>, ApiError> {
    paths
        .iter()
        .map(|p| ws.resolve(p).map_err(ApiError::from))
        .collect()
}

fn owned(v: Vec<&str>) -> Vec<String> {
    v.into_iter().map(str::to_owned).collect()
}

/// `GET /files/info?path=...`: map of each path as given to its `FileInfo`; 404 when one is
/// missing.
pub(crate) async fn info(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let pairs = query_pairs(&req);
    let paths = owned(query_all(&pairs, query::PATH));
    let ws = state.ws.clone();
    respond(
        blocking(move || {
            let rels = resolve_all(&ws, &paths)?;
            let mut names = Names::default();
            let mut out = BTreeMap::new();
            for (p, rel) in paths.iter().zip(&rels) {
                out.insert(p.clone(), file_info(&ws, rel, &mut names)?);
            }
            Ok(axum::Json(out).into_response())
        })
        .await,
    )
}

fn respond(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

/// `DELETE /files?path=...`: removes files and links (never their targets); a missing path is
/// fine (as upstream); a directory is refused (use `DELETE /directories`).
pub(crate) async fn remove_files(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let pairs = query_pairs(&req);
    let paths = owned(query_all(&pairs, query::PATH));
    let ws = state.ws.clone();
    respond(
        blocking(move || {
            let rels = resolve_all(&ws, &paths)?;
            for rel in &rels {
                match lstat(&ws, rel) {
                    Err(Error::NotFound(_)) => continue,
                    Err(e) => return Err(e.into()),
                    Ok(st) if RawType::from_raw_mode(st.st_mode as _) == RawType::Directory => {
                        return Err(Error::Conflict(format!(
                            "{} is a directory; use DELETE /directories",
                            rel.as_relative()
                        ))
                        .into());
                    }
                    Ok(_) => {}
                }
                match ws.remove(&at(&ws, rel), false) {
                    Ok(()) | Err(Error::NotFound(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(ok_empty())
        })
        .await,
    )
}

/// `POST /files/mv`: renames each `{src, dest}` in order; missing parents of `dest` are
/// created; an existing `dest` is refused (as upstream).
pub(crate) async fn move_files(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let items: Vec<RenameFileItem> = match json_body(&state, req).await {
        Ok(i) => i,
        Err(e) => return e.into_response(),
    };
    let ws = state.ws.clone();
    respond(
        blocking(move || {
            let mut pairs = Vec::with_capacity(items.len());
            for i in &items {
                pairs.push((ws.resolve(&i.src)?, ws.resolve(&i.dest)?));
            }
            for (src, dest) in &pairs {
                match lstat(&ws, dest) {
                    Err(Error::NotFound(_)) => {}
                    Err(e) => return Err(e.into()),
                    Ok(_) => {
                        return Err(Error::AlreadyExists(format!(
                            "destination {} exists; remove it first",
                            dest.as_relative()
                        ))
                        .into());
                    }
                }
                ws.rename(&at(&ws, src), &at(&ws, dest))?;
            }
            Ok(ok_empty())
        })
        .await,
    )
}

/// Mode, owner and group of `POST /files/permissions`, `POST /directories` and upload
/// metadata, as upstream reads them: `mode` absent, null or 0 leaves the mode; owner and group
/// absent or empty leave them.
#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct PermissionSpec {
    #[serde(default)]
    mode: Option<u32>,
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    group: Option<String>,
}

/// A [`PermissionSpec`] checked and turned into bits and ids.
#[derive(Debug, Clone, Copy, Default)]
struct Change {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
}

/// Reads an upstream mode (`755`: decimal digits that are octal); `0` is "unchanged". Setuid,
/// setgid and sticky bits are refused here (upstream drops them silently).
fn wire_mode(mode: Option<u32>, path: &str) -> Result<Option<u32>, ApiError> {
    let Some(m) = mode.filter(|m| *m != 0) else {
        return Ok(None);
    };
    let bits = mode_from_wire(m).ok_or_else(|| {
        ApiError::bad_request(format!(
            "invalid mode {m} for {path}: the digits must be octal (0-7), as in 755"
        ))
    })?;
    if bits & !sessionbox_fs::PERMISSION_BITS != 0 {
        return Err(ApiError::bad_request(format!(
            "mode {m} for {path} is refused: setuid, setgid and sticky bits cannot be set \
             through sessionbox-agent; give permission bits only (at most 777)"
        )));
    }
    Ok(Some(bits))
}

/// The id of a user or group name in a passwd-style file; an all-digit string is taken as the
/// id itself when no entry has that name.
fn id_of(kind: &str, file: &str, name: &str, path: &str) -> Result<u32, ApiError> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let found = text.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then(|| f.nth(1)?.parse().ok())?
    });
    found.or_else(|| name.parse().ok()).ok_or_else(|| {
        ApiError::bad_request(format!(
            "unknown {kind} {name:?} for {path}: no such name in {file}"
        ))
    })
}

impl PermissionSpec {
    fn check(&self, path: &str) -> Result<Change, ApiError> {
        let name = |v: &Option<String>| v.as_deref().filter(|n| !n.is_empty()).map(str::to_owned);
        Ok(Change {
            mode: wire_mode(self.mode, path)?,
            uid: name(&self.owner)
                .map(|n| id_of("user", "/etc/passwd", &n, path))
                .transpose()?,
            gid: name(&self.group)
                .map(|n| id_of("group", "/etc/group", &n, path))
                .transpose()?,
        })
    }
}

/// Checks every entry (paths, modes, names) before anything is changed.
fn check_all(
    ws: &Workspace,
    items: &BTreeMap<String, PermissionSpec>,
) -> Result<Vec<(String, Change)>, ApiError> {
    items
        .iter()
        .map(|(p, spec)| {
            let rel = ws.resolve(p)?;
            Ok((at(ws, &rel), spec.check(p)?))
        })
        .collect()
}

/// `POST /files/permissions`: `{path: {mode, owner, group}}`; each path must exist (a regular
/// file or a directory, links inside followed). Every entry is checked first; then they are
/// applied in path order, and the first failure stops (earlier ones stay applied, as upstream).
pub(crate) async fn set_permissions(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let items: BTreeMap<String, PermissionSpec> = match json_body(&state, req).await {
        Ok(i) => i,
        Err(e) => return e.into_response(),
    };
    let ws = state.ws.clone();
    respond(
        blocking(move || {
            for (p, c) in check_all(&ws, &items)? {
                ws.set_permissions(&p, c.mode, c.uid, c.gid)?;
            }
            Ok(ok_empty())
        })
        .await,
    )
}

/// Escapes glob metacharacters so a directory name is matched literally.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '{' | '}' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `GET /files/search?path=&pattern=`: files (not directories) below `path` whose base name
/// matches `pattern` (default `**`), at any depth, as upstream. A pattern with a `/` is matched
/// against the path below `path` instead. Links are reported, never followed.
pub(crate) async fn search(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let pairs = query_pairs(&req);
    let Some(dir) = query_one(&pairs, query::PATH)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
    else {
        return ApiError::missing_query(query::PATH).into_response();
    };
    let pattern = query_one(&pairs, query::PATTERN)
        .filter(|p| !p.is_empty())
        .unwrap_or("**")
        .to_owned();
    let ws = state.ws.clone();
    respond(
        blocking(move || {
            let rel = ws.resolve(&dir)?;
            ws.stat(&at(&ws, &rel))?;
            let base = glob_escape(rel.as_str());
            let sub = if pattern == "**" || pattern.contains('/') {
                pattern.clone()
            } else {
                format!("**/{pattern}")
            };
            let full = if base.is_empty() {
                sub
            } else {
                format!("{base}/{sub}")
            };
            let found = ws.glob(&full)?;
            let mut names = Names::default();
            let mut out = Vec::with_capacity(found.len());
            for f in found {
                let Ok(r) = ws.resolve(&format!("{}/{f}", ws.presented_root())) else {
                    continue;
                };
                match file_info(&ws, &r, &mut names) {
                    Ok(i) => out.push(i),
                    Err(Error::NotFound(_)) => {} // removed meanwhile
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(axum::Json(out).into_response())
        })
        .await,
    )
}

/// Non-overlapping occurrences of `needle` in `hay`, counted left to right.
fn count_occurrences(hay: &[u8], needle: &[u8]) -> u64 {
    if needle.is_empty() {
        return 0;
    }
    let (mut i, mut n) = (0, 0);
    while i + needle.len() <= hay.len() {
        if &hay[i..i + needle.len()] == needle {
            n += 1;
            i += needle.len();
        } else {
            i += 1;
        }
    }
    n
}

/// `POST /files/replace?verbose=`: replaces every occurrence in each file (atomically, keeping
/// its permission bits); a file without one is left untouched with a count of 0.
pub(crate) async fn replace(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let pairs = query_pairs(&req);
    let verbose = query_one(&pairs, query::VERBOSE) == Some("true");
    let items: BTreeMap<String, ReplaceFileContentItem> = match json_body(&state, req).await {
        Ok(i) => i,
        Err(e) => return e.into_response(),
    };
    let ws = state.ws.clone();
    respond(
        blocking(move || {
            let mut todo = Vec::with_capacity(items.len());
            for (p, item) in &items {
                if item.old.is_empty() {
                    return Err(ApiError::bad_request(format!(
                        "old content must not be empty (for {p})"
                    )));
                }
                todo.push((p, ws.resolve(p)?, item));
            }
            let mut results = BTreeMap::new();
            for (p, rel, item) in todo {
                let data = ws.read(&at(&ws, &rel))?;
                let mut count = count_occurrences(&data, item.old.as_bytes());
                if count > 0 {
                    let edit = EditRequest {
                        old: item.old.clone(),
                        new: item.new.clone(),
                        replace_all: true,
                    };
                    count = ws.edit(&at(&ws, &rel), &edit)?.replacements as u64;
                }
                results.insert(
                    p.clone(),
                    ReplaceFileContentResult {
                        replaced_count: count,
                    },
                );
            }
            Ok(if verbose {
                axum::Json(results).into_response()
            } else {
                ok_empty()
            })
        })
        .await,
    )
}

/// default, 0 gives none), in name order with each directory's descendants after it. Links are
/// reported, never entered; `path` itself being a link is refused (400), as upstream.
/// `GET /directories/list?path=&depth=`: entries below a directory, `depth` levels (1 by
pub(crate) async fn list_directory(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let pairs = query_pairs(&req);
    let Some(dir) = query_one(&pairs, query::PATH)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
    else {
        return ApiError::missing_query(query::PATH).into_response();
    };
    let depth: usize = match query_one(&pairs, query::DEPTH) {
        None | Some("") => 1,
        Some(d) => match d.parse() {
            Ok(d) => d,
            Err(_) => {
                return ApiError::bad_request(format!("invalid query parameter 'depth': {d}"))
                    .into_response();
            }
        },
    };
    let ws = state.ws.clone();
    respond(
        blocking(move || {
            let rel = ws.resolve(&dir)?;
            let st = lstat(&ws, &rel)?;
            match RawType::from_raw_mode(st.st_mode as _) {
                RawType::Directory => {}
                RawType::Symlink => {
                    return Err(ApiError::bad_request(format!(
                        "path is a symbolic link, refusing to traverse: {dir}"
                    )));
                }
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "path is not a directory: {dir}"
                    )));
                }
            }
            let mut names = Names::default();
            let mut out = Vec::new();
            list_into(&ws, &rel, depth, &mut names, &mut out)?;
            Ok(axum::Json(out).into_response())
        })
        .await,
    )
}

fn list_into(
    ws: &Workspace,
    rel: &WorkspacePath,
    depth: usize,
    names: &mut Names,
    out: &mut Vec<FileInfo>,
) -> Result<(), ApiError> {
    if depth == 0 {
        return Ok(());
    }
    let max = ws.limits().max_entries;
    for entry in ws.list(&at(ws, rel))? {
        let Ok(child) = rel.join(&entry.name) else {
            continue;
        };
        let info = match file_info(ws, &child, names) {
            Ok(i) => i,
            Err(Error::NotFound(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        if out.len() == max {
            return Err(Error::TooLarge {
                what: format!(
                    "the listing of {} is too large: more than {max} entries",
                    rel.as_relative()
                ),
                limit: u64::MAX,
            }
            .into());
        }
        out.push(info);
        if entry.kind == FileKind::Directory && depth > 1 {
            list_into(ws, &child, depth - 1, names, out)?;
        }
    }
    Ok(())
}

/// `POST /directories`: `{path: {mode, owner, group}}`; creates each directory and its parents
/// (`mkdir -p`). As upstream, mode, owner and group are applied only to a directory this request
/// created (the last component); parents get the default and an existing directory is left as
/// it is. Every entry is checked first.
pub(crate) async fn make_dirs(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let dirs: BTreeMap<String, PermissionSpec> = match json_body(&state, req).await {
        Ok(d) => d,
        Err(e) => return e.into_response(),
    };
    let ws = state.ws.clone();
    respond(
        blocking(move || {
            for (p, c) in check_all(&ws, &dirs)? {
                ws.mkdir_with(&p, c.mode, c.uid, c.gid)?;
            }
            Ok(ok_empty())
        })
        .await,
    )
}

/// `DELETE /directories?path=...`: removes each recursively (`rm -rf`; links inside are
/// removed, never followed); a missing path is fine; the root is refused.
pub(crate) async fn remove_dirs(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let pairs = query_pairs(&req);
    let paths = owned(query_all(&pairs, query::PATH));
    let ws = state.ws.clone();
    respond(
        blocking(move || {
            let rels = resolve_all(&ws, &paths)?;
            for rel in &rels {
                match ws.remove(&at(&ws, rel), true) {
                    Ok(()) | Err(Error::NotFound(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(ok_empty())
        })
        .await,
    )
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::transfer::{RangeSpec, disposition, parse_range, select_lines};
    use super::*;

    #[test]
    fn ranges_parse_as_upstream() {
        assert_eq!(parse_range("bytes=0-3", 10), Some(RangeSpec::Bytes(0, 4)));
        assert_eq!(parse_range("bytes=4-", 10), Some(RangeSpec::Bytes(4, 6)));
        assert_eq!(parse_range("bytes=-3", 10), Some(RangeSpec::Bytes(7, 3)));
        assert_eq!(parse_range("bytes=8-100", 10), Some(RangeSpec::Bytes(8, 2)));
        assert_eq!(parse_range("bytes=10-", 10), Some(RangeSpec::Unsatisfiable));
        assert_eq!(
            parse_range("bytes=20-30, 2-3", 10),
            Some(RangeSpec::Bytes(2, 2))
        );
        assert_eq!(parse_range("bytes=5-2", 10), None);
        assert_eq!(parse_range("items=0-1", 10), None);
        assert_eq!(parse_range("bytes=a-b", 10), None);
    }

    #[test]
    fn lines_are_selected_as_upstream() {
        let f = b"line1\nline2\nline3\nline4\nline5";
        assert_eq!(select_lines(f, 2, Some(2)), b"line2\nline3");
        assert_eq!(select_lines(f, 4, None), b"line4\nline5");
        assert_eq!(select_lines(f, 1, Some(2)), b"line1\nline2");
        assert_eq!(select_lines(f, 9, None), b"");
        assert_eq!(select_lines(b"a\n\nb\n", 1, None), b"a\n\nb");
        assert_eq!(select_lines(b"x\r\n", 1, None), b"x");
        assert_eq!(select_lines(b"x\r\r\ny\r\n", 1, None), b"x\ny");
        assert_eq!(select_lines(b"", 1, None), b"");
    }

    #[test]
    fn modes_are_read_as_upstream_and_special_bits_refused() {
        assert_eq!(wire_mode(Some(755), "p").unwrap(), Some(0o755));
        assert_eq!(wire_mode(Some(600), "p").unwrap(), Some(0o600));
        assert_eq!(wire_mode(Some(0), "p").unwrap(), None);
        assert_eq!(wire_mode(None, "p").unwrap(), None);
        assert_eq!(wire_mode(Some(7), "p").unwrap(), Some(0o7));
        for bad in [4755, 2755, 1777, 800, 79, 10000] {
            assert_eq!(
                wire_mode(Some(bad), "p").unwrap_err().status,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
        assert!(
            wire_mode(Some(4755), "p")
                .unwrap_err()
                .message
                .contains("setuid")
        );
    }

    #[test]
    fn occurrences_do_not_overlap() {
        assert_eq!(count_occurrences(b"aaaa", b"aa"), 2);
        assert_eq!(count_occurrences(b"abc", b"x"), 0);
        assert_eq!(count_occurrences(b"", b"x"), 0);
    }

    #[test]
    fn glob_metacharacters_are_escaped() {
        assert_eq!(glob_escape("a*b/[c]"), "a\\*b/\\[c\\]");
    }

    #[test]
    fn content_disposition_encodes_odd_names() {
        assert_eq!(
            disposition("a.txt").to_str().unwrap(),
            "attachment; filename=\"a.txt\""
        );
        let v = disposition("é\"x");
        assert!(v.to_str().unwrap().contains("filename*=UTF-8''%C3%A9%22x"));
    }
}
