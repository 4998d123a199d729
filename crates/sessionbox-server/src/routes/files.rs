//! `/v1/conversations/{id}/files`: read, write, remove and upload files; `edit` and `mkdir`.
//! Writing, uploading and `mkdir` create the conversation; the others answer 404 for one that
//! does not exist.

use axum::Json;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sessionbox_core::{EditRequest, Error, Operation, Refusal, Session};

use super::on_conversation;
use crate::AppState;
use crate::auth::Principal;
use crate::conversation::notify_expired;
use crate::error::{ApiError, rejection};
use crate::extract::{JsonBody, PathArgs, QueryArgs, RawBody};
use crate::openapi::ConversationErrors;
use crate::views::{Binary, EditResultView, ErrorBody};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadQuery {
    #[serde(default)]
    download: Option<String>,
}

/// True for a flag given as `1`, `true`, `yes` or empty.
fn truthy(v: &Option<String>) -> bool {
    matches!(v.as_deref(), Some("1" | "true" | "yes" | ""))
}

/// A single `bytes=` range of a `len`-byte body: `Ok(None)` for none or one this server does
/// not handle (then the whole body is sent), `Err` when unsatisfiable.
fn byte_range(headers: &HeaderMap, len: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(v) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    let Some(spec) = v.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.split_once('-') else {
        return Ok(None);
    };
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = if a.is_empty() {
        let Ok(n) = b.parse::<u64>() else {
            return Ok(None);
        };
        if n == 0 {
            return Err(());
        }
        (len.saturating_sub(n), len.saturating_sub(1))
    } else {
        let Ok(start) = a.parse::<u64>() else {
            return Ok(None);
        };
        let end = if b.is_empty() {
            len.saturating_sub(1)
        } else {
            match b.parse::<u64>() {
                Ok(e) if e >= start => e.min(len.saturating_sub(1)),
                _ => return Ok(None),
            }
        };
        (start, end)
    };
    if len == 0 || start >= len {
        return Err(());
    }
    Ok(Some((start, end)))
}

/// A content type from the file name's extension; `application/octet-stream` otherwise.
fn content_type(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("txt" | "log" | "md" | "rs" | "py" | "sh" | "toml" | "yaml" | "yml") => {
            "text/plain; charset=utf-8"
        }
        Some("csv") => "text/csv; charset=utf-8",
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("json") => "application/json",
        Some("pdf") => "application/pdf",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("svg") => "image/svg+xml",
        Some("zip") => "application/zip",
        Some("gz" | "tgz") => "application/gzip",
        _ => "application/octet-stream",
    }
}

/// `attachment; filename="..."` with the base name, non-ASCII and quotes replaced.
fn disposition(path: &str) -> HeaderValue {
    let base = path.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    let safe: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let safe = if safe.is_empty() {
        "download".to_owned()
    } else {
        safe
    };
    HeaderValue::from_str(&format!("attachment; filename=\"{safe}\""))
        .unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

/// Reads a file: raw bytes, one byte range, or an attachment with `download=1`.
#[utoipa::path(get, path = "/v1/conversations/{id}/files/{path}", tag = "files",
    operation_id = "read_file",
    params(("id" = String, Path, description = "conversation id"),
           ("path" = String, Path, description = "workspace path"),
           ("download" = Option<String>, Query, description = "1: Content-Disposition attachment"),
           ("Range" = Option<String>, Header, description = "bytes=START-END, one range")),
    responses((status = 200, description = "the file, typed by its name (application/octet-stream when unknown)", content_type = "*/*", body = Binary),
              (status = 206, description = "the range", content_type = "*/*", body = Binary),
              (status = 416, description = "range not satisfiable", body = ErrorBody),
              ConversationErrors))]
