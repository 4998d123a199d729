//! The gateway against real targets the tests start: a raw TCP echo server, an HTTP server and
//! an HTTPS server (a test CA made with rcgen) on a private address in a test network namespace
//! (allowed explicitly), servers on this host's loopback (which must never be reached), and a
//! DNS server the test controls, which counts every question.
//!
//! Needs root (network namespaces) and `ip` (iproute2); fails, never skips, without them.

use crate::support;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sessionbox_egress::token::TokenKey;
use sessionbox_egress::{Auth, Gateway, GatewayConfig, Policy};
use support::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

const CONV: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

struct Setup {
    proxy: SocketAddr,
    control: Arc<TestControl>,
    dns: TestDns,
}

async fn start_with(auth: Auth, f: impl FnOnce(&mut GatewayConfig)) -> Setup {
    let dns = TestDns::start().await;
    let control = Arc::new(TestControl::default());
    let mut config = GatewayConfig {
        nameservers: Some(vec![dns.addr]),
        dns_timeout: Duration::from_secs(2),
        ..GatewayConfig::default()
    };
    f(&mut config);
    let gw = Gateway::new(config, control.clone(), auth).unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = l.local_addr().unwrap();
    tokio::spawn(async move { gw.serve_tcp(l).await });
    Setup {
        proxy,
        control,
        dns,
    }
}

async fn start() -> Setup {
    start_with(Auth::Conversation(CONV.into()), |_| {}).await
}

