//! `sessionbox bench-egress`: what the egress gateway costs, against a direct connection to the
//! same target measured in the same run.
//!
//! The gateway never connects to loopback (it is permanently blocked), so the target runs in a
//! network namespace the benchmark creates, reached over a veth pair with a private address
//! (allowed explicitly): a kernel-local path like loopback. The benchmark deletes the namespace
//! when it ends. Needs root and `ip` (iproute2).
//!
//! - Latency per CONNECT: open a connection, send one byte, read the echo. Direct: to the
//!   target. Through the gateway: to the gateway, `CONNECT`, `200`, then the same byte. Added =
//!   p50 through the gateway - p50 direct (target: at most 1 ms).
//! - Throughput: the target sends N MiB; direct vs through a CONNECT tunnel (target: at least
//!   half of direct).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use sessionbox_egress::{Auth, Control, Gateway, GatewayConfig, LogEntry, Policy};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Target: added p50 latency per CONNECT, in milliseconds.
pub(crate) const ADDED_P50_MS: f64 = 1.0;
/// Target: throughput through the gateway as a fraction of direct.
pub(crate) const THROUGHPUT_RATIO: f64 = 0.5;

/// Arguments of `sessionbox bench-egress`.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchEgressArgs {
    /// Connections per latency measurement (each of direct and through the gateway).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(10..=1_000_000))]
    connections: u32,
    /// MiB per throughput measurement.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    mib: u32,
    /// Write the report as JSON here.
    #[arg(long, value_name = "PATH")]
    report_json: Option<PathBuf>,
    /// Exit 1 when a target is missed.
    #[arg(long)]
    check: bool,
}

#[derive(Debug, Serialize)]
struct Latency {
    p50_ms: f64,
    p95_ms: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    connections: u32,
    connect_direct: Latency,
    connect_gateway: Latency,
    added_p50_ms: f64,
    added_p50_target_ms: f64,
    mib: u32,
    throughput_direct_mib_s: f64,
    throughput_gateway_mib_s: f64,
    throughput_ratio: f64,
    throughput_ratio_target: f64,
    ok: bool,
}

/// A policy that never changes; verdicts are counted, not kept.
struct Fixed(Policy, std::sync::atomic::AtomicU64);

