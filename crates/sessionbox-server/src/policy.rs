//! Network policies and the egress log over REST, and the two reads MCP's `network` tool
//! shares with them.
//!
//! - `GET|PUT|DELETE /v1/policy`: the key's tenant's policy (what its conversations get unless
//!   they have their own). `DELETE` goes back to the default profile `none`.
//! - `GET|PUT|DELETE /v1/conversations/{id}/policy`: `GET` answers the policy in force for the
//!   conversation and where it comes from; `PUT` sets the conversation's own; `DELETE` removes
//!   it (the tenant's applies again). None of them opens or creates the conversation: a policy
//!   may be set before the conversation's first call.
//! - `GET /v1/egress-log`, `GET /v1/conversations/{id}/egress-log`: the gateway's verdicts,
//!   newest first, as `sessionbox egress-log` prints them. Verdicts never carry a URL path or
//!   query (the gateway never records them).
//!
//! Policies live in the store, where every gateway reads them per connection: a change here
//! applies to the next connection, with no restart. A change also closes the server's kept
//! sessions of the conversations it concerns, so the next call opens them through the runtime
//! again (where the `isolated` runtime applies a switch between `none` and an allowlist).
//!
//! The request body names rules as the CLI does (`*.pypi.org:443`, `10.1.0.0/16`), and every
//! rule goes through [`Policy::allowlist`]: a rule it refuses is 422 with a message naming the
//! rule. Only the API key's tenant is ever read or written. MCP gets no way to change a
//! policy: a model that could widen its own allowlist would make the policy worthless against
//! prompt injection.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sessionbox_core::{ConversationKey, ConversationRef, Error, TenantId};
use sessionbox_egress::Policy;
use sessionbox_manager::decode_policy;
use sessionbox_store::{EgressLogFilter, PolicyScope};
use std::collections::HashMap;

use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::{JsonBody, PathArgs, QueryArgs};
use crate::routes::{audited, on_conversation};
use crate::views::ErrorBody;

/// Most verdicts one request returns.
pub(crate) const MAX_LOG_ENTRIES: usize = 1000;
/// Verdicts returned when `limit` is not given.
const DEFAULT_LOG_ENTRIES: usize = 100;

/// A network profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Profile {
    /// No network at all (the default).
    None,
    /// Only what an allow rule covers and no deny rule covers, through the egress gateway.
    Allowlist,
}

/// Where the policy in force comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PolicySource {
    /// The conversation's own policy.
    Conversation,
    /// Its tenant's policy.
    Tenant,
    /// Nothing is set: the profile `none`.
    Default,
}

/// A network policy as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = NetworkPolicy)]
pub(crate) struct PolicyView {
    /// Where it comes from.
    pub source: PolicySource,
    /// `none` or `allowlist`.
    pub profile: Profile,
    /// Allow rules, as written (`*.pypi.org:443`, `203.0.113.0/24`); empty for `none`.
    pub allow: Vec<String>,
    /// Deny rules (they win over allow rules); empty for `none`.
    pub deny: Vec<String>,
    /// Hex SHA-256 of the policy's canonical JSON: the hash proxy tokens carry, and what
    /// `sessionbox policy show` prints the first 16 digits of.
    pub hash: String,
    /// When it was set; `null` for the default.
    pub updated_at: Option<DateTime<Utc>>,
}

/// `PUT /v1/policy` and `PUT /v1/conversations/{id}/policy`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NetworkPolicyRequest)]
pub(crate) struct PolicyBody {
    /// `none` (no network; no rules) or `allowlist` (at least one allow rule).
    profile: Profile,
    /// Allow rules: `example.com` (exactly), `*.example.com` (names beneath it),
    /// `203.0.113.0/24` or `2001:db8::/32` (a CIDR), each optionally with ports (`:443`,
    /// `:8000-8100`, `:80,443`; IPv6 in brackets: `[2001:db8::/32]:443`).
    #[serde(default)]
    allow: Vec<String>,
    /// Deny rules, written like allow rules; they win.
    #[serde(default)]
    deny: Vec<String>,
}

