//! `StoreDirectory`, the one `Directory` over the store, against a real SQLite file and a real
//! PostgreSQL database (see the store's `tests/support/pg.rs`): one test body per behaviour,
//! run on each backend as `sqlite::NAME` and `postgres::NAME`.

use crate::pg;

use std::time::Duration;

use chrono::Utc;
use sessionbox_core::{ConversationRef, Directory};
use sessionbox_egress::Policy;
use sessionbox_manager::{StoreDirectory, effective_policy};
use sessionbox_store::{Lifecycle, PolicyScope, Store};

fn conv(tenant: &str, id: &str) -> ConversationRef {
    ConversationRef::parse(tenant, id).unwrap()
}

/// Runs `f` on the store off the async runtime (the PostgreSQL client blocks its thread).
async fn on<T: Send + 'static>(
    store: &Store,
    f: impl FnOnce(&Store) -> sessionbox_core::Result<T> + Send + 'static,
) -> T {
    store.run(f).await.unwrap()
}

async fn set(store: &Store, scope: PolicyScope, p: &Policy) {
    let (json, hash) = (p.to_json(), p.hash());
    on(store, move |s| {
        s.set_egress_policy(&scope, &json, &hash, Utc::now())
    })
    .await;
}

async fn the_network_answer_is_the_policy_in_force(store: Store) {
    let d = StoreDirectory::new(store.clone());
    let c = conv("acme", "net");
    let none = d.network(&c).await.unwrap();
    assert!(!none.allows_network);
    assert_eq!(none.hash, None);
    assert_eq!(none.json, Policy::None.to_json());

    let tenant = Policy::allowlist(&["*.pypi.org:443"], &[]).unwrap();
    set(&store, PolicyScope::Tenant(c.tenant.clone()), &tenant).await;
    let n = d.network(&c).await.unwrap();
    assert!(n.allows_network);
    assert_eq!(n.hash.as_deref(), Some(tenant.hash().as_str()));
    assert_eq!(Policy::from_json(&n.json).unwrap(), tenant);

    // The conversation's own policy wins over its tenant's.
    set(&store, PolicyScope::Conversation(c.clone()), &Policy::None).await;
    let own = d.network(&c).await.unwrap();
    assert!(!own.allows_network);
    assert_eq!(own.hash.as_deref(), Some(Policy::None.hash().as_str()));
    assert_eq!(d.effective_policy(&c).await.unwrap(), Policy::None);
    let other = on(&store, |s| effective_policy(s, &conv("acme", "other"))).await;
    assert_eq!(other, tenant);
}

async fn a_stored_policy_that_no_longer_decodes_says_to_set_it_again(store: Store) {
    let d = StoreDirectory::new(store.clone());
    let c = conv("acme", "broken");
    let scope = PolicyScope::Conversation(c.clone());
    on(&store, move |s| {
        s.set_egress_policy(
            &scope,
            "{\"profile\":\"teleport\"}",
            &"0".repeat(64),
            Utc::now(),
        )
    })
    .await;
    let e = d.network(&c).await.unwrap_err();
    assert_eq!(e.code(), "backend_error", "{e}");
    assert!(e.to_string().contains("set it again"), "{e}");
    assert!(e.to_string().contains("broken"), "{e}");
}

async fn uids_and_idle_timeouts_come_from_the_record(store: Store) {
    let d = StoreDirectory::new(store.clone());
    let c = conv("acme", "uid");
    assert_eq!(
        d.sandbox_uid(&c.key, 5000..5002).await.unwrap_err().code(),
        "not_found"
    );
    assert_eq!(d.idle_timeout(&c.key).await.unwrap(), None);
    let lifecycle = Lifecycle {
        idle_timeout: Some(Duration::from_secs(300)),
        ..Lifecycle::default()
    };
    let c2 = c.clone();
    on(&store, move |s| {
        s.get_or_create_with(&c2, "isolated", Utc::now(), &lifecycle)
    })
    .await;
    let uid = d.sandbox_uid(&c.key, 5000..5002).await.unwrap();
    assert_eq!(uid, 5000);
    assert_eq!(d.sandbox_uid(&c.key, 5000..5002).await.unwrap(), uid);
    assert_eq!(
        d.idle_timeout(&c.key).await.unwrap(),
        Some(Duration::from_secs(300))
    );
    // No skills configured: nothing to bind.
    assert!(d.skill_binds(&c.key).await.unwrap().is_empty());
}

async fn remote_sandboxes_are_recorded_once_and_compared_by_id(store: Store) {
    let d = StoreDirectory::new(store.clone());
    let c = conv("acme", "remote");
    assert_eq!(d.remote_sandbox(&c.key).await.unwrap(), None);
    let (won, first) = d
        .record_remote_sandbox(&c.key, "opensandbox", "sb-1", None)
        .await
        .unwrap();
    assert!(first);
    assert_eq!(won.sandbox_id, "sb-1");
    let (winner, second) = d
        .record_remote_sandbox(&c.key, "opensandbox", "sb-2", None)
        .await
        .unwrap();
    assert!(!second);
    assert_eq!(winner.sandbox_id, "sb-1");
    assert!(
        !d.replace_remote_sandbox(&c.key, "sb-x", "sb-3", None)
            .await
            .unwrap()
    );
    assert!(
        d.replace_remote_sandbox(&c.key, "sb-1", "sb-3", None)
            .await
            .unwrap()
    );
    let expiry = chrono::DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap();
    assert!(
        d.set_remote_sandbox_expiry(&c.key, "sb-3", Some(expiry))
            .await
            .unwrap()
    );
    assert!(
        !d.set_remote_sandbox_expiry(&c.key, "sb-1", None)
            .await
            .unwrap()
    );
    let now = d.remote_sandbox(&c.key).await.unwrap().unwrap();
    assert_eq!(
        (now.sandbox_id.as_str(), now.expires_at),
        ("sb-3", Some(expiry))
    );
    let all = d.remote_sandboxes("opensandbox").await.unwrap();
    assert_eq!(all.len(), 1);
    assert!(d.remote_sandboxes("other").await.unwrap().is_empty());
    assert!(!d.forget_remote_sandbox(&c.key, "sb-1").await.unwrap());
    assert!(d.forget_remote_sandbox(&c.key, "sb-3").await.unwrap());
    assert_eq!(d.remote_sandbox(&c.key).await.unwrap(), None);
}

fn block_on(f: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f);
}

macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $name() {
                    let dir = tempfile::tempdir().unwrap();
                    let store = super::Store::open(&dir.path().join("store.db")).unwrap();
                    super::block_on(super::$name(store));
                }
            )*
        }
        mod postgres {
            $(
                #[test]
                fn $name() {
                    let Some(db) = super::pg::database() else { return };
                    let store = super::Store::connect(&db.url).unwrap();
                    super::block_on(super::$name(store));
                }
            )*
        }
    };
}

on_both_backends!(
    the_network_answer_is_the_policy_in_force,
    a_stored_policy_that_no_longer_decodes_says_to_set_it_again,
    uids_and_idle_timeouts_come_from_the_record,
    remote_sandboxes_are_recorded_once_and_compared_by_id,
);
