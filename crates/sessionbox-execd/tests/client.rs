//! Protocol-level tests of `ExecdClient` against a tiny in-test HTTP server that writes raw
//! responses, so that upstream quirks (a stream held open after its last event, bare-JSON
//! framing, redirects, odd error bodies) can be reproduced exactly.

#![cfg(feature = "client")]
// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use sessionbox_execd::multipart::encode_upload_with_boundary;
use sessionbox_execd::{
    Endpoint, EventType, ExecdClient, ExecdError, Permission, RenameFileItem,
    ReplaceFileContentItem, RunCommandRequest, StreamError, UploadFile,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};

// ---------- the test server ----------

#[derive(Debug, Clone)]
struct Req {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn path(&self) -> &str {
        self.target.split('?').next().unwrap()
    }
    fn query(&self) -> &str {
        self.target.split_once('?').map(|(_, q)| q).unwrap_or("")
    }
}

enum Step {
    Write(Vec<u8>),
    Sleep(Duration),
}

type Handler = Arc<dyn Fn(&Req) -> Vec<Step> + Send + Sync>;

struct Server {
    endpoint: Endpoint,
    requests: Arc<Mutex<Vec<Req>>>,
    _dir: Option<tempfile::TempDir>,
}

impl Server {
    async fn tcp(handler: impl Fn(&Req) -> Vec<Step> + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let log = requests.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve(s, handler.clone(), log.clone()));
            }
        });
        Server {
            endpoint: Endpoint::Http(format!("http://{addr}")),
            requests,
            _dir: None,
        }
    }

    async fn unix(handler: impl Fn(&Req) -> Vec<Step> + Send + Sync + 'static) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let path: PathBuf = dir.path().join("execd.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let log = requests.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve(s, handler.clone(), log.clone()));
            }
        });
        Server {
            endpoint: Endpoint::Unix(path),
            requests,
            _dir: Some(dir),
        }
    }

    fn client(&self) -> ExecdClient {
        ExecdClient::builder(self.endpoint.clone()).build().unwrap()
    }

    fn requests(&self) -> Vec<Req> {
        self.requests.lock().unwrap().clone()
    }

    fn last(&self) -> Req {
        self.requests().pop().expect("a request was made")
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    handler: Handler,
    log: Arc<Mutex<Vec<Req>>>,
) {
    let Some(req) = read_request(&mut s).await else {
        return;
    };
    log.lock().unwrap().push(req.clone());
    for step in handler(&req) {
        match step {
            Step::Write(b) => {
                if s.write_all(&b).await.is_err() || s.flush().await.is_err() {
                    return;
                }
            }
            Step::Sleep(d) => tokio::time::sleep(d).await,
        }
    }
}

async fn read_request<S: AsyncRead + Unpin>(s: &mut S) -> Option<Req> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).ok()?;
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let target = first.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&tmp[..n]);
    }
    Some(Req {
        method,
        target,
        headers,
        body,
    })
}

fn response(status: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status}\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

fn json(status: &str, body: &str) -> Vec<Step> {
    vec![Step::Write(response(
        status,
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    ))]
}

fn empty_ok() -> Vec<Step> {
    vec![Step::Write(response("200 OK", &[], b""))]
}

/// Response head of a command stream, as upstream sends it (chunked, held open).
fn sse_head() -> Step {
    Step::Write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
          Connection: keep-alive\r\nX-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec(),
    )
}

fn chunk(data: &str) -> Step {
    Step::Write(format!("{:x}\r\n{data}\r\n", data.len()).into_bytes())
}

const INIT: &str = r#"{"type":"init","text":"cmd-42","timestamp":1}"#;
const OUT: &str = r#"{"type":"stdout","text":"hello\n","timestamp":2}"#;
const ERR: &str = r#"{"type":"stderr","text":"warn\n","timestamp":3}"#;
const DONE: &str = r#"{"type":"execution_complete","execution_time":7,"timestamp":4}"#;

// ---------- command streams ----------