/// One verdict of the egress gateway.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = EgressVerdict)]
pub(crate) struct VerdictView {
    /// Increasing with each verdict.
    pub id: i64,
    /// When it was decided.
    pub at: DateTime<Utc>,
    /// The conversation's id, when its record still exists.
    pub conversation_id: Option<String>,
    /// The conversation key (hex SHA-256 of tenant and id).
    pub conversation_key: String,
    /// `allowed` or `denied`.
    pub verdict: &'static str,
    /// `CONNECT`, or the method of a plain HTTP request.
    pub method: String,
    /// `host:port` as asked (never a path or query).
    pub target: String,
    /// The address connected to, for an allowed request.
    pub address: Option<String>,
    /// The rule that allowed it, or why it was refused.
    pub rule: String,
    /// Bytes sent to the target.
    pub bytes_up: u64,
    /// Bytes received from it.
    pub bytes_down: u64,
    /// How long the connection lasted, in milliseconds.
    pub duration_ms: u64,
    /// How an allowed connection ended (`closed`, `idle timeout`, `connect failed: ...`).
    pub end: Option<String>,
    /// How many identical verdicts this entry stands for (at least 1): the gateway logs a
    /// flood of one verdict as one entry, `at` the first one's time, bytes summed,
    /// `duration_ms` the longest.
    pub count: u64,
}

/// Verdicts, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = EgressLog)]
pub(crate) struct EgressLogView {
    entries: Vec<VerdictView>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LogQuery {
    since: Option<String>,
    limit: Option<usize>,
}

fn view(policy: &Policy, source: PolicySource, updated_at: Option<DateTime<Utc>>) -> PolicyView {
    let (allow, deny) = policy.rule_strings();
    PolicyView {
        source,
        profile: if policy.is_none() {
            Profile::None
        } else {
            Profile::Allowlist
        },
        allow,
        deny,
        hash: policy.hash(),
        updated_at,
    }
}

/// The policy in force for `conversation`: its own, else its tenant's, else `none`.
pub(crate) async fn in_force(
    s: &AppState,
    conversation: &ConversationRef,
) -> Result<(Policy, PolicyView), Error> {
    let conv = conversation.clone();
    let stored = s
        .manager
        .store()
        .run(move |store| store.effective_egress_policy(&conv))
        .await?;
    Ok(match stored {
        None => (
            Policy::None,
            view(&Policy::None, PolicySource::Default, None),
        ),
        Some(row) => {
            let p = decode_policy(Some(&row))?;
            let source = if row.conversation_id.is_some() {
                PolicySource::Conversation
            } else {
                PolicySource::Tenant
            };
            let v = view(&p, source, Some(row.updated_at));
            (p, v)
        }
    })
}

/// The tenant's own policy, or the default.
async fn tenant_policy(s: &AppState, tenant: &TenantId) -> Result<PolicyView, Error> {
    let scope = PolicyScope::Tenant(tenant.clone());
    let stored = s
        .manager
        .store()
        .run(move |store| store.egress_policy(&scope))
        .await?;
    Ok(match stored {
        None => view(&Policy::None, PolicySource::Default, None),
        Some(row) => view(
            &decode_policy(Some(&row))?,
            PolicySource::Tenant,
            Some(row.updated_at),
        ),
    })
}

/// The verdicts of `tenant` (of one conversation when `key` is given), newest first.
pub(crate) async fn verdicts(
    s: &AppState,
    tenant: &TenantId,
    conversation: Option<&ConversationRef>,
    since: Option<DateTime<Utc>>,
    limit: usize,
) -> Result<Vec<VerdictView>, Error> {
    let filter = EgressLogFilter {
        tenant: Some(tenant.clone()),
        key: conversation.map(|c| c.key.clone()),
        since,
        limit: Some(limit),
    };
    let records = s
        .manager
        .store()
        .run(move |store| store.egress_log(&filter))
        .await?;
    // Ids by key: the one conversation asked about, or every conversation of the tenant.
    let ids: HashMap<ConversationKey, String> = match conversation {
        Some(c) => HashMap::from([(c.key.clone(), c.id.as_str().to_owned())]),
        None if records.is_empty() => HashMap::new(),
        None => s
            .manager
            .list(Some(tenant))
            .await?
            .into_iter()
            .map(|r| (r.key, r.conversation_id.as_str().to_owned()))
            .collect(),
    };
    Ok(records
        .into_iter()
        .map(|r| {
            let e = r.entry;
            VerdictView {
                id: r.id,
                at: e.at,
                conversation_id: ids.get(&e.conversation_key).cloned(),
                conversation_key: e.conversation_key.to_string(),
                verdict: if e.allowed { "allowed" } else { "denied" },
                method: e.method,
                target: e.target,
                address: e.address,
                rule: e.rule,
                bytes_up: e.bytes_up,
                bytes_down: e.bytes_down,
                duration_ms: e.duration_ms,
                end: e.end,
                count: e.count,
            }
        })
        .collect())
}

fn unprocessable(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message)
}

