//! The HTTP part of `sessionbox bench`: what serving adds to an exec, and how the server holds
//! up under many clients. Runs on the same manager (store and runtime) as the library numbers.
//!
//! 1. Round trip: `sessionbox-server` on a loopback port in this process, with a fresh API key;
//!    one warm conversation. Each iteration runs `true` once through the library (the manager's
//!    session, opened once) and once through HTTP (`sessionbox-client`, a kept-alive
//!    connection), back to back, so both see the machine in the same state. Reported: both
//!    latencies and the p50 added by HTTP (target: at most 1 ms). The HTTP path pays what a
//!    request pays: key check, the conversation's turn, opening it, the audit records.
//! 2. Load: C client tasks share a list of N new conversations; each takes the next
//!    conversation and runs its M execs of `true` one after another (a conversation's turns
//!    are sequential), then takes another. Reported: errors (target: zero), p50/p95/p99 of
//!    every exec, of first execs (which create the conversation) and of the rest, and
//!    throughput in execs per second of wall time.
//!
//! The key is revoked and every conversation is destroyed by the caller afterwards.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Context;
use chrono::Utc;
use serde_json::{Value, json};
use sessionbox_client::Client;
use sessionbox_core::{ConversationId, ConversationRef, ExecRequest, Session, TenantId};
use sessionbox_manager::Manager;
use sessionbox_server::{AppState, ServerConfig};

/// Target: HTTP adds at most this much to the p50 of a warm exec, ms (issue 20).
pub(crate) const ADDED_P50_MS: f64 = 0.2;

/// Shape of the load test, and of the throughput levels measured through HTTP.
#[derive(Debug, Clone)]
pub(crate) struct Load {
    /// Concurrency levels (conversations at once) of the throughput measurement.
    pub levels: Vec<usize>,
    /// Execs per conversation at each level.
    pub level_execs: usize,
    /// New conversations.
    pub conversations: usize,
    /// Execs per conversation.
    pub execs: usize,
    /// Concurrent clients.
    pub clients: usize,
}

use crate::scale::{check_true as check, percentiles as summary};

/// The p50 of `v` (ms, to the microsecond).
fn p50(v: &[f64]) -> f64 {
    summary(v.to_vec())["p50_ms"].as_f64().unwrap_or(f64::NAN)
}

/// Measures round trip and load on `manager`. Conversations it creates are pushed to
/// `created` before they are used, so the caller destroys them whatever happens.
pub(crate) async fn measure(
    manager: &Manager,
    tenant: &TenantId,
    run_id: &str,
    iterations: usize,
    load: Load,
    created: &mut Vec<ConversationRef>,
) -> anyhow::Result<Value> {
    let store = manager.store().clone();
    let key = store.create_api_key(tenant, Some("sessionbox bench (revoked after)"), Utc::now())?;
    let result =
        serve_and_measure(manager, tenant, run_id, iterations, load, created, &key.key).await;
    store.revoke_api_key(&key.record.id, Utc::now())?;
    result
}