pub(crate) async fn read(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs((id, path)): PathArgs<(String, String)>,
    QueryArgs(query): QueryArgs<ReadQuery>,
    headers: HeaderMap,
) -> Response {
    on_conversation(&principal, "read", &id, async |conv| {
        state.manager.check_path(&conv, &path)?;
        // The file is counted in the tenant's budget before it is read, and stays counted until
        // the client has taken the answer (a range too: the whole file is read for it).
        let (data, held) = state
            .with_conversation(&conv, Operation::Read, async |opened| {
                let size = opened.conv.stat(&path).await.map_or(0, |s| s.size);
                let size = usize::try_from(size)
                    .unwrap_or(usize::MAX)
                    .min(state.config.max_file_bytes);
                let mut held = vec![state.budget.reserve_body(&conv.tenant, size)?];
                let data = opened.conv.read(&path).await?;
                // It grew between the two: the rest is counted too.
                if data.len() > size {
                    held.push(state.budget.reserve_body(&conv.tenant, data.len() - size)?);
                }
                Ok::<_, sessionbox_core::Error>((data, held))
            })
            .await??;
        let len = data.len() as u64;
        let mut response_headers = HeaderMap::new();
        response_headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(&path)),
        );
        response_headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        // A workspace file is untrusted content served from the API's own origin: a browser
        // must neither guess it is HTML nor run its scripts there (a model may have written
        // it, or a page may have uploaded it).
        response_headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        response_headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("sandbox; default-src 'none'"),
        );
        if truthy(&query.download) {
            response_headers.insert(header::CONTENT_DISPOSITION, disposition(&path));
        }
        match byte_range(&headers, len) {
            Ok(None) => {
                let body = crate::budget::held_body(data, held);
                Ok((StatusCode::OK, response_headers, body).into_response())
            }
            Ok(Some((start, end))) => {
                let content_range = format!("bytes {start}-{end}/{len}");
                if let Ok(value) = HeaderValue::from_str(&content_range) {
                    response_headers.insert(header::CONTENT_RANGE, value);
                }
                let part = data[start as usize..=end as usize].to_vec();
                drop(data);
                let body = crate::budget::held_body(part, held);
                Ok((StatusCode::PARTIAL_CONTENT, response_headers, body).into_response())
            }
            Err(()) => {
                let mut response = ApiError::new(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    "range_not_satisfiable",
                    format!("the file has {len} bytes"),
                )
                .into_response();
                if let Ok(value) = HeaderValue::from_str(&format!("bytes */{len}")) {
                    response.headers_mut().insert(header::CONTENT_RANGE, value);
                }
                Ok(response)
            }
        }
    })
    .await
}

/// Writes a file atomically from the raw body, creating parents (and the conversation).
#[utoipa::path(put, path = "/v1/conversations/{id}/files/{path}", tag = "files",
    operation_id = "write_file",
    params(("id" = String, Path, description = "conversation id"),
           ("path" = String, Path, description = "workspace path")),
    request_body(content = Binary, content_type = "application/octet-stream"),
    responses((status = 204, description = "written"), ConversationErrors))]
pub(crate) async fn write(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs((id, path)): PathArgs<(String, String)>,
    RawBody(body): RawBody,
) -> Response {
    on_conversation(&principal, "write", &id, async |conv| {
        state.manager.check_path(&conv, &path)?;
        let (written, previous_expired_at) = state
            .with_conversation(&conv, Operation::Write, async |opened| {
                (
                    opened.conv.write(&path, &body).await,
                    opened.previous_expired_at(),
                )
            })
            .await?;
        written?;
        Ok(notify_expired(
            StatusCode::NO_CONTENT.into_response(),
            previous_expired_at,
        ))
    })
    .await
}

/// Most files in one multipart upload.
pub(crate) const MAX_UPLOAD_FILES: usize = 1000;

/// One file an upload wrote.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct UploadedFile {
    /// The workspace path, as given.
    path: String,
    /// Bytes written.
    bytes: usize,
}

/// What an upload wrote, in the order of the parts.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct UploadView {
    files: Vec<UploadedFile>,
}

/// The multipart body of an upload, for the schema.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // Only read by the schema generator.
pub(crate) struct UploadForm {
    /// Optional, repeatable: the workspace path of the next file part (default: that part's
    /// filename).
    path: Option<String>,
    /// The files: parts with a filename.
    #[schema(value_type = Vec<Binary>)]
    file: Vec<Vec<u8>>,
}