/// The policy a request body asks for, every rule checked.
fn requested(body: PolicyBody) -> Result<Policy, ApiError> {
    match body.profile {
        Profile::None => {
            if !body.allow.is_empty() || !body.deny.is_empty() {
                return Err(unprocessable(
                    "the profile none takes no rules: send {\"profile\": \"none\"} for no \
                     network, or {\"profile\": \"allowlist\", \"allow\": [...]} to allow some",
                ));
            }
            Ok(Policy::None)
        }
        Profile::Allowlist => {
            if body.allow.is_empty() {
                return Err(unprocessable(
                    "an allowlist needs at least one allow rule; send {\"profile\": \"none\"} \
                     for no network",
                ));
            }
            let allow: Vec<&str> = body.allow.iter().map(String::as_str).collect();
            let deny: Vec<&str> = body.deny.iter().map(String::as_str).collect();
            Policy::allowlist(&allow, &deny).map_err(|e| unprocessable(e.0))
        }
    }
}

fn parse_since(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, ApiError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let bad = || {
        ApiError::bad_request(format!(
            "since {text:?} is neither an RFC 3339 time (2026-11-29T15:00:00Z) nor an age such \
             as 90s, 15m, 2h or 7d"
        ))
    };
    let age = humantime::parse_duration(text).map_err(|_| bad())?;
    chrono::Duration::from_std(age)
        .ok()
        .and_then(|a| now.checked_sub_signed(a))
        .ok_or_else(bad)
}

fn log_filter(q: &LogQuery) -> Result<(Option<DateTime<Utc>>, usize), ApiError> {
    let limit = q.limit.unwrap_or(DEFAULT_LOG_ENTRIES);
    if limit == 0 || limit > MAX_LOG_ENTRIES {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {MAX_LOG_ENTRIES}"
        )));
    }
    let since = match &q.since {
        Some(t) => Some(parse_since(t, Utc::now())?),
        None => None,
    };
    Ok((since, limit))
}

/// Closes the kept sessions a policy change concerns (see the module documentation).
async fn applied(s: &AppState, concerns: impl Fn(&ConversationRef) -> bool) {
    crate::sessions::close_all(s.sessions.invalidate(concerns)).await;
}

async fn store_policy(s: &AppState, scope: PolicyScope, policy: &Policy) -> Result<(), Error> {
    let (text, hash) = (policy.to_json(), policy.hash());
    s.manager
        .store()
        .run(move |store| store.set_egress_policy(&scope, &text, &hash, store.now()))
        .await
}

async fn clear_policy(s: &AppState, scope: PolicyScope) -> Result<bool, Error> {
    s.manager
        .store()
        .run(move |store| store.clear_egress_policy(&scope))
        .await
}

// ---- Tenant. ----

/// The tenant's network policy (what its conversations get unless they have their own).
#[utoipa::path(get, path = "/v1/policy", tag = "network",
    responses((status = 200, body = PolicyView)))]
pub(crate) async fn get_tenant_policy(
    State(state): State<AppState>,
    principal: Principal,
) -> Response {
    let result = tenant_policy(&state, &principal.tenant)
        .await
        .map(|v| Json(v).into_response())
        .map_err(ApiError::from);
    audited(&principal, "policy_get", result)
}

