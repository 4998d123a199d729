//! `GET /metrics`: Prometheus text exposition (the `prometheus` crate).
//!
//! Series (all prefixed `sessionbox_`):
//! - `http_requests_total{route,method,status}`: answered requests; `route` is the route
//!   template (`/v1/conversations/{id}/exec`), `unmatched` for unknown paths, so ids and paths
//!   never become labels.
//! - `http_request_duration_seconds{route,method}`: time to the response head (for an event
//!   stream, to its start), a histogram.
//! - `http_errors_total{code}`: error answers by their `code`.
//! - `execs_total{mode}`: commands started, `mode` = `json`, `stream` or `background`.
//! - `busy_conversations`: conversations with a request holding or waiting for their turn.
//! - `background_commands_running`: background commands running now.
//! - `live_conversations`: conversations the runtime holds processes for (a running sandbox, or
//!   host processes in the workspace), counted from the runtime's inventory at scrape time.
//!
//! Metrics are server-wide, not per tenant, and carry no ids: any valid key may read them.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use crate::AppState;
use crate::auth::Principal;
use crate::error::{ApiError, ErrorCode};

/// The server's metrics and their registry.
pub(crate) struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    errors: IntCounterVec,
    pub execs: IntCounterVec,
    busy: IntGauge,
    background: IntGauge,
    live: IntGauge,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let registry = Registry::new_custom(Some("sessionbox".into()), None)
            .expect("a registry with a valid prefix");
        let requests = IntCounterVec::new(
            Opts::new("http_requests_total", "HTTP requests answered"),
            &["route", "method", "status"],
        )
        .expect("valid metric");
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "Time from request to response head, in seconds",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0, 120.0, 600.0,
            ]),
            &["route", "method"],
        )
        .expect("valid metric");
        let errors = IntCounterVec::new(
            Opts::new("http_errors_total", "Error answers by code"),
            &["code"],
        )
        .expect("valid metric");
        let execs = IntCounterVec::new(
            Opts::new("execs_total", "Commands started, by mode"),
            &["mode"],
        )
        .expect("valid metric");
        let busy = IntGauge::new(
            "busy_conversations",
            "Conversations with requests holding or waiting for their turn",
        )
        .expect("valid metric");
        let background = IntGauge::new(
            "background_commands_running",
            "Background commands running now",
        )
        .expect("valid metric");
        let live = IntGauge::new(
            "live_conversations",
            "Conversations with processes running in the runtime (running sandboxes)",
        )
        .expect("valid metric");
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(latency.clone()),
            Box::new(errors.clone()),
            Box::new(execs.clone()),
            Box::new(busy.clone()),
            Box::new(background.clone()),
            Box::new(live.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        Metrics {
            registry,
            requests,
            latency,
            errors,
            execs,
            busy,
            background,
            live,
        }
    }
}

/// Middleware: counts and times every request by route template.
pub(crate) async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |m| m.as_str())
        .to_owned();
    let method = req.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(req).await;
    let m = &state.metrics;
    let status = response.status();
    m.requests
        .with_label_values(&[route.as_str(), method.as_str(), status.as_str()])
        .inc();
    m.latency
        .with_label_values(&[route.as_str(), method.as_str()])
        .observe(started.elapsed().as_secs_f64());
    if status.is_client_error() || status.is_server_error() {
        let code = response
            .extensions()
            .get::<ErrorCode>()
            .map_or_else(|| status.as_str().to_owned(), |c| c.0.to_owned());
        m.errors.with_label_values(&[code.as_str()]).inc();
    }
    response
}

/// Prometheus metrics of this server, in the text exposition format. Needs a key like every
/// other route (except `/healthz` and `/readyz`); any tenant's key reads the server-wide series.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text exposition format 0.0.4",
               content_type = "text/plain", body = String)))]
pub(crate) async fn metrics(State(state): State<AppState>, _principal: Principal) -> Response {
    let m = &state.metrics;
    m.busy.set(state.busy_conversations() as i64);
    m.background.set(state.commands.running() as i64);
    if let Ok(list) = state.manager.runtime().list().await {
        m.live
            .set(list.iter().filter(|c| !c.processes.is_empty()).count() as i64);
    }
    let mut buf = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&m.registry.gather(), &mut buf) {
        return ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "backend",
            format!("cannot encode the metrics: {e}"),
        )
        .into_response();
    }
    let mut r = buf.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
