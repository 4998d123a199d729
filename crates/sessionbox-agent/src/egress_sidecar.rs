//! `sessionbox-agent egress-sidecar`: an egress sidecar for OpenSandbox's Docker runtime that
//! enforces a sandbox's `networkPolicy` on connections, not on DNS answers.
//!
//! The contract it meets is the one the 1.1.1 server expects of `[egress] image` (read from the
//! server's `services/docker/networking.py`): the server starts the sidecar first, with
//! `CAP_NET_ADMIN`, on the bridge network, with the sandbox's ports published on it, and the
//! environment `OPENSANDBOX_EGRESS_RULES` (the create request's `networkPolicy` as JSON),
//! `OPENSANDBOX_EGRESS_MODE`, `OPENSANDBOX_EGRESS_TOKEN` and `OPENSANDBOX_EGRESS_SANDBOX_ID`,
//! plus every `OPENSANDBOX_EGRESS_*` variable of the create request; it waits until
//! `GET :18080/healthz` with the header `OPENSANDBOX-EGRESS-AUTH: <token>` answers 2xx, and
//! only then starts the sandbox container in the sidecar's network namespace
//! (`network_mode: container:<sidecar>`) without `NET_ADMIN`. The policy API is
//! `../shared/specs/opensandbox/egress-api.yaml`.
//!
//! What this sidecar does differently from upstream's (which filters DNS answers, and in
//! `dns+nft` mode adds the addresses it resolved): it installs one nftables table in the shared
//! namespace **before** it reports healthy, so no command of the sandbox ever runs unfiltered:
//! - outbound: loopback and replies are accepted; then the policy's rules in order (`allow`
//!   accepts, `deny` rejects), each target an IP address, a CIDR block or a host name resolved
//!   once at start; then the default action. IPv4 and IPv6 alike (one `inet` table). A target
//!   may end in `:PORT` (a sessionbox extension; IPv6 in brackets, `[2001:db8::1]:3128`): the
//!   rule then matches that TCP port only. sessionbox sends its gateway as `ADDRESS:PORT`, so
//!   every connection goes through the gateway's per-CONNECT checks. (The server accepts any
//!   target text; upstream's sidecar, which matches names, would match nothing: fail closed.)
//! - inbound: loopback, replies, and new TCP connections to the ports the server publishes
//!   (44772 execd, 8080, 18080 this API) from the network's default gateway (the host: the
//!   server's proxy and Docker's published ports) only; so another container on the bridge
//!   reaches no port here, not even a server a command starts on a published port.
//!
//! A wildcard target (`*.example.com`) cannot be enforced on addresses: the sidecar refuses to
//! start rather than enforce less than it was given, and the server's create fails. So does a
//! `deny` rule naming a host that does not resolve when the default is `allow`. `PATCH` and
//! `DELETE /policy` answer 501: a sessionbox sandbox gets a new sandbox for a new policy.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};

/// The port of the sidecar's API (upstream's).
pub const API_PORT: u16 = 18080;
/// The header carrying the sidecar's token (upstream's).
pub const AUTH_HEADER: &str = "OPENSANDBOX-EGRESS-AUTH";
/// The name of the nftables table the sidecar owns.
pub const TABLE: &str = "sessionbox_egress";
/// Ports the server publishes on the sidecar and so must be reachable from outside.
const INBOUND_PORTS: [u16; 3] = [44772, 8080, API_PORT];

/// A `networkPolicy` as the lifecycle API and the egress API define it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicy {
    /// `allow` or `deny`; absent means `deny`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_action: Option<String>,
    /// Rules, first match wins.
    #[serde(default)]
    pub egress: Vec<NetworkRule>,
}

/// One egress rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkRule {
    /// `allow` or `deny`.
    pub action: String,
    /// An IP address, a CIDR block or a host name.
    pub target: String,
}

/// Why the sidecar will not start.
#[derive(Debug)]
pub enum SidecarError {
    /// The policy cannot be enforced as given.
    Policy(String),
    /// nftables refused the rules.
    Firewall(String),
}

