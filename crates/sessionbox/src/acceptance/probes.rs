//! The probes of `verify --acceptance` as data: each one's POSIX `sh` script (no bash, no
//! python: busybox `sh` must run it) and the parser that turns its output into what was
//! measured. Nothing here runs anything; `acceptance.rs` runs the scripts through a
//! [`sessionbox_core::Session`] and computes each row's verdict from these parsers.

use serde::Serialize;

/// What one row concludes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Verdict {
    /// The probe showed the control holds.
    Pass,
    /// The runtime claims the control, and the probe showed it does not hold.
    Fail,
    /// The runtime does not claim the control (and the probe did not show it holding).
    NotEnforced,
    /// The probe could not measure it in this run (the reason is in the row's detail).
    NotMeasured,
}

impl Verdict {
    /// How the Markdown table says it.
    pub(crate) fn phrase(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "FAIL",
            Verdict::NotEnforced => "not enforced by this runtime",
            Verdict::NotMeasured => "not measured",
        }
    }

    /// The verdict of a probe whose control `holds`, on a runtime that does or does not
    /// `claim` it: pass when it holds, else fail when claimed, else not enforced.
    pub(crate) fn of(holds: bool, claimed: bool) -> Verdict {
        match (holds, claimed) {
            (true, _) => Verdict::Pass,
            (false, true) => Verdict::Fail,
            (false, false) => Verdict::NotEnforced,
        }
    }
}

/// The identity probe: the status of the command's own process (`cat` reads its own).
pub(crate) const IDENTITY: &str = "cat /proc/self/status";

/// The fields of `/proc/self/status` the identity rows look at.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Identity {
    /// Real, effective, saved and filesystem uids.
    pub(crate) uids: Vec<u32>,
    /// Effective capabilities (a bit mask).
    pub(crate) cap_eff: Option<u64>,
    /// Bounding set (a bit mask).
    pub(crate) cap_bnd: Option<u64>,
    /// `NoNewPrivs`: 1 when set.
    pub(crate) no_new_privs: Option<u32>,
    /// `Seccomp`: 0 off, 1 strict, 2 filter.
    pub(crate) seccomp: Option<u32>,
}

/// Parses `/proc/self/status`.
pub(crate) fn parse_identity(status: &str) -> Identity {
    let mut id = Identity::default();
    for line in status.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k {
            "Uid" => {
                id.uids = v
                    .split_whitespace()
                    .filter_map(|u| u.parse().ok())
                    .collect()
            }
            "CapEff" => id.cap_eff = u64::from_str_radix(v, 16).ok(),
            "CapBnd" => id.cap_bnd = u64::from_str_radix(v, 16).ok(),
            "NoNewPrivs" => id.no_new_privs = v.parse().ok(),
            "Seccomp" => id.seccomp = v.parse().ok(),
            _ => {}
        }
    }
    id
}

/// The root file system probe: tries to create a file in each of `/`, `/etc`, `/usr` (which
/// should refuse) and the workspace and `/tmp` (which should accept), removing what it made.
/// Prints `writable DIR` or `readonly DIR` for each.
pub(crate) fn root_fs_script(run_id: &str) -> String {
    format!(
        "for d in / /etc /usr \"$PWD\" /tmp; do f=\"${{d%/}}/.sessionbox-acceptance-{run_id}\"; \
         if touch \"$f\" 2>/dev/null; then rm -f \"$f\"; echo \"writable $d\"; \
         else echo \"readonly $d\"; fi; done"
    )
}

/// The directories [`root_fs_script`] found writable and read-only.
pub(crate) fn parse_root_fs(out: &str) -> (Vec<String>, Vec<String>) {
    let (mut w, mut r) = (Vec::new(), Vec::new());
    for line in out.lines() {
        if let Some(d) = line.strip_prefix("writable ") {
            w.push(d.to_owned());
        } else if let Some(d) = line.strip_prefix("readonly ") {
            r.push(d.to_owned());
        }
    }
    (w, r)
}

