//! `ls`, `stat`, `glob` and `grep` on a conversation's workspace. None of them creates the
//! conversation.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sessionbox_core::{GrepRequest, Operation, Session};

use super::on_conversation;
use crate::AppState;
use crate::auth::Principal;
use crate::extract::{JsonBody, PathArgs, QueryArgs};
use crate::openapi::ConversationErrors;
use crate::views::{DirEntryView, FileStatView, GrepBody, GrepMatchView};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PathQuery {
    #[serde(default)]
    path: Option<String>,
}

/// A directory listing.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct LsView {
    entries: Vec<DirEntryView>,
}

/// Paths matching a glob.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct GlobView {
    paths: Vec<String>,
}

/// Matching lines.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct GrepView {
    matches: Vec<GrepMatchView>,
}

/// Lists a directory, sorted by name.
#[utoipa::path(get, path = "/v1/conversations/{id}/ls", tag = "files",
    params(("id" = String, Path, description = "conversation id"), ("path" = Option<String>, Query, description = "default the workspace root")),
    responses((status = 200, body = LsView), ConversationErrors))]
pub(crate) async fn ls(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    QueryArgs(query): QueryArgs<PathQuery>,
) -> Response {
    on_conversation(&principal, "ls", &id, async |conv| {
        let path = query.path.unwrap_or_else(|| ".".to_owned());
        state.manager.check_path(&conv, &path)?;
        let entries = state
            .with_conversation(&conv, Operation::List, async |opened| {
                opened.conv.list(&path).await
            })
            .await??;
        let entries = entries.into_iter().map(DirEntryView::from).collect();
        Ok(Json(LsView { entries }).into_response())
    })
    .await
}

/// Metadata of a path.
#[utoipa::path(get, path = "/v1/conversations/{id}/stat", tag = "files",
    params(("id" = String, Path, description = "conversation id"), ("path" = Option<String>, Query, description = "default the workspace root")),
    responses((status = 200, body = FileStatView), ConversationErrors))]
pub(crate) async fn stat(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    QueryArgs(query): QueryArgs<PathQuery>,
) -> Response {
    on_conversation(&principal, "stat", &id, async |conv| {
        let path = query.path.unwrap_or_else(|| ".".to_owned());
        state.manager.check_path(&conv, &path)?;
        let stat = state
            .with_conversation(&conv, Operation::Stat, async |opened| {
                opened.conv.stat(&path).await
            })
            .await??;
        Ok(Json(FileStatView::from(stat)).into_response())
    })
    .await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GlobQuery {
    pattern: String,
}

/// Workspace-relative paths of files matching a glob, sorted.
#[utoipa::path(get, path = "/v1/conversations/{id}/glob", tag = "files",
    params(("id" = String, Path, description = "conversation id"), ("pattern" = String, Query, description = "for example **/*.rs")),
    responses((status = 200, body = GlobView), ConversationErrors))]
pub(crate) async fn glob(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    QueryArgs(query): QueryArgs<GlobQuery>,
) -> Response {
    on_conversation(&principal, "glob", &id, async |conv| {
        let paths = state
            .with_conversation(&conv, Operation::Glob, async |opened| {
                opened.conv.glob(&query.pattern).await
            })
            .await??;
        Ok(Json(GlobView { paths }).into_response())
    })
    .await
}

/// Searches file contents with a regular expression.
#[utoipa::path(post, path = "/v1/conversations/{id}/grep", tag = "files",
    params(("id" = String, Path, description = "conversation id")),
    request_body = GrepBody,
    responses((status = 200, body = GrepView), ConversationErrors))]
pub(crate) async fn grep(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    JsonBody(body): JsonBody<GrepBody>,
) -> Response {
    let request = GrepRequest::from(body);
    on_conversation(&principal, "grep", &id, async |conv| {
        if let Some(path) = &request.path {
            state.manager.check_path(&conv, path)?;
        }
        let matches = state
            .with_conversation(&conv, Operation::Grep, async |opened| {
                opened.conv.grep(&request).await
            })
            .await??;
        let matches = matches.into_iter().map(GrepMatchView::from).collect();
        Ok(Json(GrepView { matches }).into_response())
    })
    .await
}
