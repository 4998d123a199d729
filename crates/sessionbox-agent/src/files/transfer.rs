//! `POST /files/upload` and `GET /files/download` (whole files, byte ranges, lines).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sessionbox_core::{Error, FileKind};
use sessionbox_execd::multipart;
use sessionbox_execd::wire::{error_code, query};

use super::{PermissionSpec, at, respond};
use crate::server::{
    ApiError, AppState, blocking, ok_empty, parse_json, query_one, query_pairs, read_body,
};

/// Size of each read when a whole file larger than `max_file_bytes` is streamed.
const DOWNLOAD_CHUNK: u64 = 4 * 1024 * 1024;

/// `POST /files/upload`: multipart, the n-th `metadata` part (JSON `FileMetadata`, sent as a file
/// part by the SDK; a plain field is accepted too) paired with the n-th `file` part. Each file
/// is written atomically, parents created, with `mode` set before it appears (without one, new
/// files get `0644` and existing ones keep their bits); `owner`/`group` (names) are applied
/// after the write. Every path, mode and name is checked before anything is written.
pub(crate) async fn upload(State(state): State<Arc<AppState>>, req: Request) -> Response {
    respond(upload_inner(state, req).await)
}

async fn upload_inner(state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    let bad = |code: &'static str, m: String| ApiError::new(StatusCode::BAD_REQUEST, code, m);
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let boundary = multipart::upload_boundary(&content_type).map_err(|e| bad(e.code, e.message))?;
    let body = read_body(req, state.config.max_upload_bytes).await?;
    let parts = multipart::decode_upload(&boundary, body).map_err(|e| bad(e.code, e.message))?;
    let (metadata, files): (Vec<_>, Vec<_>) =
        parts.into_iter().map(|p| (p.metadata, p.data)).unzip();
    let mut targets = Vec::with_capacity(files.len());
    for m in &metadata {
        let meta: UploadMetadata = parse_json(m).map_err(|e| {
            bad(
                error_code::INVALID_FILE_METADATA,
                format!("invalid metadata format: {}", e.message),
            )
        })?;
        if meta.path.is_empty() {
            return Err(bad(
                error_code::INVALID_FILE_METADATA,
                "metadata path is empty".into(),
            ));
        }
        let change = meta.spec.check(&meta.path)?;
        targets.push((meta.path, change));
    }
    let ws = state.ws.clone();
    blocking(move || {
        let mut todo = Vec::with_capacity(targets.len());
        for (p, change) in &targets {
            todo.push((at(&ws, &ws.resolve(p)?), *change));
        }
        for ((p, c), data) in todo.iter().zip(&files) {
            ws.write_with_mode(p, data, c.mode)?;
            if c.uid.is_some() || c.gid.is_some() {
                ws.set_permissions(p, None, c.uid, c.gid)?;
            }
        }
        Ok(ok_empty())
    })
    .await
}

/// One upload `metadata` part: `{path, mode, owner, group}`.
#[derive(Debug, serde::Deserialize)]
struct UploadMetadata {
    #[serde(default)]
    path: String,
    #[serde(flatten)]
    spec: PermissionSpec,
}

/// One satisfiable byte range, or why there is none.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum RangeSpec {
    /// The first satisfiable range: start and length.
    Bytes(u64, u64),
    /// Well-formed, but no range overlaps the file.
    Unsatisfiable,
}

/// Parses `bytes=A-B[, ...]` against a file of `size` bytes, as upstream: suffix ranges
/// (`-N`), open ranges (`A-`), ranges past the end cut; the first satisfiable one is served.
/// `None` when malformed.
pub(super) fn parse_range(s: &str, size: u64) -> Option<RangeSpec> {
    let spec = s.trim().strip_prefix("bytes=")?;
    let mut first = None;
    for part in spec.split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (a, b) = part.split_once('-')?;
        let (a, b) = (a.trim(), b.trim());
        let (start, len) = if a.is_empty() {
            let n: u64 = b.parse().ok()?;
            let n = n.min(size);
            (size - n, n)
        } else {
            let start: u64 = a.parse().ok()?;
            if b.is_empty() {
                (start, size.saturating_sub(start))
            } else {
                let end: u64 = b.parse().ok()?;
                if end < start {
                    return None;
                }
                (start, end - start + 1)
            }
        };
        if start >= size || len == 0 {
            continue;
        }
        let len = len.min(size - start);
        first.get_or_insert(RangeSpec::Bytes(start, len));
    }
    Some(first.unwrap_or(RangeSpec::Unsatisfiable))
}

/// Lines `offset` (1-based) .. `offset + limit` of `data`, as upstream's line reads: split on
/// `\n`, every trailing `\r`/`\n` removed from each line, joined with `\n`, no final newline;
/// empty past the end.
pub(super) fn select_lines(data: &[u8], offset: u64, limit: Option<u64>) -> Vec<u8> {
    let skip = usize::try_from(offset.saturating_sub(1)).unwrap_or(usize::MAX);
    let take = limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
    let mut out = Vec::new();
    for (i, line) in data
        .split_inclusive(|b| *b == b'\n')
        .skip(skip)
        .take(take)
        .enumerate()
    {
        if i > 0 {
            out.push(b'\n');
        }
        let end = line
            .iter()
            .rposition(|b| *b != b'\n' && *b != b'\r')
            .map_or(0, |e| e + 1);
        out.extend_from_slice(&line[..end]);
    }
    out
}