/// The secrets probe: the names of the variables in the command's environment, then the
/// `/proc/*/environ` files visible to it that hold any of `names` (only file names are
/// printed, never a value). `names` are variable names (checked by the caller to be
/// `[A-Z_]+`).
pub(crate) fn secrets_script(names: &[&str]) -> String {
    let patterns: String = names.iter().map(|n| format!(" -e '{n}='")).collect();
    format!(
        "env; echo '--environ--'; for f in /proc/[0-9]*/environ; do \
         tr '\\000' '\\n' < \"$f\" 2>/dev/null | grep -q{patterns} && echo \"$f\"; done; true"
    )
}

/// The fork probe: starts up to `max` short-lived `sleep`s at once, printing the count after
/// each start. A refused fork stops the loop (or the shell); the sleeps end by themselves.
pub(crate) fn pids_script(max: u64) -> String {
    format!("n=0; while [ $n -lt {max} ]; do sleep 3 & n=$((n+1)); echo $n; done; echo all-started")
}

/// The most processes [`pids_script`] started, and whether it started all it tried.
pub(crate) fn parse_pids(out: &str) -> (u64, bool) {
    let most = out
        .lines()
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    (most, out.lines().any(|l| l == "all-started"))
}

/// The memory probe: holds `bytes` in a shell variable (command substitution keeps it all in
/// memory), then says `survived LEN` if nothing killed it.
pub(crate) fn memory_script(bytes: u64) -> String {
    format!("x=$(head -c {bytes} /dev/zero | tr '\\000' a); echo \"survived ${{#x}}\"")
}

/// The CPU probe: `loops` busy loops for two seconds, then the children's user and system
/// time (`times`, second line), and the cgroup's `cpu.max` when it can be read.
pub(crate) fn cpu_script(loops: u32) -> String {
    let start: String = (0..loops)
        .map(|i| format!("(while :; do :; done) & p{i}=$!; "))
        .collect();
    let pids: String = (0..loops).map(|i| format!(" $p{i}")).collect();
    format!(
        "{start}sleep 2; kill{pids}; wait; times; echo \"cpu.max $(cat /sys/fs/cgroup/cpu.max 2>/dev/null)\""
    )
}

/// The seconds of CPU the children used, from `times` (its second line: children's user
/// and system time, each `XmY.Zs`), and the `cpu.max` line's value if any.
pub(crate) fn parse_cpu(out: &str) -> (Option<f64>, Option<String>) {
    let secs = |t: &str| -> Option<f64> {
        let t = t.strip_suffix('s')?;
        let (m, s) = t.split_once('m')?;
        Some(m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
    };
    let times: Vec<&str> = out
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() == 2 && f.iter().all(|t| secs(t).is_some())
        })
        .collect();
    let used = times.get(1).and_then(|l| {
        let f: Vec<f64> = l.split_whitespace().filter_map(secs).collect();
        Some(f.first()? + f.get(1)?)
    });
    let max = out
        .lines()
        .find_map(|l| l.strip_prefix("cpu.max "))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned);
    (used, max)
}

/// The bytes of each file the disk probe writes.
pub(crate) const DISK_CHUNK: u64 = 16 << 20;

/// The disk probe: writes up to `chunks` files of [`DISK_CHUNK`] bytes into the workspace
/// until one is refused (`refused AFTER` with the count written whole, then `avail KIB`, what
/// the file system says is left), then removes them.
pub(crate) fn disk_script(run_id: &str, chunks: u64) -> String {
    format!(
        "i=0; while [ $i -lt {chunks} ]; do \
         if ! head -c {DISK_CHUNK} /dev/zero > .acceptance-fill-{run_id}.$i; then echo \"refused $i\"; \
         echo \"avail $(df -k . | awk 'NR==2 {{print $4}}')\"; break; fi; \
         i=$((i+1)); done; rm -f .acceptance-fill-{run_id}.*; echo cleaned"
    )
}

