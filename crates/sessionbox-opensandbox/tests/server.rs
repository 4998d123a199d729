//! The `opensandbox` runtime and its lifecycle client against a real `opensandbox-server`
//! 1.1.1 on Docker, whose sandboxes run sessionbox's agent as execd (scripts/opensandbox-up).
//! Each test uses its own instance name and checks that nothing of its own is left.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use sessionbox_core::{ExecRequest, Runtime, Session};
use sessionbox_opensandbox::{
    CreateSandbox, EXECD_PORT, ListFilter, Metadata, OpenSandboxError, SandboxState,
};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_probe_accepts_the_real_server() {
    let Some((domain, key)) = server() else {
        return;
    };
    let health = client(&domain, key).probe().await.unwrap();
    assert_eq!(health.version.as_deref(), Some("1.1.1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recovery_and_isolation() {
    let Some((domain, key)) = server() else {
        return;
    };
    let (rt, _store) = runtime(&domain, key, "recovery");
    let (a, b) = (conv("alice"), conv("bob"));

    let t0 = Instant::now();
    let sa = rt.open(&a).await.unwrap();
    assert!(!sa.state_lost());
    sa.write("notes/alpha.txt", b"alpha").await.unwrap();
    let first = exec_out(sa.as_ref(), "cat notes/alpha.txt && pwd").await;
    let create_to_first_exec = t0.elapsed();
    assert_eq!(first, "alpha/workspace\n");
    let t1 = Instant::now();
    for _ in 0..10 {
        exec_out(sa.as_ref(), "true").await;
    }
    let warm_exec = t1.elapsed() / 10;
    eprintln!(
        "opensandbox: create-to-first-exec {create_to_first_exec:?}, warm exec {warm_exec:?}"
    );
    let id_a = rt.sandbox_id(&a.key).await.unwrap().unwrap();
    sa.close().await.unwrap();

    // Reopen: same sandbox, same files.
    let sa = rt.open(&a).await.unwrap();
    assert!(!sa.state_lost());
    assert_eq!(sa.read("notes/alpha.txt").await.unwrap(), b"alpha");
    assert_eq!(rt.sandbox_id(&a.key).await.unwrap().unwrap(), id_a);

    // A second conversation: its own sandbox and files.
    let sb = rt.open(&b).await.unwrap();
    sb.write("marker.txt", b"beta").await.unwrap();
    assert_ne!(rt.sandbox_id(&b.key).await.unwrap().unwrap(), id_a);
    assert!(sb.read("notes/alpha.txt").await.unwrap_err().code() == "not_found");
    assert_eq!(
        exec_out(sb.as_ref(), "ls /workspace").await,
        "marker.txt\n",
        "B sees only its own workspace"
    );

    // The other conversation's location, and traversal, are refused before any request: with
    // A's sandbox deleted under the session, a request would fail otherwise.
    let b_location = rt.workspace_location(&b.key);
    rt.client().delete(&id_a).await.unwrap();
    for path in [
        format!("{b_location}/marker.txt"),
        format!("../{}/marker.txt", b.key),
        "/etc/passwd".to_owned(),
    ] {
        let e = sa.read(&path).await.unwrap_err();
        assert_eq!(e.code(), "outside_workspace", "{path}: {e}");
        let e = sa.write(&path, b"pwned").await.unwrap_err();
        assert_eq!(e.code(), "outside_workspace", "{path}: {e}");
    }
    assert_eq!(sb.read("marker.txt").await.unwrap(), b"beta");

    sa.close().await.unwrap();
    sb.close().await.unwrap();
    rt.destroy(&a.key).await.unwrap();
    rt.destroy(&b.key).await.unwrap();
    assert_nothing_left(&rt).await;
}

async fn concurrency(conversations: usize, rounds: usize, test: &str) {
    let Some((domain, key)) = server() else {
        return;
    };
    let (rt, _store) = runtime(&domain, key, test);
    let rt = Arc::new(rt);
    let barrier = Arc::new(tokio::sync::Barrier::new(conversations));
    let mut tasks = Vec::new();
    for c in 0..conversations {
        let (rt, barrier) = (rt.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let conv = conv(&format!("conc-{c}"));
            barrier.wait().await;
            let mut verified = 0;
            for r in 0..rounds {
                let s = rt.open(&conv).await.unwrap();
                let value = format!("conversation {c} round {r}");
                s.write(&format!("r{r}.txt"), value.as_bytes())
                    .await
                    .unwrap();
                let out = exec_out(s.as_ref(), "ls | wc -l").await;
                assert_eq!(
                    out.trim(),
                    (r + 1).to_string(),
                    "conversation {c} round {r}"
                );
                let out = exec_out(s.as_ref(), &format!("cat r{r}.txt")).await;
                assert_eq!(out, value, "conversation {c} round {r} ran elsewhere");
                assert_eq!(
                    s.read(&format!("r{r}.txt")).await.unwrap(),
                    value.as_bytes(),
                    "conversation {c} round {r} read another's value"
                );
                s.close().await.unwrap();
                verified += 1;
            }
            verified
        }));
    }
    let mut verified = 0;
    for t in tasks {
        verified += t.await.unwrap();
    }
    assert_eq!(verified, conversations * rounds);
    let ids: BTreeSet<String> = rt
        .list()
        .await
        .unwrap()
        .iter()
        .map(|c| c.key.to_string())
        .collect();
    assert_eq!(ids.len(), conversations);
    assert_eq!(rt.server_inventory().await.unwrap().len(), conversations);
    for c in 0..conversations {
        rt.destroy(&conv(&format!("conc-{c}")).key).await.unwrap();
    }
    assert_nothing_left(&rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_4_conversations_3_rounds() {
    concurrency(4, 3, "conc4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrency_16_conversations_5_rounds() {
    concurrency(16, 5, "conc16").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_opens_of_one_conversation_make_one_sandbox() {
    let Some((domain, key)) = server() else {
        return;
    };
    let (rt, _store) = runtime(&domain, key, "race");
    let rt = Arc::new(rt);
    let c = conv("racer");
    let mut tasks = Vec::new();
    for i in 0..4 {
        let (rt, c) = (rt.clone(), c.clone());
        tasks.push(tokio::spawn(async move {
            let s = rt.open(&c).await.unwrap();
            s.write(&format!("w{i}.txt"), b"x").await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // The losers deleted their own sandboxes: one is left, holding every write.
    let left = rt.server_inventory().await.unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].id, rt.sandbox_id(&c.key).await.unwrap().unwrap());
    let s = rt.open(&c).await.unwrap();
    assert_eq!(
        exec_out(s.as_ref(), "ls").await,
        "w0.txt\nw1.txt\nw2.txt\nw3.txt\n"
    );
    rt.destroy(&c.key).await.unwrap();
    assert_nothing_left(&rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metadata_values_over_63_characters_are_never_sent() {
    let Some((domain, key)) = server() else {
        return;
    };
    // The real server's rule, seen first-hand with a raw request: 64 characters is a 400.
    let raw = reqwest::Client::new()
        .post(format!("{domain}/v1/sandboxes"))
        .header("OPEN-SANDBOX-API-KEY", key.expose())
        .json(&serde_json::json!({
            "image": {"uri": "sessionbox/sandbox:local"},
            "entrypoint": ["tail", "-f", "/dev/null"],
            "timeout": 60,
            "resourceLimits": {"cpu": "1", "memory": "64Mi"},
            "metadata": {"sessionbox.test": "a".repeat(64)},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status().as_u16(), 400);
    let body: serde_json::Value = raw.json().await.unwrap();
    assert_eq!(body["code"], "SANDBOX::INVALID_METADATA_LABEL");

    // Our client refuses it before any request; 63 characters go through.
    let mut m = Metadata::new();
    assert!(m.insert("sessionbox.test", &"a".repeat(64)).is_err());
    let c = client(&domain, key);
    let value63 = format!("{}z", "a".repeat(62));
    m.insert("sessionbox.test", &value63).unwrap();
    let mut req = CreateSandbox::new(
        "sessionbox/sandbox:local",
        vec!["tail".into(), "-f".into(), "/dev/null".into()],
    );
    req.timeout = Some(Duration::from_secs(120));
    req.metadata = m.clone();
    req.resource_limits =
        BTreeMap::from([("cpu".into(), "1".into()), ("memory".into(), "64Mi".into())]);
    let s = c.create(&req).await.unwrap();
    assert_eq!(s.metadata.get("sessionbox.test"), Some(&value63));
    let found = c
        .list(&ListFilter {
            metadata: m,
            states: vec![],
        })
        .await
        .unwrap();
    assert_eq!(found.iter().map(|s| &s.id).collect::<Vec<_>>(), vec![&s.id]);
    assert!(c.delete(&s.id).await.unwrap());
    assert!(
        !c.delete(&s.id).await.unwrap(),
        "a second delete is not an error"
    );

    // The runtime's own labels fit: the conversation label is 62 hex digits.
    let (rt, _store) = runtime(&domain, c.config().api_key.clone().unwrap(), "meta");
    let cv = conv("a-conversation-with-a-rather-long-identifier-that-goes-on-and-on-and-on");
    rt.open(&cv).await.unwrap();
    let inv = rt.server_inventory().await.unwrap();
    assert_eq!(inv.len(), 1);
    for v in inv[0].metadata.values() {
        assert!(v.len() <= 63, "{v}");
    }
    assert_eq!(
        inv[0].metadata["sessionbox.conversation"],
        cv.key.as_str()[..62]
    );
    rt.destroy(&cv.key).await.unwrap();
    assert_nothing_left(&rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renew_sets_an_absolute_expiry_recorded_in_the_store() {
    let Some((domain, key)) = server() else {
        return;
    };
    let (rt, _store) = runtime(&domain, key, "renew");
    let c = conv("renewer");
    rt.open(&c).await.unwrap();
    let id = rt.sandbox_id(&c.key).await.unwrap().unwrap();
    let recorded = rt.recorded_expiry(&c.key).await.unwrap().unwrap();
    let server_side = rt.client().get(&id).await.unwrap().expires_at.unwrap();
    assert!(
        (server_side - recorded).num_seconds().abs() <= 5,
        "{server_side} vs {recorded}"
    );

    let renewed = rt.renew_now(&c.key).await.unwrap();
    assert!(renewed >= recorded);
    assert_eq!(rt.recorded_expiry(&c.key).await.unwrap(), Some(renewed));
    let server_side = rt.client().get(&id).await.unwrap().expires_at.unwrap();
    assert!(
        (server_side - renewed).num_milliseconds().abs() <= 1000,
        "{server_side} vs {renewed}"
    );

    // Absolute: a shorter expiry is taken as given.
    let shorter = chrono::Utc::now() + chrono::Duration::seconds(300);
    let got = rt.client().renew(&id, shorter).await.unwrap();
    assert!(
        (got - shorter).num_milliseconds().abs() <= 1000,
        "{got} vs {shorter}"
    );

    // Renewing a sandbox that does not exist is a typed not-found.
    let e = rt
        .client()
        .renew("00000000-0000-4000-8000-000000000000", shorter)
        .await
        .unwrap_err();
    assert!(e.is_not_found(), "{e:?}");

    rt.destroy(&c.key).await.unwrap();
    assert_nothing_left(&rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vanished_sandbox_is_replaced_and_the_loss_reported() {
    let Some((domain, key)) = server() else {
        return;
    };
    let (rt, _store) = runtime(&domain, key, "vanish");
    let c = conv("vanishing");
    let s = rt.open(&c).await.unwrap();
    s.write("kept.txt", b"before").await.unwrap();
    s.close().await.unwrap();
    let old = rt.sandbox_id(&c.key).await.unwrap().unwrap();
    // Deleted elsewhere (as an expiry would).
    assert!(rt.client().delete(&old).await.unwrap());

    let s = rt.open(&c).await.unwrap();
    assert!(s.state_lost(), "the caller is told the state was lost");
    let new = rt.sandbox_id(&c.key).await.unwrap().unwrap();
    assert_ne!(new, old);
    assert_eq!(s.read("kept.txt").await.unwrap_err().code(), "not_found");
    s.write("kept.txt", b"after").await.unwrap();
    s.close().await.unwrap();

    // The next open is an ordinary resume.
    let s = rt.open(&c).await.unwrap();
    assert!(!s.state_lost());
    assert_eq!(s.read("kept.txt").await.unwrap(), b"after");
    let e = rt.client().get(&old).await.unwrap_err();
    assert!(e.is_not_found(), "{e:?}");
    rt.destroy(&c.key).await.unwrap();
    assert_nothing_left(&rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn destroy_is_idempotent() {
    let Some((domain, key)) = server() else {
        return;
    };
    let (rt, _store) = runtime(&domain, key, "destroy");
    let c = conv("destroyed");
    rt.open(&c).await.unwrap();
    let first = rt.destroy(&c.key).await.unwrap();
    assert!(first.sandbox_removed);
    let second = rt.destroy(&c.key).await.unwrap();
    assert!(!second.sandbox_removed);
    let never = rt.destroy(&conv("never-opened").key).await.unwrap();
    assert!(!never.sandbox_removed);
    assert!(rt.list().await.unwrap().is_empty());
    assert_nothing_left(&rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inventory_nothing_of_ours_left_and_nothing_unknown_touched() {
    let Some((domain, key)) = server() else {
        return;
    };
    let c = client(&domain, key.clone());
    // Someone else's sandbox on the same server.
    let mut foreign = CreateSandbox::new(
        "sessionbox/sandbox:local",
        vec!["tail".into(), "-f".into(), "/dev/null".into()],
    );
    foreign.timeout = Some(Duration::from_secs(300));
    foreign.metadata.insert("owner", "someone-else").unwrap();
    foreign.resource_limits =
        BTreeMap::from([("cpu".into(), "1".into()), ("memory".into(), "64Mi".into())]);
    let foreign = c.create(&foreign).await.unwrap();
    let before: BTreeSet<String> = c
        .list(&ListFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert!(before.contains(&foreign.id));

    let (rt, _store) = runtime(&domain, key, "inventory");
    for id in ["inv-a", "inv-b", "inv-c"] {
        let s = rt.open(&conv(id)).await.unwrap();
        s.write("f.txt", id.as_bytes()).await.unwrap();
    }
    assert_eq!(rt.server_inventory().await.unwrap().len(), 3);
    for id in ["inv-a", "inv-b", "inv-c"] {
        rt.destroy(&conv(id).key).await.unwrap();
    }
    assert_nothing_left(&rt).await;
    let after = c.get(&foreign.id).await.unwrap();
    assert_eq!(
        after.status.state,
        SandboxState::Running,
        "the foreign sandbox is untouched"
    );
    assert!(c.delete(&foreign.id).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_resume_and_the_proxied_endpoint() {
    let Some((domain, key)) = server() else {
        return;
    };
    let c = client(&domain, key);
    let mut req = CreateSandbox::new(
        "sessionbox/sandbox:local",
        vec!["tail".into(), "-f".into(), "/dev/null".into()],
    );
    req.timeout = Some(Duration::from_secs(120));
    req.resource_limits =
        BTreeMap::from([("cpu".into(), "1".into()), ("memory".into(), "64Mi".into())]);
    let s = c.create(&req).await.unwrap();
    let ep = c.endpoint(&s.id, EXECD_PORT).await.unwrap();
    assert_eq!(
        ep.url,
        format!("{domain}/v1/sandboxes/{}/proxy/{EXECD_PORT}", s.id)
    );
    c.pause(&s.id).await.unwrap();
    let mut state = SandboxState::Pending;
    for _ in 0..100 {
        state = c.get(&s.id).await.unwrap().status.state;
        if state == SandboxState::Paused {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, SandboxState::Paused);
    c.resume(&s.id).await.unwrap();
    for _ in 0..100 {
        state = c.get(&s.id).await.unwrap().status.state;
        if state == SandboxState::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, SandboxState::Running);
    assert!(c.delete(&s.id).await.unwrap());
    let e = c.get(&s.id).await.unwrap_err();
    assert!(matches!(e, OpenSandboxError::NotFound { .. }), "{e:?}");
}

/// A command that prints nothing for longer than the OpenSandbox 1.1.1 server's proxy waits
/// for a byte (its HTTP client's 180 s read timeout) still reports its output and exit code:
/// the agent's `ping` events every 3 s keep the proxied stream alive. Before the keepalive
/// this failed after 180 s with "the command event stream ended without a terminal event".
/// `direct = "off"`, so the command does cross the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_quiet_for_200_seconds_survives_the_server_proxy() {
    let Some((domain, key)) = server() else {
        return;
    };
    let (rt, _store) = runtime_with(&domain, key, "quiet", |c| {
        c.direct = sessionbox_opensandbox::DirectMode::Off;
    });
    let c = conv("quiet");
    let s = rt.open(&c).await.unwrap();
    let started = Instant::now();
    let r = s
        .exec(
            ExecRequest::new("sleep 200; printf 'done\\n'; exit 7")
                .timeout(Duration::from_secs(400)),
        )
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(
        r.shell_exit_code(),
        7,
        "{:?}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert_eq!(r.stdout, b"done\n");
    assert!(!r.timed_out);
    assert!(took >= Duration::from_secs(200), "{took:?}");
    eprintln!("opensandbox: a 200 s quiet command returned after {took:?}");
    s.close().await.unwrap();
    rt.destroy(&c.key).await.unwrap();
    assert_nothing_left(&rt).await;
}

/// Issue 15: a command's output comes back byte for byte through `exec` and `exec_stream`
/// (random bytes compared with the copy the command wrote, NUL and invalid UTF-8 on both
/// streams, a character split across two writes, a `tar czf -` archive compared with the one
/// `tee` wrote).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_is_exact_bytes_through_exec_and_exec_stream() {
    use sessionbox_core::{ExitStatus, OutputStream};
    let Some((domain, key)) = server() else {
        return;
    };
    let (rt, _store) = runtime(&domain, key, "exact");
    let s = rt.open(&conv("exact")).await.unwrap();
    // (name, command, stdout (None: the file r.bin the command wrote), stderr)
    type Case<'a> = (&'a str, &'a str, Option<&'a [u8]>, &'a [u8]);
    let cases: [Case<'_>; 4] = [
        (
            "random",
            "head -c 65536 /dev/urandom > r.bin && cat r.bin",
            None,
            b"",
        ),
        (
            "nul-invalid",
            r"printf 'a\000b\377\376c\n'; printf 'e\000\377' >&2",
            Some(b"a\0b\xff\xfec\n"),
            b"e\0\xff",
        ),
        (
            "split",
            r"printf '\342\202'; sleep 0.2; printf '\254\000\377'",
            Some(b"\xe2\x82\xac\x00\xff"),
            b"",
        ),
        (
            "tar",
            "rm -rf d && mkdir -p d/sub && head -c 20000 /dev/urandom > d/sub/x && \
             echo hi > d/y && tar czf - d | tee r.bin",
            None,
            b"",
        ),
    ];
    for (name, command, stdout, stderr) in cases {
        let r = s.exec(ExecRequest::new(command)).await.unwrap();
        assert_eq!(r.status, ExitStatus::Code(0), "{name}: {r:?}");
        let want = match stdout {
            Some(b) => b.to_vec(),
            None => s.read("r.bin").await.unwrap(),
        };
        assert!(
            r.stdout == want,
            "{name}: stdout differs ({} bytes, want {})",
            r.stdout.len(),
            want.len()
        );
        assert_eq!(r.stderr, stderr, "{name}: stderr");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut sink = |stream: OutputStream, b: &[u8]| match stream {
            OutputStream::Stdout => out.extend_from_slice(b),
            OutputStream::Stderr => err.extend_from_slice(b),
        };
        let r = s
            .exec_stream(ExecRequest::new(command), &mut sink)
            .await
            .unwrap();
        let want = match stdout {
            Some(b) => b.to_vec(),
            None => s.read("r.bin").await.unwrap(),
        };
        assert!(
            out == want && r.stdout == want,
            "{name}: streamed stdout differs"
        );
        assert_eq!(err, stderr, "{name}: streamed stderr");
    }
    rt.destroy(s.key()).await.unwrap();
    assert_nothing_left(&rt).await;
}
