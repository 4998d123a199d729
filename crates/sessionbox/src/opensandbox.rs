//! Wiring of the `opensandbox` runtime: where the server is (`--endpoint`, then
//! `OPEN_SANDBOX_DOMAIN`, then `[opensandbox] endpoint`), the API key (only from
//! `OPEN_SANDBOX_API_KEY`: never a flag or the file), and the runtime's settings, network
//! included (`network_policy`, `egress_gateway` with the data directory's `egress.key`).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use sessionbox_opensandbox::{ApiKey, ClientConfig, OpenSandboxConfig, OpenSandboxRuntime};
use sessionbox_store::Store;

use crate::config::OpenSandboxSection;

/// The environment variable holding the server's address (as OpenSandbox users already set it).
pub const DOMAIN_ENV: &str = "OPEN_SANDBOX_DOMAIN";
/// The environment variable holding the API key.
pub const API_KEY_ENV: &str = "OPEN_SANDBOX_API_KEY";

/// The lifecycle client's settings from the flag, the environment and the file.
pub fn client_config(
    endpoint_flag: Option<&str>,
    section: &OpenSandboxSection,
) -> anyhow::Result<ClientConfig> {
    let endpoint = endpoint_flag
        .map(str::to_owned)
        .or_else(|| std::env::var(DOMAIN_ENV).ok().filter(|s| !s.is_empty()))
        .or_else(|| section.endpoint.clone());
    let Some(endpoint) = endpoint else {
        bail!(
            "the opensandbox runtime needs a server: pass --endpoint http://HOST:PORT, set \
             {DOMAIN_ENV}, or set endpoint in [opensandbox] of sessionbox.toml \
             (scripts/opensandbox-up starts a local one)"
        );
    };
    let key = match std::env::var(API_KEY_ENV) {
        Ok(k) if !k.is_empty() => {
            Some(ApiKey::new(k).map_err(|e| anyhow::anyhow!("{API_KEY_ENV}: {e}"))?)
        }
        _ => None,
    };
    let mut config = ClientConfig::new(endpoint, key);
    if let Some(p) = section.use_server_proxy {
        config.use_server_proxy = p;
    }
    config.direct_hosts = section.direct_hosts.clone();
    Ok(config)
}

/// The runtime for `data_dir`'s store.
pub fn runtime(
    endpoint_flag: Option<&str>,
    section: &OpenSandboxSection,
    data_dir: &Path,
    store: Store,
) -> anyhow::Result<OpenSandboxRuntime> {
    let client = client_config(endpoint_flag, section)?;
    let instance = match &section.instance {
        Some(i) => i.clone(),
        None => default_instance(data_dir)?,
    };
    let mut config = OpenSandboxConfig::new(client, instance);
    if let Some(image) = &section.image {
        config.image = image.clone();
    }
    if let Some(t) = section.timeout_secs {
        config.timeout = Duration::from_secs(t);
    }
    if let Some(t) = section.ready_timeout_secs {
        config.ready_timeout = Duration::from_secs(t);
    }
    if let Some(cpu) = &section.cpu {
        config.resource_limits.insert("cpu".into(), cpu.clone());
    }
    if let Some(memory) = &section.memory {
        config
            .resource_limits
            .insert("memory".into(), memory.clone());
    }
    config.egress.network_policy = section.network_policy.unwrap_or(false);
    if let Some(address) = &section.egress_gateway {
        config.egress.gateway = Some(
            crate::egress::gateway_access(address, data_dir)
                .context("[opensandbox] egress_gateway")?,
        );
    }
    Ok(OpenSandboxRuntime::new(config, store)?)
}

/// `sb-` and 12 hex digits of the SHA-256 of the data directory's canonical path: one instance
/// per store, so two installations sharing a server never touch each other's sandboxes.
fn default_instance(data_dir: &Path) -> anyhow::Result<String> {
    use sha2::Digest;
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let canon = std::fs::canonicalize(data_dir)
        .with_context(|| format!("cannot resolve {}", data_dir.display()))?;
    let digest = sha2::Sha256::digest(canon.as_os_str().as_encoded_bytes());
    Ok(format!(
        "sb-{}",
        digest[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ))
}
