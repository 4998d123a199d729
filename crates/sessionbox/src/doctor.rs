//! `sessionbox doctor`: which sandbox layers this machine enforces, and what to do about a
//! missing one. Never falls back silently: the `isolated` runtime either runs with every layer
//! reported here or fails naming the missing one.

use std::process::ExitCode;

use sessionbox_local::sandbox::{self, LayerState};

use crate::config::RuntimeKind;

/// Prints the report; exit 0 only when `default` can run here. `opensandbox` is the
/// OpenSandbox server to probe, when one is configured (or the default runtime needs one).
pub async fn run(
    default: RuntimeKind,
    opensandbox: Option<anyhow::Result<sessionbox_opensandbox::ClientConfig>>,
    aio: Option<anyhow::Result<sessionbox_aio::AioRuntime>>,
) -> ExitCode {
    let layers = sandbox::probe();
    let width = layers.iter().map(|l| l.layer.len()).max().unwrap_or(10);
    outln!("sandbox layers (needed by the isolated runtime):");
    let mut missing = 0;
    for l in &layers {
        let state = match l.state {
            LayerState::Enforced => "enforced",
            LayerState::Missing => {
                missing += 1;
                "MISSING"
            }
        };
        outln!("  {:<width$}  {state:<8}  {}", l.layer, l.detail);
        if let Some(hint) = &l.hint
            && l.state == LayerState::Missing
        {
            outln!("  {:<width$}            fix: {hint}", "");
        }
    }
    outln!();
    let isolated_ok = missing == 0;
    outln!(
        "isolated runtime: {}",
        if isolated_ok {
            "can run (every layer enforced)".to_owned()
        } else {
            format!("cannot run: {missing} layer(s) missing; see the fixes above")
        }
    );
    outln!("host runtime: can run (not a security boundary: directory separation only)");
    let aio_ok = match aio {
        None => {
            outln!(
                "aio runtime: not configured (--runtime aio --endpoint URL, AIO_SANDBOX_BASE_URL \
                 or [aio] endpoint); one shared container, trusted users only"
            );
            false
        }
        Some(Err(e)) => {
            outln!("aio runtime: cannot run: {e:#}");
            false
        }
        Some(Ok(rt)) => match rt.client().bash_sessions().await {
            Ok(sessions) => {
                outln!(
                    "aio runtime: can run: {} answers ({} bash session(s)); one shared \
                     container, trusted users only",
                    rt.client().endpoint(),
                    sessions.len()
                );
                true
            }
            Err(e) => {
                outln!("aio runtime: cannot run: {e}");
                false
            }
        },
    };
    let opensandbox_ok = match opensandbox {
        None => {
            outln!(
                "opensandbox runtime: not configured (--endpoint, OPEN_SANDBOX_DOMAIN or \
                 [opensandbox] endpoint; scripts/opensandbox-up starts a local server)"
            );
            false
        }
        Some(Err(e)) => {
            outln!("opensandbox runtime: cannot run: {e:#}");
            false
        }
        Some(Ok(config)) => probe_opensandbox(config).await,
    };
    outln!("default runtime: {}", default.name());
    let ok = match default {
        RuntimeKind::Isolated => isolated_ok,
        RuntimeKind::Host => true,
        RuntimeKind::Aio => aio_ok,
        RuntimeKind::Opensandbox => opensandbox_ok,
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `/health` must say exactly `{"status":"healthy"}` and an authenticated list must succeed.
async fn probe_opensandbox(config: sessionbox_opensandbox::ClientConfig) -> bool {
    let client = match sessionbox_opensandbox::OpenSandboxClient::new(config) {
        Ok(c) => c,
        Err(e) => {
            outln!("opensandbox runtime: cannot run: {e}");
            return false;
        }
    };
    let server = client.origin().as_str().trim_end_matches('/').to_owned();
    match client.probe().await {
        Ok(h) => {
            outln!(
                "opensandbox runtime: can run: {server} is a healthy OpenSandbox server \
                 (version {}), the API key is accepted ({} sandbox(es) visible)",
                h.version.as_deref().unwrap_or("unknown"),
                h.sandboxes
            );
            true
        }
        Err(e @ sessionbox_opensandbox::OpenSandboxError::Unauthorized { .. }) => {
            outln!("opensandbox runtime: cannot run: wrong or missing API key: {e}");
            false
        }
        Err(e) => {
            outln!("opensandbox runtime: cannot run: {e}");
            false
        }
    }
}
