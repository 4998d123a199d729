//! `Manager::open_for` in each mode against each state of the record (absent, active, expired,
//! destroyed and made again), and `Manager::revalidate`, over the real `host` runtime and a
//! real SQLite store.

use std::sync::Arc;

use chrono::{Duration as Span, Utc};
use sessionbox_core::{ConversationRef, OpenMode, Operation, Session};
use sessionbox_egress::Policy;
use sessionbox_local::host::{HostConfig, HostRuntime};
use sessionbox_manager::{Manager, TOUCH_EVERY};
use sessionbox_store::{PolicyScope, Store};

fn manager(dir: &std::path::Path) -> Manager {
    let store = Store::open(&dir.join("sessionbox.db")).unwrap();
    let runtime = HostRuntime::new(HostConfig::new(dir)).unwrap();
    Manager::new(store, Arc::new(runtime))
}

fn conv(id: &str) -> ConversationRef {
    ConversationRef::parse("acme", id).unwrap()
}

async fn record(m: &Manager, c: &ConversationRef) -> Option<sessionbox_store::ConversationRecord> {
    let key = c.key.clone();
    m.store().run(move |s| s.get(&key)).await.unwrap()
}

async fn expire(m: &Manager, c: &ConversationRef) {
    let key = c.key.clone();
    let past = Utc::now() - Span::seconds(5);
    m.store()
        .run(move |s| s.set_expiry(&key, Some(past)))
        .await
        .unwrap();
}

/// Gives `c` a policy of its own (an allowlist); returns its hash.
async fn set_own_policy(m: &Manager, c: &ConversationRef) -> String {
    let p = Policy::allowlist(&["*.pypi.org:443"], &[]).unwrap();
    let (json, hash) = (p.to_json(), p.hash());
    let scope = PolicyScope::Conversation(c.clone());
    let h = hash.clone();
    m.store()
        .run(move |s| s.set_egress_policy(&scope, &json, &h, Utc::now()))
        .await
        .unwrap();
    hash
}

#[tokio::test]
async fn an_absent_conversation_opened_existing_only_is_not_found_and_not_made() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let c = conv("absent");
    let e = m
        .open_for(&c, Operation::Read.open_mode())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "not_found", "{e}");
    assert!(e.to_string().contains("does not exist"), "{e}");
    assert!(record(&m, &c).await.is_none());
    assert!(!d.path().join("workspaces").join(c.key.as_str()).exists());
}

#[tokio::test]
async fn an_absent_conversation_opened_create_if_absent_is_made() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let c = conv("new");
    let held = m.open_for(&c, OpenMode::CreateIfAbsent).await.unwrap();
    assert!(held.created());
    assert!(held.previous_expired().is_none());
    held.write("a.txt", b"x").await.unwrap();
    let r = record(&m, &c).await.unwrap();
    assert_eq!(r.generation, held.record().generation);
    let (session, _lock) = held.into_parts();
    Box::new(session).close().await.unwrap();
}

#[tokio::test]
async fn an_active_conversation_opens_in_both_modes_with_its_files() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let c = conv("active");
    let first = m.open_for(&c, OpenMode::CreateIfAbsent).await.unwrap();
    first.write("kept.txt", b"kept").await.unwrap();
    let generation = first.record().generation;
    drop(first);
    for mode in [OpenMode::ExistingOnly, OpenMode::CreateIfAbsent] {
        let again = m.open_for(&c, mode).await.unwrap();
        assert!(!again.created(), "{mode:?}");
        assert_eq!(again.record().generation, generation, "{mode:?}");
        assert_eq!(again.read("kept.txt").await.unwrap(), b"kept", "{mode:?}");
    }
}

#[tokio::test]
async fn an_expired_conversation_is_not_found_existing_only_and_made_anew_by_a_creating_open() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let c = conv("expired");
    let first = m.open_for(&c, OpenMode::CreateIfAbsent).await.unwrap();
    first.write("gone.txt", b"old").await.unwrap();
    let old = first.record().generation;
    drop(first);
    expire(&m, &c).await;

    let e = m.open_for(&c, OpenMode::ExistingOnly).await.unwrap_err();
    assert_eq!(e.code(), "not_found", "{e}");
    assert!(e.to_string().contains("expired at"), "{e}");
    assert!(e.to_string().contains("files are gone"), "{e}");
    // Left to garbage collection (or a creating open): still the old record.
    assert_eq!(record(&m, &c).await.unwrap().generation, old);

    let fresh = m.open_for(&c, Operation::Exec.open_mode()).await.unwrap();
    assert!(fresh.created());
    assert!(fresh.previous_expired().is_some());
    assert_ne!(fresh.record().generation, old);
    assert_eq!(
        fresh.read("gone.txt").await.unwrap_err().code(),
        "not_found"
    );
}

