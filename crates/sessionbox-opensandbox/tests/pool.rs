//! The warm pool against the real server: slots made ahead and recorded, bound to new
//! conversations (their own files, nothing of the pool left, the agent refusing other
//! tokens), refilled, a slot lost on the server not bound, pruned and drained, and no pool at
//! size 0. Prints the open-to-first-exec times with and without a slot.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use sessionbox_core::{ExecRequest, PoolSizes, Runtime, Session, TenantId};
use sessionbox_opensandbox::runtime::{DEFAULT_IMAGE, LABEL_CONVERSATION};
use sessionbox_opensandbox::{
    AgentPath, CreateSandbox, LABEL_POOL, OpenSandboxConfig, OpenSandboxRuntime,
};
use sessionbox_store::Store;

fn agent_key() -> sessionbox_egress::token::TokenKey {
    sessionbox_egress::token::TokenKey::from_bytes([9; 32])
}

fn tenant() -> TenantId {
    TenantId::new("default").unwrap()
}

/// A runtime of `instance` with a pool of `size` per tenant, over `store`.
fn pooled(
    domain: &str,
    key: sessionbox_opensandbox::ApiKey,
    instance: &str,
    size: usize,
    store: &Store,
) -> OpenSandboxRuntime {
    let mut config = OpenSandboxConfig::new(client_config(domain, key), instance);
    config.timeout = Duration::from_secs(600);
    config
        .resource_limits
        .insert("memory".into(), "256Mi".into());
    config.agent_key = Some(agent_key());
    config.pool = PoolSizes {
        default: size,
        tenants: Default::default(),
    };
    OpenSandboxRuntime::new(config, directory(store.clone())).unwrap()
}

async fn exec_out(s: &dyn Session, cmd: &str) -> String {
    let r = s.exec(ExecRequest::new(cmd)).await.unwrap();
    assert_eq!(
        r.shell_exit_code(),
        0,
        "{cmd}: {:?}",
        String::from_utf8_lossy(&r.stderr)
    );
    String::from_utf8(r.stdout).unwrap()
}

/// The command names of the sandbox's processes other than the `ps` that lists them and its
/// shell.
async fn process_names(s: &dyn Session) -> BTreeSet<String> {
    exec_out(s, "ps -o comm")
        .await
        .lines()
        .skip(1)
        .map(|l| l.trim().to_owned())
        .filter(|c| c != "ps" && c != "sh")
        .collect()
}