/// `Content-Disposition: attachment; filename=...`, RFC 5987-encoded when not plain ASCII.
pub(super) fn disposition(name: &str) -> HeaderValue {
    let plain = name
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\');
    let text = if plain {
        format!("attachment; filename=\"{name}\"")
    } else {
        let enc: String = name
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        format!("attachment; filename=\"{enc}\"; filename*=UTF-8''{enc}")
    };
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

/// `GET /files/download?path=`: the whole file (200); with `Range`, the first satisfiable range
/// (206) or 416; with `offset`/`limit`, those lines as text.
pub(crate) async fn download(State(state): State<Arc<AppState>>, req: Request) -> Response {
    respond(download_inner(state, req).await)
}

async fn download_inner(state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    let pairs = query_pairs(&req);
    let path = query_one(&pairs, query::PATH)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::missing_query(query::PATH))?
        .to_owned();
    let range = req
        .headers()
        .get(header::RANGE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let number = |name: &str| -> Result<Option<u64>, ApiError> {
        match query_one(&pairs, name) {
            None | Some("") => Ok(None),
            Some(v) => v
                .parse::<u64>()
                .ok()
                .filter(|n| *n >= 1)
                .map(Some)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "query parameter '{name}' must be a whole number of at least 1"
                    ))
                }),
        }
    };
    let offset = number(query::OFFSET)?;
    let limit = number(query::LIMIT)?;
    let ws = state.ws.clone();
    if offset.is_some() || limit.is_some() {
        if range.is_some() {
            return Err(ApiError::bad_request(
                "offset/limit and the Range header are mutually exclusive",
            ));
        }
        return blocking(move || {
            let data = ws.read(&path)?;
            let text = select_lines(&data, offset.unwrap_or(1), limit);
            let mut r = (StatusCode::OK, text).into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            Ok(r)
        })
        .await;
    }
    let (rel, size) = {
        let ws = ws.clone();
        let path = path.clone();
        blocking(move || {
            let rel = ws.resolve(&path)?;
            let st = ws.stat(&at(&ws, &rel))?;
            if st.kind != FileKind::File {
                return Err(Error::Conflict(format!(
                    "{} is not a regular file",
                    rel.as_relative()
                ))
                .into());
            }
            Ok((rel, st.size))
        })
        .await?
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(
        header::CONTENT_DISPOSITION,
        disposition(rel.file_name().unwrap_or("file")),
    );
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Some(range) = range {
        let (start, len) = match parse_range(&range, size) {
            Some(RangeSpec::Bytes(s, l)) => (s, l),
            _ => {
                let mut r = ApiError::new(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    error_code::UNKNOWN,
                    format!("range {range:?} is not satisfiable for a file of {size} bytes"),
                )
                .into_response();
                r.headers_mut().insert(
                    header::CONTENT_RANGE,
                    HeaderValue::from_str(&format!("bytes */{size}"))
                        .unwrap_or_else(|_| HeaderValue::from_static("bytes */0")),
                );
                return Ok(r);
            }
        };
        let rel2 = rel.clone();
        let data = blocking(move || Ok(ws.read_range(&at(&ws, &rel2), start, len)?)).await?;
        let end = start + (data.len() as u64).max(1) - 1;
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{end}/{size}")) {
            headers.insert(header::CONTENT_RANGE, v);
        }
        return Ok((StatusCode::PARTIAL_CONTENT, headers, data).into_response());
    }
    if size <= ws.limits().max_file_bytes {
        let data = blocking(move || Ok(ws.read(&at(&ws, &rel))?)).await?;
        return Ok((StatusCode::OK, headers, data).into_response());
    }
    // Larger than one read may be: stream it in chunks, each read beneath the root.
    let stream = futures::stream::unfold(Some(0u64), move |pos| {
        let ws = ws.clone();
        let rel = rel.clone();
        async move {
            let off = pos?;
            let read = tokio::task::spawn_blocking(move || {
                ws.read_range(&at(&ws, &rel), off, DOWNLOAD_CHUNK)
            })
            .await;
            match read {
                Ok(Ok(d)) if d.is_empty() => None,
                Ok(Ok(d)) => {
                    let next = off + d.len() as u64;
                    Some((Ok::<Bytes, std::io::Error>(Bytes::from(d)), Some(next)))
                }
                Ok(Err(e)) => Some((Err(std::io::Error::other(e.to_string())), None)),
                Err(e) => Some((Err(std::io::Error::other(e.to_string())), None)),
            }
        }
    });
    Ok((StatusCode::OK, headers, Body::from_stream(stream)).into_response())
}