impl std::fmt::Display for SidecarError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SidecarError::Policy(m) => write!(f, "the network policy cannot be enforced: {m}"),
            SidecarError::Firewall(m) => write!(f, "nftables refused the rules: {m}"),
        }
    }
}

impl std::error::Error for SidecarError {}

/// A rule's target as the firewall sees it: a set of address blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Block {
    addr: IpAddr,
    prefix: u8,
}

impl std::fmt::Display for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Parses a target that is an address or a CIDR block; `None` for anything else.
fn literal(target: &str) -> Option<Block> {
    let (a, p) = match target.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (target, None),
    };
    let addr: IpAddr = a
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match p {
        Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max)?,
        None => max,
    };
    Some(Block { addr, prefix })
}

/// Splits `host:port` (`[v6]:port` for IPv6) into its parts; a target without a port, and a
/// bare IPv6 address, is all host.
///
/// # Errors
/// [`SidecarError::Policy`] for a port that is not 1-65535.
fn split_port(target: &str) -> Result<(&str, Option<u16>), SidecarError> {
    let bad = || SidecarError::Policy(format!("{target:?}: the port is not 1-65535"));
    if let Some(rest) = target.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((host, "")) => Ok((host, None)),
            Some((host, port)) => {
                let port = port.strip_prefix(':').ok_or_else(bad)?;
                Ok((
                    host,
                    Some(port.parse().ok().filter(|p| *p > 0).ok_or_else(bad)?),
                ))
            }
            None => Err(SidecarError::Policy(format!(
                "{target:?}: unclosed bracket"
            ))),
        };
    }
    match target.rsplit_once(':') {
        // More than one colon and no brackets: an IPv6 address (or block) without a port.
        Some((host, _)) if host.contains(':') => Ok((target, None)),
        Some((host, port)) => Ok((
            host,
            Some(port.parse().ok().filter(|p| *p > 0).ok_or_else(bad)?),
        )),
        None => Ok((target, None)),
    }
}

/// The nftables rule text for `policy`. `resolve` turns a host name into its addresses
/// (injected so that tests need no DNS).
///
/// # Errors
/// [`SidecarError::Policy`] for an unknown action, a wildcard target, or an unresolvable `deny`
/// target under a default `allow`.
pub fn ruleset(
    policy: &NetworkPolicy,
    resolve: &dyn Fn(&str) -> Vec<IpAddr>,
    inbound_from: Option<std::net::Ipv4Addr>,
) -> Result<String, SidecarError> {
    let default_allow = match policy
        .default_action
        .as_deref()
        .map(str::to_ascii_lowercase)
    {
        None => false,
        Some(a) if a == "deny" => false,
        Some(a) if a == "allow" => true,
        Some(a) => return Err(SidecarError::Policy(format!("unknown defaultAction {a:?}"))),
    };
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    // Delete any earlier table of ours (a restarted sidecar) in the same transaction.
    line(format!("table inet {TABLE} {{}}"));
    line(format!("delete table inet {TABLE}"));
    line(format!("table inet {TABLE} {{"));
    line("  chain output {".into());
    line("    type filter hook output priority filter; policy drop;".into());
    line("    oifname \"lo\" accept".into());
    line("    ct state established,related accept".into());
    for rule in &policy.egress {
        let allow = match rule.action.to_ascii_lowercase().as_str() {
            "allow" => true,
            "deny" => false,
            other => return Err(SidecarError::Policy(format!("unknown action {other:?}"))),
        };
        let (target, port) = split_port(rule.target.trim())?;
        let port_match = port.map(|p| format!(" tcp dport {p}")).unwrap_or_default();
        if target.contains('*') {
            return Err(SidecarError::Policy(format!(
                "the wildcard target {target:?} names no address; this sidecar enforces \
                 addresses (give an address, a CIDR block or a host name, or let sessionbox's \
                 gateway match names)"
            )));
        }
        let blocks: Vec<Block> = match literal(target) {
            Some(b) => vec![b],
            None => {
                let addrs = resolve(target);
                if addrs.is_empty() && !allow && default_allow {
                    return Err(SidecarError::Policy(format!(
                        "the deny target {target:?} does not resolve, so it cannot be denied"
                    )));
                }
                addrs
                    .into_iter()
                    .map(|addr| Block {
                        prefix: if addr.is_ipv4() { 32 } else { 128 },
                        addr,
                    })
                    .collect()
            }
        };
        for b in blocks {
            let family = if b.addr.is_ipv4() { "ip" } else { "ip6" };
            if allow {
                line(format!("    {family} daddr {b}{port_match} accept"));
            } else {
                line(format!("    {family} daddr {b}{port_match} jump refuse"));
            }
        }
    }
    if default_allow {
        line("    accept".into());
    } else {
        line("    jump refuse".into());
    }
    line("  }".into());
    line("  chain refuse {".into());
    // Refused at once, not dropped: a program learns now instead of after its timeout.
    line("    meta l4proto tcp reject with tcp reset".into());
    line("    reject with icmpx admin-prohibited".into());
    line("  }".into());
    line("  chain input {".into());
    line("    type filter hook input priority filter; policy drop;".into());
    line("    iifname \"lo\" accept".into());
    line("    ct state established,related accept".into());
    let inbound: Vec<String> = INBOUND_PORTS.iter().map(u16::to_string).collect();
    // Only from the host (the bridge's gateway: the server's proxy and Docker's published
    // ports come from there), so no other container on the bridge reaches a port here.
    let from = inbound_from
        .map(|a| format!("ip saddr {a} "))
        .unwrap_or_default();
    line(format!(
        "    {from}tcp dport {{ {} }} accept",
        inbound.join(", ")
    ));
    line("  }".into());
    line("}".into());
    Ok(out)
}

