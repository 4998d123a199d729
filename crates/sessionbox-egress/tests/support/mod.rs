//! Real things the tests start themselves: a test network (a network namespace joined to this
//! one by a veth pair, with private addresses), servers in it or on loopback, a DNS server
//! that counts the questions it is asked, and a small proxy client.
//!
//! Nothing here touches system state the test did not create: a [`TestNet`] deletes exactly the
//! namespace it added (which takes its veth pair with it).

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sessionbox_egress::{Control, LogEntry, Policy};
use sessionbox_test_support::bind_in_netns;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip (install iproute2): {e}"));
    assert!(
        out.status.success(),
        "ip {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace with a veth pair: `host_ip` on this side, `peer_ip` inside, a /30.
pub struct TestNet {
    pub name: String,
    pub host_ip: Ipv4Addr,
    pub peer_ip: Ipv4Addr,
    pub cidr: String,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl TestNet {
    pub fn new() -> TestNet {
        TestNet::new_in(10, 211)
    }

    /// A test network of four addresses under `p0.p1.0.0/16` (10.211 for [`TestNet::new`]).
    pub fn new_in(p0: u8, p1: u8) -> TestNet {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let v = ((std::process::id() as usize) * 16 + n) % 16384;
        let (a, b) = ((v >> 6) as u8, ((v & 63) << 2) as u8);
        let name = format!("sbeg-{}-{n}", std::process::id());
        let host_if = format!("sbe{:x}h{n}", std::process::id() % 0xfffff);
        let peer_if = format!("sbe{:x}p{n}", std::process::id() % 0xfffff);
        let host_ip = Ipv4Addr::new(p0, p1, a, b + 1);
        let peer_ip = Ipv4Addr::new(p0, p1, a, b + 2);
        ip(&["netns", "add", &name]);
        let net = TestNet {
            name: name.clone(),
            host_ip,
            peer_ip,
            cidr: format!("{p0}.{p1}.{a}.{b}/30"),
        };
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if, "netns", &name,
        ]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        ip(&[
            "-n",
            &name,
            "addr",
            "add",
            &format!("{peer_ip}/30"),
            "dev",
            &peer_if,
        ]);
        ip(&["-n", &name, "link", "set", &peer_if, "up"]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        net
    }

    /// A TCP listener bound inside the namespace (a socket stays in the namespace it was made
    /// in, whichever thread uses it later).
    pub fn listen(&self, port: u16) -> tokio::net::TcpListener {
        let addr = SocketAddr::new(IpAddr::V4(self.peer_ip), port);
        tokio::net::TcpListener::from_std(bind_in_netns(&self.name, addr)).unwrap()
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        // Deleting the namespace deletes the veth end inside it, and with it the pair.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Counts accepted connections; serves each with `f`.
#[derive(Clone, Default)]
pub struct Accepts(pub Arc<AtomicUsize>);

impl Accepts {
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A raw TCP echo server.
pub fn echo_server(l: tokio::net::TcpListener) -> Accepts {
    let accepts = Accepts::default();
    let a = accepts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            a.0.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    accepts
}

/// A server that accepts, says nothing, and reports when the peer closed (EOF or error).
pub fn silent_server(
    l: tokio::net::TcpListener,
) -> (Accepts, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let accepts = Accepts::default();
    let a = accepts.clone();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            a.0.fetch_add(1, Ordering::SeqCst);
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
                let _ = tx.send(());
            });
        }
    });
    (accepts, rx)
}

/// A server that sends one byte every `every` forever.
pub fn trickle_server(l: tokio::net::TcpListener, every: Duration) -> Accepts {
    let accepts = Accepts::default();
    let a = accepts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            a.0.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                while s.write_all(b".").await.is_ok() {
                    tokio::time::sleep(every).await;
                }
            });
        }
    });
    accepts
}

/// An HTTP/1.1 server answering every request with `hello from <path>`, recording request
/// heads (to show what reached it).
pub fn http_server(l: tokio::net::TcpListener) -> (Accepts, Arc<Mutex<Vec<String>>>) {
    let accepts = Accepts::default();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let (a, h) = (accepts.clone(), heads.clone());
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            a.0.fetch_add(1, Ordering::SeqCst);
            let h = h.clone();
            tokio::spawn(async move { serve_http(s, h).await });
        }
    });
    (accepts, heads)
}