/// Upstream writes bare JSON + blank line, then sleeps ~1 s with the response open. Here the
/// server holds it open for 3 s; the client must return at `execution_complete`.
async fn returns_at_terminal_event(server: Server) {
    let client = server.client();
    let start = Instant::now();
    let outcome = client
        .run_command(&RunCommandRequest::shell("echo hello").timeout(Duration::from_secs(5)))
        .await
        .unwrap();
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_millis(500), "took {elapsed:?}");
    assert_eq!(outcome.id.as_deref(), Some("cmd-42"));
    assert_eq!(outcome.stdout_text(), "hello\n");
    assert_eq!(outcome.stderr_text(), "warn\n");
    assert_eq!(outcome.exit_code, Some(0));
    assert_eq!(outcome.execution_time, Some(Duration::from_millis(7)));
    assert!(!outcome.timed_out);

    let req = server.last();
    assert_eq!((req.method.as_str(), req.path()), ("POST", "/command"));
    assert_eq!(req.header("content-type"), Some("application/json"));
    assert_eq!(req.header("accept"), Some("text/event-stream"));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&req.body).unwrap(),
        serde_json::json!({"command": "echo hello", "timeout": 5000})
    );
}

fn held_open_stream(_: &Req) -> Vec<Step> {
    // Events split at awkward places across chunks, then a long silence.
    let all = format!("{INIT}\n\n{OUT}\n\n{ERR}\n\n{DONE}\n\n");
    let (a, rest) = all.split_at(7);
    let (b, c) = rest.split_at(rest.len() - 20);
    vec![
        sse_head(),
        chunk(a),
        chunk(b),
        chunk(c),
        Step::Sleep(Duration::from_secs(3)),
        Step::Write(b"0\r\n\r\n".to_vec()),
    ]
}

