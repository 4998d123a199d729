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

use anyhow::{Context, bail};
use chrono::Utc;
use serde_json::{Value, json};
use sessionbox_client::Client;
use sessionbox_core::{ConversationId, ConversationRef, ExecRequest, Session, TenantId};
use sessionbox_manager::Manager;
use sessionbox_server::{AppState, ServerConfig};

/// Target: HTTP adds at most this much to the p50 of a warm exec, ms.
pub(crate) const ADDED_P50_MS: f64 = 1.0;

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

/// Nearest-rank percentile of sorted `v` (ms).
fn pct(v: &[f64], p: f64) -> f64 {
    let x = v[((v.len() as f64 - 1.0) * p).round() as usize];
    (x * 1000.0).round() / 1000.0
}

fn summary(mut v: Vec<f64>) -> Value {
    if v.is_empty() {
        return Value::Null;
    }
    v.sort_by(f64::total_cmp);
    json!({
        "count": v.len(),
        "p50_ms": pct(&v, 0.5),
        "p95_ms": pct(&v, 0.95),
        "p99_ms": pct(&v, 0.99),
        "max_ms": pct(&v, 1.0),
    })
}

fn check(r: &sessionbox_core::ExecResult) -> anyhow::Result<()> {
    if !r.success() {
        bail!(
            "`true` failed with {} ({})",
            r.shell_exit_code(),
            String::from_utf8_lossy(&r.stderr).trim()
        );
    }
    Ok(())
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
    let state = AppState::new(
        manager.clone(),
        ServerConfig {
            // Every exec of the load may wait behind the others of its conversation.
            max_queue: load.execs.max(64),
            ..ServerConfig::default()
        },
    );
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
            let l = crate::bench::ms_since(t);
            let t = Instant::now();
            check(&remote.exec(ExecRequest::new("true")).await?)?;
            let h = crate::bench::ms_since(t);
            via_lib.push(l);
            via_http.push(h);
            added.push(h - l);
        }
        let mcp = crate::bench_mcp::round_trip(&format!("http://{addr}/mcp"), key, &lib, iterations)
            .await
            .context("over MCP")?;
        Box::new(lib).close().await?;
        let (lib_p50, http_p50) = {
            let (mut a, mut b) = (via_lib.clone(), via_http.clone());
            a.sort_by(f64::total_cmp);
            b.sort_by(f64::total_cmp);
            (pct(&a, 0.5), pct(&b, 0.5))
        };
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
                    let open_ms = crate::bench::ms_since(t);
                    for n in 0..execs {
                        let t = Instant::now();
                        match remote.exec(ExecRequest::new("true")).await {
                            Ok(r) if r.success() => {
                                let ms = crate::bench::ms_since(t);
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
        let mut levels = Vec::new();
        for &c in &load.levels {
            let mut convs = Vec::with_capacity(c);
            for i in 0..c {
                let conv = ConversationRef::new(
                    tenant.clone(),
                    ConversationId::new(format!("bench-{run_id}-hc{c}-{i:04}"))?,
                );
                created.push(conv.clone());
                let r = client.open(&conv.id).await?;
                check(&r.exec(ExecRequest::new("true")).await?)?;
                convs.push(r);
            }
            let t0 = Instant::now();
            let mut tasks = Vec::with_capacity(c);
            for r in convs {
                let n = load.level_execs;
                tasks.push(tokio::spawn(async move {
                    let mut lat = Vec::with_capacity(n);
                    for _ in 0..n {
                        let t = Instant::now();
                        check(&r.exec(ExecRequest::new("true")).await?)?;
                        lat.push(crate::bench::ms_since(t));
                    }
                    Ok::<_, anyhow::Error>(lat)
                }));
            }
            let mut lat = Vec::new();
            for t in tasks {
                lat.extend(t.await??);
            }
            let wall = t0.elapsed().as_secs_f64();
            levels.push(json!({
                "concurrency": c,
                "execs": lat.len(),
                "wall_s": (wall * 1000.0).round() / 1000.0,
                "throughput_execs_per_s": ((lat.len() as f64 / wall) * 10.0).round() / 10.0,
                "latency": summary(lat),
            }));
        }
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
        Ok(Ok(Err(e))) => eprintln!("bench: the HTTP server failed: {e}"),
        Ok(Err(e)) => eprintln!("bench: the HTTP server task failed: {e}"),
        Err(_) => eprintln!("bench: the HTTP server did not stop within 10 s"),
    }
    result
}
