//! How an open conversation reaches its sandbox's agent: straight (the server's direct
//! endpoint) or through the server's proxy.
//!
//! With [`DirectMode::Auto`] (the default), each open asks the server for the direct endpoint
//! of the agent's port (`use_server_proxy=false`). The 1.1.1 Docker runtime answers
//! `PUBLIC_HOST:MAPPED_PORT/proxy/44772` (the sandbox's 44772 published on the Docker host;
//! the agent serves its own `/proxy/44772/...` internally), which
//! [`crate::endpoint::validate_endpoint`] accepts only on an allowlisted host: the configured
//! `direct_hosts` plus the lifecycle server's own host (see [`crate::endpoint`]). An endpoint
//! outside the allowlist is refused before any connection ([`OpenSandboxError::UntrustedEndpoint`],
//! logged as a warning) and the open goes through the proxy: the agent token is never sent to
//! it. An accepted endpoint is probed with one `/ping` bounded by
//! [`OpenSandboxConfig::direct_probe_timeout`] (its connect timeout too); when it does not
//! answer, the open waits for the agent through the proxy (a new sandbox's agent may not be up
//! yet) and probes once more. The verdict is remembered per sandbox in this process
//! ([`AgentPath`], [`OpenSandboxRuntime::agent_path`]): a sandbox found unreachable directly
//! is not probed again; one reached directly is probed on each open, and re-judged when that
//! probe fails.
//!
//! Who can reach the direct port: the sandbox's 44772 is published by Docker on the server's
//! `publish_host`; the egress sidecar (when the sandbox has one) admits inbound connections
//! to it only from the bridge's gateway, that is the Docker host; and the agent refuses any
//! request without the conversation's token (`EXECD_ACCESS_TOKEN`).

use super::*;

/// Whether commands and file operations go straight to the sandbox's agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectMode {
    /// Always through the server's proxy.
    Off,
    /// Straight to the agent when the server hands out an allowlisted direct endpoint that
    /// answers; through the proxy otherwise.
    #[default]
    Auto,
}

impl std::str::FromStr for DirectMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "off" => Ok(DirectMode::Off),
            "auto" => Ok(DirectMode::Auto),
            other => Err(Error::InvalidRequest(format!(
                "opensandbox direct must be \"auto\" or \"off\", not {:?}",
                crate::endpoint::printable(other)
            ))),
        }
    }
}

/// How the last open of a sandbox reached its agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentPath {
    /// Straight to the agent at this base URL.
    Direct {
        /// The validated direct endpoint (`http://host:port/proxy/44772`).
        url: String,
    },
    /// Through the server's proxy.
    Proxy {
        /// Why not directly: `direct = "off"`, the endpoint refused (the rule it broke), or
        /// it did not answer.
        reason: String,
    },
}

/// The verdicts, per sandbox id.
#[derive(Debug, Clone, Default)]
pub(super) struct Paths(Arc<Mutex<HashMap<String, AgentPath>>>);

impl Paths {
    fn get(&self, id: &str) -> Option<AgentPath> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    fn set(&self, id: &str, path: AgentPath) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_owned(), path);
    }

    /// Forgets a sandbox (deleted or replaced).
    pub(super) fn forget(&self, id: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }
}

impl OpenSandboxRuntime {
    /// How this process last reached the agent of `sandbox_id`: `None` before any open of it.
    pub fn agent_path(&self, sandbox_id: &str) -> Option<AgentPath> {
        self.paths.get(sandbox_id)
    }