/// How many chunks were written whole before a refusal (`None`: none was refused), and
/// whether the refusal said the disk or quota was full.
pub(crate) fn parse_disk(stdout: &str, stderr: &str) -> (Option<u64>, bool) {
    let refused = stdout
        .lines()
        .find_map(|l| l.strip_prefix("refused "))
        .and_then(|n| n.trim().parse().ok());
    // The writer's own words when it gives them (busybox says only "I/O error"), else the
    // file system's: nothing left.
    let none_left = stdout
        .lines()
        .find_map(|l| l.strip_prefix("avail "))
        .is_some_and(|n| n.trim() == "0");
    let full = stderr.contains("No space left on device")
        || stderr.contains("quota exceeded")
        || none_left;
    (refused, full)
}

/// The default gateway of the sandbox's network, from its `/proc/net/route` (the host's
/// bridge address on a container network).
pub(crate) fn parse_gateway(route: &str) -> Option<std::net::Ipv4Addr> {
    route.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 3 || f[1] != "00000000" {
            return None;
        }
        let g = u32::from_str_radix(f[2], 16).ok()?;
        (g != 0).then(|| std::net::Ipv4Addr::from(g.to_le_bytes()))
    })
}

/// The direct-network probe: with every proxy variable unset, each available client (`nc`,
/// `wget`, `curl`, bash's `/dev/tcp`) tries each `host:port` once, two seconds at most.
/// Prints `tools: ...` with the clients it found.
pub(crate) fn network_script(hosts: &[String], port: u16) -> String {
    let hosts = hosts.join(" ");
    format!(
        "unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy; t=''; \
         for h in {hosts}; do \
         if command -v nc >/dev/null 2>&1; then t=\"$t nc\"; nc -w 2 $h {port} </dev/null >/dev/null 2>&1; fi; \
         if command -v wget >/dev/null 2>&1; then t=\"$t wget\"; wget -q -T 2 -t 1 -O /dev/null http://$h:{port}/ >/dev/null 2>&1; fi; \
         if command -v curl >/dev/null 2>&1; then t=\"$t curl\"; curl -s -m 2 -o /dev/null http://$h:{port}/ >/dev/null 2>&1; fi; \
         if command -v bash >/dev/null 2>&1; then t=\"$t bash\"; timeout 2 bash -c \"exec 3<>/dev/tcp/$h/{port}\" >/dev/null 2>&1; fi; \
         done; echo \"tools:$t\""
    )
}

/// The distinct clients [`network_script`] found.
pub(crate) fn parse_tools(out: &str) -> Vec<String> {
    let mut tools: Vec<String> = out
        .lines()
        .find_map(|l| l.strip_prefix("tools:"))
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    tools.sort();
    tools.dedup();
    tools
}

/// The other-conversation probe, run in B: prints whatever it can read of A's marker `name`
/// at A's location as the host knows it (`a_location`), beside its own workspace, and
/// through every visible process's root and working directory.
pub(crate) fn other_conversation_script(a_location: &str, name: &str) -> String {
    format!(
        "for p in '{a_location}/{name}' \"$PWD\"/../*/{name} /workspace/../*/{name} \
         /proc/[0-9]*/root/workspace/{name} /proc/[0-9]*/root'{a_location}/{name}' \
         /proc/[0-9]*/cwd/{name}; do cat \"$p\" 2>/dev/null; done; \
         ls /workspace/.. 2>/dev/null | head -c 4096; echo probe-ran"
    )
}

