//! A statement that committed but whose answer was lost: the server ends between its commit
//! and its reply (`pg_ctl restart -m immediate`, a crash, a cut network), so the client sees a
//! closed connection for a change that was made. Injected exactly with a TCP relay in front of
//! the real server that forwards the statement, holds back everything the server answers to it
//! and then closes the client's connection.
//!
//! What must hold: a call that is told "unavailable" made nothing, and a call whose change was
//! made says so. Found under `pg_ctl restart -m immediate` in `serve`: a first open was refused
//! while its record was made (a record pointing at no workspace), and `keys create` ran its
//! `INSERT` again on a new connection and failed with a duplicate key after making the key.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sessionbox_core::TenantId;
use sessionbox_store::{KeyCheck, Store};

use super::{conv, pg};

/// The relay: every connection goes to the server; the first time a client runs a statement
/// containing the armed text, the server's answer is lost.
struct LosingRelay {
    addr: SocketAddr,
    /// The text a statement must contain to lose its answer (`None`: relay everything).
    armed: Arc<Mutex<Option<String>>>,
    /// Set once an answer was lost.
    fired: Arc<AtomicBool>,
}

impl LosingRelay {
    fn start(upstream: SocketAddr) -> LosingRelay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let armed: Arc<Mutex<Option<String>>> = Arc::default();
        let fired = Arc::new(AtomicBool::new(false));
        let (a, f) = (armed.clone(), fired.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let (a, f) = (a.clone(), f.clone());
                std::thread::spawn(move || relay(client, server, a, f));
            }
        });
        LosingRelay { addr, armed, fired }
    }

    /// Loses the answer to the next statement that contains `text`.
    fn arm(&self, text: &str) {
        self.fired.store(false, Ordering::SeqCst);
        *self.armed.lock().unwrap() = Some(text.to_owned());
    }
}

/// One message of the protocol after the startup: its type byte and its whole bytes.
fn message(from: &mut impl Read) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    from.read_exact(&mut head).ok()?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut all = head.to_vec();
    all.resize(1 + len, 0);
    from.read_exact(&mut all[5..]).ok()?;
    Some((head[0], all))
}

fn relay(
    mut client: TcpStream,
    mut server: TcpStream,
    armed: Arc<Mutex<Option<String>>>,
    fired: Arc<AtomicBool>,
) {
    // The startup message has no type byte: a length, then the rest.
    let mut len = [0u8; 4];
    if client.read_exact(&mut len).is_err() {
        return;
    }
    let mut startup = len.to_vec();
    startup.resize(u32::from_be_bytes(len) as usize, 0);
    client.read_exact(&mut startup[4..]).unwrap();
    assert_ne!(
        &startup[4..8],
        &80_877_103u32.to_be_bytes(),
        "the relay speaks plain connections only (no SSLRequest)"
    );
    server.write_all(&startup).unwrap();
    // Set on this connection while the server's answer to the armed statement is held back.
    let losing = Arc::new(AtomicBool::new(false));
    let (mut c_in, mut s_out, l) = (
        client.try_clone().unwrap(),
        server.try_clone().unwrap(),
        losing.clone(),
    );
    let up = std::thread::spawn(move || {
        let mut parsed_armed = false;
        while let Some((kind, bytes)) = message(&mut c_in) {
            let needle = armed.lock().unwrap().clone();
            let has = |n: &str| bytes.windows(n.len()).any(|w| w == n.as_bytes());
            if let Some(n) = needle.as_deref() {
                match kind {
                    // A simple query (`COMMIT` is sent so).
                    b'Q' if has(n) => l.store(true, Ordering::SeqCst),
                    // An extended query: Parse holds the text, Execute runs it.
                    b'P' => parsed_armed = has(n),
                    b'E' if parsed_armed => l.store(true, Ordering::SeqCst),
                    _ => {}
                }
                if l.load(Ordering::SeqCst) {
                    *armed.lock().unwrap() = None;
                }
            }
            if s_out.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = s_out.shutdown(Shutdown::Write);
    });
    while let Some((kind, bytes)) = message(&mut server) {
        if losing.load(Ordering::SeqCst) {
            // Held back; at the server's ReadyForQuery the statement is done (committed, in
            // autocommit or by COMMIT), and the client loses its connection instead.
            if kind == b'Z' {
                fired.store(true, Ordering::SeqCst);
                break;
            }
            continue;
        }
        if client.write_all(&bytes).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
    let _ = up.join();
}

/// A store on the test database `url` through a new relay.
fn through_relay(url: &str) -> (LosingRelay, Store) {
    let config: postgres::Config = url.parse().unwrap();
    let host = match &config.get_hosts()[0] {
        postgres::config::Host::Tcp(h) => h.clone(),
        postgres::config::Host::Unix(_) => panic!("the test server is reached over TCP"),
    };
    let port = config.get_ports()[0];
    let upstream: SocketAddr = format!("{host}:{port}").parse().unwrap();
    let relay = LosingRelay::start(upstream);
    let relayed = url.replacen(&format!("{host}:{port}"), &relay.addr.to_string(), 1);
    assert_ne!(relayed, url, "the URL names {host}:{port}");
    let store = Store::connect(&relayed).unwrap();
    (relay, store)
}

#[test]
fn a_first_open_whose_commit_answer_is_lost_is_reported_made_not_refused() {
    let Some(db) = pg::database() else { return };
    let (relay, store) = through_relay(&db.url);
    let c = conv("lost-commit");
    relay.arm("COMMIT");
    let (record, made) = store
        .get_or_create(&c, "host", chrono::Utc::now())
        .expect("the record was made, so making it must not fail");
    assert!(
        relay.fired.load(Ordering::SeqCst),
        "the relay lost no answer"
    );
    assert!(made, "the record this call made is reported as found");
    // The same record, once: a second open finds it and makes nothing.
    let (again, made_again) = store.get_or_create(&c, "host", chrono::Utc::now()).unwrap();
    assert_eq!((again.generation, made_again), (record.generation, false));
    assert_eq!(store.list(None).unwrap().len(), 1);
}

#[test]
fn a_first_open_whose_insert_never_reached_the_server_makes_nothing() {
    let Some(db) = pg::database() else { return };
    let (relay, store) = through_relay(&db.url);
    // The advisory lock before the INSERT loses its answer: the transaction never commits.
    relay.arm("pg_advisory_xact_lock");
    let c = conv("lost-lock");
    let err = store
        .get_or_create(&c, "host", chrono::Utc::now())
        .expect_err("nothing was committed, so the call fails");
    assert!(relay.fired.load(Ordering::SeqCst));
    assert_eq!(err.code(), "unavailable", "{err}");
    assert!(store.get(&c.key).unwrap().is_none(), "a record was made");
}

#[test]
fn an_api_key_whose_insert_answer_is_lost_is_made_once_and_works() {
    let Some(db) = pg::database() else { return };
    let (relay, store) = through_relay(&db.url);
    let tenant = TenantId::new("acme").unwrap();
    // A connection in the pool first: the INSERT runs on it, and again on a new one.
    assert!(!store.has_api_keys().unwrap());
    relay.arm("INSERT INTO api_keys");
    let key = store
        .create_api_key(&tenant, Some("lost"), chrono::Utc::now())
        .expect("the key was made, so making it must not fail");
    assert!(relay.fired.load(Ordering::SeqCst));
    assert_eq!(store.list_api_keys().unwrap().len(), 1);
    assert!(matches!(
        store.verify_api_key(&key.key, chrono::Utc::now()).unwrap(),
        KeyCheck::Valid(_)
    ));
}