/// Opens `conv`, runs one command, and gives the time from the open's start to the command's
/// answer.
async fn open_to_first_exec(
    rt: &OpenSandboxRuntime,
    conv: &sessionbox_core::ConversationRef,
) -> (Box<dyn Session>, Duration) {
    let t0 = Instant::now();
    let s = rt.open(conv).await.unwrap();
    assert_eq!(exec_out(s.as_ref(), "echo first").await, "first\n");
    (s, t0.elapsed())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pooled_conversations_are_ready_isolated_and_guarded() {
    let Some((domain, key)) = server() else {
        return;
    };
    let store = Store::open_in_memory().unwrap();
    let inst = instance("pool");
    let rt = pooled(&domain, key.clone(), &inst, 2, &store);

    // Filled: two recorded slots, on the server with the pool label and no conversation's.
    assert_eq!(rt.refill_pool(&tenant()).await.unwrap(), 2);
    assert_eq!(rt.refill_pool(&tenant()).await.unwrap(), 0, "at size");
    let slots = store.pool_slots("opensandbox").unwrap();
    assert_eq!(slots.len(), 2);
    let on_server = rt.server_inventory().await.unwrap();
    assert_eq!(on_server.len(), 2);
    for s in &on_server {
        assert!(s.metadata.contains_key(LABEL_POOL), "{:?}", s.metadata);
        assert!(!s.metadata.contains_key(LABEL_CONVERSATION));
        assert!(slots.iter().any(|p| p.sandbox_id == s.id));
    }

    // A new conversation takes a slot: ready at once, nothing of the pool in it.
    let a = conv("pool-a");
    let (sa, took) = open_to_first_exec(&rt, &a).await;
    let id_a = rt.sandbox_id(&a.key).await.unwrap().unwrap();
    let slot_a = slots.iter().find(|p| p.sandbox_id == id_a).expect("a slot");
    assert_eq!(store.pool_slots("opensandbox").unwrap().len(), 1);
    eprintln!("opensandbox pool: open-to-first-exec with a slot {took:?}");
    assert!(!sa.state_lost());
    assert_eq!(
        exec_out(sa.as_ref(), "ls -A /tmp").await,
        "",
        "/tmp is empty"
    );
    assert_eq!(exec_out(sa.as_ref(), "ls -A /workspace").await, "");
    let pooled_procs = process_names(sa.as_ref()).await;
    sa.write("mine.txt", b"alpha").await.unwrap();
    assert_eq!(
        exec_out(sa.as_ref(), "cat mine.txt && pwd").await,
        "alpha/workspace\n"
    );

    // A second conversation takes the other slot and sees none of the first's files.
    let b = conv("pool-b");
    let (sb, _) = open_to_first_exec(&rt, &b).await;
    let id_b = rt.sandbox_id(&b.key).await.unwrap().unwrap();
    assert_ne!(id_a, id_b);
    assert!(slots.iter().any(|p| p.sandbox_id == id_b), "from the pool");
    assert!(store.pool_slots("opensandbox").unwrap().is_empty());
    assert_eq!(
        exec_out(sb.as_ref(), "ls -A /workspace /tmp").await,
        "/tmp:\n\n/workspace:\n"
    );
    assert_eq!(sb.read("mine.txt").await.unwrap_err().code(), "not_found");

    // A reopen finds the same sandbox (the token from its pool label), files intact.
    drop(sa);
    let sa = rt.open(&a).await.unwrap();
    assert_eq!(sa.read("mine.txt").await.unwrap(), b"alpha");
    assert_eq!(rt.sandbox_id(&a.key).await.unwrap().unwrap(), id_a);

    // The bound sandbox's agent takes only its own token.
    let Some(AgentPath::Direct { url }) = rt.agent_path(&id_a) else {
        panic!("not direct: {:?}", rt.agent_path(&id_a));
    };
    let http = reqwest::Client::new();
    let ping = |token: Option<String>| {
        let mut r = http.get(format!("{url}/ping"));
        if let Some(t) = token {
            r = r.header("X-EXECD-ACCESS-TOKEN", t);
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(ping(None).await, 401, "no token");
    assert_eq!(
        ping(Some(agent_key().agent_token(b.key.as_str()))).await,
        401,
        "b's token"
    );
    let slot_b = slots.iter().find(|p| p.sandbox_id == id_b).unwrap();
    let slot_token = |slot: &str| Some(agent_key().agent_token(&format!("pool:{slot}")));
    assert_eq!(
        ping(slot_token(&slot_b.slot)).await,
        401,
        "another slot's token"
    );
    assert_eq!(ping(slot_token(&slot_a.slot)).await, 200, "its own");

    // Without a pool: created as today, labelled for its conversation, the same processes.
    let plain_store = Store::open_in_memory().unwrap();
    let plain = pooled(&domain, key.clone(), &instance("nopool"), 0, &plain_store);
    assert_eq!(plain.refill_pool(&tenant()).await.unwrap(), 0);
    let c = conv("plain-c");
    let (sc, cold) = open_to_first_exec(&plain, &c).await;
    eprintln!("opensandbox pool: open-to-first-exec without a slot {cold:?}");
    let inv = plain.server_inventory().await.unwrap();
    assert_eq!(inv.len(), 1);
    assert!(inv[0].metadata.contains_key(LABEL_CONVERSATION));
    assert!(!inv[0].metadata.contains_key(LABEL_POOL));
    assert!(plain_store.pool_slots("opensandbox").unwrap().is_empty());
    assert_eq!(
        process_names(sc.as_ref()).await,
        pooled_procs,
        "no process of the pool's own"
    );
    drop(sc);
    plain.destroy(&c.key).await.unwrap();
    assert_nothing_left(&plain).await;

    // Refilled after the binds; destroy of bound conversations leaves nothing of theirs.
    assert_eq!(rt.refill_pool(&tenant()).await.unwrap(), 2);
    drop((sa, sb));
    for k in [&a.key, &b.key] {
        let r = rt.destroy(k).await.unwrap();
        assert!(r.sandbox_removed);
    }
    let left: Vec<_> = rt.server_inventory().await.unwrap();
    assert!(left.iter().all(|s| s.id != id_a && s.id != id_b));
    assert_eq!(left.len(), 2, "the refilled slots");

    // A smaller pool prunes the surplus; a drain leaves nothing, on the server or the store.
    let smaller = pooled(&domain, key, &inst, 1, &store);
    assert_eq!(smaller.prune_pool(false).await.unwrap(), 1);
    assert_eq!(store.pool_slots("opensandbox").unwrap().len(), 1);
    assert_eq!(rt.prune_pool(true).await.unwrap(), 1);
    assert!(store.pool_slots("opensandbox").unwrap().is_empty());
    assert!(store.remote_sandboxes("opensandbox").unwrap().is_empty());
    assert_nothing_left(&rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_lost_on_the_server_is_not_bound_and_strays_are_pruned() {
    let Some((domain, key)) = server() else {
        return;
    };
    let store = Store::open_in_memory().unwrap();
    let inst = instance("pool-lost");
    let rt = pooled(&domain, key.clone(), &inst, 1, &store);
    assert_eq!(rt.refill_pool(&tenant()).await.unwrap(), 1);
    let lost = store.pool_slots("opensandbox").unwrap().remove(0);
    assert!(rt.client().delete(&lost.sandbox_id).await.unwrap());

    // The open takes the lost slot, finds it gone, and creates: a working sandbox.
    let c = conv("lost-c");
    let (s, _) = open_to_first_exec(&rt, &c).await;
    assert!(!s.state_lost(), "a new conversation lost nothing");
    let id = rt.sandbox_id(&c.key).await.unwrap().unwrap();
    assert_ne!(id, lost.sandbox_id);
    assert!(store.pool_slots("opensandbox").unwrap().is_empty());
    drop(s);

    // Refill forgets a slot that vanished and makes a new one.
    assert_eq!(rt.refill_pool(&tenant()).await.unwrap(), 1);
    let second = store.pool_slots("opensandbox").unwrap().remove(0);
    assert!(rt.client().delete(&second.sandbox_id).await.unwrap());
    assert_eq!(rt.refill_pool(&tenant()).await.unwrap(), 1);
    let third = store.pool_slots("opensandbox").unwrap();
    assert_eq!(third.len(), 1);
    assert_ne!(third[0].slot, second.slot);

    // A pool-labelled sandbox of this instance that the store does not record (its maker
    // died before recording it) is deleted by a prune once past the grace; a fresh one stays.
    let mut metadata = rt.instance_metadata();
    metadata
        .insert(LABEL_POOL, "stray.0000000000000000")
        .unwrap();
    let stray = rt
        .client()
        .create(&CreateSandbox {
            volumes: Vec::new(),
            image: DEFAULT_IMAGE.into(),
            entrypoint: vec!["tail".into(), "-f".into(), "/dev/null".into()],
            timeout: Some(Duration::from_secs(600)),
            metadata,
            resource_limits: [
                ("cpu".to_owned(), "1".to_owned()),
                ("memory".to_owned(), "256Mi".to_owned()),
            ]
            .into(),
            env: Default::default(),
            network_policy: None,
        })
        .await
        .unwrap();
    assert_eq!(
        rt.prune_pool(false).await.unwrap(),
        0,
        "young: may be a slot being made"
    );
    let mut config = OpenSandboxConfig::new(client_config(&domain, key), &inst);
    config.pool = PoolSizes {
        default: 1,
        tenants: Default::default(),
    };
    config.pool_unrecorded_grace = Duration::ZERO;
    let eager = OpenSandboxRuntime::new(config, directory(store.clone())).unwrap();
    assert_eq!(eager.prune_pool(false).await.unwrap(), 1, "the stray only");
    let ids: Vec<_> = rt
        .server_inventory()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert!(!ids.contains(&stray.id));
    assert!(
        ids.contains(&id) && ids.contains(&third[0].sandbox_id),
        "{ids:?}"
    );

    rt.destroy(&c.key).await.unwrap();
    assert_eq!(rt.prune_pool(true).await.unwrap(), 1);
    assert!(store.pool_slots("opensandbox").unwrap().is_empty());
    assert_nothing_left(&rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn open_to_first_exec_with_and_without_a_slot() {
    let Some((domain, key)) = server() else {
        return;
    };
    const N: usize = 5;
    let store = Store::open_in_memory().unwrap();
    let rt = pooled(&domain, key.clone(), &instance("pool-time"), N, &store);
    assert_eq!(rt.refill_pool(&tenant()).await.unwrap(), N);
    let mut with = Vec::new();
    for i in 0..N {
        let c = conv(&format!("timed-{i}"));
        let (s, took) = open_to_first_exec(&rt, &c).await;
        let id = rt.sandbox_id(&c.key).await.unwrap().unwrap();
        assert!(
            rt.server_inventory()
                .await
                .unwrap()
                .iter()
                .any(|s| s.id == id && s.metadata.contains_key(LABEL_POOL)),
            "bound from the pool"
        );
        with.push(took);
        drop(s);
        rt.destroy(&c.key).await.unwrap();
    }
    let plain_store = Store::open_in_memory().unwrap();
    let plain = pooled(&domain, key, &instance("nopool-time"), 0, &plain_store);
    let mut without = Vec::new();
    for i in 0..3 {
        let c = conv(&format!("cold-{i}"));
        let (s, took) = open_to_first_exec(&plain, &c).await;
        without.push(took);
        drop(s);
        plain.destroy(&c.key).await.unwrap();
    }
    eprintln!(
        "opensandbox pool: open-to-first-exec p50 with a slot {:?} (of {with:?}), without {:?} \
         (of {without:?})",
        median(with.clone()),
        median(without.clone())
    );
    assert!(
        median(with) < median(without),
        "a slot is faster than a create"
    );
    assert_eq!(rt.prune_pool(true).await.unwrap(), 0, "all bound");
    assert_nothing_left(&rt).await;
    assert_nothing_left(&plain).await;
}

/// As `serve` runs it: a refilling manager fills the pool (`maintain_pools`), a new
/// conversation takes the slot and the pool is refilled in the background; a collection with
/// the pool turned off drains it and leaves the bound conversation alone; destroy through the
/// manager leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refilling_manager_keeps_the_pool_and_gc_drains_it() {
    let Some((domain, key)) = server() else {
        return;
    };
    let store = Store::open_in_memory().unwrap();
    let inst = instance("pool-manager");
    let rt = std::sync::Arc::new(pooled(&domain, key.clone(), &inst, 1, &store));
    let manager = sessionbox_manager::Manager::new(store.clone(), rt.clone()).with_pool_refill();
    assert_eq!(manager.maintain_pools(&[tenant()]).await.unwrap(), 1);
    let slot = store.pool_slots("opensandbox").unwrap().remove(0);
    let c = conv("managed");
    let s = manager.open(&c).await.unwrap();
    assert!(s.exec(ExecRequest::new("true")).await.unwrap().success());
    assert_eq!(
        rt.sandbox_id(&c.key).await.unwrap().unwrap(),
        slot.sandbox_id
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.pool_slots("opensandbox").unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the pool was not refilled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        manager.maintain_pools(&[tenant()]).await.unwrap(),
        0,
        "full"
    );
    Box::new(s).close().await.unwrap();

    let off = std::sync::Arc::new(pooled(&domain, key, &inst, 0, &store));
    let report = sessionbox_manager::Manager::new(store.clone(), off)
        .collect_garbage(sessionbox_manager::GcOptions::default())
        .await
        .unwrap();
    assert_eq!(report.pool_pruned, 1);
    assert!(report.orphans.is_empty(), "{:?}", report.orphans);
    assert!(store.pool_slots("opensandbox").unwrap().is_empty());
    let left = rt.server_inventory().await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].id, slot.sandbox_id, "the bound one stays");
    manager.destroy(&c).await.unwrap();
    assert_nothing_left(&rt).await;
}

/// With `network_policy` on, a slot is created deny-all (labelled `none`, the sidecar
/// enforcing it): a conversation under `none` takes it and reaches nothing; one with an
/// allowlist is created as before and leaves the slot in the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_network_policy_only_conversations_under_none_take_a_slot() {
    let Some((domain, key)) = server() else {
        return;
    };
    let store = Store::open_in_memory().unwrap();
    let mut config = OpenSandboxConfig::new(client_config(&domain, key), instance("pool-net"));
    config.timeout = Duration::from_secs(600);
    config
        .resource_limits
        .insert("memory".into(), "256Mi".into());
    config.agent_key = Some(agent_key());
    config.egress.network_policy = true;
    config.pool = PoolSizes {
        default: 1,
        tenants: Default::default(),
    };
    let rt = OpenSandboxRuntime::new(config, directory(store.clone())).unwrap();
    // Slots and sandboxes with a sidecar are made here (see `SIDECARS`).
    let sidecars = SIDECARS.lock().await;
    assert_eq!(rt.refill_pool(&tenant()).await.unwrap(), 1);
    let slot = store.pool_slots("opensandbox").unwrap().remove(0);
    let on_server = rt.client().get(&slot.sandbox_id).await.unwrap();
    assert_eq!(
        on_server
            .metadata
            .get(sessionbox_opensandbox::LABEL_NETWORK)
            .map(String::as_str),
        Some("none")
    );

    let allowed = conv("pool-net-allow");
    let policy = sessionbox_egress::Policy::allowlist(&["*.pypi.org:443"], &[]).unwrap();
    store
        .set_egress_policy(
            &sessionbox_store::PolicyScope::Conversation(allowed.clone()),
            &policy.to_json(),
            &policy.hash(),
            chrono::Utc::now(),
        )
        .unwrap();
    let sa = rt.open(&allowed).await.unwrap();
    drop(sidecars);
    assert_ne!(
        rt.sandbox_id(&allowed.key).await.unwrap().unwrap(),
        slot.sandbox_id
    );
    assert_eq!(
        store.pool_slots("opensandbox").unwrap().len(),
        1,
        "left in the pool"
    );
    drop(sa);

    let none = conv("pool-net-none");
    let s = rt.open(&none).await.unwrap();
    assert_eq!(
        rt.sandbox_id(&none.key).await.unwrap().unwrap(),
        slot.sandbox_id
    );
    let out = exec_out(
        s.as_ref(),
        "nc -w 3 1.1.1.1 443 </dev/null; echo public=$?; echo alive",
    )
    .await;
    assert!(
        out.contains("public=1") && out.ends_with("alive\n"),
        "{out}"
    );
    drop(s);
    for k in [&allowed.key, &none.key] {
        rt.destroy(k).await.unwrap();
    }
    assert_eq!(rt.prune_pool(true).await.unwrap(), 0);
    assert_nothing_left(&rt).await;
}