/// sessionbox's agent ends a command's body right after its terminal event: the client reads
/// that end and keeps the connection for the next call (one connection for three commands),
/// where a stream held open after its last event costs its connection (above).
#[tokio::test]
async fn a_stream_that_ends_at_its_terminal_event_keeps_its_connection() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("execd.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                while read_request(&mut s).await.is_some() {
                    let events = format!("{INIT}\n\n{OUT}\n\n{DONE}\n\n");
                    let mut bytes = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
                        Transfer-Encoding: chunked\r\n\r\n"
                        .to_vec();
                    bytes.extend(format!("{:x}\r\n{events}\r\n0\r\n\r\n", events.len()).bytes());
                    if s.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let client = ExecdClient::builder(Endpoint::Unix(path)).build().unwrap();
    for _ in 0..3 {
        let outcome = client
            .run_command(&RunCommandRequest::shell("echo hello"))
            .await
            .unwrap();
        assert_eq!(outcome.stdout_text(), "hello\n");
        assert_eq!(outcome.exit_code, Some(0));
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn run_command_returns_at_terminal_event_over_tcp() {
    returns_at_terminal_event(Server::tcp(held_open_stream).await).await;
}

#[tokio::test]
async fn run_command_returns_at_terminal_event_over_unix_socket() {
    returns_at_terminal_event(Server::unix(held_open_stream).await).await;
}

#[tokio::test]
async fn error_event_carries_the_exit_code_and_garbage_after_it_is_ignored() {
    let server = Server::tcp(|_| {
        vec![
            sse_head(),
            chunk(&format!("data: {INIT}\n\n: comment\n\n")),
            chunk(r#"data: {"type":"error","timestamp":5,"error":{"ename":"CommandExecError","evalue":"3","traceback":["exit status 3"]}}"#),
            chunk("\n\n{{{{ not json \u{1} at all\n\n"),
            Step::Sleep(Duration::from_secs(3)),
        ]
    })
    .await;
    let start = Instant::now();
    let outcome = server
        .client()
        .run_command(&RunCommandRequest::shell("exit 3"))
        .await
        .unwrap();
    assert!(start.elapsed() < Duration::from_millis(500));
    assert_eq!(outcome.exit_code, Some(3));
    assert!(!outcome.success());
    let err = outcome.error.unwrap();
    assert_eq!(err.ename, "CommandExecError");
    assert_eq!(err.traceback, vec!["exit status 3".to_string()]);
}

#[tokio::test]
async fn stream_without_terminal_event_is_a_clear_error() {
    let server = Server::tcp(|_| {
        vec![
            sse_head(),
            chunk(&format!("{INIT}\n\n{OUT}\n\n")),
            Step::Write(b"0\r\n\r\n".to_vec()),
        ]
    })
    .await;
    let err = server
        .client()
        .run_command(&RunCommandRequest::shell("x"))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ExecdError::Stream(StreamError::MissingTerminal { events: 2 })
    );
    assert!(
        err.to_string().contains("without a terminal event"),
        "{err}"
    );
}

#[tokio::test]
async fn streaming_variant_yields_events_as_they_come() {
    let server = Server::unix(|_| {
        vec![
            sse_head(),
            chunk(&format!("{INIT}\n\n")),
            Step::Sleep(Duration::from_millis(1500)),
            chunk(&format!("{DONE}\n\n")),
            Step::Sleep(Duration::from_secs(3)),
        ]
    })
    .await;
    let client = server.client();
    let start = Instant::now();
    let mut events = client
        .run_command_stream(&RunCommandRequest::shell("sleep 1.5"))
        .await
        .unwrap();
    let first = events.next().await.unwrap().unwrap();
    assert_eq!(first.kind, EventType::Init);
    assert!(
        start.elapsed() < Duration::from_millis(1000),
        "init came late"
    );
    let last = events.next().await.unwrap().unwrap();
    assert_eq!(last.kind, EventType::ExecutionComplete);
    assert!(events.next().await.is_none());
    assert!(start.elapsed() < Duration::from_millis(2500));

    // The callback variant sees the same events.
    let mut seen = Vec::new();
    let outcome = client
        .run_command_with(&RunCommandRequest::shell("x"), |e| {
            seen.push(e.kind.clone())
        })
        .await
        .unwrap();
    assert_eq!(seen, [EventType::Init, EventType::ExecutionComplete]);
    assert_eq!(outcome.exit_code, Some(0));
}

#[tokio::test]
async fn invalid_command_requests_are_refused_before_sending() {
    let server = Server::tcp(|_| empty_ok()).await;
    let err = server
        .client()
        .run_command(&RunCommandRequest::shell("  "))
        .await
        .unwrap_err();
    assert!(matches!(err, ExecdError::InvalidRequest(_)), "{err}");
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn command_stream_error_status_is_reported() {
    let server = Server::tcp(|_| {
        json(
            "400 Bad Request",
            r#"{"code":"INVALID_REQUEST_BODY","message":"invalid request, validation error"}"#,
        )
    })
    .await;
    let err = server
        .client()
        .run_command(&RunCommandRequest::shell("x"))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(400));
    let core: sessionbox_core::Error = err.into();
    assert_eq!(core.code(), "invalid_request");
}

// ---------- redirects, tokens, timeouts ----------

#[tokio::test]
async fn redirects_are_not_followed() {
    let server = Server::tcp(|req| {
        if req.path() != "/elsewhere" {
            vec![Step::Write(response(
                "302 Found",
                &[("Location", "/elsewhere")],
                b"",
            ))]
        } else {
            empty_ok()
        }
    })
    .await;
    let client = ExecdClient::builder(server.endpoint.clone())
        .token("tok-123")
        .build()
        .unwrap();
    let err = client.ping().await.unwrap_err();
    match &err {
        ExecdError::Redirect {
            status, location, ..
        } => {
            assert_eq!(*status, 302);
            assert_eq!(location, "/elsewhere");
        }
        other => panic!("expected a redirect error, got {other:?}"),
    }
    assert!(err.to_string().contains("never followed"), "{err}");
    let paths: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.path().to_owned())
        .collect();
    assert_eq!(paths, ["/ping"], "the redirect must not be followed");

    // A redirect answering a command, too.
    let err = client
        .run_command(&RunCommandRequest::shell("x"))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(302));
    assert!(server.requests().iter().all(|r| r.path() != "/elsewhere"));
}