async fn serve_and_measure(
    manager: &Manager,
    tenant: &TenantId,
    run_id: &str,
    iterations: usize,
    load: Load,
    created: &mut Vec<ConversationRef>,
    key: &str,
) -> anyhow::Result<Value> {
    let state = AppState::new(manager.clone(), {
        // Room in the output budget for every request the load and the levels have in
        // flight at once, twice over (a reservation ends just after its answer is sent, so
        // a client's next request can overlap it): each reserves 2x the default output
        // limit. The default budget (128 such requests) is what a production server needs,
        // and a measurement at 128 concurrent requests would be refused at its edge.
        let in_flight = load
            .levels
            .iter()
            .copied()
            .max()
            .unwrap_or(1)
            .max(load.clients) as u64;
        let budget = (4 * in_flight * sessionbox_core::DEFAULT_OUTPUT_LIMIT as u64)
            .max(sessionbox_server::DEFAULT_MAX_OUTPUT_BYTES_PER_TENANT);
        ServerConfig {
            // Every exec of the load may wait behind the others of its conversation.
            max_queue: load.execs.max(64),
            max_output_bytes_per_tenant: budget,
            max_output_bytes_total: budget.max(sessionbox_server::DEFAULT_MAX_OUTPUT_BYTES_TOTAL),
            ..ServerConfig::default()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot listen on a loopback port")?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sessionbox_server::serve(listener, state, async {
        let _ = stopped.await;
    }));
    let client = Client::new(&format!("http://{addr}"), Some(key.to_owned()))?;
    let result = async {
        // 1. Round trip on one warm conversation.
        let conv = ConversationRef::new(
            tenant.clone(),
            ConversationId::new(format!("bench-{run_id}-http"))?,
        );
        created.push(conv.clone());
        let lib = manager.open(&conv).await?;
        let remote = client.open(&conv.id).await?;
        for _ in 0..(iterations / 10).clamp(1, 20) {
            check(&lib.exec(ExecRequest::new("true")).await?)?;
            check(&remote.exec(ExecRequest::new("true")).await?)?;
        }
        let (mut via_lib, mut via_http, mut added) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..iterations {
            let t = Instant::now();
            check(&lib.exec(ExecRequest::new("true")).await?)?;
            let l = crate::stats::ms(t);
            let t = Instant::now();
            check(&remote.exec(ExecRequest::new("true")).await?)?;
            let h = crate::stats::ms(t);
            via_lib.push(l);
            via_http.push(h);
            added.push(h - l);
        }
        let mcp = crate::mcp::round_trip(&format!("http://{addr}/mcp"), key, &lib, iterations)
            .await
            .context("over MCP")?;
        Box::new(lib).close().await?;
        let (lib_p50, http_p50) = (p50(&via_lib), p50(&via_http));
        let added_p50 = ((http_p50 - lib_p50) * 1000.0).round() / 1000.0;

        // 2. Load.
        let convs: Vec<ConversationRef> = (0..load.conversations)
            .map(|i| {
                Ok(ConversationRef::new(
                    tenant.clone(),
                    ConversationId::new(format!("bench-{run_id}-load-{i:04}"))?,
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        created.extend(convs.iter().cloned());
        let convs = Arc::new(convs);
        let next = Arc::new(AtomicUsize::new(0));
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..load.clients {
            let (client, convs, next) = (client.clone(), convs.clone(), next.clone());
            let execs = load.execs;
            tasks.push(tokio::spawn(async move {
                let (mut first, mut rest, mut errors) = (Vec::new(), Vec::new(), Vec::new());
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(conv) = convs.get(i) else { break };
                    let t = Instant::now();
                    let remote = match client.open(&conv.id).await {
                        Ok(r) => r,
                        Err(e) => {
                            errors.push(format!("open {}: {e}", conv.id));
                            continue;
                        }
                    };
                    let open_ms = crate::stats::ms(t);
                    for n in 0..execs {
                        let t = Instant::now();
                        match remote.exec(ExecRequest::new("true")).await {
                            Ok(r) if r.success() => {
                                let ms = crate::stats::ms(t);
                                if n == 0 {
                                    first.push(open_ms + ms);
                                } else {
                                    rest.push(ms);
                                }
                            }
                            Ok(r) => errors.push(format!(
                                "{} exec {n}: exit {}",
                                conv.id,
                                r.shell_exit_code()
                            )),
                            Err(e) => errors.push(format!("{} exec {n}: {e}", conv.id)),
                        }
                    }
                }
                (first, rest, errors)
            }));
        }
        let (mut first, mut rest, mut errors) = (Vec::new(), Vec::new(), Vec::new());
        for t in tasks {
            let (f, r, e) = t.await.context("a load client panicked")?;
            first.extend(f);
            rest.extend(r);
            errors.extend(e);
        }
        let wall = t0.elapsed().as_secs_f64();
        let done = first.len() + rest.len();
        let all: Vec<f64> = first.iter().chain(rest.iter()).copied().collect();
        errors.truncate(20);

        // 3. Throughput at each level, as the library's is measured (bench_scale).
        let prefix = format!("bench-{run_id}-h");
        let levels = crate::scale::throughput(
            tenant,
            &prefix,
            &load.levels,
            load.level_execs,
            created,
            |c| {
                let client = client.clone();
                async move { Ok(client.open(&c.id).await?) }
            },
        )
        .await?;
        Ok::<Value, anyhow::Error>(json!({
            "mcp_round_trip": mcp,
            "throughput": levels,
            "round_trip": {
                "what": "`true` on one warm conversation: library (manager session) then HTTP (sessionbox-client, keep-alive), back to back",
                "library": summary(via_lib),
                "http": summary(via_http),
                "added_per_iteration": summary(added),
                "added_p50_ms": added_p50,
                "target_added_p50_ms": ADDED_P50_MS,
            },
            "load": {
                "conversations": load.conversations,
                "execs_per_conversation": load.execs,
                "clients": load.clients,
                "execs_ok": done,
                "errors": load.conversations * load.execs - done,
                "error_samples": errors,
                "wall_s": (wall * 1000.0).round() / 1000.0,
                "throughput_execs_per_s": ((done as f64 / wall) * 10.0).round() / 10.0,
                "all": summary(all),
                "first_exec_with_create": summary(first),
                "later_execs": summary(rest),
            },
        }))
    }
    .await;
    let _ = stop.send(());
    match tokio::time::timeout(std::time::Duration::from_secs(10), server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => warn!("the HTTP server failed: {e}"),
        Ok(Err(e)) => warn!("the HTTP server task failed: {e}"),
        Err(_) => warn!("the HTTP server did not stop within 10 s"),
    }
    result
}
