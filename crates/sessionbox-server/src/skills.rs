//! The `skill` tool over REST: `GET /v1/skills` lists the key's tenant's skills (name and
//! description); `GET /v1/conversations/{id}/skills/{name}` loads one: its SKILL.md body and
//! its base directory as that conversation's commands see it (`/skills/<name>` where the runtime
//! mounts skills, `<workspace>/.skills/<name>` where they are copied). MCP's `skill` tool runs
//! the same two functions. A skill that breaks a rule is left out of both (the server log,
//! the audit and `sessionbox skills` name it and the rule); a conversation is told only of the
//! skills its sandbox has (see `Manager::announced_skills`).
//!
//! Neither opens a conversation: the catalog is the host's skills directories, and the base
//! path follows from the runtime. The skills are in place once the conversation is opened (by
//! any call that opens it).

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sessionbox_core::{ConversationRef, Error, TenantId};

use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::PathArgs;
use crate::routes::{audited, on_conversation};
use crate::views::ErrorBody;

/// A skill as listed.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct SkillSummary {
    /// The skill's name (lowercase letters, digits, hyphens).
    pub name: String,
    /// What it does and when to use it.
    pub description: String,
}

/// The tenant's skills, by name.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct SkillsView {
    skills: Vec<SkillSummary>,
}

/// One skill, loaded.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct SkillView {
    /// The skill's name.
    pub name: String,
    /// What it does and when to use it.
    pub description: String,
    /// SKILL.md after its front matter: the instructions.
    pub body: String,
    /// The skill's directory as the conversation's commands see it; the paths in the body are
    /// relative to it.
    pub base_path: String,
}

/// The skills of `tenant` (a skill that breaks a rule is left out).
pub(crate) async fn list(s: &AppState, tenant: &TenantId) -> Result<Vec<SkillSummary>, Error> {
    Ok(summaries(s.manager.skill_catalog(tenant).await?))
}

/// The skills `conversation`'s commands can use now: its tenant's, less a skill its running
/// sandbox does not have yet (see `Manager::announced_skills`).
pub(crate) async fn list_for(
    s: &AppState,
    conversation: &ConversationRef,
) -> Result<Vec<SkillSummary>, Error> {
    Ok(summaries(s.manager.announced_skills(conversation).await?))
}

fn summaries(catalog: sessionbox_skills::Catalog) -> Vec<SkillSummary> {
    catalog
        .skills
        .into_iter()
        .map(|k| SkillSummary {
            name: k.doc.name,
            description: k.doc.description,
        })
        .collect()
}

/// The skill `name` for `conversation`.
pub(crate) async fn load(
    s: &AppState,
    conversation: &ConversationRef,
    name: &str,
) -> Result<SkillView, Error> {
    sessionbox_skills::check_name(name).map_err(Error::InvalidRequest)?;
    let catalog = s.manager.announced_skills(conversation).await?;
    let Some(skill) = catalog.get(name) else {
        return Err(Error::NotFound(format!(
            "no skill named {name:?}; list the skills to see their names"
        )));
    };
    Ok(SkillView {
        name: skill.doc.name.clone(),
        description: skill.doc.description.clone(),
        body: skill.doc.body.clone(),
        base_path: s.manager.skill_delivery(conversation).base_path(name),
    })
}

/// This tenant's skills: name and description of each.
#[utoipa::path(get, path = "/v1/skills", tag = "skills",
    responses((status = 200, body = SkillsView)))]
pub(crate) async fn list_skills(State(state): State<AppState>, principal: Principal) -> Response {
    let result = list(&state, &principal.tenant)
        .await
        .map(|skills| Json(SkillsView { skills }).into_response())
        .map_err(ApiError::from);
    audited(&principal, "skills", result)
}

/// Loads one skill for a conversation: its instructions and its base directory there.
#[utoipa::path(get, path = "/v1/conversations/{id}/skills/{name}", tag = "skills",
    params(("id" = String, Path, description = "conversation id"), ("name" = String, Path, description = "skill name")),
    responses((status = 200, body = SkillView), (status = 400, description = "invalid input", body = ErrorBody),
              (status = 404, description = "no such skill (one that breaks a rule is left out; one added while the conversation's sandbox runs is there once it restarts)", body = ErrorBody)))]
pub(crate) async fn load_skill(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs((id, name)): PathArgs<(String, String)>,
) -> Response {
    on_conversation(&principal, "skill", &id, async |conv| {
        Ok(Json(load(&state, &conv, &name).await?).into_response())
    })
    .await
}
