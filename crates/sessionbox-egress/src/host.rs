//! The addresses of the gateway's own host: every address and every local route of its
//! interfaces, read from the kernel (`/proc/net/fib_trie` for IPv4: the `host LOCAL` entries of
//! the local routing table, whatever their prefix length; `/proc/net/ipv6_route` for IPv6: the
//! routes flagged `RTF_LOCAL`; and `/proc/net/if_inet6`, the interface addresses). A connection
//! to one of them reaches the host itself (its SSH, databases, the gateway), whatever range the
//! address is in, so the policy treats them apart ([`crate::Policy::check_addr_from`]).
//!
//! The set is read again when it is older than [`HostAddrs::MAX_AGE`], so an address or route
//! added while the gateway runs counts within that time. When the files cannot be read (not
//! Linux, no `/proc`), the set is empty and only the policy's ranges apply. Not seen: an address
//! that reaches this host only through a router outside it (a cloud's 1:1 NAT public address).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ipnet::IpNet;

/// The host's own addresses and local routes, read lazily and cached.
#[derive(Debug, Default)]
pub struct HostAddrs {
    cached: Mutex<Option<(Instant, Vec<IpNet>)>>,
}

impl HostAddrs {
    /// How long a reading is used before the kernel is asked again: 2 s.
    pub const MAX_AGE: Duration = Duration::from_secs(2);

    /// True when `ip`, as given or as the IPv4 address an IPv6 form carries, is an address of
    /// this host or lies in one of its local routes. Both forms are checked: the gateway
    /// connects to the address as given, and the kernel may treat it as the IPv4 one.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let canonical = crate::policy::canonical(ip);
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = cached
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < Self::MAX_AGE);
        if !fresh {
            *cached = Some((Instant::now(), read()));
        }
        cached.as_ref().is_some_and(|(_, nets)| {
            nets.iter()
                .any(|n| n.contains(&ip) || n.contains(&canonical))
        })
    }
}

/// Reads the host's addresses and local routes now.
pub fn read() -> Vec<IpNet> {
    let mut nets = Vec::new();
    if let Ok(t) = std::fs::read_to_string("/proc/net/fib_trie") {
        nets.extend(local_v4(&t));
    }
    if let Ok(t) = std::fs::read_to_string("/proc/net/ipv6_route") {
        nets.extend(local_v6_routes(&t));
    }
    if let Ok(t) = std::fs::read_to_string("/proc/net/if_inet6") {
        nets.extend(
            local_v6(&t)
                .into_iter()
                .filter_map(|a| IpNet::new(IpAddr::V6(a), 128).ok()),
        );
    }
    nets
}

/// The `/N host LOCAL` entries of `/proc/net/fib_trie`, each as the prefix of the `|-- ADDRESS`
/// line it follows.
fn local_v4(fib_trie: &str) -> Vec<IpNet> {
    let mut out = Vec::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in fib_trie.lines() {
        let t = line.trim();
        if let Some(a) = t.strip_prefix("|-- ") {
            last = a.trim().parse().ok();
        } else if let Some(rest) = t.strip_prefix('/')
            && t.contains(" host LOCAL")
            && let Some(a) = last
            && let Some(len) = rest.split_whitespace().next().and_then(|l| l.parse().ok())
            && let Ok(n) = IpNet::new(IpAddr::V4(a), len)
        {
            out.push(n.trunc());
        }
    }
    out
}

/// The routes of `/proc/net/ipv6_route` flagged `RTF_LOCAL` (0x80000000): destination (32 hex
/// digits), prefix length (hex), ..., flags (hex, the ninth field).
fn local_v6_routes(ipv6_route: &str) -> Vec<IpNet> {
    const RTF_LOCAL: u32 = 0x8000_0000;
    ipv6_route
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let dest = u128::from_str_radix(f.first()?, 16).ok()?;
            let len = u8::from_str_radix(f.get(1)?, 16).ok()?;
            let flags = u32::from_str_radix(f.get(8)?, 16).ok()?;
            (flags & RTF_LOCAL != 0)
                .then(|| IpNet::new(IpAddr::V6(Ipv6Addr::from(dest)), len).ok())
                .flatten()
        })
        .collect()
}

/// The addresses of `/proc/net/if_inet6`: 32 hex digits first on each line.
fn local_v6(if_inet6: &str) -> Vec<Ipv6Addr> {
    if_inet6
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|h| u128::from_str_radix(h, 16).ok().filter(|_| h.len() == 32))
        .map(Ipv6Addr::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covers(nets: &[IpNet], ip: &str) -> bool {
        let ip: IpAddr = ip.parse().unwrap();
        nets.iter().any(|n| n.contains(&ip))
    }

    #[test]
    fn the_kernels_tables_are_read_with_their_prefixes() {
        let fib = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n\
                   Local:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 127.0.0.1\n        /32 host LOCAL\n\
                   |-- 192.0.2.2\n        /32 host LOCAL\n     |-- 192.0.2.255\n\
                   /32 link BROADCAST\n     |-- 203.0.113.0\n        /24 host LOCAL\n";
        let v4 = local_v4(fib);
        assert!(covers(&v4, "192.0.2.2"));
        assert!(covers(&v4, "127.0.0.1"));
        assert!(
            covers(&v4, "203.0.113.9"),
            "a local route for a whole range"
        );
        assert!(!covers(&v4, "192.0.2.255"));
        assert!(!covers(&v4, "192.0.2.3"));
        assert!(!covers(&v4, "0.0.0.0"));
        let routes = local_v6_routes(
            "fd000000000000000000000000000000 40 00000000000000000000000000000000 00 \
             00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0\n\
             fd000000000000000000000000000002 80 00000000000000000000000000000000 00 \
             00000000000000000000000000000000 00000000 00000004 00000000 80200001 eth0\n\
             20010db8007700000000000000000000 40 00000000000000000000000000000000 00 \
             00000000000000000000000000000000 00000000 00000001 00000000 80000001 lo\n",
        );
        assert!(covers(&routes, "fd00::2"));
        assert!(!covers(&routes, "fd00::3"), "an on-link route is not local");
        assert!(covers(&routes, "2001:db8:77::5"), "a local /64");
        let v6 = local_v6(
            "00000000000000000000000000000001 01 80 10 80       lo\n\
             20010db8000000000000000000000002 02 40 00 80     eth0\n",
        );
        assert!(v6.contains(&"::1".parse().unwrap()));
        assert!(v6.contains(&"2001:db8::2".parse().unwrap()));
    }

    #[test]
    fn this_hosts_loopback_is_among_its_addresses() {
        // Every Linux host has 127.0.0.1 on `lo`.
        let addrs = HostAddrs::default();
        assert!(addrs.contains("127.0.0.1".parse().unwrap()));
        assert!(addrs.contains("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!addrs.contains("192.0.2.200".parse().unwrap()));
    }

    /// A host address that carries an IPv4 one (6to4 here) is the host's as given, even though
    /// the policy reads it as the IPv4 address inside.
    #[test]
    fn both_forms_of_an_address_are_checked() {
        let addrs = HostAddrs::default();
        *addrs.cached.lock().unwrap() =
            Some((Instant::now(), vec!["2002:808:808::1/128".parse().unwrap()]));
        assert!(addrs.contains("2002:808:808::1".parse().unwrap()));
        assert!(!addrs.contains("8.8.8.8".parse().unwrap()));
    }
}
