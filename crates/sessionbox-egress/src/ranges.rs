//! Classes of addresses the egress policy treats apart from the public internet, and where
//! each class comes from.
//!
//! - The permanently blocked set ([`blocked`]): loopback, unspecified, link-local (with the
//!   cloud metadata address 169.254.169.254), multicast, broadcast and reserved. No rule opens it.
//! - Cloud fabric addresses ([`fabric`]): the control endpoints clouds put inside a tenant's
//!   network outside the link-local block (Azure's WireServer 168.63.129.16, Alibaba Cloud's
//!   metadata 100.100.100.200, Oracle Cloud's 192.0.0.192, the IPv6 metadata services of AWS,
//!   `fd00:ec2::254`, and Google Cloud, `fd20:ce::254`). Only an allow rule naming exactly the
//!   address opens one: a broad rule that happens to cover it never does.
//! - Private and special-purpose blocks ([`reserved`]): the private ranges (RFC 1918, the shared
//!   address space of RFC 6598, unique local and site-local IPv6) and the other entries of the
//!   IANA IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890 and the RFCs each entry
//!   cites: documentation, benchmarking, protocol assignments, AS112, AMT, the 6to4 relay
//!   anycast, discard-only, SRv6). Only an allow CIDR rule lying inside the block opens an
//!   address of it, so `0.0.0.0/0` or an allowed name never reaches a documentation or
//!   benchmarking network by accident.
//!
//! Every check takes the canonical form first ([`canonical`]): an IPv6 address carrying an IPv4
//! one (mapped, compatible, NAT64, 6to4) is classified by the IPv4 address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

use ipnet::IpNet;

/// One private or special-purpose block ([`reserved`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The block, as the registry writes it (`198.18.0.0/15`).
    pub net: IpNet,
    /// What it is, in a few words (`benchmarking (RFC 2544)`).
    pub kind: &'static str,
}

/// The blocks, disjoint, the outermost entry of the registries where entries nest.
const BLOCKS: &[(&str, &str)] = &[
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "shared address space (RFC 6598)"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments (RFC 6890)"),
    ("192.0.2.0/24", "documentation, TEST-NET-1 (RFC 5737)"),
    ("192.31.196.0/24", "AS112 (RFC 7535)"),
    ("192.52.193.0/24", "AMT (RFC 7450)"),
    ("192.88.99.0/24", "deprecated 6to4 relay anycast (RFC 7526)"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("192.175.48.0/24", "AS112 direct delegation (RFC 7534)"),
    ("198.18.0.0/15", "benchmarking (RFC 2544)"),
    ("198.51.100.0/24", "documentation, TEST-NET-2 (RFC 5737)"),
    ("203.0.113.0/24", "documentation, TEST-NET-3 (RFC 5737)"),
    ("100::/64", "discard-only (RFC 6666)"),
    ("100:0:0:1::/64", "dummy prefix (RFC 9780)"),
    ("2001::/23", "IETF protocol assignments (RFC 2928)"),
    ("2001:db8::/32", "documentation (RFC 3849)"),
    ("2620:4f:8000::/48", "AS112 (RFC 7534)"),
    ("3fff::/20", "documentation (RFC 9637)"),
    ("5f00::/16", "SRv6 SIDs (RFC 9602)"),
    ("fc00::/7", "unique local (RFC 4193)"),
    ("fec0::/10", "deprecated site-local (RFC 3879)"),
];

static RESERVED: LazyLock<Vec<Block>> = LazyLock::new(|| {
    BLOCKS
        .iter()
        .map(|(net, kind)| Block {
            net: net.parse().expect("a valid block in the table"),
            kind,
        })
        .collect()
});

/// The cloud fabric addresses and whose they are.
const FABRIC: &[(&str, &str)] = &[
    ("168.63.129.16", "Azure WireServer"),
    ("100.100.100.200", "Alibaba Cloud metadata"),
    ("192.0.0.192", "Oracle Cloud metadata"),
    ("fd00:ec2::254", "AWS instance metadata over IPv6"),
    ("fd20:ce::254", "Google Cloud metadata over IPv6"),
];

/// The private or special-purpose block `ip` lies in, or `None` (see the module
/// documentation). Takes the canonical form.
pub fn reserved(ip: IpAddr) -> Option<&'static Block> {
    let ip = canonical(ip);
    RESERVED.iter().find(|b| b.net.contains(&ip))
}

/// The block a whole network lies in, or `None` (a network that merely overlaps one, like
/// `0.0.0.0/0`, does not count as a rule for it).
pub(crate) fn reserved_net(net: &IpNet) -> Option<&'static Block> {
    let first = reserved(net.network())?;
    first.net.contains(&net.broadcast()).then_some(first)
}

/// The private range `ip` is in (RFC 1918, 100.64.0.0/10, fc00::/7, fec0::/10), as its CIDR
/// text, or `None`: the private subset of [`reserved`].
pub fn private(ip: IpAddr) -> Option<&'static str> {
    const PRIVATE: [&str; 6] = [
        "10.0.0.0/8",
        "100.64.0.0/10",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "fc00::/7",
        "fec0::/10",
    ];
    let block = reserved(ip)?;
    PRIVATE
        .iter()
        .copied()
        .find(|p| p.parse::<IpNet>().ok() == Some(block.net))
}