/// The IPv4 default gateway of this network namespace (`/proc/net/route`): the host, on a
/// Docker bridge.
fn default_gateway() -> Option<std::net::Ipv4Addr> {
    let text = std::fs::read_to_string("/proc/net/route").ok()?;
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 3 || f[1] != "00000000" {
            return None;
        }
        let g = u32::from_str_radix(f[2], 16).ok()?;
        // The kernel writes the address in host (little-endian) byte order.
        Some(std::net::Ipv4Addr::from(g.swap_bytes()))
    })
}

fn system_resolve(name: &str) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = (name, 0)
        .to_socket_addrs()
        .map(|it| it.map(|a| a.ip()).collect())
        .unwrap_or_default();
    v.sort();
    v.dedup();
    v
}

fn apply(rules: &str) -> Result<(), SidecarError> {
    use std::io::Write;
    let nft = std::env::var("SESSIONBOX_NFT").unwrap_or_else(|_| "nft".into());
    let mut child = std::process::Command::new(&nft)
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| SidecarError::Firewall(format!("cannot run {nft}: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(rules.as_bytes())
            .map_err(|e| SidecarError::Firewall(e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| SidecarError::Firewall(e.to_string()))?;
    if !out.status.success() {
        return Err(SidecarError::Firewall(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ));
    }
    // Check rather than trust: the table must be there now.
    let listed = std::process::Command::new(&nft)
        .args(["list", "table", "inet", TABLE])
        .output()
        .map_err(|e| SidecarError::Firewall(e.to_string()))?;
    if !listed.status.success() {
        return Err(SidecarError::Firewall(format!(
            "the table {TABLE} is not there after loading it"
        )));
    }
    Ok(())
}

struct Api {
    token: Option<String>,
    policy: NetworkPolicy,
}

fn authorized(api: &Api, headers: &HeaderMap) -> bool {
    let Some(want) = &api.token else {
        return true;
    };
    let got = headers
        .get(AUTH_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    // Constant time in the token's length.
    got.len() == want.len()
        && got
            .iter()
            .zip(want.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn json(status: StatusCode, v: serde_json::Value) -> Response {
    (status, axum::Json(v)).into_response()
}

fn unauthorized() -> Response {
    json(
        StatusCode::UNAUTHORIZED,
        serde_json::json!({"code": "UNAUTHORIZED", "message": format!("missing or wrong {AUTH_HEADER} header")}),
    )
}

async fn healthz(State(api): State<Arc<Api>>, headers: HeaderMap) -> Response {
    if !authorized(&api, &headers) {
        return unauthorized();
    }
    (StatusCode::OK, "ok").into_response()
}

async fn get_policy(State(api): State<Arc<Api>>, headers: HeaderMap) -> Response {
    if !authorized(&api, &headers) {
        return unauthorized();
    }
    let deny =
        !matches!(api.policy.default_action.as_deref(), Some(a) if a.eq_ignore_ascii_case("allow"));
    json(
        StatusCode::OK,
        serde_json::json!({
            "status": "ok",
            "mode": if deny { "deny_all" } else { "allow_all" },
            "enforcementMode": "nft",
            "policy": api.policy,
        }),
    )
}

async fn change_policy(State(api): State<Arc<Api>>, headers: HeaderMap) -> Response {
    if !authorized(&api, &headers) {
        return unauthorized();
    }
    json(
        StatusCode::NOT_IMPLEMENTED,
        serde_json::json!({
            "code": "NOT_IMPLEMENTED",
            "message": "sessionbox's egress sidecar enforces the policy the sandbox was created \
                        with; create a new sandbox for another policy",
        }),
    )
}

/// Runs the sidecar (see the module documentation): reads its environment, installs the
/// firewall, then serves the API until SIGTERM. Exit code 1 when the policy cannot be
/// enforced or the firewall cannot be installed (the server's readiness wait then fails the
/// create: a sandbox never runs with less than its policy).
pub fn run() -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SESSIONBOX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    match setup() {
        Ok(api) => serve(api),
        Err(e) => {
            eprintln!("sessionbox egress sidecar: {e}");
            ExitCode::FAILURE
        }
    }
}

fn setup() -> Result<Api, SidecarError> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let policy: NetworkPolicy = match var("OPENSANDBOX_EGRESS_RULES") {
        // The egress API: no policy, or `null`, is allow-all at startup.
        None => NetworkPolicy {
            default_action: Some("allow".into()),
            egress: Vec::new(),
        },
        Some(text) if text.trim() == "null" => NetworkPolicy {
            default_action: Some("allow".into()),
            egress: Vec::new(),
        },
        Some(text) => serde_json::from_str(&text).map_err(|e| {
            SidecarError::Policy(format!(
                "OPENSANDBOX_EGRESS_RULES is not a network policy: {e}"
            ))
        })?,
    };
    let rules = ruleset(&policy, &system_resolve, default_gateway())?;
    apply(&rules)?;
    tracing::info!(
        rules = policy.egress.len(),
        default = policy.default_action.as_deref().unwrap_or("deny"),
        "egress firewall installed"
    );
    Ok(Api {
        token: var("OPENSANDBOX_EGRESS_TOKEN"),
        policy,
    })
}

fn serve(api: Api) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sessionbox egress sidecar: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route(
            "/policy",
            get(get_policy).patch(change_policy).delete(change_policy),
        )
        .with_state(Arc::new(api));
    let result = runtime.block_on(async {
        let listener =
            tokio::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], API_PORT))).await?;
        axum::serve(listener, app)
            .with_graceful_shutdown(crate::termination_signal())
            .await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sessionbox egress sidecar: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(default: Option<&str>, rules: &[(&str, &str)]) -> NetworkPolicy {
        NetworkPolicy {
            default_action: default.map(str::to_owned),
            egress: rules
                .iter()
                .map(|(a, t)| NetworkRule {
                    action: (*a).into(),
                    target: (*t).into(),
                })
                .collect(),
        }
    }

    fn no_dns(_: &str) -> Vec<IpAddr> {
        Vec::new()
    }

    #[test]
    fn deny_all_accepts_only_loopback_replies_and_the_published_ports() {
        let r = ruleset(
            &policy(Some("deny"), &[]),
            &no_dns,
            Some([172, 17, 0, 1].into()),
        )
        .unwrap();
        let output = r.split("chain refuse").next().unwrap();
        assert!(output.contains("policy drop;"), "{r}");
        assert!(output.contains("oifname \"lo\" accept"), "{r}");
        assert!(output.trim_end().ends_with("jump refuse\n  }"), "{r}");
        assert!(!output.contains("daddr"), "{r}");
        assert!(
            r.contains("ip saddr 172.17.0.1 tcp dport { 44772, 8080, 18080 } accept"),
            "{r}"
        );
        // An absent default is deny too.
        assert_eq!(
            ruleset(&policy(None, &[]), &no_dns, Some([172, 17, 0, 1].into())).unwrap(),
            r
        );
    }

    #[test]
    fn rules_become_addresses_in_order_and_a_port_restricts_its_rule() {
        let resolve = |n: &str| match n {
            "gw.example" => vec!["192.0.2.7".parse().unwrap(), "2001:db8::7".parse().unwrap()],
            _ => Vec::new(),
        };
        let r = ruleset(
            &policy(
                Some("deny"),
                &[
                    ("deny", "192.0.2.0/28"),
                    ("allow", "192.0.2.0/24:3128"),
                    ("allow", "gw.example:3128"),
                    ("allow", "nowhere.example"),
                    ("allow", "[2001:db8::9]:443"),
                    ("allow", "2001:db8::/64"),
                ],
            ),
            &resolve,
            None,
        )
        .unwrap();
        let lines: Vec<&str> = r.lines().map(str::trim).collect();
        let at = |s: &str| {
            lines
                .iter()
                .position(|l| *l == s)
                .unwrap_or_else(|| panic!("{s:?} not in\n{r}"))
        };
        let deny = at("ip daddr 192.0.2.0/28 jump refuse");
        let allow = at("ip daddr 192.0.2.0/24 tcp dport 3128 accept");
        let v4 = at("ip daddr 192.0.2.7/32 tcp dport 3128 accept");
        let v6 = at("ip6 daddr 2001:db8::7/128 tcp dport 3128 accept");
        let bracketed = at("ip6 daddr 2001:db8::9/128 tcp dport 443 accept");
        let block = at("ip6 daddr 2001:db8::/64 accept");
        assert!(
            deny < allow && allow < v4 && v4 < v6 && v6 < bracketed && bracketed < block,
            "{r}"
        );
        // A name that does not resolve allows nothing.
        assert!(!r.contains("nowhere"), "{r}");
    }

    #[test]
    fn what_cannot_be_enforced_is_refused() {
        for (p, want) in [
            (policy(Some("deny"), &[("allow", "*.pypi.org")]), "wildcard"),
            (
                policy(Some("allow"), &[("deny", "gone.example")]),
                "does not resolve",
            ),
            (policy(Some("maybe"), &[]), "defaultAction"),
            (policy(Some("deny"), &[("permit", "192.0.2.1")]), "action"),
            (policy(Some("deny"), &[("allow", "192.0.2.1:0")]), "port"),
            (policy(Some("deny"), &[("allow", "192.0.2.1:http")]), "port"),
            (
                policy(Some("deny"), &[("allow", "[2001:db8::1:443")]),
                "bracket",
            ),
        ] {
            let e = ruleset(&p, &no_dns, None).unwrap_err().to_string();
            assert!(e.contains(want), "{p:?}: {e}");
        }
    }

    #[test]
    fn literals_are_addresses_and_blocks_only() {
        assert_eq!(literal("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(literal("[::1]").unwrap().to_string(), "::1/128");
        assert!(literal("10.0.0.0/33").is_none());
        assert!(literal("example.com").is_none());
    }

    #[test]
    fn nft_accepts_the_rules() {
        // Needs root and nft; the firewall is checked end to end against the real server in
        // the opensandbox crate's tests. Here: the syntax, with `nft --check`.
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED: not root");
            return;
        }
        let Ok(out) = std::process::Command::new("nft").arg("--version").output() else {
            eprintln!("SKIPPED: no nft");
            return;
        };
        assert!(out.status.success());
        let r = ruleset(
            &policy(
                Some("deny"),
                &[("allow", "192.0.2.0/24:3128"), ("deny", "2001:db8::/32")],
            ),
            &no_dns,
            Some([172, 17, 0, 1].into()),
        )
        .unwrap();
        use std::io::Write;
        let mut child = std::process::Command::new("nft")
            .args(["--check", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(r.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}\n{r}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