/// Reads the multipart body: every file part with the workspace path it goes to.
async fn upload_parts(req: Request, state: &AppState) -> Result<Vec<(String, Bytes)>, ApiError> {
    use axum::extract::Multipart;
    let mut form = Multipart::from_request(req, state)
        .await
        .map_err(|e| rejection(e.status(), e.body_text()))?;
    let field_error =
        |e: axum::extract::multipart::MultipartError| rejection(e.status(), e.body_text());
    let mut files = Vec::new();
    let mut next_path: Option<String> = None;
    while let Some(field) = form.next_field().await.map_err(field_error)? {
        let name = field.name().unwrap_or("").to_owned();
        match field.file_name().map(str::to_owned) {
            None if name == "path" => {
                if next_path.is_some() {
                    return Err(ApiError::bad_request(
                        "two `path` fields in a row: each names the file part after it",
                    ));
                }
                next_path = Some(field.text().await.map_err(field_error)?);
            }
            None => {
                return Err(ApiError::bad_request(format!(
                    "unexpected form field {name:?}: send files as parts with a filename, each \
                     optionally after a `path` field"
                )));
            }
            Some(file_name) => {
                let path = next_path.take().unwrap_or(file_name);
                let data = field.bytes().await.map_err(field_error)?;
                if files.len() == MAX_UPLOAD_FILES {
                    return Err(ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "too_large",
                        format!("at most {MAX_UPLOAD_FILES} files per upload"),
                    ));
                }
                files.push((path, data));
            }
        }
    }
    if next_path.is_some() {
        return Err(ApiError::bad_request(
            "the last `path` field has no file part after it",
        ));
    }
    if files.is_empty() {
        return Err(ApiError::bad_request(
            "the upload has no file part (a part with a filename)",
        ));
    }
    Ok(files)
}

/// Uploads several files at once (`multipart/form-data`), creating parents (and the
/// conversation). Each file part goes to the path of the `path` field before it, or else to its
/// filename. Every path is checked before anything is written; each file is written atomically.
// (Not in the doc comment, which is the OpenAPI document's: when one file cannot be written,
// the workspace full, the upload stops there; the files before it stay written, and the
// error's message names them.)
#[utoipa::path(post, path = "/v1/conversations/{id}/files", tag = "files",
    operation_id = "upload_files",
    params(("id" = String, Path, description = "conversation id")),
    request_body(content = UploadForm, content_type = "multipart/form-data"),
    responses((status = 200, description = "every file written", body = UploadView), (status = 400, description = "invalid input (not multipart, no file, a bad path)", body = ErrorBody),
              (status = 403, description = "path outside the workspace", body = ErrorBody),
              (status = 409, description = "conflict", body = ErrorBody),
              (status = 413, description = "body too large, or too many files", body = ErrorBody),
              (status = 429, description = "the conversation's queue is full", body = ErrorBody)))]
pub(crate) async fn upload(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    request: Request,
) -> Response {
    on_conversation(&principal, "upload", &id, async |conv| {
        let files = upload_parts(request, &state).await?;
        for (path, _) in &files {
            state.manager.check_path(&conv, path)?;
        }
        let (written, failed, previous_expired_at) = state
            .with_conversation(&conv, Operation::Upload, async |opened| {
                let mut written = Vec::with_capacity(files.len());
                let mut failed = None;
                for (path, data) in files {
                    if let Err(error) = opened.conv.write(&path, &data).await {
                        failed = Some(error);
                        break;
                    }
                    written.push(UploadedFile {
                        path,
                        bytes: data.len(),
                    });
                }
                (written, failed, opened.previous_expired_at())
            })
            .await?;
        if let Some(error) = failed {
            // Each file is written whole or not at all, but the files before the one that
            // failed stay written: the caller is told which.
            let mut answer = ApiError::from(error);
            if !written.is_empty() {
                let names: Vec<&str> = written.iter().take(10).map(|f| f.path.as_str()).collect();
                answer.message = format!(
                    "{}; the upload stopped there, after writing its first {} file(s): {}{}",
                    answer.message,
                    written.len(),
                    names.join(", "),
                    if written.len() > names.len() {
                        ", ..."
                    } else {
                        ""
                    }
                );
            }
            return Err(answer);
        }
        Ok(notify_expired(
            Json(UploadView { files: written }).into_response(),
            previous_expired_at,
        ))
    })
    .await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RemoveQuery {
    #[serde(default)]
    recursive: Option<String>,
}

/// Removes a file, link or directory (`recursive=1` for a non-empty one).
#[utoipa::path(delete, path = "/v1/conversations/{id}/files/{path}", tag = "files",
    operation_id = "remove_file",
    params(("id" = String, Path, description = "conversation id"),
           ("path" = String, Path, description = "workspace path"), ("recursive" = Option<String>, Query, description = "1: remove a directory tree")),
    responses((status = 204, description = "removed"), ConversationErrors))]