/// Whose cloud fabric address `ip` is, or `None` (see the module documentation). Takes the
/// canonical form.
pub fn fabric(ip: IpAddr) -> Option<&'static str> {
    let ip = canonical(ip);
    FABRIC
        .iter()
        .find(|(a, _)| a.parse::<IpAddr>().ok() == Some(ip))
        .map(|(_, who)| *who)
}

/// The address the kernel would use: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible
/// (`::a.b.c.d`), NAT64 (`64:ff9b::/96`, `64:ff9b:1::/48`) and 6to4 (`2002::/16`) IPv6
/// addresses are classified by the IPv4 address they carry.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => embedded_v4(v6).map_or(ip, IpAddr::V4),
    }
}

fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let o = v6.octets();
    let tail = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    // IPv4-compatible ::a.b.c.d (deprecated); :: and ::1 stay IPv6 (unspecified, loopback).
    if s[..6] == [0; 6] && u32::from(tail) > 1 {
        return Some(tail);
    }
    // NAT64 well-known prefix 64:ff9b::/96 and local-use 64:ff9b:1::/48 (RFC 8215).
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || s[..3] == [0x64, 0xff9b, 1] {
        return Some(tail);
    }
    // 6to4 2002:AABB:CCDD::/48 carries AA.BB.CC.DD.
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    None
}

/// Why `ip` is in the permanently blocked set, or `None`. Takes the canonical form.
pub fn blocked(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            if v4.is_loopback() {
                Some("loopback")
            } else if o[0] == 0 {
                Some("unspecified (0.0.0.0/8)")
            } else if v4.is_link_local() {
                Some("link-local (169.254.0.0/16, cloud metadata)")
            } else if v4.is_multicast() {
                Some("multicast")
            } else if v4.is_broadcast() || o[0] >= 240 {
                Some("broadcast or reserved (240.0.0.0/4)")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if s[0] & 0xffc0 == 0xfe80 {
                Some("link-local (fe80::/10)")
            } else if v6.is_multicast() {
                Some("multicast")
            } else {
                None
            }
        }
    }
}

/// Why a whole network lies in the permanently blocked set, or `None`.
pub(crate) fn blocked_net(net: &IpNet) -> Option<&'static str> {
    let first = blocked(net.network())?;
    // Both ends blocked for the same reason: the whole (contiguous) network is.
    (blocked(net.broadcast()) == Some(first)).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_blocks_are_disjoint_and_none_is_in_the_blocked_set() {
        for (i, a) in RESERVED.iter().enumerate() {
            assert!(blocked(a.net.network()).is_none(), "{}", a.net);
            for b in &RESERVED[i + 1..] {
                assert!(
                    !a.net.contains(&b.net.network()) && !b.net.contains(&a.net.network()),
                    "{} and {} overlap",
                    a.net,
                    b.net
                );
            }
        }
        for (a, _) in FABRIC {
            assert!(blocked(ip(a)).is_none(), "{a}");
        }
    }

    #[test]
    fn every_special_purpose_block_is_found_in_every_spelling() {
        for (a, block) in [
            ("192.0.2.1", "192.0.2.0/24"),
            ("198.51.100.7", "198.51.100.0/24"),
            ("203.0.113.255", "203.0.113.0/24"),
            ("198.19.255.1", "198.18.0.0/15"),
            ("192.0.0.9", "192.0.0.0/24"),
            ("192.88.99.1", "192.88.99.0/24"),
            ("::ffff:198.18.0.1", "198.18.0.0/15"),
            ("64:ff9b::c000:201", "192.0.2.0/24"),
            ("2001:db8::1", "2001:db8::/32"),
            ("2001::1", "2001::/23"),
            ("2001:2::1", "2001::/23"),
            ("3fff:1::1", "3fff::/20"),
            ("100::1", "100::/64"),
            ("fd00::1", "fc00::/7"),
        ] {
            assert_eq!(
                reserved(ip(a)).map(|b| b.net.to_string()).as_deref(),
                Some(block),
                "{a}"
            );
        }
        for a in [
            "8.8.8.8",
            "1.1.1.1",
            "198.20.0.1",
            "2606:4700::1111",
            "2001:4860::8888",
        ] {
            assert_eq!(reserved(ip(a)), None, "{a}");
        }
        assert_eq!(private(ip("10.1.2.3")), Some("10.0.0.0/8"));
        assert_eq!(
            private(ip("192.0.2.1")),
            None,
            "special-purpose, not private"
        );
    }

    #[test]
    fn fabric_addresses_are_known_in_their_canonical_form() {
        assert_eq!(fabric(ip("168.63.129.16")), Some("Azure WireServer"));
        assert_eq!(fabric(ip("::ffff:168.63.129.16")), Some("Azure WireServer"));
        assert!(fabric(ip("fd00:ec2::254")).is_some());
        assert!(fabric(ip("fd20:ce::254")).is_some());
        assert_eq!(fabric(ip("168.63.129.17")), None);
    }

    #[test]
    fn a_network_counts_for_a_block_only_when_it_lies_inside() {
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(
            reserved_net(&net("198.18.4.0/24")).map(|b| b.kind),
            Some("benchmarking (RFC 2544)")
        );
        assert_eq!(reserved_net(&net("198.0.0.0/8")), None);
        assert_eq!(reserved_net(&net("0.0.0.0/0")), None);
        assert_eq!(reserved_net(&net("::/0")), None);
    }
}