#[tokio::test]
async fn access_token_is_sent_and_never_shown() {
    let server = Server::tcp(|req| {
        if req.header("x-execd-access-token") == Some("s3cr3t-token") && req.path() == "/ping" {
            empty_ok()
        } else {
            // Upstream's middleware answers 401 with {"error": ...}; this one echoes the token.
            json(
                "401 Unauthorized",
                r#"{"error":"Unauthorized: bad header X-EXECD-ACCESS-TOKEN s3cr3t-token"}"#,
            )
        }
    })
    .await;
    let client = ExecdClient::builder(server.endpoint.clone())
        .token("s3cr3t-token")
        .build()
        .unwrap();
    client.ping().await.unwrap();
    assert_eq!(
        server.last().header("X-EXECD-ACCESS-TOKEN"),
        Some("s3cr3t-token")
    );
    let err = client.metrics().await.unwrap_err();
    let shown = format!(
        "{err} {err:?} {}",
        sessionbox_core::Error::from(err.clone())
    );
    assert!(!shown.contains("s3cr3t-token"), "{shown}");
    assert!(shown.contains("401"), "{shown}");
    assert!(shown.contains("Unauthorized"), "{shown}");
    assert!(!format!("{client:?}").contains("s3cr3t-token"));

    // Without a token, no header at all.
    server.client().ping().await.unwrap_err();
    assert_eq!(server.last().header("x-execd-access-token"), None);
}

