//! `GET /v1/installation/doctor`: `sessionbox doctor`'s report on the machine `serve` runs on,
//! run on demand by the front end that knows how ([`AppState::set_doctor`]) and kept for
//! [`DOCTOR_MAX_AGE`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use serde::Serialize;
use utoipa::ToSchema;

use super::audited;
use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiError;

/// How long a doctor report is shown before the next request runs the checks again.
pub const DOCTOR_MAX_AGE: Duration = Duration::from_secs(600);

/// What `sessionbox doctor` found, as the front end that ran it hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoctorReport {
    /// True when the default runtime can run here (`doctor`'s exit status 0).
    pub ok: bool,
    /// The lines that name a problem: a missing sandbox layer, a disk quota that does not
    /// hold, a configured runtime that cannot run.
    pub problems: Vec<String>,
    /// The whole report, as `sessionbox doctor` prints it.
    pub text: String,
}

/// Runs the checks; called at most once at a time, and at most once per [`DOCTOR_MAX_AGE`].
pub type DoctorProbe = Arc<dyn Fn() -> BoxFuture<'static, DoctorReport> + Send + Sync>;

/// The probe and its last report, with when it was made.
#[derive(Default)]
pub(crate) struct Doctor {
    probe: std::sync::OnceLock<DoctorProbe>,
    /// Held while the checks run: a second request waits for the first's report.
    last: tokio::sync::Mutex<Option<(Instant, DoctorView)>>,
}

impl Doctor {
    pub(crate) fn set(&self, probe: DoctorProbe) -> bool {
        self.probe.set(probe).is_ok()
    }

    /// The last report when younger than [`DOCTOR_MAX_AGE`], else a new one; `None` without
    /// a probe.
    async fn report(&self) -> Option<DoctorView> {
        let probe = self.probe.get()?;
        let mut last = self.last.lock().await;
        if let Some((at, view)) = last.as_ref()
            && at.elapsed() < DOCTOR_MAX_AGE
        {
            return Some(view.clone());
        }
        let r = probe().await;
        let view = DoctorView {
            available: true,
            ok: r.ok,
            problems: r.problems,
            report: r.text,
            checked_at: Some(Utc::now()),
        };
        *last = Some((Instant::now(), view.clone()));
        Some(view)
    }
}

/// `sessionbox doctor` on the machine the server runs on.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = Doctor)]
pub(crate) struct DoctorView {
    /// False when this server cannot run the checks (it was started as a library, not by
    /// `sessionbox serve`); the other fields are then empty.
    available: bool,
    /// True when the default runtime can run here.
    ok: bool,
    /// The lines of the report that name a problem.
    problems: Vec<String>,
    /// The whole report, as `sessionbox doctor` prints it.
    report: String,
    /// When the checks ran (they run again on a request after 10 minutes).
    checked_at: Option<DateTime<Utc>>,
}

/// `sessionbox doctor`'s report on this machine: the sandbox layers the `isolated` runtime
/// needs, its limits and disk quota, and whether each configured runtime can run. Run on the
/// first request and again on one 10 minutes after the last (the checks make and remove a
/// probe cgroup and, with a disk quota, a small volume). Tenant-wide: a key limited to
/// conversations is refused.
#[utoipa::path(get, path = "/v1/installation/doctor", tag = "account",
    operation_id = "installation_doctor",
    responses((status = 200, body = DoctorView)))]
pub(crate) async fn doctor(State(state): State<AppState>, principal: Principal) -> Response {
    let result = async {
        let view = state.doctor.report().await.unwrap_or(DoctorView {
            available: false,
            ok: false,
            problems: Vec::new(),
            report: String::new(),
            checked_at: None,
        });
        Ok::<_, ApiError>(Json(view).into_response())
    }
    .await;
    audited(&principal, "installation", result)
}