pub async fn serve_http<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: S,
    heads: Arc<Mutex<Vec<String>>>,
) {
    let mut r = BufReader::new(s);
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
        heads.lock().unwrap().push(head);
        let body = format!("hello from {path}\n");
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: text/plain\r\n\r\n{body}",
            body.len()
        );
        if r.get_mut().write_all(resp.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// A DNS server on 127.0.0.1 (UDP) that answers A and AAAA questions from a table and counts
/// every question by name.
pub struct TestDns {
    pub addr: SocketAddr,
    pub answers: Arc<Mutex<HashMap<String, Vec<IpAddr>>>>,
    pub queries: Arc<Mutex<Vec<String>>>,
}

impl TestDns {
    pub async fn start() -> TestDns {
        use hickory_proto::op::{Message, MessageType, ResponseCode};
        use hickory_proto::rr::{RData, Record, RecordType, rdata};
        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        let answers: Arc<Mutex<HashMap<String, Vec<IpAddr>>>> = Arc::default();
        let queries: Arc<Mutex<Vec<String>>> = Arc::default();
        let (a, q) = (answers.clone(), queries.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, from)) = sock.recv_from(&mut buf).await else {
                    return;
                };
                let Ok(msg) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let mut resp = Message::new();
                resp.set_id(msg.id())
                    .set_message_type(MessageType::Response)
                    .set_op_code(msg.op_code())
                    .set_recursion_desired(msg.recursion_desired())
                    .set_recursion_available(true);
                let mut known = false;
                for query in msg.queries() {
                    resp.add_query(query.clone());
                    let name = query
                        .name()
                        .to_ascii()
                        .trim_end_matches('.')
                        .to_ascii_lowercase();
                    q.lock()
                        .unwrap()
                        .push(format!("{name} {}", query.query_type()));
                    let table = a.lock().unwrap();
                    if let Some(ips) = table.get(&name) {
                        known = true;
                        for ip in ips {
                            let rd = match (ip, query.query_type()) {
                                (IpAddr::V4(v4), RecordType::A) => RData::A(rdata::A(*v4)),
                                (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(rdata::AAAA(*v6)),
                                _ => continue,
                            };
                            resp.add_answer(Record::from_rdata(query.name().clone(), 5, rd));
                        }
                    }
                }
                if !known {
                    resp.set_response_code(ResponseCode::NXDomain);
                }
                if let Ok(bytes) = resp.to_vec() {
                    let _ = sock.send_to(&bytes, from).await;
                }
            }
        });
        TestDns {
            addr,
            answers,
            queries,
        }
    }

    pub fn set(&self, name: &str, ips: &[IpAddr]) {
        self.answers
            .lock()
            .unwrap()
            .insert(name.to_owned(), ips.to_vec());
    }

    /// Questions asked about `name` (any type).
    pub fn asked(&self, name: &str) -> Vec<String> {
        self.queries
            .lock()
            .unwrap()
            .iter()
            .filter(|q| q.split(' ').next() == Some(name))
            .cloned()
            .collect()
    }
}

/// The gateway's host side for tests: a policy that can change, and the log.
#[derive(Default)]
pub struct TestControl {
    pub policy: Mutex<Policy>,
    pub log: Mutex<Vec<LogEntry>>,
}

impl Control for TestControl {
    fn policy(&self, _conversation: &str) -> Result<Policy, String> {
        Ok(self.policy.lock().unwrap().clone())
    }
    fn record(&self, entry: LogEntry) {
        self.log.lock().unwrap().push(entry);
    }
}

impl TestControl {
    pub fn set(&self, p: Policy) {
        *self.policy.lock().unwrap() = p;
    }
    pub fn entries(&self) -> Vec<LogEntry> {
        self.log.lock().unwrap().clone()
    }
    /// Waits until an entry for `target` with an `end` is logged.
    pub async fn ended(&self, target: &str) -> LogEntry {
        for _ in 0..500 {
            if let Some(e) = self
                .entries()
                .into_iter()
                .find(|e| e.target == target && (e.end.is_some() || !e.allowed))
            {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no log entry ended for {target}: {:?}", self.entries());
    }
}

/// Sends `CONNECT authority` (with optional extra header lines) and returns the status code
/// and the stream (positioned after the response head).
pub async fn connect(
    proxy: SocketAddr,
    authority: &str,
    extra: &str,
) -> (u16, BufReader<TcpStream>) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(
        format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{extra}\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut r = BufReader::new(s);
    let status = read_head(&mut r).await;
    (status, r)
}

/// Reads a response head; returns the status code.
pub async fn read_head<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> u16 {
    let mut line = String::new();
    r.read_line(&mut line).await.unwrap();
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not a status line: {line:?}"));
    loop {
        let mut l = String::new();
        if r.read_line(&mut l).await.unwrap() == 0 || l == "\r\n" {
            break;
        }
    }
    status
}
