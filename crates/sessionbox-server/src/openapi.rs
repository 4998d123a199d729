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
    /// Permission bits in octal, at least four digits (`"0644"`).
    #[schema(pattern = "^[0-7]{4,}$", example = "0644")]
    mode: String,
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

/// The pattern of a conversation id (`ConversationId`'s rule, as a regular expression).
pub(crate) const CONVERSATION_ID_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$";

/// Gives every `{id}` path parameter the conversation id's rule as a schema (pattern and
/// length), so that generated clients and fuzzers know it.
struct IdRule;

impl Modify for IdRule {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::ParameterIn;
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        for item in doc.paths.paths.values_mut() {
            let ops = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
                &mut item.head,
            ];
            for op in ops.into_iter().flatten() {
                for p in op.parameters.iter_mut().flatten() {
                    if p.name == "id" && p.parameter_in == ParameterIn::Path {
                        p.schema = Some(
                            ObjectBuilder::new()
                                .schema_type(Type::String)
                                .min_length(Some(1))
                                .max_length(Some(128))
                                .pattern(Some(CONVERSATION_ID_PATTERN))
                                .into(),
                        );
                    }
                }
            }
        }
    }
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
        api::open_conversation,
        api::destroy_conversation,
        api::exec,
        api::list_commands,
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
        crate::policy::get_tenant_policy,
        crate::policy::put_tenant_policy,
        crate::policy::delete_tenant_policy,
        crate::policy::get_conversation_policy,
        crate::policy::put_conversation_policy,
        crate::policy::delete_conversation_policy,
        crate::policy::tenant_egress_log,
        crate::policy::conversation_egress_log,
        crate::skills::list_skills,
        crate::skills::load_skill,
        crate::metrics::metrics,
    ),
    components(schemas(
        ErrorBody,
        ExitStatusDoc,
        FileKindDoc,
        crate::output::OutputText,
        api::ExecExit,
        crate::commands::CommandView,
        crate::commands::CommandListView
    )),
    modifiers(&Security, &IdRule),
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

#[cfg(test)]
mod tests {
    use super::*;
    use sessionbox_core::ConversationId;

    /// The documented pattern accepts exactly the ids `ConversationId` accepts: every case of
    /// the shared cases file, and every single byte, at both length bounds.
    #[test]
    fn the_documented_id_pattern_is_the_id_rule() {
        let re = regex::Regex::new(CONVERSATION_ID_PATTERN).unwrap();
        let cases: serde_json::Value = serde_json::from_str(include_str!(
            "../../sessionbox-core/tests/cases/conversation-ids.json"
        ))
        .unwrap();
        let mut inputs: Vec<String> = cases["valid"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        inputs.extend(
            cases["invalid"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v["id"].as_str().unwrap().to_owned()),
        );
        for b in 0u8..=127 {
            let c = char::from(b);
            inputs.push(c.to_string());
            inputs.push(format!("a{c}"));
            inputs.push(format!("{}{c}", "a".repeat(127)));
        }
        inputs.push("a".repeat(129));
        inputs.push("é".into());
        for id in &inputs {
            assert_eq!(
                re.is_match(id),
                ConversationId::new(id.as_str()).is_ok(),
                "{id:?}"
            );
        }
        // And the document carries it on every `{id}` parameter.
        let doc = serde_json::to_value(openapi()).unwrap();
        let mut seen = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for op in item.as_object().unwrap().values() {
                for p in op["parameters"].as_array().into_iter().flatten() {
                    if p["name"] == "id" {
                        assert_eq!(p["schema"]["pattern"], CONVERSATION_ID_PATTERN, "{path}");
                        seen += 1;
                    }
                }
            }
        }
        assert!(seen >= 10, "{seen}");
    }
}