    /// An execd client of the sandbox `id`, waiting until its agent answers: directly when
    /// allowed and reachable, through the server's proxy otherwise (module documentation).
    /// `subject` is what the agent's token derives from: the conversation key, or
    /// `pool:<slot>` for a sandbox made as a warm pool slot (see `pool.rs`).
    pub(super) async fn connect(&self, id: &str, subject: &str) -> Result<ExecdClient> {
        if self.config.direct == DirectMode::Off {
            self.paths.set(
                id,
                AgentPath::Proxy {
                    reason: "direct = \"off\"".into(),
                },
            );
            return self.connect_proxy(id, subject).await;
        }
        if let Some(AgentPath::Proxy { .. }) = self.paths.get(id) {
            return self.connect_proxy(id, subject).await;
        }
        let endpoint = match self.client.direct_endpoint(id, EXECD_PORT, true).await {
            Ok(e) => e,
            Err(e @ OpenSandboxError::NotFound { .. }) => return Err(to_core_error(e)),
            Err(e) => {
                // Refused (outside the allowlist, a bad path...) or not offered: nothing was
                // sent to it.
                tracing::warn!(sandbox = %id, error = %e, "not using the server's direct endpoint of the sandbox's agent; going through the server proxy");
                self.paths.set(
                    id,
                    AgentPath::Proxy {
                        reason: e.to_string(),
                    },
                );
                return self.connect_proxy(id, subject).await;
            }
        };
        let probe = self.config.direct_probe_timeout;
        let direct = self.execd_client(&endpoint, subject, probe)?;
        let answers = |c: ExecdClient| async move {
            matches!(tokio::time::timeout(probe, c.ping()).await, Ok(Ok(())))
        };
        let chosen = AgentPath::Direct {
            url: endpoint.url.clone(),
        };
        if answers(direct.clone()).await {
            self.paths.set(id, chosen);
            return Ok(direct);
        }
        // A new sandbox's agent may not be up yet: wait for it through the proxy, then ask
        // directly once more.
        let proxied = self.connect_proxy(id, subject).await?;
        if answers(direct.clone()).await {
            self.paths.set(id, chosen);
            return Ok(direct);
        }
        tracing::warn!(sandbox = %id, endpoint = %endpoint.url, "the sandbox's agent does not answer at its direct endpoint; going through the server proxy");
        self.paths.set(
            id,
            AgentPath::Proxy {
                reason: format!(
                    "the direct endpoint {} did not answer /ping within {probe:?}",
                    endpoint.url
                ),
            },
        );
        Ok(proxied)
    }

    /// An execd client for `endpoint`, with the agent's token (the server's, when it sent
    /// one; else the one derived from `subject`).
    fn execd_client(
        &self,
        endpoint: &crate::endpoint::ValidatedEndpoint,
        subject: &str,
        connect_timeout: Duration,
    ) -> Result<ExecdClient> {
        let mut builder = ExecdClient::builder(Endpoint::Http(endpoint.url.clone()))
            .connect_timeout(connect_timeout);
        if let Some((_, token)) = endpoint
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("X-EXECD-ACCESS-TOKEN"))
        {
            builder = builder.token(token.clone());
        } else if let Some(k) = &self.config.agent_key {
            builder = builder.token(k.agent_token(subject));
        }
        builder.build().map_err(Error::from)
    }

    /// The agent through the server's proxy, once it answers `/ping`.
    async fn connect_proxy(&self, id: &str, subject: &str) -> Result<ExecdClient> {
        let endpoint = self
            .client
            .endpoint(id, EXECD_PORT)
            .await
            .map_err(to_core_error)?;
        let client = self.execd_client(&endpoint, subject, self.config.client.connect_timeout)?;
        // Create answers once the container started, not when execd inside answers.
        let deadline = Instant::now() + self.config.ready_timeout;
        let mut wait = Duration::from_millis(20);
        loop {
            match tokio::time::timeout(Duration::from_secs(5), client.ping()).await {
                Ok(Ok(())) => return Ok(client),
                Ok(Err(e)) if Instant::now() >= deadline => {
                    return Err(Error::Backend(format!(
                        "the sandbox's execd did not answer within {:?}: {e}",
                        self.config.ready_timeout
                    )));
                }
                Err(_) if Instant::now() >= deadline => {
                    return Err(Error::TimedOut(self.config.ready_timeout));
                }
                _ => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(250));
                }
            }
        }
    }
}
