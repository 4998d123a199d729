//! Egress rules and targets (`sessionbox_egress::{policy, target, ranges}`): what a sandboxed
//! command asks the gateway to reach (a CONNECT authority or an absolute-form URL) and the
//! rules a policy is written in.
//!
//! Input: bytes read with `arbitrary::Unstructured`: a permanently blocked address, a spelling
//! of it, a form (CONNECT or absolute URL, with fuzz bytes around it); then lines of raw text.
//! Properties:
//! - a permanently blocked address (loopback, unspecified, link-local with 169.254.169.254,
//!   multicast, broadcast and reserved, in any IPv6 form that carries them) written in any
//!   spelling (decimal, octal, hex, fewer than four parts, trailing dot, IPv4-mapped,
//!   -compatible, NAT64 or 6to4 IPv6, bracketed, upper case, percent-encoded, with a zone) is
//!   refused by the parser or parsed to a blocked address, which no policy allows: not one with
//!   `0.0.0.0/0`, `::/0` and a rule naming exactly that address, not as a host address, not by
//!   a name's rule;
//! - any target the parsers accept: a numeric host is classified by the address it connects
//!   to (blocked means denied), a name is a bare lower-case host name that is no address
//!   spelling, and `localhost` names are denied before DNS;
//! - rules: a parsed rule written back reads as the same rule; a valid policy's rule strings
//!   read back as the same policy; its canonical JSON reads back as the same policy.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use sessionbox_egress::policy::{HostPattern, Net, Policy, Rule, blocked, canonical};
use sessionbox_egress::target::{Host, Target, absolute_target, parse_authority, parse_host};

/// An address in the permanently blocked set.
fn blocked_v4(u: &mut Unstructured<'_>) -> Result<Ipv4Addr> {
    let [_, b, c, d] = u.arbitrary::<[u8; 4]>()?;
    Ok(match u.int_in_range(0..=5)? {
        0 => Ipv4Addr::new(127, b, c, d),
        1 => Ipv4Addr::new(0, b, c, d),
        2 => Ipv4Addr::new(169, 254, c, d),
        3 => Ipv4Addr::new(169, 254, 169, 254),
        4 => Ipv4Addr::new(u.int_in_range(224..=239)?, b, c, d),
        _ => Ipv4Addr::new(u.int_in_range(240..=255)?, b, c, d),
    })
}

fn blocked_addr(u: &mut Unstructured<'_>) -> Result<IpAddr> {
    let v4 = blocked_v4(u)?;
    let [a, b, c, d] = v4.octets();
    let tail = [u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d])];
    let r: [u16; 8] = u.arbitrary()?;
    Ok(match u.int_in_range(0..=9)? {
        0 | 1 => IpAddr::V4(v4),
        2 => IpAddr::V6(v4.to_ipv6_mapped()),
        3 => IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, tail[0], tail[1])), // compatible
        4 => IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, tail[0], tail[1])),
        5 => IpAddr::V6(Ipv6Addr::new(
            0x64, 0xff9b, 1, r[3], r[4], r[5], tail[0], tail[1],
        )),
        6 => IpAddr::V6(Ipv6Addr::new(
            0x2002, tail[0], tail[1], r[3], r[4], r[5], r[6], r[7],
        )),
        7 => IpAddr::V6(Ipv6Addr::new(
            0xfe80 | (r[0] & 0x3f),
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            r[6],
            r[7],
        )),
        8 => IpAddr::V6(Ipv6Addr::new(
            0xff00 | (r[0] & 0xff),
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            r[6],
            r[7],
        )),
        _ => IpAddr::V6(if r[0] & 1 == 0 {
            Ipv6Addr::LOCALHOST
        } else {
            Ipv6Addr::UNSPECIFIED
        }),
    })
}

/// One number in a WHATWG IPv4 spelling: decimal, octal (leading 0) or hex (0x), with or without
/// extra leading zeros and in either case.
fn number(u: &mut Unstructured<'_>, n: u32) -> Result<String> {
    let zeros = "0".repeat(usize::from(u.int_in_range(0..=3u8)?));
    Ok(match u.int_in_range(0..=3)? {
        0 => n.to_string(),
        1 => format!("0{zeros}{n:o}"),
        2 => format!("0x{zeros}{n:x}"),
        _ => format!("0X{zeros}{n:X}"),
    })
}

