//! The addresses of the gateway's own host: every address assigned to one of its interfaces,
//! read from the kernel (`/proc/net/fib_trie` for IPv4: the `host LOCAL` entries of the local
//! routing table; `/proc/net/if_inet6` for IPv6). A connection to one of them reaches the host
//! itself (its SSH, databases, the gateway), whatever range the address is in, so the policy
//! treats them apart ([`crate::Policy::check_addr_from`]).
//!
//! The set is read again when it is older than [`HostAddrs::MAX_AGE`], so an address added
//! while the gateway runs counts within that time. When the files cannot be read (not Linux,
//! no `/proc`), the set is empty and only the policy's ranges apply.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The host's own addresses, read lazily and cached.
#[derive(Debug, Default)]
pub struct HostAddrs {
    cached: Mutex<Option<(Instant, HashSet<IpAddr>)>>,
}

impl HostAddrs {
    /// How long a reading is used before the kernel is asked again: 2 s.
    pub const MAX_AGE: Duration = Duration::from_secs(2);

    /// True when `ip` (or the IPv4 address an IPv6 form carries) is an address of this host.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = crate::policy::canonical(ip);
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = cached
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < Self::MAX_AGE);
        if !fresh {
            *cached = Some((Instant::now(), read()));
        }
        cached.as_ref().is_some_and(|(_, set)| set.contains(&ip))
    }
}

/// Reads the host's addresses now.
pub fn read() -> HashSet<IpAddr> {
    let mut set = HashSet::new();
    if let Ok(t) = std::fs::read_to_string("/proc/net/fib_trie") {
        set.extend(local_v4(&t).into_iter().map(IpAddr::V4));
    }
    if let Ok(t) = std::fs::read_to_string("/proc/net/if_inet6") {
        set.extend(local_v6(&t).into_iter().map(IpAddr::V6));
    }
    set
}

/// The `/32 host LOCAL` entries of `/proc/net/fib_trie`: each follows the `|-- ADDRESS` line it
/// belongs to.
fn local_v4(fib_trie: &str) -> HashSet<Ipv4Addr> {
    let mut out = HashSet::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in fib_trie.lines() {
        let t = line.trim();
        if let Some(a) = t.strip_prefix("|-- ") {
            last = a.trim().parse().ok();
        } else if t.starts_with("/32 host LOCAL")
            && let Some(a) = last
        {
            out.insert(a);
        }
    }
    out
}

/// The addresses of `/proc/net/if_inet6`: 32 hex digits first on each line.
fn local_v6(if_inet6: &str) -> HashSet<Ipv6Addr> {
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

    #[test]
    fn the_kernels_tables_are_read() {
        let fib = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n\
                   Local:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 127.0.0.1\n        /32 host LOCAL\n\
                   |-- 192.0.2.2\n        /32 host LOCAL\n     |-- 192.0.2.255\n\
                   /32 link BROADCAST\n";
        let v4 = local_v4(fib);
        assert!(v4.contains(&"192.0.2.2".parse().unwrap()));
        assert!(v4.contains(&"127.0.0.1".parse().unwrap()));
        assert!(!v4.contains(&"192.0.2.255".parse().unwrap()));
        assert!(!v4.contains(&"0.0.0.0".parse().unwrap()));
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
}