#[tokio::test]
async fn request_deadline_and_missing_socket() {
    let server = Server::tcp(|_| vec![Step::Sleep(Duration::from_secs(5))]).await;
    let client = ExecdClient::builder(server.endpoint.clone())
        .request_timeout(Some(Duration::from_millis(200)))
        .build()
        .unwrap();
    let start = Instant::now();
    let err = client.ping().await.unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(matches!(err, ExecdError::Timeout { .. }), "{err:?}");
    assert_eq!(
        sessionbox_core::Error::from(err),
        sessionbox_core::Error::TimedOut(Duration::from_millis(200))
    );
    // The head of a command stream is under the same deadline.
    let err = client
        .run_command(&RunCommandRequest::shell("x"))
        .await
        .unwrap_err();
    assert!(matches!(err, ExecdError::Timeout { .. }), "{err:?}");

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nobody.sock");
    let err = ExecdClient::builder(Endpoint::Unix(missing.clone()))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
        .ping()
        .await
        .unwrap_err();
    match &err {
        ExecdError::Connect { endpoint, .. } => {
            assert_eq!(endpoint, &format!("unix:{}", missing.display()))
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
}

// ---------- files ----------

#[tokio::test]
async fn upload_sends_the_sdk_multipart_shape() {
    let server = Server::unix(|_| empty_ok()).await;
    let files = [
        UploadFile::new("/workspace/a.txt", &b"alpha\n"[..]),
        UploadFile::new("/workspace/sub/b.bin", vec![0u8, 1, 2, 255]).mode(644),
    ];
    server.client().upload(&files).await.unwrap();
    let req = server.last();
    assert_eq!((req.method.as_str(), req.path()), ("POST", "/files/upload"));
    let ct = req.header("content-type").unwrap();
    let boundary = ct
        .strip_prefix("multipart/form-data; boundary=")
        .expect("multipart content type");
    assert_eq!(
        req.header("content-length")
            .map(|l| l.parse::<usize>().unwrap()),
        Some(req.body.len())
    );
    assert_eq!(req.body, encode_upload_with_boundary(&files, boundary));
    let text = String::from_utf8_lossy(&req.body);
    // Metadata first, as a file part, then the data, per file.
    let parts: Vec<&str> = text.split(&format!("--{boundary}")).collect();
    assert_eq!(parts.len(), 6, "{text}");
    assert!(parts[1].contains(
        "Content-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n{\"path\": \"/workspace/a.txt\", \"owner\": null, \"group\": null, \"mode\": 755}\r\n"
    ));
    assert!(parts[2].contains("name=\"file\"; filename=\"a.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nalpha\n\r\n"));
    assert!(parts[3].contains("\"mode\": 644}"));
    assert!(parts[4].contains("filename=\"b.bin\""));
    assert_eq!(parts[5], "--\r\n");

    // Nothing to upload, nothing sent.
    let before = server.requests().len();
    server.client().upload(&[]).await.unwrap();
    assert_eq!(server.requests().len(), before);
}

#[tokio::test]
async fn file_endpoints_speak_the_wire_format() {
    let info = r#"{"/w/a b":{"path":"/w/a b","type":"file","size":3,"modified_at":"2025-11-16T14:30:45Z","created_at":"2025-11-16T14:30:45Z","owner":"u","group":"g","mode":644}}"#;
    let server = Server::tcp(move |req| match (req.method.as_str(), req.path()) {
        ("GET", "/files/info") => json("200 OK", info),
        ("GET", "/files/search") => json("200 OK", "null"),
        ("GET", "/directories/list") => json("200 OK", &format!("[{}]", &info[10..info.len() - 1])),
        ("POST", "/files/replace") => json("200 OK", r#"{"/w/a":{"replacedCount":2}}"#),
        ("GET", "/metrics") => json(
            "200 OK",
            r#"{"cpu_count":2.0,"cpu_used_pct":1.5,"mem_total_mib":100.0,"mem_used_mib":50.0,"timestamp":9}"#,
        ),
        ("GET", "/files/download") => match req.header("range") {
            Some("bytes=2-4") => vec![Step::Write(response(
                "206 Partial Content",
                &[("Content-Range", "bytes 2-4/10")],
                b"234",
            ))],
            // A server that ignores Range.
            _ => vec![Step::Write(response("200 OK", &[], b"0123456789"))],
        },
        ("GET", "/files/missing") => json("404 Not Found", ""),
        _ => empty_ok(),
    })
    .await;
    let c = server.client();

    let map = c.files_info(["/w/a b", "/x"]).await.unwrap();
    assert_eq!(map["/w/a b"].size, 3);
    assert_eq!(server.last().query(), "path=%2Fw%2Fa+b&path=%2Fx");

    assert!(c.search_files("/w", None).await.unwrap().is_empty());
    assert_eq!(server.last().query(), "path=%2Fw&pattern=**");

    let entries = c.list_directory("/w", None).await.unwrap();
    assert_eq!(entries[0].mode, 644);
    assert_eq!(server.last().query(), "path=%2Fw");
    c.list_directory("/w", Some(2)).await.unwrap();
    assert_eq!(server.last().query(), "path=%2Fw&depth=2");

    let mut items = BTreeMap::new();
    items.insert(
        "/w/a".to_string(),
        ReplaceFileContentItem {
            old: "x".into(),
            new: "y".into(),
        },
    );
    let counts = c.replace_content(&items).await.unwrap();
    assert_eq!(counts["/w/a"].replaced_count, 2);
    let req = server.last();
    assert_eq!(req.query(), "verbose=true");
    assert_eq!(req.body, br#"{"/w/a":{"old":"x","new":"y"}}"#);

    c.move_files(&[RenameFileItem {
        src: "/a".into(),
        dest: "/b".into(),
    }])
    .await
    .unwrap();
    assert_eq!(server.last().body, br#"[{"src":"/a","dest":"/b"}]"#);

    let mut dirs = BTreeMap::new();
    dirs.insert("/w/d".to_string(), Permission::mode(700));
    c.make_dirs(&dirs).await.unwrap();
    let req = server.last();
    assert_eq!((req.method.as_str(), req.path()), ("POST", "/directories"));
    assert_eq!(req.body, br#"{"/w/d":{"mode":700}}"#);

    c.remove_dirs(["/w/d"]).await.unwrap();
    let req = server.last();
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("DELETE", "/directories?path=%2Fw%2Fd")
    );

    c.remove_files(["/w/a", "/w/b"]).await.unwrap();
    let req = server.last();
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("DELETE", "/files?path=%2Fw%2Fa&path=%2Fw%2Fb")
    );

    c.chmod_files(&dirs).await.unwrap();
    assert_eq!(server.last().path(), "/files/permissions");

    assert_eq!(
        &c.download_range("/f", 2, Some(4)).await.unwrap()[..],
        b"234"
    );
    assert_eq!(server.last().header("range"), Some("bytes=2-4"));
    assert_eq!(&c.download_range("/f", 7, None).await.unwrap()[..], b"789");
    assert_eq!(
        &c.download_range("/f", 3, Some(5)).await.unwrap()[..],
        b"345"
    );
    assert_eq!(&c.download("/f").await.unwrap()[..], b"0123456789");
    assert_eq!(server.last().header("range"), None);
    c.download_lines("/f", 10, Some(5)).await.unwrap();
    assert_eq!(server.last().query(), "path=%2Ff&offset=10&limit=5");

    let m = c.metrics().await.unwrap();
    assert_eq!(m.timestamp, 9);

    assert!(matches!(
        c.files_info(Vec::<String>::new()).await,
        Err(ExecdError::InvalidRequest(_))
    ));
}

#[tokio::test]
async fn command_status_logs_and_interrupt() {
    let server = Server::tcp(|req| match (req.method.as_str(), req.path()) {
        ("GET", "/command/status/cmd%2F1") => json(
            "200 OK",
            r#"{"id":"cmd/1","content":"sleep 1","running":false,"exit_code":0,"started_at":"2025-12-22T09:08:05Z","finished_at":"2025-12-22T09:08:06Z"}"#,
        ),
        ("GET", "/command/cmd-1/logs") => vec![Step::Write(response(
            "200 OK",
            &[
                ("Content-Type", "text/plain; charset=utf-8"),
                ("EXECD-COMMANDS-TAIL-CURSOR", "12"),
            ],
            b"line1\nline2\n",
        ))],
        ("GET", "/command/status/nope") => json(
            "404 Not Found",
            r#"{"code":"INVALID_REQUEST_BODY","message":"command nope not found"}"#,
        ),
        ("DELETE", "/command") => empty_ok(),
        _ => json("500 Internal Server Error", "boom"),
    })
    .await;
    let c = server.client();
    let s = c.command_status("cmd/1").await.unwrap();
    assert_eq!(
        (s.id.as_str(), s.running, s.exit_code),
        ("cmd/1", false, Some(0))
    );

    let logs = c.command_logs("cmd-1", Some(3)).await.unwrap();
    assert_eq!(logs.content, "line1\nline2\n");
    assert_eq!(logs.cursor, Some(12));
    assert_eq!(server.last().query(), "cursor=3");
    c.command_logs("cmd-1", None).await.unwrap();
    assert_eq!(server.last().query(), "");

    c.interrupt_command("cmd-1").await.unwrap();
    assert_eq!(server.last().target, "/command?id=cmd-1");

    let err = c.command_status("nope").await.unwrap_err();
    assert_eq!(
        sessionbox_core::Error::from(err),
        sessionbox_core::Error::NotFound("command nope not found".into())
    );
    let err = c.metrics().await.unwrap_err();
    assert!(err.to_string().contains("HTTP 500: boom"), "{err}");
}

// ---------- answers past the client's bound ----------

/// An agent runs beside the commands it serves: one that answers without end (replaced by a
/// command, or broken) must not grow the caller's memory. A declared length past the bound
/// fails before the body is read; an undeclared one (chunked) fails once it passes it; an answer
/// at the bound is whole.
#[tokio::test]
async fn an_answer_longer_than_the_bound_fails_instead_of_filling_memory() {
    const BOUND: u64 = 1 << 20;
    let server = Server::tcp(|req| match req.path() {
        // Exactly the bound.
        "/files/download" if req.query().contains("fits") => vec![Step::Write(response(
            "200 OK",
            &[],
            &vec![b'y'; BOUND as usize],
        ))],
        // 4 MiB declared.
        "/files/download" => vec![Step::Write(response(
            "200 OK",
            &[("Content-Type", "application/octet-stream")],
            &vec![b'x'; 4 << 20],
        ))],
        // Chunked, 64 KiB at a time, without end (the client hangs up first).
        "/sessionbox/v1/memory" => {
            let mut steps = vec![Step::Write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                    .to_vec(),
            )];
            let piece = " ".repeat(64 << 10);
            steps.extend((0..1024).map(|_| chunk(&piece)));
            steps
        }
        _ => json("404 Not Found", r#"{"code":"NOT_FOUND","message":"no"}"#),
    })
    .await;
    let client = ExecdClient::builder(server.endpoint.clone())
        .max_answer_bytes(BOUND)
        .build()
        .unwrap();
    let e = client.download("/workspace/big").await.unwrap_err();
    assert!(
        matches!(&e, ExecdError::Protocol { reason, .. } if reason.contains("4194304 bytes")),
        "{e}"
    );
    let e = client.memory_usage().await.unwrap_err();
    assert!(
        matches!(&e, ExecdError::Protocol { reason, .. } if reason.contains("bound of 1048576 bytes")),
        "{e}"
    );
    let whole = client
        .download_lines("/workspace/fits", 1, None)
        .await
        .unwrap();
    assert_eq!(whole.len() as u64, BOUND);
}