fn spell_v4(u: &mut Unstructured<'_>, a: Ipv4Addr) -> Result<String> {
    let [p, q, r, s] = a.octets();
    let n = u32::from(a);
    let parts = match u.int_in_range(0..=3)? {
        0 => vec![
            number(u, p.into())?,
            number(u, q.into())?,
            number(u, r.into())?,
            number(u, s.into())?,
        ],
        1 => vec![
            number(u, p.into())?,
            number(u, q.into())?,
            number(u, n & 0xffff)?,
        ],
        2 => vec![number(u, p.into())?, number(u, n & 0x00ff_ffff)?],
        _ => vec![number(u, n)?],
    };
    let mut s = parts.join(".");
    if u.arbitrary()? {
        s.push('.');
    }
    Ok(s)
}

fn spell_v6(u: &mut Unstructured<'_>, a: Ipv6Addr) -> Result<String> {
    let segs = a.segments();
    let s = match u.int_in_range(0..=4)? {
        0 => a.to_string(),
        1 => segs
            .iter()
            .map(|g| format!("{g:x}"))
            .collect::<Vec<_>>()
            .join(":"),
        2 => segs
            .iter()
            .map(|g| format!("{g:04X}"))
            .collect::<Vec<_>>()
            .join(":"),
        3 => {
            // The last 32 bits as a dotted quad.
            let o = a.octets();
            let head: Vec<String> = segs[..6].iter().map(|g| format!("{g:x}")).collect();
            format!("{}:{}.{}.{}.{}", head.join(":"), o[12], o[13], o[14], o[15])
        }
        _ => a.to_string().to_uppercase(),
    };
    Ok(format!("[{s}]"))
}

/// The host written some way; some ways must be refused by the parser.
fn spell(u: &mut Unstructured<'_>, ip: IpAddr) -> Result<String> {
    let s = match ip {
        IpAddr::V4(a) => spell_v4(u, a)?,
        IpAddr::V6(a) => spell_v6(u, a)?,
    };
    Ok(match u.int_in_range(0..=7)? {
        // Percent-encode one byte.
        0 if !s.is_empty() => {
            let i = usize::from(u.int_in_range(0..=u8::MAX)?) % s.len();
            format!("{}%{:02X}{}", &s[..i], s.as_bytes()[i], &s[i + 1..])
        }
        // A zone id.
        1 if s.ends_with(']') => format!("{}%25eth0]", &s[..s.len() - 1]),
        // IPv4 in brackets.
        2 if !s.starts_with('[') => format!("[{s}]"),
        _ => s,
    })
}

/// Every policy check of `ip` on `port`, against the most open policy there can be.
fn assert_never_allowed(ip: IpAddr, port: u16, shown: &str) {
    let exact = Rule {
        host: HostPattern::Cidr(Net::from(ip)),
        ports: vec![],
    };
    let open = Policy::Allowlist {
        allow: vec![
            exact,
            "0.0.0.0/0".parse().expect("rule"),
            "::/0".parse().expect("rule"),
            "*.example".parse().expect("rule"),
        ],
        deny: vec![],
    };
    for host_local in [false, true] {
        for by_name in [None, Some("*.example")] {
            let v = open.check_addr_from(ip, port, by_name, host_local);
            assert!(!v.is_allow(), "{shown:?} -> {ip} allowed: {v:?}");
        }
    }
}

fn check_target(t: &Target, shown: &str) {
    match &t.host {
        Host::Ip(ip) => {
            if blocked(*ip).is_some() {
                assert_never_allowed(*ip, t.port, shown);
            }
        }
        Host::Name(n) => {
            assert_eq!(n, &n.to_ascii_lowercase(), "{shown:?}");
            assert!(!n.ends_with('.') && !n.is_empty(), "{shown:?} -> {n:?}");
            assert!(
                n.parse::<IpAddr>().is_err(),
                "{shown:?} -> name {n:?} is an address"
            );
            assert!(
                matches!(url::Host::parse(n), Ok(url::Host::Domain(_))),
                "{shown:?} -> name {n:?} is an address spelling"
            );
            if n == "localhost" || n.ends_with(".localhost") {
                let open =
                    Policy::allowlist(&["*.localhost.example", "0.0.0.0/0"], &[]).expect("policy");
                assert!(!open.check_name(n, t.port).is_allow());
            }
        }
    }
}