#[tokio::test]
async fn the_conversation_stays_held_while_the_open_lives() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let c = conv("held");
    let held = m.open_for(&c, OpenMode::CreateIfAbsent).await.unwrap();
    let key = c.key.clone();
    let other = m
        .store()
        .run(move |s| s.try_lock_conversation(&key).map(|l| l.is_some()))
        .await
        .unwrap();
    assert!(
        !other,
        "another holder got the lock while the open was held"
    );
    drop(held);
    let key = c.key.clone();
    let free = m
        .store()
        .run(move |s| s.try_lock_conversation(&key).map(|l| l.is_some()))
        .await
        .unwrap();
    assert!(free);
}

#[tokio::test]
async fn a_kept_session_is_valid_until_its_conversation_is_destroyed_and_made_again() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let c = conv("recreated");
    let (kept, lock) = m
        .open_for(&c, OpenMode::CreateIfAbsent)
        .await
        .unwrap()
        .into_parts();
    drop(lock);
    assert!(m.revalidate(&kept, None).await.unwrap());
    {
        let _lock = m.hold(&c).await.unwrap();
        m.destroy(&c).await.unwrap();
    }
    assert!(!m.revalidate(&kept, None).await.unwrap(), "destroyed");
    let again = m.open_for(&c, OpenMode::CreateIfAbsent).await.unwrap();
    assert!(again.created());
    assert!(
        !m.revalidate(&kept, None).await.unwrap(),
        "a new generation is another conversation"
    );
    assert!(m.revalidate(&again, None).await.unwrap());
}

#[tokio::test]
async fn a_kept_session_is_invalid_once_it_expires_or_its_policy_changes() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let c = conv("policy");
    let (kept, _lock) = m
        .open_for(&c, OpenMode::CreateIfAbsent)
        .await
        .unwrap()
        .into_parts();
    assert!(m.revalidate(&kept, None).await.unwrap());
    let hash = set_own_policy(&m, &c).await;
    assert!(!m.revalidate(&kept, None).await.unwrap(), "policy changed");
    assert!(m.revalidate(&kept, Some(&hash)).await.unwrap());
    expire(&m, &c).await;
    assert!(!m.revalidate(&kept, Some(&hash)).await.unwrap(), "expired");
}

#[tokio::test]
async fn revalidating_renews_the_record_at_most_once_per_touch_interval() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let c = conv("touch");
    let (kept, _lock) = m
        .open_for(&c, OpenMode::CreateIfAbsent)
        .await
        .unwrap()
        .into_parts();
    let opened = kept.touched_at();
    let used = record(&m, &c).await.unwrap().last_used_at;
    assert!(m.revalidate(&kept, None).await.unwrap());
    assert_eq!(kept.touched_at(), opened, "renewed within the interval");
    assert_eq!(record(&m, &c).await.unwrap().last_used_at, used);
    tokio::time::sleep(TOUCH_EVERY + std::time::Duration::from_millis(50)).await;
    assert!(m.revalidate(&kept, None).await.unwrap());
    assert!(kept.touched_at() > opened);
    assert!(record(&m, &c).await.unwrap().last_used_at > used);
}

#[tokio::test]
async fn a_conversation_being_destroyed_is_busy_in_both_modes() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let c = conv("destroying");
    let first = m.open_for(&c, OpenMode::CreateIfAbsent).await.unwrap();
    let generation = first.record().generation;
    drop(first);
    let key = c.key.clone();
    m.store()
        .run(move |s| s.claim_for_destroy(&key, generation))
        .await
        .unwrap();
    for mode in [OpenMode::ExistingOnly, OpenMode::CreateIfAbsent] {
        let e = m.open_for(&c, mode).await.unwrap_err();
        assert_eq!(e.code(), "busy", "{mode:?}: {e}");
    }
}

#[tokio::test]
async fn an_open_records_the_hash_of_the_policy_in_force_for_revalidate() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path());
    let c = conv("hash");
    let (first, lock) = m
        .open_for(&c, OpenMode::CreateIfAbsent)
        .await
        .unwrap()
        .into_parts();
    assert_eq!(first.policy_hash(), None, "no policy stored");
    assert!(m.revalidate(&first, first.policy_hash()).await.unwrap());
    Box::new(first).close().await.unwrap();
    drop(lock);
    let hash = set_own_policy(&m, &c).await;
    let (again, _lock) = m
        .open_for(&c, Operation::Read.open_mode())
        .await
        .unwrap()
        .into_parts();
    assert_eq!(again.policy_hash(), Some(hash.as_str()));
    assert!(m.revalidate(&again, again.policy_hash()).await.unwrap());
}