impl Control for Fixed {
    fn policy(&self, _: &str) -> Result<Policy, String> {
        Ok(self.0.clone())
    }
    fn record(&self, _: LogEntry) {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The target's namespace and veth pair; deleted on drop.
struct Netns {
    name: String,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run ip: install iproute2")?;
    if !out.status.success() {
        bail!(
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    (sorted[i] * 1000.0).round() / 1000.0
}

fn latency(mut v: Vec<f64>) -> Latency {
    v.sort_by(f64::total_cmp);
    Latency {
        p50_ms: percentile(&v, 0.5),
        p95_ms: percentile(&v, 0.95),
    }
}

async fn connect_via(
    proxy: SocketAddr,
    target: SocketAddr,
) -> anyhow::Result<BufReader<TcpStream>> {
    let mut s = TcpStream::connect(proxy).await?;
    s.set_nodelay(true)?;
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).await?;
    if !line.starts_with("HTTP/1.1 200") {
        bail!("the gateway answered {line:?}");
    }
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 || line == "\r\n" {
            break;
        }
    }
    Ok(r)
}

/// Runs `sessionbox bench-egress`.
pub(crate) async fn run(args: &BenchEgressArgs) -> anyhow::Result<ExitCode> {
    if !rustix::process::geteuid().is_root() {
        bail!("bench-egress creates a network namespace for its target: run it as root");
    }
    let pid = std::process::id();
    let v = pid % 16384;
    let (a, b) = ((v >> 6) as u8, ((v & 63) << 2) as u8);
    let name = format!("sbbench-{pid}");
    let (h, p) = (
        format!("sbb{:x}h", pid % 0xfffff),
        format!("sbb{:x}p", pid % 0xfffff),
    );
    ip(&["netns", "add", &name])?;
    let _ns = Netns { name: name.clone() };
    ip(&[
        "link", "add", &h, "type", "veth", "peer", "name", &p, "netns", &name,
    ])?;
    ip(&[
        "addr",
        "add",
        &format!("10.213.{a}.{}/30", b + 1),
        "dev",
        &h,
    ])?;
    ip(&["link", "set", &h, "up"])?;
    let peer = Ipv4Addr::new(10, 213, a, b + 2);
    ip(&["-n", &name, "addr", "add", &format!("{peer}/30"), "dev", &p])?;
    ip(&["-n", &name, "link", "set", &p, "up"])?;
    // Two listeners inside: an echo server and a sender of zeros.
    let path = format!("/run/netns/{name}");
    let (echo, sink) = std::thread::spawn(move || -> anyhow::Result<_> {
        use std::os::fd::AsFd;
        let f = std::fs::File::open(&path)?;
        rustix::thread::move_into_link_name_space(
            f.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )?;
        let bind = || std::net::TcpListener::bind(SocketAddr::from((peer, 0)));
        Ok((bind()?, bind()?))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the namespace thread panicked"))??;
    let echo_addr = echo.local_addr()?;
    let sink_addr = sink.local_addr()?;
    for l in [&echo, &sink] {
        l.set_nonblocking(true)?;
    }
    let (echo, sink) = (
        tokio::net::TcpListener::from_std(echo)?,
        tokio::net::TcpListener::from_std(sink)?,
    );
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let bytes = u64::from(args.mib) * 1024 * 1024;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = sink.accept().await {
            tokio::spawn(async move {
                let buf = vec![0u8; 256 * 1024];
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(buf.len() as u64) as usize;
                    if s.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    left -= n as u64;
                }
            });
        }
    });
    // The gateway, with the target's /30 allowed explicitly.
    let policy = Policy::allowlist(&[&format!("10.213.{a}.{b}/30")], &[])?;
    let control = Arc::new(Fixed(policy, Default::default()));
    let gw = Gateway::new(
        GatewayConfig {
            nameservers: Some(vec![SocketAddr::from(([127, 0, 0, 1], 9))]),
            ..GatewayConfig::default()
        },
        control.clone(),
        Auth::Conversation("0".repeat(64)),
    )?;
    let gl = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let proxy = gl.local_addr()?;
    tokio::spawn(async move { gw.serve_tcp(gl).await });

    // Latency, interleaved so that both see the same machine.
    let (mut direct, mut via) = (Vec::new(), Vec::new());
    for i in 0..args.connections + 20 {
        let t = Instant::now();
        let mut s = TcpStream::connect(echo_addr).await?;
        s.set_nodelay(true)?;
        s.write_all(b"x").await?;
        let mut one = [0u8; 1];
        s.read_exact(&mut one).await?;
        let d = t.elapsed();
        drop(s);
        let t = Instant::now();
        let mut r = connect_via(proxy, echo_addr).await?;
        r.get_mut().write_all(b"x").await?;
        r.read_exact(&mut one).await?;
        let g = t.elapsed();
        drop(r);
        if i >= 20 {
            direct.push(d.as_secs_f64() * 1000.0);
            via.push(g.as_secs_f64() * 1000.0);
        }
    }
    let (connect_direct, connect_gateway) = (latency(direct), latency(via));
    let added = ((connect_gateway.p50_ms - connect_direct.p50_ms) * 1000.0).round() / 1000.0;

    // Throughput.
    async fn drain<R: tokio::io::AsyncRead + Unpin>(
        mut r: R,
        want: u64,
    ) -> anyhow::Result<Duration> {
        let t = Instant::now();
        let mut buf = vec![0u8; 256 * 1024];
        let mut got = 0u64;
        while got < want {
            let n = r.read(&mut buf).await?;
            if n == 0 {
                bail!("the stream ended after {got} of {want} bytes");
            }
            got += n as u64;
        }
        Ok(t.elapsed())
    }
    let mib_s = |d: Duration| (f64::from(args.mib) / d.as_secs_f64() * 10.0).round() / 10.0;
    let mut best_direct = f64::MIN;
    let mut best_gateway = f64::MIN;
    for _ in 0..3 {
        let d = drain(TcpStream::connect(sink_addr).await?, bytes).await?;
        best_direct = best_direct.max(mib_s(d));
        let g = drain(connect_via(proxy, sink_addr).await?, bytes).await?;
        best_gateway = best_gateway.max(mib_s(g));
    }
    let ratio = (best_gateway / best_direct * 1000.0).round() / 1000.0;
    let ok = added <= ADDED_P50_MS && ratio >= THROUGHPUT_RATIO;
    let report = Report {
        connections: args.connections,
        connect_direct,
        connect_gateway,
        added_p50_ms: added,
        added_p50_target_ms: ADDED_P50_MS,
        mib: args.mib,
        throughput_direct_mib_s: best_direct,
        throughput_gateway_mib_s: best_gateway,
        throughput_ratio: ratio,
        throughput_ratio_target: THROUGHPUT_RATIO,
        ok,
    };
    let mark = |pass: bool| if pass { "ok" } else { "MISSED" };
    outln!("egress gateway (target in a test namespace over veth; same run, interleaved)");
    outln!(
        "  connect + 1-byte echo, p50/p95: direct {:.3}/{:.3} ms, through the gateway {:.3}/{:.3} ms",
        report.connect_direct.p50_ms,
        report.connect_direct.p95_ms,
        report.connect_gateway.p50_ms,
        report.connect_gateway.p95_ms
    );
    outln!(
        "  added per CONNECT (p50): {:.3} ms (target <= {ADDED_P50_MS} ms) {}",
        added,
        mark(added <= ADDED_P50_MS)
    );
    outln!(
        "  throughput ({} MiB, best of 3): direct {:.1} MiB/s, through the gateway {:.1} MiB/s = {:.0}% (target >= {:.0}%) {}",
        args.mib,
        best_direct,
        best_gateway,
        ratio * 100.0,
        THROUGHPUT_RATIO * 100.0,
        mark(ratio >= THROUGHPUT_RATIO)
    );
    if let Some(p) = &args.report_json {
        std::fs::write(p, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(if ok || !args.check {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