pub(crate) async fn remove(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs((id, path)): PathArgs<(String, String)>,
    QueryArgs(query): QueryArgs<RemoveQuery>,
) -> Response {
    on_conversation(&principal, "remove", &id, async |conv| {
        state.manager.check_path(&conv, &path)?;
        let recursive = truthy(&query.recursive);
        state
            .with_conversation(&conv, Operation::Remove, async |opened| {
                opened.conv.remove(&path, recursive).await
            })
            .await?
            .map_err(with_fields)?;
        Ok(StatusCode::NO_CONTENT.into_response())
    })
    .await
}

/// `POST /v1/conversations/{id}/edit`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EditBody {
    path: String,
    old: String,
    new: String,
    #[serde(default)]
    replace_all: bool,
}

/// Replaces an exact string in a file; it must occur once unless `replace_all`.
#[utoipa::path(post, path = "/v1/conversations/{id}/edit", tag = "files",
    params(("id" = String, Path, description = "conversation id")),
    request_body = EditBody,
    responses((status = 200, body = EditResultView), ConversationErrors))]
pub(crate) async fn edit(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    JsonBody(body): JsonBody<EditBody>,
) -> Response {
    on_conversation(&principal, "edit", &id, async |conv| {
        state.manager.check_path(&conv, &body.path)?;
        if body.old.is_empty() {
            return Err(ApiError::bad_request("old must not be empty"));
        }
        let request = EditRequest {
            old: body.old,
            new: body.new,
            replace_all: body.replace_all,
        };
        let result = state
            .with_conversation(&conv, Operation::Edit, async |opened| {
                opened.conv.edit(&body.path, &request).await
            })
            .await?
            .map_err(with_fields)?;
        Ok(Json(EditResultView::from(result)).into_response())
    })
    .await
}

/// A library refusal with what to do in this API's fields (the library names none).
fn with_fields(e: Error) -> Error {
    let advice = match e.refusal() {
        Some(Refusal::EditEmpty) => "send the exact text to replace in `old`",
        Some(Refusal::EditAbsent) => "read the file and send its exact text in `old`",
        Some(Refusal::EditAmbiguous) => {
            "give more context in `old`, or set `replace_all` to replace every occurrence"
        }
        Some(Refusal::DirectoryNotEmpty) => "add `?recursive=1` to remove it and everything in it",
        _ => return e,
    };
    e.with_advice(advice)
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PathBody {
    path: String,
}

/// Creates a directory and its parents (and the conversation).
#[utoipa::path(post, path = "/v1/conversations/{id}/mkdir", tag = "files",
    params(("id" = String, Path, description = "conversation id")),
    request_body = PathBody,
    responses((status = 204, description = "created or existed"), ConversationErrors))]
pub(crate) async fn mkdir(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    JsonBody(body): JsonBody<PathBody>,
) -> Response {
    on_conversation(&principal, "mkdir", &id, async |conv| {
        state.manager.check_path(&conv, &body.path)?;
        let (made, previous_expired_at) = state
            .with_conversation(&conv, Operation::Mkdir, async |opened| {
                (
                    opened.conv.mkdir(&body.path).await,
                    opened.previous_expired_at(),
                )
            })
            .await?;
        made?;
        Ok(notify_expired(
            StatusCode::NO_CONTENT.into_response(),
            previous_expired_at,
        ))
    })
    .await
}
