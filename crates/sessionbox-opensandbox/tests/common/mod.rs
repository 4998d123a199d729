//! Shared by the tests that need a real OpenSandbox server (`eval "$(scripts/opensandbox-up)"`).
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sessionbox_core::{ConversationId, ConversationRef, TenantId};
use sessionbox_opensandbox::{
    ApiKey, ClientConfig, OpenSandboxClient, OpenSandboxConfig, OpenSandboxRuntime,
};
use sessionbox_store::Store;

/// The server from `OPEN_SANDBOX_DOMAIN` / `OPEN_SANDBOX_API_KEY`. Without them: under
/// `CI=true` the test fails; elsewhere it is skipped with a note (run scripts/test, which starts
/// the server, to run it).
pub fn server() -> Option<(String, ApiKey)> {
    let domain = std::env::var("OPEN_SANDBOX_DOMAIN")
        .ok()
        .filter(|s| !s.is_empty());
    let key = std::env::var("OPEN_SANDBOX_API_KEY")
        .ok()
        .filter(|s| !s.is_empty());
    match (domain, key) {
        (Some(d), Some(k)) => Some((d, ApiKey::new(k).unwrap())),
        _ => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(
                !ci,
                "OPEN_SANDBOX_DOMAIN and OPEN_SANDBOX_API_KEY are not set: under CI the \
                 OpenSandbox tests must run (scripts/test starts the server with \
                 scripts/opensandbox-up)"
            );
            eprintln!(
                "SKIPPED: no OpenSandbox server configured (eval \"$(scripts/opensandbox-up)\")"
            );
            None
        }
    }
}

/// A unique instance name per test, so each test sees only its own sandboxes.
pub fn instance(test: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "t{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst),
        test
    )
}

pub fn client_config(domain: &str, key: ApiKey) -> ClientConfig {
    let mut c = ClientConfig::new(domain, Some(key));
    c.create_timeout = Duration::from_secs(180);
    c.request_timeout = Duration::from_secs(60);
    c
}

pub fn client(domain: &str, key: ApiKey) -> OpenSandboxClient {
    OpenSandboxClient::new(client_config(domain, key)).unwrap()
}

pub fn runtime_with(
    domain: &str,
    key: ApiKey,
    test: &str,
    edit: impl FnOnce(&mut OpenSandboxConfig),
) -> (OpenSandboxRuntime, Store) {
    let mut config = OpenSandboxConfig::new(client_config(domain, key), instance(test));
    config.timeout = Duration::from_secs(600);
    config
        .resource_limits
        .insert("memory".into(), "256Mi".into());
    edit(&mut config);
    let store = Store::open_in_memory().unwrap();
    (
        OpenSandboxRuntime::new(config, directory(store.clone())).unwrap(),
        store,
    )
}

/// A runtime with the defaults of [`runtime`] over `store` (a file-backed store, for tests
/// that need the conversation locks: an in-memory store has none).
pub fn runtime_in(domain: &str, key: ApiKey, test: &str, store: Store) -> OpenSandboxRuntime {
    let mut config = OpenSandboxConfig::new(client_config(domain, key), instance(test));
    config.timeout = Duration::from_secs(600);
    config
        .resource_limits
        .insert("memory".into(), "256Mi".into());
    OpenSandboxRuntime::new(config, directory(store)).unwrap()
}

pub fn runtime(domain: &str, key: ApiKey, test: &str) -> (OpenSandboxRuntime, Store) {
    runtime_with(domain, key, test, |_| {})
}

pub fn conv(id: &str) -> ConversationRef {
    ConversationRef::new(
        TenantId::new("default").unwrap(),
        ConversationId::new(id).unwrap(),
    )
}

/// Asserts that the server holds no sandbox of `rt`'s instance.
pub async fn assert_nothing_left(rt: &OpenSandboxRuntime) {
    let left = rt.server_inventory().await.unwrap();
    assert!(
        left.is_empty(),
        "sandboxes of ours left on the server: {:?}",
        left.iter().map(|s| &s.id).collect::<Vec<_>>()
    );
}

/// The runtime's view of `store`: the manager's one `Directory`.
pub fn directory(store: Store) -> std::sync::Arc<dyn sessionbox_core::Directory> {
    std::sync::Arc::new(sessionbox_manager::StoreDirectory::new(store))
}
