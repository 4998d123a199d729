//! The OpenAPI 3.1 document, generated from the handlers' annotations (utoipa), served at
//! `/v1/openapi.json`.
//!
//! `sessionbox-core` knows no wire format, so the core types that appear in responses are
//! mirrored here for the schema only (`*Doc`); the handlers serialise the core types themselves,
//! and the tests check the two agree.

#![allow(dead_code)] // The mirrors are only read by the schema generator.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::api;

/// Every error: a stable code and a message for people (also the data of an `error` event on
/// an exec event stream).
#[derive(ToSchema)]
#[schema(as = Error)]
pub(crate) struct ErrorBody {
    /// `invalid_id`, `invalid_path`, `invalid_request`, `outside_workspace`, `unauthorized`,
    /// `not_found`, `conflict`, `already_exists`, `too_large`, `busy`, ...
    code: String,
    message: String,
}

/// Raw bytes.
#[derive(ToSchema)]
#[schema(as = Binary, value_type = String, format = Binary)]
pub(crate) struct BinaryDoc(Vec<u8>);

/// How a command ended: `{"code": N}` or `{"signal": N}`.
#[derive(ToSchema)]
#[schema(as = ExitStatus)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ExitStatusDoc {
    Code(i32),
    Signal(i32),
}

#[derive(ToSchema)]
#[schema(as = FileKind)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FileKindDoc {
    File,
    Directory,
    Symlink,
    Other,
}

/// One directory entry.
#[derive(ToSchema)]
#[schema(as = DirEntry)]
pub(crate) struct DirEntryDoc {
    name: String,
    kind: FileKindDoc,
    size: u64,
    modified_unix: i64,
}

/// Metadata of one path.
#[derive(ToSchema)]
#[schema(as = FileStat)]
pub(crate) struct FileStatDoc {
    path: String,
    kind: FileKindDoc,
    size: u64,
    mode: u32,
    modified_unix: i64,
}

/// What an edit did.
#[derive(ToSchema)]
#[schema(as = EditResult)]
pub(crate) struct EditResultDoc {
    replacements: usize,
}

/// A content search.
#[derive(ToSchema)]
#[schema(as = GrepRequest)]
pub(crate) struct GrepRequestDoc {
    /// A Rust `regex` pattern.
    pattern: String,
    /// File or directory to search; default the whole workspace.
    path: Option<String>,
    /// Only files whose workspace-relative path matches this glob.
    glob: Option<String>,
    #[schema(default = false)]
    case_insensitive: Option<bool>,
    max_matches: Option<usize>,
}

/// One matching line.
#[derive(ToSchema)]
#[schema(as = GrepMatch)]
pub(crate) struct GrepMatchDoc {
    path: String,
    line_number: u64,
    line: String,
}

struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let c = doc.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        c.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sessionbox",
        description = "Isolated, resumable workspaces for AI-agent conversations."
    ),
    paths(
        api::healthz,
        api::readyz,
        api::list_conversations,
        api::get_conversation,
        api::destroy_conversation,
        api::exec,
        api::command_status,
        api::command_logs,
        api::kill_command,
        api::upload_files,
        api::read_file,
        api::write_file,
        api::remove_file,
        api::edit,
        api::mkdir,
        api::ls,
        api::stat,
        api::glob,
        api::grep,
        crate::metrics::metrics,
    ),
    components(schemas(
        ErrorBody,
        ExitStatusDoc,
        FileKindDoc,
        crate::output::OutputText,
        api::ExecExit
    )),
    modifiers(&Security),
    security(("bearer" = []), ("api_key" = []))
)]
struct ApiDoc;

/// The OpenAPI document of the API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// `GET /v1/openapi.json` (no key needed).
pub(crate) async fn document() -> Response {
    static DOC: OnceLock<String> = OnceLock::new();
    let body = DOC.get_or_init(|| {
        openapi()
            .to_json()
            .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    });
    ([(header::CONTENT_TYPE, "application/json")], body.clone()).into_response()
}