/// Sets the tenant's network policy. Applies to the next connection of every conversation of
/// the tenant without a policy of its own.
#[utoipa::path(put, path = "/v1/policy", tag = "network", request_body = PolicyBody,
    responses((status = 200, description = "set; the tenant's policy now", body = PolicyView),
              (status = 400, description = "malformed JSON", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "a rule or the profile is refused (the message names the rule), or JSON of the wrong shape", body = ErrorBody)))]
pub(crate) async fn put_tenant_policy(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody<PolicyBody>,
) -> Response {
    let result = async {
        let policy = requested(body)?;
        store_policy(
            &state,
            PolicyScope::Tenant(principal.tenant.clone()),
            &policy,
        )
        .await?;
        applied(&state, |c| c.tenant == principal.tenant).await;
        Ok(Json(tenant_policy(&state, &principal.tenant).await?).into_response())
    }
    .await;
    audited(&principal, "policy_set", result)
}

/// Removes the tenant's network policy: its conversations without their own policy are back
/// to the default profile `none`. Answers the policy now in force for the tenant.
#[utoipa::path(delete, path = "/v1/policy", tag = "network",
    responses((status = 200, description = "removed (or there was none); the default now", body = PolicyView)))]
pub(crate) async fn delete_tenant_policy(
    State(state): State<AppState>,
    principal: Principal,
) -> Response {
    let result = async {
        clear_policy(&state, PolicyScope::Tenant(principal.tenant.clone())).await?;
        applied(&state, |c| c.tenant == principal.tenant).await;
        Ok(Json(tenant_policy(&state, &principal.tenant).await?).into_response())
    }
    .await;
    audited(&principal, "policy_delete", result)
}

// ---- One conversation. ----

/// The network policy in force for a conversation, its hash, and where it comes from
/// (`conversation`, `tenant` or `default`). Does not open or create the conversation.
#[utoipa::path(get, path = "/v1/conversations/{id}/policy", tag = "network",
    params(("id" = String, Path, description = "conversation id")),
    responses((status = 200, body = PolicyView),
              (status = 400, description = "invalid id", body = ErrorBody)))]
pub(crate) async fn get_conversation_policy(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
) -> Response {
    on_conversation(&principal, "policy_get", &id, async |conv| {
        Ok(Json(in_force(&state, &conv).await?.1).into_response())
    })
    .await
}

/// Sets a conversation's own network policy (it wins over the tenant's). The conversation
/// need not exist yet, and is neither opened nor created. Applies to its next connection.
#[utoipa::path(put, path = "/v1/conversations/{id}/policy", tag = "network",
    params(("id" = String, Path, description = "conversation id")), request_body = PolicyBody,
    responses((status = 200, description = "set; the policy now in force", body = PolicyView),
              (status = 400, description = "invalid id, or malformed JSON", body = ErrorBody),
              (status = 413, description = "body too large", body = ErrorBody),
              (status = 422, description = "a rule or the profile is refused (the message names the rule), or JSON of the wrong shape", body = ErrorBody)))]
pub(crate) async fn put_conversation_policy(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    JsonBody(body): JsonBody<PolicyBody>,
) -> Response {
    on_conversation(&principal, "policy_set", &id, async |conv| {
        let policy = requested(body)?;
        store_policy(&state, PolicyScope::Conversation(conv.clone()), &policy).await?;
        applied(&state, |c| c.key == conv.key).await;
        Ok(Json(in_force(&state, &conv).await?.1).into_response())
    })
    .await
}

/// Removes a conversation's own network policy: its tenant's applies again (or `none`).
/// Answers the policy now in force.
#[utoipa::path(delete, path = "/v1/conversations/{id}/policy", tag = "network",
    params(("id" = String, Path, description = "conversation id")),
    responses((status = 200, description = "removed (or there was none); the policy now in force", body = PolicyView),
              (status = 400, description = "invalid id", body = ErrorBody)))]
pub(crate) async fn delete_conversation_policy(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
) -> Response {
    on_conversation(&principal, "policy_delete", &id, async |conv| {
        clear_policy(&state, PolicyScope::Conversation(conv.clone())).await?;
        applied(&state, |c| c.key == conv.key).await;
        Ok(Json(in_force(&state, &conv).await?.1).into_response())
    })
    .await
}

