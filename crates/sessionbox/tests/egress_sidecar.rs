//! Enforced egress on the `opensandbox` runtime: the real OpenSandbox 1.1.1 server with
//! sessionbox's egress sidecar (`[egress] image = "sessionbox/egress:local"`, written by
//! scripts/opensandbox-up), through the real `sessionbox` binary. The target is an HTTP server
//! in a network namespace this test creates (10.212.0.0/16, routed from the Docker bridge
//! through this host); a DNS server on the bridge stands for a resolver a program picks itself.
//!
//! The same attempts are made from a sandbox of an installation without `network_policy`
//! first: they succeed there, so their failure under the sidecar is the sidecar's doing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::egress::{
    Data, GatewayProcess, TestNet, dns_on, docker_bridge, http_on, opensandbox_server, osb_sh as sh,
};

/// Unsets every proxy variable: a program that ignores them.
const NO_PROXY: &str = "env -u http_proxy -u HTTP_PROXY -u https_proxy -u HTTPS_PROXY \
                        -u all_proxy -u ALL_PROXY";

fn add_config(data: &Data, lines: &str) {
    let path = data.path.join("sessionbox.toml");
    let mut config = std::fs::read_to_string(&path).unwrap();
    config.push_str(lines);
    std::fs::write(path, config).unwrap();
}

/// Attack: a command that ignores the proxy variables connects to the target by address, asks
/// its own resolver, uses an IPv4-mapped IPv6 address, reaches another port of the gateway's
/// host, or tries to change the network it shares with the sidecar. Under the sidecar every
/// attempt fails and the target and the resolver see nothing; the same program through the
/// gateway reaches the allowed target, and the verdict is in the store's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_sidecar_an_opensandbox_sandbox_reaches_only_its_gateway_and_no_bypass_works() {
    if !opensandbox_server() {
        return;
    }
    let bridge = docker_bridge();
    let net = TestNet::new(7);
    let target = net.listen();
    let tp = target.local_addr().unwrap().port();
    let target_accepts = http_on(target);
    let peer = net.peer;
    // Another port on the gateway's host, which no rule names.
    let side = tokio::net::TcpListener::bind((bridge, 0)).await.unwrap();
    let side_port = side.local_addr().unwrap().port();
    let side_accepts = http_on(side);
    let resolver = dns_on(SocketAddr::from((bridge, 53)), HashMap::new()).await;
    let instance = format!("t{}-sidecar", std::process::id());

    // The baseline: an installation without network_policy, whose sandboxes have the server's
    // bridge network as it is.
    let open = Arc::new(Data::new("127.0.0.1:9".parse().unwrap()));
    add_config(
        &open,
        &format!(
            "[opensandbox]\nmemory = \"256Mi\"\ntimeout_secs = 300\ninstance = \"{instance}-open\"\n"
        ),
    );
    let (code, out) = sh(
        &open,
        "baseline",
        format!(
            "{NO_PROXY} nc -w 3 {peer} {tp} </dev/null; echo nc=$?; \
             nslookup open-resolver.test {bridge} >/dev/null 2>&1; echo dns=$?"
        ),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("nc=0"),
        "the target is not reachable even without the sidecar: {out}"
    );
    assert_eq!(target_accepts.load(Ordering::SeqCst), 1, "{out}");
    assert!(
        resolver
            .asked
            .lock()
            .unwrap()
            .iter()
            .any(|n| n == "open-resolver.test"),
        "the resolver is not reachable even without the sidecar: {out}"
    );
    open.ok(&["--runtime", "opensandbox", "destroy", "-c", "baseline"]);

    // Enforced: network_policy with sessionbox's gateway on the bridge.
    let data = Arc::new(Data::new("127.0.0.1:9".parse().unwrap()));
    let gateway = GatewayProcess::start(&data, SocketAddr::from((bridge, 0)));
    add_config(
        &data,
        &format!(
            "[opensandbox]\nmemory = \"256Mi\"\ntimeout_secs = 300\ninstance = \"{instance}\"\n\
             network_policy = true\negress_gateway = \"{}\"\n",
            gateway.addr
        ),
    );
    let conv = "sidecar";
    data.ok(&[
        "policy",
        "set",
        "-c",
        conv,
        "--allow",
        &format!("{peer}/32:{tp}"),
    ]);

    // Through the gateway: allowed, checked and logged.
    let (code, out) = sh(
        &data,
        conv,
        format!("wget -q -O - http://{peer}:{tp}/via-gateway"),
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "hello from /via-gateway\n"));
    assert_eq!(target_accepts.load(Ordering::SeqCst), 2);

    // Every way around it.
    let attempts = [
        (
            "raw address",
            format!("{NO_PROXY} nc -w 3 {peer} {tp} </dev/null"),
        ),
        (
            "raw address, HTTP",
            format!("{NO_PROXY} timeout 5 wget -q -O - http://{peer}:{tp}/direct"),
        ),
        ("own resolver", format!("nslookup bypass.test {bridge}")),
        (
            "IPv4-mapped IPv6",
            format!("{NO_PROXY} nc -w 3 ::ffff:{peer} {tp} </dev/null"),
        ),
        (
            "IPv6",
            format!("{NO_PROXY} nc -w 3 2001:db8::1 {tp} </dev/null"),
        ),
        (
            "the gateway's host, another port",
            format!("{NO_PROXY} nc -w 3 {bridge} {side_port} </dev/null"),
        ),
        (
            "drop the firewall's route",
            "ip route del default".to_owned(),
        ),
        (
            "another address",
            "ip addr add 10.213.0.1/32 dev lo".to_owned(),
        ),
    ];
    for (what, cmd) in &attempts {
        let (code, out) = sh(&data, conv, cmd.clone()).await;
        assert_ne!(code, 0, "{what} worked under the sidecar: {cmd}: {out}");
    }
    assert_eq!(
        target_accepts.load(Ordering::SeqCst),
        2,
        "a direct connection reached the target"
    );
    assert_eq!(side_accepts.load(Ordering::SeqCst), 0);
    assert!(
        !resolver
            .asked
            .lock()
            .unwrap()
            .iter()
            .any(|n| n == "bypass.test"),
        "the sandbox's own resolver was asked"
    );
    // No global IPv6 address in the shared namespace.
    let (_, out) = sh(&data, conv, "ip -6 addr show scope global".into()).await;
    assert!(!out.contains("inet6"), "{out}");
    // Still working after all of it.
    let (code, out) = sh(
        &data,
        conv,
        format!("wget -q -O - http://{peer}:{tp}/again"),
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "hello from /again\n"));

    let entries = data.verdicts_until(conv, 2);
    let allowed: u64 = entries
        .iter()
        .filter(|e| e["verdict"] == "allowed" && e["target"] == format!("{peer}:{tp}"))
        .map(|e| e["count"].as_u64().unwrap())
        .sum();
    assert_eq!(allowed, 2, "{entries:?}");

    // A conversation under `none` gets no route at all, not even to the gateway.
    let (code, out) = sh(
        &data,
        "none",
        format!(
            "nc -w 3 {} {} </dev/null; echo gw=$?; {NO_PROXY} nc -w 3 {peer} {tp} </dev/null; echo direct=$?",
            gateway.addr.ip(),
            gateway.addr.port()
        ),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("gw=1") && out.contains("direct=1"), "{out}");
    assert_eq!(target_accepts.load(Ordering::SeqCst), 3);
    for c in [conv, "none"] {
        data.ok(&["--runtime", "opensandbox", "destroy", "-c", c]);
    }
    drop(gateway);
}