/// A Kubernetes-style quantity (`512Mi`, `2G`, `500m`, `1.5`) as a number (bytes for
/// memory, CPUs for cpu). `None` when it does not parse.
pub(crate) fn parse_quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let units: [(&str, f64); 9] = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Ti", 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("m", 1e-3),
    ];
    for (suffix, factor) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<f64>().ok().map(|n| n * factor);
        }
    }
    q.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_fields_are_read_from_a_status_file() {
        let s = "Name:\tcat\nUid:\t1000\t1000\t1000\t1000\nCapEff:\t0000000000000000\n\
                 CapBnd:\t000001ffffffffff\nNoNewPrivs:\t1\nSeccomp:\t2\n";
        let id = parse_identity(s);
        assert_eq!(id.uids, vec![1000; 4]);
        assert_eq!(id.cap_eff, Some(0));
        assert_eq!(id.cap_bnd, Some(0x1ff_ffff_ffff));
        assert_eq!(id.no_new_privs, Some(1));
        assert_eq!(id.seccomp, Some(2));
        assert_eq!(parse_identity("garbage"), Identity::default());
    }

    #[test]
    fn verdicts_follow_what_held_and_what_was_claimed() {
        assert_eq!(Verdict::of(true, false), Verdict::Pass);
        assert_eq!(Verdict::of(false, true), Verdict::Fail);
        assert_eq!(Verdict::of(false, false), Verdict::NotEnforced);
    }

    #[test]
    fn cpu_times_and_quota_are_parsed_from_dash_and_bash_formats() {
        let out = "0m0.01s 0m0.00s\n0m1.50s 0m0.25s\ncpu.max 50000 100000\n";
        let (used, max) = parse_cpu(out);
        assert!((used.unwrap() - 1.75).abs() < 1e-9);
        assert_eq!(max.as_deref(), Some("50000 100000"));
        let (used, max) = parse_cpu("0m0.001000s 0m0.000000s\n1m2.000000s 0m0.000000s\ncpu.max \n");
        assert!((used.unwrap() - 62.0).abs() < 1e-9);
        assert_eq!(max, None);
    }

    #[test]
    fn pids_disk_and_tools_outputs_are_parsed() {
        assert_eq!(parse_pids("1\n2\n3\n"), (3, false));
        assert_eq!(parse_pids("1\n2\nall-started\n"), (2, true));
        assert_eq!(
            parse_disk(
                "refused 3\ncleaned\n",
                "sh: 1: cannot create x: No space left on device"
            ),
            (Some(3), true)
        );
        assert_eq!(parse_disk("cleaned\n", ""), (None, false));
        assert_eq!(
            parse_disk(
                "refused 2\navail 0\ncleaned\n",
                "head: standard output: I/O error\n"
            ),
            (Some(2), true)
        );
        assert_eq!(
            parse_disk("refused 2\navail 5120\ncleaned\n", "head: I/O error\n"),
            (Some(2), false)
        );
        assert_eq!(parse_tools("tools: nc wget nc\n"), vec!["nc", "wget"]);
        assert!(parse_tools("tools:\n").is_empty());
    }

    #[test]
    fn the_gateway_is_read_from_a_route_table() {
        let route = "Iface\tDestination\tGateway \tFlags\n\
                     eth0\t00000000\t010011AC\t0003\n\
                     eth0\t000011AC\t00000000\t0001\n";
        assert_eq!(
            parse_gateway(route),
            Some(std::net::Ipv4Addr::new(172, 17, 0, 1))
        );
        assert_eq!(parse_gateway("Iface\tDestination\tGateway\n"), None);
    }

    #[test]
    fn quantities_are_read_with_binary_and_decimal_suffixes() {
        assert_eq!(parse_quantity("512Mi"), Some(512.0 * 1024.0 * 1024.0));
        assert_eq!(parse_quantity("2G"), Some(2e9));
        assert_eq!(parse_quantity("500m"), Some(0.5));
        assert_eq!(parse_quantity("1.5"), Some(1.5));
        assert_eq!(parse_quantity("lots"), None);
    }

    #[test]
    fn root_fs_lines_are_split_into_writable_and_read_only() {
        let (w, r) = parse_root_fs("readonly /\nreadonly /etc\nwritable /workspace\n");
        assert_eq!(w, vec!["/workspace"]);
        assert_eq!(r, vec!["/", "/etc"]);
    }
}