// ---- Verdicts. ----

/// The egress gateway's verdicts for every conversation of the tenant, newest first.
#[utoipa::path(get, path = "/v1/egress-log", tag = "network",
    params(("since" = Option<String>, Query, description = "only verdicts at or after: RFC 3339, or an age such as 15m, 2h, 7d"),
           ("limit" = Option<usize>, Query, description = "the newest N, 1-1000; default 100")),
    responses((status = 200, body = EgressLogView),
              (status = 400, description = "invalid since or limit", body = ErrorBody),
              (status = 422, description = "an unknown query parameter", body = ErrorBody)))]
pub(crate) async fn tenant_egress_log(
    State(state): State<AppState>,
    principal: Principal,
    QueryArgs(q): QueryArgs<LogQuery>,
) -> Response {
    let result = async {
        let (since, limit) = log_filter(&q)?;
        let entries = verdicts(&state, &principal.tenant, None, since, limit).await?;
        Ok(Json(EgressLogView { entries }).into_response())
    }
    .await;
    audited(&principal, "egress_log", result)
}

/// The egress gateway's verdicts for one conversation, newest first. Does not open or create
/// the conversation.
#[utoipa::path(get, path = "/v1/conversations/{id}/egress-log", tag = "network",
    params(("id" = String, Path, description = "conversation id"),
           ("since" = Option<String>, Query, description = "only verdicts at or after: RFC 3339, or an age such as 15m, 2h, 7d"),
           ("limit" = Option<usize>, Query, description = "the newest N, 1-1000; default 100")),
    responses((status = 200, body = EgressLogView),
              (status = 400, description = "invalid id, since or limit", body = ErrorBody),
              (status = 422, description = "an unknown query parameter", body = ErrorBody)))]
pub(crate) async fn conversation_egress_log(
    State(state): State<AppState>,
    principal: Principal,
    PathArgs(id): PathArgs<String>,
    QueryArgs(q): QueryArgs<LogQuery>,
) -> Response {
    on_conversation(&principal, "egress_log", &id, async |conv| {
        let (since, limit) = log_filter(&q)?;
        let entries = verdicts(&state, &principal.tenant, Some(&conv), since, limit).await?;
        Ok(Json(EgressLogView { entries }).into_response())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: serde_json::Value) -> PolicyBody {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_refused_rule_is_named_in_the_422() {
        for rule in [
            "169.254.169.254",
            "10.0.0.0/8:99999",
            "*.",
            "127.0.0.1",
            "a b.example",
        ] {
            let e = requested(body(
                serde_json::json!({"profile": "allowlist", "allow": [rule]}),
            ))
            .unwrap_err();
            assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY, "{rule}");
            assert!(e.message.contains(rule), "{rule}: {}", e.message);
        }
        let e = requested(body(
            serde_json::json!({"profile": "allowlist", "allow": ["a.example"], "deny": ["*."]}),
        ))
        .unwrap_err();
        assert!(e.message.contains("\"*.\""), "{}", e.message);
        assert_eq!(
            requested(body(serde_json::json!({"profile": "allowlist"})))
                .unwrap_err()
                .status,
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(
            requested(body(
                serde_json::json!({"profile": "none", "allow": ["a.example"]})
            ))
            .unwrap_err()
            .status,
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(
            requested(body(serde_json::json!({"profile": "none"}))).unwrap(),
            Policy::None
        );
    }

    #[test]
    fn since_is_a_time_or_an_age() {
        let now = Utc::now();
        assert_eq!(
            parse_since("15m", now).unwrap(),
            now - chrono::Duration::minutes(15)
        );
        assert_eq!(
            parse_since("2026-11-29T15:00:00Z", now)
                .unwrap()
                .to_rfc3339(),
            "2026-11-29T15:00:00+00:00"
        );
        for bad in ["yesterday", "", "-5m", "99999999999999d"] {
            assert_eq!(
                parse_since(bad, now).unwrap_err().status,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
    }
}