/// The CONNECT form and the absolute form of `host` on `port`, as hyper hands them over.
fn parse_both(
    host: &str,
    port: u16,
    path: &str,
) -> Vec<(String, std::result::Result<Target, String>)> {
    let mut out = Vec::new();
    let authority = format!("{host}:{port}");
    out.push((
        authority.clone(),
        parse_authority(&authority).map_err(|e| e.0),
    ));
    if let Ok(uri) = authority.parse::<http::Uri>()
        && let Some(a) = uri.authority()
    {
        out.push((
            authority.clone(),
            parse_authority(a.as_str()).map_err(|e| e.0),
        ));
    }
    for url in [
        format!("http://{host}:{port}/{path}"),
        format!("http://{host}/{path}"),
    ] {
        if let Ok(uri) = url.parse::<http::Uri>() {
            out.push((url, absolute_target(&uri).map_err(|e| e.0)));
        }
    }
    out
}

fn rules(text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    for line in &lines {
        if let Ok(r) = line.parse::<Rule>() {
            let written = r.to_string();
            assert_eq!(
                written.parse::<Rule>().as_ref(),
                Ok(&r),
                "{line:?} written as {written:?}"
            );
        }
    }
    let (allow, deny) = lines.split_at(lines.len().div_ceil(2));
    if let Ok(p) = Policy::allowlist(allow, deny) {
        let (a, d) = p.rule_strings();
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let d: Vec<&str> = d.iter().map(String::as_str).collect();
        assert_eq!(
            Policy::allowlist(&a, &d).as_ref(),
            Ok(&p),
            "rule strings {a:?} {d:?}"
        );
        assert_eq!(Policy::from_json(&p.to_json()).as_ref(), Ok(&p));
        // Whatever the rules, the blocked set stays closed.
        for ip in [
            "127.0.0.1",
            "169.254.169.254",
            "::1",
            "::ffff:127.0.0.1",
            "0.0.0.0",
            "224.0.0.1",
        ] {
            let ip: IpAddr = ip.parse().expect("address");
            assert!(
                !p.check_addr(ip, 443, Some("r")).is_allow(),
                "{p:?} allows {ip}"
            );
        }
    }
}

fn spelled(u: &mut Unstructured<'_>) -> Result<()> {
    let ip = blocked_addr(u)?;
    assert!(
        blocked(ip).is_some(),
        "{ip} ({}) should be blocked",
        canonical(ip)
    );
    let host = spell(u, ip)?;
    let port: u16 = u.int_in_range(1..=u16::MAX)?;
    let path: String = u.arbitrary()?;
    for (shown, parsed) in parse_both(&host, port, &path) {
        match parsed {
            Err(_) => {}
            Ok(t) => {
                let Host::Ip(got) = t.host else {
                    panic!("{shown:?} (blocked {ip}) parsed as the name {:?}", t.host)
                };
                assert!(
                    blocked(got).is_some(),
                    "{shown:?} (blocked {ip}) parsed as {got}"
                );
                assert_never_allowed(got, t.port, &shown);
            }
        }
    }
    // With fuzz bytes around it, whatever parses is still classified by what it connects to.
    let before: String = u.arbitrary()?;
    let after: String = u.arbitrary()?;
    let host = format!("{before}{host}{after}");
    for (shown, parsed) in parse_both(&host, port, &path) {
        if let Ok(t) = parsed {
            check_target(&t, &shown);
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let _ = spelled(&mut u);
    let Ok(text) = std::str::from_utf8(u.take_rest()) else {
        return;
    };
    for line in text.lines() {
        if let Ok(h) = parse_host(line) {
            check_target(&Target { host: h, port: 443 }, line);
        }
        for (shown, parsed) in parse_both(line, 443, "") {
            if let Ok(t) = parsed {
                check_target(&t, &shown);
            }
        }
        if let Ok(t) = parse_authority(line) {
            check_target(&t, line);
        }
        if let Ok(uri) = line.parse::<http::Uri>()
            && let Ok(t) = absolute_target(&uri)
        {
            check_target(&t, line);
        }
    }
    rules(text);
});
