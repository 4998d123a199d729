//! The OpenAPI 3.1 document, generated from the handlers' annotations (utoipa), served at
//! `/v1/openapi.json`.
//!
//! The schemas are those of the very types the handlers serialise (the views, see
//! `views.rs`). The error answers every route shares are declared once: 401 is added to every
//! operation that needs a key ([`Unauthorized`]), and the routes on a conversation list
//! [`ConversationErrors`].

use std::sync::OnceLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, ResponseBuilder};
use utoipa::{IntoResponses, Modify, OpenApi, ToSchema};

use crate::routes::{
    account, commands, conversations, exec, files, fs, health, preview, pty, snapshots, watch,
};
use crate::views::{ErrorBody, ExitStatusView, FileKindView};

/// The error answers of the routes on one conversation, besides 401 (see [`Unauthorized`]).
#[derive(IntoResponses)]
#[allow(dead_code)] // Only read by the schema generator.
pub(crate) enum ConversationErrors {
    #[response(status = 400, description = "invalid input")]
    InvalidInput(ErrorBody),
    #[response(
        status = 403,
        description = "a path outside the workspace (`outside_workspace`), or a request the API key's scope does not allow (`forbidden`, naming the rule)"
    )]
    OutsideWorkspace(ErrorBody),
    #[response(status = 404, description = "no such conversation or file")]
    NotFound(ErrorBody),
    #[response(status = 409, description = "conflict")]
    Conflict(ErrorBody),
    #[response(status = 413, description = "body too large")]
    TooLarge(ErrorBody),
    #[response(status = 422, description = "JSON of the wrong shape")]
    WrongShape(ErrorBody),
    #[response(status = 429, description = "the conversation's queue is full")]
    Busy(ErrorBody),
}

/// Adds the 401 answer to every operation that needs a key (all but those that declare
/// `security()`, the health checks).
struct Unauthorized;

impl Modify for Unauthorized {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let unauthorized = ResponseBuilder::new()
            .description("no valid API key")
            .content(
                "application/json",
                utoipa::openapi::ContentBuilder::new()
                    .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                        ErrorBody::name(),
                    ))))
                    .build(),
            )
            .build();
        for item in doc.paths.paths.values_mut() {
            for op in operations(item) {
                if op.security.is_none() {
                    op.responses
                        .responses
                        .entry("401".to_owned())
                        .or_insert_with(|| unauthorized.clone().into());
                }
            }
        }
    }
}

/// The operations of one path.
fn operations(
    item: &mut utoipa::openapi::PathItem,
) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.patch,
        &mut item.head,
    ]
    .into_iter()
    .flatten()
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
            for op in operations(item) {
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
        health::healthz,
        health::readyz,
        conversations::list,
        conversations::get,
        conversations::open,
        conversations::destroy,
        exec::exec,
        preview::link,
        preview::by_key,
        preview::by_link,
        commands::list,
        commands::status,
        commands::logs,
        commands::kill,
        commands::write_stdin,
        commands::close_stdin,
        files::upload,
        files::read,
        files::write,
        files::remove,
        files::edit,
        files::mkdir,
        fs::ls,
        fs::stat,
        fs::glob,
        fs::grep,
        pty::pty,
        watch::watch,
        snapshots::take,
        snapshots::restore,
        snapshots::fork_conversation,
        snapshots::list,
        snapshots::get,
        snapshots::delete,
        snapshots::export,
        snapshots::import,
        snapshots::fork_snapshot,
        snapshots::templates,
        snapshots::set_template,
        snapshots::delete_template,
        snapshots::fork_template,
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
        account::whoami,
        account::audit,
        account::installation,
        crate::routes::doctor::doctor,
        pty::ticket,
    ),
    components(schemas(
        ErrorBody,
        preview::PreviewLinkRequest,
        preview::PreviewLinkView,
        ExitStatusView,
        FileKindView,
        crate::output::OutputText,
        exec::ExecExit,
        crate::commands::CommandView,
        crate::commands::CommandListView,
        crate::views::WatchEventView
    )),
    modifiers(&Security, &IdRule, &Unauthorized),
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