async fn echo_round_trip(r: &mut tokio::io::BufReader<tokio::net::TcpStream>, msg: &[u8]) {
    r.get_mut().write_all(msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    tokio::time::timeout(Duration::from_secs(5), r.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, msg);
}

#[tokio::test]
async fn connect_to_an_explicitly_allowed_private_address_relays_and_counts_bytes() {
    let net = TestNet::new();
    let l = net.listen(0);
    let port = l.local_addr().unwrap().port();
    let accepts = echo_server(l);
    let s = start().await;
    s.control.set(Policy::allowlist(&[&net.cidr], &[]).unwrap());
    let target = format!("{}:{port}", net.peer_ip);
    let (status, mut r) = connect(s.proxy, &target, "").await;
    assert_eq!(status, 200);
    echo_round_trip(&mut r, b"ping through the gateway").await;
    drop(r);
    let e = s.control.ended(&target).await;
    assert!(e.allowed);
    assert_eq!(e.rule, net.cidr);
    assert_eq!(e.address.as_deref(), Some(target.as_str()));
    assert_eq!((e.bytes_up, e.bytes_down), (24, 24));
    assert_eq!(e.end.as_deref(), Some("closed"));
    assert_eq!(accepts.count(), 1);
}

#[tokio::test]
async fn https_to_an_allowed_name_works_with_one_lookup_and_no_second() {
    use rustls::pki_types::ServerName;
    let net = TestNet::new();
    let l = net.listen(0);
    let port = l.local_addr().unwrap().port();
    // A test CA and a certificate for the target's name.
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(vec![]).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["api.allowed.example".into()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server_cfg = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_cfg));
    let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let h = heads.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let acceptor = acceptor.clone();
            let h = h.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    serve_http(tls, h).await;
                }
            });
        }
    });
    let s = start().await;
    s.dns.set("api.allowed.example", &[IpAddr::V4(net.peer_ip)]);
    s.control
        .set(Policy::allowlist(&["*.allowed.example", &net.cidr], &[]).unwrap());
    let (status, r) = connect(s.proxy, &format!("api.allowed.example:{port}"), "").await;
    assert_eq!(status, 200);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let client_cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client_cfg))
        .connect(
            ServerName::try_from("api.allowed.example").unwrap(),
            r.into_inner(),
        )
        .await
        .unwrap();
    let mut tls = tokio::io::BufReader::new(tls);
    tls.get_mut()
        .write_all(b"GET /secure HTTP/1.1\r\nHost: api.allowed.example\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_head(&mut tls).await, 200);
    let mut body = String::new();
    tls.read_line(&mut body).await.unwrap();
    assert_eq!(body, "hello from /secure\n");
    // Resolved once (one question per record type), by the gateway.
    let asked = s.dns.asked("api.allowed.example");
    assert!(!asked.is_empty() && asked.len() <= 2, "{asked:?}");
    assert_eq!(heads.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_denied_name_is_refused_and_never_resolved() {
    let s = start().await;
    s.dns
        .set("denied.example", &[IpAddr::from([203, 0, 113, 7])]);
    s.control
        .set(Policy::allowlist(&["*.allowed.example"], &["*.denied.example"]).unwrap());
    for target in [
        "denied.example:443",
        "x.denied.example:443",
        "allowed.example.evil.example:443",
    ] {
        let (status, _) = connect(s.proxy, target, "").await;
        assert_eq!(status, 403, "{target}");
        let e = s.control.ended(target).await;
        assert!(!e.allowed && e.address.is_none(), "{e:?}");
    }
    // OpenShell #1169: not a single DNS question for a denied name.
    assert!(
        s.dns.queries.lock().unwrap().is_empty(),
        "{:?}",
        s.dns.queries
    );
}

#[tokio::test]
async fn a_denied_ip_and_a_private_address_without_a_rule_are_refused_before_any_connection() {
    let net = TestNet::new();
    let l = net.listen(0);
    let port = l.local_addr().unwrap().port();
    let accepts = echo_server(l);
    let s = start().await;
    // The network is allowed but the target address denied: deny wins.
    s.control
        .set(Policy::allowlist(&[&net.cidr], &[&net.peer_ip.to_string()]).unwrap());
    let target = format!("{}:{port}", net.peer_ip);
    assert_eq!(connect(s.proxy, &target, "").await.0, 403);
    // A public allowlist does not open a private address.
    s.control
        .set(Policy::allowlist(&["0.0.0.0/0", "::/0"], &[]).unwrap());
    assert_eq!(connect(s.proxy, &target, "").await.0, 403);
    let reasons: Vec<String> = s.control.entries().into_iter().map(|e| e.rule).collect();
    assert!(reasons[0].starts_with("deny rule"), "{reasons:?}");
    assert!(reasons[1].contains("private"), "{reasons:?}");
    assert_eq!(accepts.count(), 0, "the target saw a connection");
}

#[tokio::test]
async fn every_permanently_blocked_spelling_is_refused_and_loopback_is_never_reached() {
    // Real servers on this host's loopback, IPv4 and IPv6, on one port: an attack that gets
    // through would show up as an accepted connection.
    let v4 = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = v4.local_addr().unwrap().port();
    let v6 = tokio::net::TcpListener::bind(("::1", port)).await.unwrap();
    let (a4, a6) = (echo_server(v4), echo_server(v6));
    let s = start().await;
    s.control
        .set(Policy::allowlist(&["0.0.0.0/0", "::/0"], &[]).unwrap());
    let cases: serde_json::Value =
        serde_json::from_str(include_str!("cases/egress-targets.json")).unwrap();
    let mut hosts: Vec<String> = cases["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["host"].as_str().unwrap().to_owned())
        .collect();
    // The rest of the kind: other spellings of loopback and metadata, NAT64 and mapped forms.
    hosts.extend(
        [
            "0x7f000001",
            "0177.0.0.1",
            "127.0.0.2",
            "0.0.0.0",
            "[::]",
            "[::ffff:7f00:1]",
            "[64:ff9b::7f00:1]",
            "[64:ff9b::a9fe:a9fe]",
            "[::ffff:169.254.169.254]",
            "0xa9fea9fe",
            "2852039166",
            "[fe80::1]",
            "255.255.255.255",
            "localhost",
            "foo.localhost",
        ]
        .map(String::from),
    );
    for h in &hosts {
        let target = format!("{h}:{port}");
        let (status, _) = connect(s.proxy, &target, "").await;
        assert_eq!(status, 403, "{target} was not refused");
    }
    // Absolute-form too.
    for h in ["127.1", "[::1]", "0x7f.1", "169.254.169.254"] {
        let mut st = tokio::net::TcpStream::connect(s.proxy).await.unwrap();
        st.write_all(format!("GET http://{h}:{port}/ HTTP/1.1\r\nHost: {h}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut r = tokio::io::BufReader::new(st);
        assert_eq!(read_head(&mut r).await, 403, "{h}");
    }
    assert_eq!(a4.count() + a6.count(), 0, "a loopback server was reached");
    assert!(
        s.control
            .entries()
            .iter()
            .all(|e| !e.allowed && e.address.is_none())
    );
    assert!(s.dns.queries.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_dns_answer_pointing_at_loopback_is_refused() {
    // crabbox #912: the name is allowed, its answer is loopback.
    let lo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = lo.local_addr().unwrap().port();
    let accepts = echo_server(lo);
    let s = start().await;
    s.dns
        .set("rebind.allowed.example", &[IpAddr::from([127, 0, 0, 1])]);
    s.dns.set(
        "mixed.allowed.example",
        &[
            IpAddr::from([8, 8, 4, 4]),
            IpAddr::from([169, 254, 169, 254]),
        ],
    );
    s.control
        .set(Policy::allowlist(&["*.allowed.example"], &[]).unwrap());
    for name in ["rebind.allowed.example", "mixed.allowed.example"] {
        let target = format!("{name}:{port}");
        assert_eq!(connect(s.proxy, &target, "").await.0, 403, "{name}");
        let e = s.control.ended(&target).await;
        assert!(e.rule.contains("permanently blocked"), "{e:?}");
    }
    assert_eq!(accepts.count(), 0);
}

#[tokio::test]
async fn absolute_form_http_is_checked_forwarded_and_never_logs_the_query() {
    let net = TestNet::new();
    let l = net.listen(0);
    let port = l.local_addr().unwrap().port();
    let (accepts, heads) = http_server(l);
    let s = start().await;
    s.dns.set("www.allowed.example", &[IpAddr::V4(net.peer_ip)]);
    s.control
        .set(Policy::allowlist(&["www.allowed.example", &net.cidr], &["denied.example"]).unwrap());
    // claude-code #40213: absolute-form to a denied host carries a secret in its query.
    let mut st = tokio::net::TcpStream::connect(s.proxy).await.unwrap();
    st.write_all(
        b"GET http://denied.example/log?t=SECRET HTTP/1.1\r\nHost: denied.example\r\n\r\n",
    )
    .await
    .unwrap();
    let mut r = tokio::io::BufReader::new(st);
    assert_eq!(read_head(&mut r).await, 403);
    // Allowed: forwarded in origin form, the proxy credentials stripped.
    let mut st = tokio::net::TcpStream::connect(s.proxy).await.unwrap();
    st.write_all(
        format!(
            "GET http://www.allowed.example:{port}/page?q=1 HTTP/1.1\r\nHost: www.allowed.example\r\n\
             Proxy-Authorization: Bearer not-for-the-target\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut r = tokio::io::BufReader::new(st);
    assert_eq!(read_head(&mut r).await, 200);
    let mut body = String::new();
    r.read_line(&mut body).await.unwrap();
    assert_eq!(body, "hello from /page?q=1\n");
    drop(r);
    let seen = heads.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].starts_with("GET /page?q=1 HTTP/1.1"), "{seen:?}");
    assert!(
        !seen[0].to_ascii_lowercase().contains("proxy-authorization"),
        "{seen:?}"
    );
    assert_eq!(accepts.count(), 1);
    let target = format!("www.allowed.example:{port}");
    let e = s.control.ended(&target).await;
    assert!(e.allowed && e.bytes_up > 0 && e.bytes_down > 0, "{e:?}");
    let log = format!("{:?}", s.control.entries());
    assert!(!log.contains("SECRET") && !log.contains("q=1"), "{log}");
    assert!(s.dns.asked("denied.example").is_empty());
}

#[tokio::test]
async fn idle_and_total_timeouts_close_the_tunnel() {
    let net = TestNet::new();
    let (l1, l2) = (net.listen(0), net.listen(0));
    let (p1, p2) = (
        l1.local_addr().unwrap().port(),
        l2.local_addr().unwrap().port(),
    );
    let (_, mut closed) = silent_server(l1);
    trickle_server(l2, Duration::from_millis(50));
    let s = start_with(Auth::Conversation(CONV.into()), |c| {
        c.idle_timeout = Duration::from_millis(300);
        c.total_timeout = Duration::from_millis(900);
    })
    .await;
    s.control.set(Policy::allowlist(&[&net.cidr], &[]).unwrap());
    // Idle: nothing moves, the gateway closes both sides.
    let t0 = Instant::now();
    let (status, mut r) = connect(s.proxy, &format!("{}:{p1}", net.peer_ip), "").await;
    assert_eq!(status, 200);
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), r.read(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(t0.elapsed() < Duration::from_secs(3));
    tokio::time::timeout(Duration::from_secs(5), closed.recv())
        .await
        .unwrap();
    let e = s.control.ended(&format!("{}:{p1}", net.peer_ip)).await;
    assert_eq!(e.end.as_deref(), Some("idle timeout"));
    // Total: bytes keep coming, the total timeout still ends it.
    let t0 = Instant::now();
    let (status, mut r) = connect(s.proxy, &format!("{}:{p2}", net.peer_ip), "").await;
    assert_eq!(status, 200);
    let mut got = 0;
    loop {
        match tokio::time::timeout(Duration::from_secs(5), r.read(&mut buf))
            .await
            .unwrap()
        {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    assert!(got > 3, "{got}");
    assert!(t0.elapsed() >= Duration::from_millis(850) && t0.elapsed() < Duration::from_secs(3));
    let e = s.control.ended(&format!("{}:{p2}", net.peer_ip)).await;
    assert_eq!(e.end.as_deref(), Some("total timeout"));
}

#[tokio::test]
async fn a_client_that_goes_away_closes_the_target_connection() {
    let net = TestNet::new();
    let l = net.listen(0);
    let port = l.local_addr().unwrap().port();
    let (accepts, mut closed) = silent_server(l);
    let s = start().await;
    s.control.set(Policy::allowlist(&[&net.cidr], &[]).unwrap());
    let (status, r) = connect(s.proxy, &format!("{}:{port}", net.peer_ip), "").await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(r); // cancelled
    tokio::time::timeout(Duration::from_secs(5), closed.recv())
        .await
        .expect("the target connection stayed open after the client left");
    assert_eq!(accepts.count(), 1);
    let e = s.control.ended(&format!("{}:{port}", net.peer_ip)).await;
    assert_eq!(e.end.as_deref(), Some("closed"));
}

#[tokio::test]
async fn a_policy_change_applies_to_the_next_connection() {
    let net = TestNet::new();
    let l = net.listen(0);
    let port = l.local_addr().unwrap().port();
    echo_server(l);
    let s = start().await;
    let target = format!("{}:{port}", net.peer_ip);
    assert_eq!(connect(s.proxy, &target, "").await.0, 403, "profile none");
    s.control.set(Policy::allowlist(&[&net.cidr], &[]).unwrap());
    let (status, mut open) = connect(s.proxy, &target, "").await;
    assert_eq!(status, 200);
    s.control
        .set(Policy::allowlist(&[&net.cidr], &[&format!("{}:{port}", net.peer_ip)]).unwrap());
    assert_eq!(connect(s.proxy, &target, "").await.0, 403);
    // The connection opened before the change still works (the change is per connection).
    echo_round_trip(&mut open, b"still here").await;
    s.control.set(Policy::None);
    assert_eq!(connect(s.proxy, &target, "").await.0, 403);
}

#[tokio::test]
async fn remote_runtimes_need_a_valid_token_on_every_request() {
    let net = TestNet::new();
    let l = net.listen(0);
    let port = l.local_addr().unwrap().port();
    echo_server(l);
    let key = TokenKey::from_bytes([9; 32]);
    let s = start_with(Auth::Token(key.clone()), |_| {}).await;
    let policy = Policy::allowlist(&[&net.cidr], &[]).unwrap();
    s.control.set(policy.clone());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let target = format!("{}:{port}", net.peer_ip);
    let good = key.issue(CONV, &policy.hash(), now, 60);
    let cases = [
        (String::new(), 407),
        ("Proxy-Authorization: Bearer nonsense\r\n".into(), 407),
        (
            format!(
                "Proxy-Authorization: Bearer {}\r\n",
                TokenKey::from_bytes([1; 32]).issue(CONV, &policy.hash(), now, 60)
            ),
            407,
        ),
        (
            format!(
                "Proxy-Authorization: Bearer {}\r\n",
                key.issue(CONV, &policy.hash(), now - 120, 60)
            ),
            407,
        ),
        (
            format!(
                "Proxy-Authorization: Bearer {}\r\n",
                key.issue(CONV, &Policy::None.hash(), now, 60)
            ),
            407,
        ),
        (format!("Proxy-Authorization: Bearer {good}\r\n"), 200),
    ];
    for (header, want) in cases {
        let (status, _) = connect(s.proxy, &target, &header).await;
        assert_eq!(status, want, "{header}");
    }
    // Basic, as clients send it from http://user:TOKEN@proxy.
    use base64::Engine;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("sessionbox:{good}"));
    let (status, mut r) = connect(
        s.proxy,
        &target,
        &format!("Proxy-Authorization: Basic {basic}\r\n"),
    )
    .await;
    assert_eq!(status, 200);
    echo_round_trip(&mut r, b"token ok").await;
    let log = format!("{:?}", s.control.entries());
    assert!(!log.contains(&good), "the token reached the log");
}

/// An address of the gateway's own host (here the test network's host end, assigned to this
/// host's veth) reaches the host itself: a CIDR rule that merely covers it (the test network's
/// /30) does not open it, and the host service never sees a connection; a rule naming exactly
/// that address does.
#[tokio::test]
async fn an_address_of_the_gateways_own_host_needs_a_rule_naming_exactly_it() {
    let net = TestNet::new();
    let l = tokio::net::TcpListener::bind((net.host_ip, 0))
        .await
        .unwrap();
    let port = l.local_addr().unwrap().port();
    let accepts = echo_server(l);
    let s = start().await;
    let target = format!("{}:{port}", net.host_ip);
    s.control.set(Policy::allowlist(&[&net.cidr], &[]).unwrap());
    let (status, _) = connect(s.proxy, &target, "").await;
    assert_eq!(status, 403);
    let e = s.control.ended(&target).await;
    assert!(!e.allowed);
    assert!(e.rule.contains("own host"), "{e:?}");
    assert_eq!(accepts.count(), 0, "the host service saw a connection");
    s.control
        .set(Policy::allowlist(&[&format!("{}/32", net.host_ip)], &[]).unwrap());
    let (status, mut r) = connect(s.proxy, &target, "").await;
    assert_eq!(status, 200);
    echo_round_trip(&mut r, b"to the host, by its exact rule").await;
}

/// A special-purpose address reached with a broad allow rule: the target listens on a
/// benchmarking address (198.18.0.0/15, RFC 2544) inside a network namespace the test makes.
/// `0.0.0.0/0`, and an allowed name whose DNS answer points there, are refused before any
/// connection, naming the block; the target never sees a connection. A rule inside the block
/// opens it.
#[tokio::test]
async fn a_special_purpose_address_needs_a_rule_inside_its_block() {
    let net = TestNet::new_in(198, 18);
    let l = net.listen(0);
    let port = l.local_addr().unwrap().port();
    let accepts = echo_server(l);
    let s = start().await;
    s.dns.set("bench.example.com", &[IpAddr::V4(net.peer_ip)]);
    s.control
        .set(Policy::allowlist(&["0.0.0.0/0", "::/0", "*.example.com"], &[]).unwrap());
    let target = format!("{}:{port}", net.peer_ip);
    assert_eq!(connect(s.proxy, &target, "").await.0, 403);
    let by_name = format!("bench.example.com:{port}");
    assert_eq!(connect(s.proxy, &by_name, "").await.0, 403);
    for t in [&target, &by_name] {
        let e = s.control.ended(t).await;
        assert!(!e.allowed, "{e:?}");
        assert!(
            e.rule.contains("198.18.0.0/15") && e.rule.contains("benchmarking"),
            "{e:?}"
        );
    }
    assert_eq!(accepts.count(), 0, "the target saw a connection");
    s.control
        .set(Policy::allowlist(&["198.18.0.0/15"], &[]).unwrap());
    let (status, mut r) = connect(s.proxy, &target, "").await;
    assert_eq!(status, 200);
    echo_round_trip(&mut r, b"inside its block, by a rule inside it").await;
}

/// `CONNECT authority` over the gateway's Unix socket (as the isolated runtime's relay sends
/// it); returns the status and the stream after the response head.
async fn connect_unix(
    path: &std::path::Path,
    authority: &str,
) -> (u16, tokio::io::BufReader<tokio::net::UnixStream>) {
    let mut s = tokio::net::UnixStream::connect(path).await.unwrap();
    s.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut r = tokio::io::BufReader::new(s);
    let status = tokio::time::timeout(Duration::from_secs(10), read_head(&mut r))
        .await
        .expect("the gateway answers a CONNECT within 10 s");
    (status, r)
}

/// Attack: a conversation opens far more tunnels at once than its gateway's cap (8 here) and
/// holds them, to grow the gateway without bound (before: every one was served, each with
/// 512 KiB of relay buffers, until the gateway failed with EMFILE and stopped serving).
/// Verdict: the 8 held tunnels keep relaying; each of 200 more CONNECTs is answered 503 and
/// closed at once, opens no connection to the target and writes no verdict (the refusal costs
/// no store write); the gateway counts 8 connections throughout; once a tunnel closes, the
/// next CONNECT is served again.
#[tokio::test]
async fn connects_past_the_cap_get_503_while_held_tunnels_keep_working() {
    let net = TestNet::new();
    let l = net.listen(0);
    let port = l.local_addr().unwrap().port();
    let accepts = echo_server(l);
    let dns = TestDns::start().await;
    let control = Arc::new(TestControl::default());
    control.set(Policy::allowlist(&[&net.cidr], &[]).unwrap());
    let config = GatewayConfig {
        nameservers: Some(vec![dns.addr]),
        max_connections: 8,
        ..GatewayConfig::default()
    };
    let gw = Gateway::new(config, control.clone(), Auth::Conversation(CONV.into())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let g = gw.clone();
    tokio::spawn(async move { g.serve_unix(listener).await });
    let target = format!("{}:{port}", net.peer_ip);

    let mut held = Vec::new();
    for _ in 0..8 {
        let (status, r) = connect_unix(&path, &target).await;
        assert_eq!(status, 200);
        held.push(r);
    }
    assert_eq!(gw.connections(), 8);
    let started = Instant::now();
    for i in 0..200 {
        let (status, mut r) = connect_unix(&path, &target).await;
        assert_eq!(status, 503, "CONNECT {i} over the cap");
        let mut body = String::new();
        r.read_to_string(&mut body).await.unwrap();
        assert!(body.contains("too many connections"), "{body}");
    }
    let refusing = started.elapsed();
    assert!(
        refusing < Duration::from_secs(5),
        "200 refusals took {refusing:?}"
    );
    assert_eq!(gw.connections(), 8);
    assert_eq!(accepts.count(), 8, "a refused CONNECT reached the target");
    assert!(
        control.entries().is_empty(),
        "a refusal was logged as a verdict"
    );
    for r in &mut held {
        let msg = b"still relaying";
        r.get_mut().write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        r.read_exact(&mut back).await.unwrap();
        assert_eq!(back, msg);
    }
    // One tunnel ends: its permit comes back and the next CONNECT is served.
    drop(held.pop());
    let until = Instant::now() + Duration::from_secs(5);
    while gw.connections() > 7 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(gw.connections(), 7);
    let (status, mut r) = connect_unix(&path, &target).await;
    assert_eq!(status, 200);
    r.get_mut().write_all(b"after").await.unwrap();
    let mut back = [0u8; 5];
    r.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"after");
    assert_eq!(accepts.count(), 9);
}

/// The same cap on a `--listen` (TCP) gateway: with one tunnel held at a cap of 1, 50 more
/// CONNECTs each read a complete 503 (the refusal drains the request before closing, so no TCP
/// reset eats the answer), none reaches the target, and the held tunnel keeps relaying.
#[tokio::test]
async fn a_tcp_gateway_over_its_cap_answers_a_complete_503() {
    let net = TestNet::new();
    let l = net.listen(0);
    let port = l.local_addr().unwrap().port();
    let accepts = echo_server(l);
    let s = start_with(Auth::Conversation(CONV.into()), |c| c.max_connections = 1).await;
    s.control.set(Policy::allowlist(&[&net.cidr], &[]).unwrap());
    let target = format!("{}:{port}", net.peer_ip);
    let (status, mut held) = connect(s.proxy, &target, "").await;
    assert_eq!(status, 200);
    for i in 0..50 {
        let (status, mut r) = connect(s.proxy, &target, "").await;
        assert_eq!(status, 503, "CONNECT {i}");
        let mut body = String::new();
        r.read_to_string(&mut body).await.unwrap();
        assert!(body.contains("too many connections"), "{body}");
    }
    echo_round_trip(&mut held, b"the held tunnel").await;
    assert_eq!(accepts.count(), 1);
}

/// Opens a TCP connection to `proxy` from the local address `from` (any of 127.0.0.0/8).
async fn connect_from(from: &str, proxy: SocketAddr) -> tokio::net::TcpStream {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind(format!("{from}:0").parse().unwrap()).unwrap();
    s.connect(proxy).await.unwrap()
}

/// Attack on the token gateway that remote sandboxes share: one sandbox (source 127.0.0.2)
/// opens connections and sends nothing, so it never even authenticates. With a cap per source
/// it holds at most its share (4 of 8) and its further connections get `503`; another
/// sandbox (127.0.0.1) with a valid token still gets its tunnel and relays. Without one (a
/// source may hold all 8) the second sandbox is refused: what the cap prevents.
#[tokio::test]
async fn one_source_cannot_take_every_connection_of_a_token_gateway() {
    let net = TestNet::new();
    let l = net.listen(0);
    let port = l.local_addr().unwrap().port();
    let accepts = echo_server(l);
    let key = TokenKey::from_bytes([5; 32]);
    let policy = Policy::allowlist(&[&net.cidr], &[]).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let auth = format!(
        "Proxy-Authorization: Bearer {}\r\n",
        key.issue(CONV, &policy.hash(), now, 60)
    );
    let target = format!("{}:{port}", net.peer_ip);
    for per_source in [4, 8] {
        let s = start_with(Auth::Token(key.clone()), |c| {
            c.max_connections = 8;
            c.max_connections_per_source = per_source;
        })
        .await;
        s.control.set(policy.clone());
        let mut hogs = Vec::new();
        let mut refused = 0;
        for _ in 0..20 {
            let mut c = connect_from("127.0.0.2", s.proxy).await;
            // An admitted connection waits for a request head that never comes; a refused one
            // is answered at once.
            let mut buf = [0u8; 12];
            match tokio::time::timeout(Duration::from_millis(300), c.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => {
                    assert!(buf.starts_with(b"HTTP/1.1 503"), "{buf:?}");
                    refused += 1;
                }
                Ok(other) => panic!("the gateway closed a waiting connection: {other:?}"),
                Err(_) => hogs.push(c),
            }
        }
        assert_eq!(hogs.len(), per_source, "connections one source holds");
        assert_eq!(refused, 20 - per_source);
        let (status, mut r) = connect(s.proxy, &target, &auth).await;
        if per_source == 4 {
            assert_eq!(status, 200, "another sandbox was refused");
            echo_round_trip(&mut r, b"a fair share").await;
        } else {
            assert_eq!(
                status, 503,
                "without a per-source cap the hog takes every permit"
            );
        }
    }
    assert_eq!(accepts.count(), 1);
}
