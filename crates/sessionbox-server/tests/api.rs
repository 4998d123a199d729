//! The REST API end to end: a real server on 127.0.0.1:0, a real HTTP client (reqwest), the
//! real `host` runtime and a real SQLite store. (The `isolated` runtime needs the `sessionbox`
//! binary; `crates/sessionbox/tests/serve.rs` drives `sessionbox serve` with it.)

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them).
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use reqwest::{Client, Method, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use sessionbox_core::{Runtime, TenantId};
use sessionbox_local::host::{HostConfig, HostRuntime};
use sessionbox_manager::Manager;
use sessionbox_server::{AppState, ServerConfig};
use sessionbox_store::{AuditFilter, Store};

/// The host runtime's settings, with this test binary as its command supervisor: started with
/// the supervisor's variable and these arguments, it runs only [`supervisor_entry`], which
/// becomes the supervisor (as the `sessionbox` binary does first thing in `main`).
fn host_config(dir: &std::path::Path) -> HostConfig {
    let mut c = HostConfig::new(dir);
    c.supervisor = Some(std::env::current_exe().unwrap());
    c.supervisor_args = ["supervisor_entry", "--exact", "--test-threads=1", "-q"]
        .map(String::from)
        .to_vec();
    c
}

/// Not a test: the entry of the host runtime's command supervisor (see [`host_config`]); run
/// by the test runner, it does nothing.
#[test]
fn supervisor_entry() {
    if sessionbox_local::supervise::is_supervisor_invocation() {
        sessionbox_local::supervise::supervisor_main();
    }
}

struct Server {
    base: String,
    client: Client,
    store: Store,
    dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    state: AppState,
    /// Key of tenant `acme`.
    key: String,
}

impl Server {
    async fn start(mut config: ServerConfig, with_key: bool) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
        let runtime: Arc<dyn Runtime> =
            Arc::new(HostRuntime::new(host_config(dir.path())).unwrap());
        let key = if with_key {
            store
                .create_api_key(&TenantId::new("acme").unwrap(), Some("test"), Utc::now())
                .unwrap()
                .key
        } else {
            String::new()
        };
        if config.open_tenant.is_none() && !with_key {
            config.open_tenant = Some(TenantId::new("local").unwrap());
        }
        let state = AppState::new(Manager::new(store.clone(), runtime), config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let served = state.clone();
        let task = tokio::spawn(sessionbox_server::serve(listener, served, async {
            let _ = rx.await;
        }));
        Server {
            base: format!("http://{addr}"),
            client: Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            store,
            dir,
            stop: Some(tx),
            task: Some(task),
            state,
            key,
        }
    }

    fn req(&self, method: Method, path: &str) -> RequestBuilder {
        let r = self.client.request(method, format!("{}{path}", self.base));
        if self.key.is_empty() {
            r
        } else {
            r.bearer_auth(&self.key)
        }
    }

    fn json(&self, method: Method, path: &str, body: &Value) -> RequestBuilder {
        self.req(method, path)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap())
    }

    /// The host directory of conversation `id` of tenant `acme`.
    fn workspace(&self, id: &str) -> std::path::PathBuf {
        let conv = sessionbox_core::ConversationRef::new(
            TenantId::new("acme").unwrap(),
            sessionbox_core::ConversationId::new(id).unwrap(),
        );
        self.dir.path().join("workspaces").join(conv.key.as_str())
    }

    fn workspaces(&self) -> usize {
        std::fs::read_dir(self.dir.path().join("workspaces"))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .expect("server stops")
                .unwrap()
                .unwrap();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

async fn body(r: Response) -> (StatusCode, Value) {
    let status = r.status();
    let bytes = r.bytes().await.unwrap();
    let v = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
    };
    (status, v)
}

/// Checks an error answer: status, JSON `{"code", "message"}`.
async fn error(r: Response, status: StatusCode, code: &str) {
    let (s, v) = body(r).await;
    assert_eq!(s, status, "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
}

/// Sends `method path` (with the JSON `body` when given) and checks the error answer: the
/// status, the code and a message.
async fn check_status(
    server: &Server,
    method: Method,
    path: &str,
    body: Option<&Value>,
    status: StatusCode,
    code: &str,
) {
    let request = match body {
        Some(body) => server.json(method, path, body),
        None => server.req(method, path),
    };
    error(request.send().await.unwrap(), status, code).await;
}

/// Every test is bounded in time.
async fn bounded(f: impl Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_and_readiness_need_no_key() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        for path in ["/healthz", "/readyz"] {
            let r = s
                .client
                .get(format!("{}{path}", s.base))
                .send()
                .await
                .unwrap();
            let (st, v) = body(r).await;
            assert_eq!(st, StatusCode::OK, "{path}: {v}");
        }
        check_status(
            &s,
            Method::GET,
            "/no/such/route",
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;
        check_status(
            &s,
            Method::PATCH,
            "/v1/conversations/a",
            None,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        )
        .await;
        s.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exec_returns_exit_code_output_text_and_base64() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let r = s
            .json(
                Method::POST,
                "/v1/conversations/c1/exec",
                &json!({"command": "echo out; echo err >&2; exit 7"}),
            )
            .send()
            .await
            .unwrap();
        let (st, v) = body(r).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["exit_code"], 7);
        assert_eq!(v["status"], json!({"code": 7}));
        assert_eq!(v["stdout"], "out\n");
        assert_eq!(v["stderr"], "err\n");
        assert!(v.get("stdout_base64").is_none(), "{v}");
        assert_eq!(v["timed_out"], false);

        // stdin (text and base64), env, cwd, binary output.
        s.json(
            Method::POST,
            "/v1/conversations/c1/mkdir",
            &json!({"path": "sub"}),
        )
        .send()
        .await
        .unwrap();
        let r = s
            .json(
                Method::POST,
                "/v1/conversations/c1/exec",
                &json!({"command": "cat; echo \" $X\"; basename \"$PWD\"; printf '\\377' >&2",
                        "stdin": "in", "env": {"X": "y"}, "cwd": "sub"}),
            )
            .send()
            .await
            .unwrap();
        let (_, v) = body(r).await;
        assert_eq!(v["stdout"], "in y\nsub\n", "{v}");
        assert_eq!(v["stderr_base64"], "/w==", "{v}");
        assert_eq!(v["stderr"], "\u{fffd}", "{v}");
        let r = s
            .json(
                Method::POST,
                "/v1/conversations/c1/exec",
                &json!({"command": "od -An -tx1", "stdin_base64": "AAH/"}),
            )
            .send()
            .await
            .unwrap();
        let (_, v) = body(r).await;
        assert_eq!(v["stdout"].as_str().unwrap().trim(), "00 01 ff", "{v}");

        // Timeout is a result, not an error.
        let r = s
            .json(
                Method::POST,
                "/v1/conversations/c1/exec",
                &json!({"command": "sleep 30", "timeout_ms": 300}),
            )
            .send()
            .await
            .unwrap();
        let (st, v) = body(r).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(v["timed_out"], true);
        assert_eq!(v["exit_code"], 124);

        // Bad requests: 400, nothing run.
        for bad in [
            json!({"command": ""}),
            json!({"command": "true", "timeout_ms": 0}),
            json!({"command": "true", "timeout_ms": 700000}),
            json!({"command": "true", "env": {"1X": "v"}}),
            json!({"command": "true", "stdin": "a", "stdin_base64": "YQ=="}),
            json!({"command": "true", "stdin_base64": "!!"}),
        ] {
            check_status(
                &s,
                Method::POST,
                "/v1/conversations/c1/exec",
                Some(&bad),
                StatusCode::BAD_REQUEST,
                "invalid_request",
            )
            .await;
        }
        check_status(
            &s,
            Method::POST,
            "/v1/conversations/c1/exec",
            Some(&json!({"command": "true", "cwd": "../x"})),
            StatusCode::FORBIDDEN,
            "outside_workspace",
        )
        .await;
        s.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn files_round_trip_with_range_download_edit_ls_glob_grep_stat_and_delete() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let base = "/v1/conversations/f";
        let r = s
            .req(Method::PUT, &format!("{base}/files/dir/a.txt"))
            .body("hello world\nsecond line\n")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        let binary: Vec<u8> = (0..=255u8).collect();
        let r = s
            .req(Method::PUT, &format!("{base}/files/bin.dat"))
            .body(binary.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);

        let r = s
            .req(Method::GET, &format!("{base}/files/bin.dat"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["accept-ranges"], "bytes");
        assert!(r.headers().get("content-disposition").is_none());
        assert_eq!(r.bytes().await.unwrap().to_vec(), binary);

        let r = s
            .req(Method::GET, &format!("{base}/files/bin.dat"))
            .header("range", "bytes=10-12")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
        assert_eq!(r.headers()["content-range"], "bytes 10-12/256");
        assert_eq!(r.bytes().await.unwrap().to_vec(), vec![10, 11, 12]);
        let r = s
            .req(Method::GET, &format!("{base}/files/bin.dat"))
            .header("range", "bytes=-2")
            .send()
            .await
            .unwrap();
        assert_eq!(r.bytes().await.unwrap().to_vec(), vec![254, 255]);
        let r = s
            .req(Method::GET, &format!("{base}/files/bin.dat"))
            .header("range", "bytes=300-")
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["content-range"], "bytes */256");
        error(
            r,
            StatusCode::RANGE_NOT_SATISFIABLE,
            "range_not_satisfiable",
        )
        .await;

        let r = s
            .req(Method::GET, &format!("{base}/files/dir/a.txt?download=1"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.headers()["content-disposition"],
            "attachment; filename=\"a.txt\""
        );
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );

        // edit: unique, ambiguous (409), missing file (404).
        let r = s
            .json(
                Method::POST,
                &format!("{base}/edit"),
                &json!({"path": "dir/a.txt", "old": "world", "new": "there"}),
            )
            .send()
            .await
            .unwrap();
        let (st, v) = body(r).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["replacements"], 1);
        check_status(
            &s,
            Method::POST,
            &format!("{base}/edit"),
            Some(&json!({"path": "dir/a.txt", "old": "e", "new": "E"})),
            StatusCode::CONFLICT,
            "conflict",
        )
        .await;
        check_status(
            &s,
            Method::POST,
            &format!("{base}/edit"),
            Some(&json!({"path": "nope.txt", "old": "e", "new": "E"})),
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;
        let text = s
            .req(Method::GET, &format!("{base}/files/dir/a.txt"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(text, "hello there\nsecond line\n");

        let (_, v) = body(
            s.req(Method::GET, &format!("{base}/ls?path=dir"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(v["entries"][0]["name"], "a.txt", "{v}");
        assert_eq!(v["entries"][0]["kind"], "file", "{v}");
        let (_, v) = body(
            s.req(Method::GET, &format!("{base}/ls"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(v["entries"].as_array().unwrap().len(), 2, "{v}");
        let (_, v) = body(
            s.req(Method::GET, &format!("{base}/glob?pattern=**/*.txt"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(v["paths"], json!(["dir/a.txt"]), "{v}");
        let (_, v) = body(
            s.json(
                Method::POST,
                &format!("{base}/grep"),
                &json!({"pattern": "sec.nd"}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(v["matches"][0]["line_number"], 2, "{v}");
        assert_eq!(v["matches"][0]["path"], "dir/a.txt", "{v}");
        let (st, v) = body(
            s.req(Method::GET, &format!("{base}/stat?path=bin.dat"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["size"], 256);

        // Remove a file, then a directory recursively; missing is 404.
        let r = s
            .req(Method::DELETE, &format!("{base}/files/bin.dat"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        check_status(
            &s,
            Method::GET,
            &format!("{base}/files/bin.dat"),
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;
        let r = s
            .req(Method::DELETE, &format!("{base}/files/dir?recursive=1"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        check_status(
            &s,
            Method::DELETE,
            &format!("{base}/files/dir"),
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;

        // Paths that leave the workspace: refused, whether encoded or not.
        for p in ["..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "a/..%2F..%2Fx"] {
            let r = s
                .req(Method::GET, &format!("{base}/files/{p}"))
                .send()
                .await
                .unwrap();
            let (st, v) = body(r).await;
            assert!(
                st == StatusCode::FORBIDDEN || st == StatusCode::BAD_REQUEST,
                "{p}: {st} {v}"
            );
        }
        s.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conversations_are_listed_in_pages_shown_and_destroyed_idempotently() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        for id in ["c", "a", "e", "b", "d"] {
            let r = s
                .req(Method::PUT, &format!("/v1/conversations/{id}/files/x"))
                .body("x")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::NO_CONTENT);
        }
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..10 {
            let q = match &cursor {
                Some(c) => format!("/v1/conversations?limit=2&cursor={c}"),
                None => "/v1/conversations?limit=2".to_owned(),
            };
            let (st, v) = body(s.req(Method::GET, &q).send().await.unwrap()).await;
            assert_eq!(st, StatusCode::OK, "{v}");
            let page = v["conversations"].as_array().unwrap();
            assert!(page.len() <= 2);
            seen.extend(page.iter().map(|c| c["id"].as_str().unwrap().to_owned()));
            match v["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
        }
        assert_eq!(seen, ["a", "b", "c", "d", "e"]);
        check_status(
            &s,
            Method::GET,
            "/v1/conversations?limit=0",
            None,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        )
        .await;
        check_status(
            &s,
            Method::GET,
            "/v1/conversations?limit=x",
            None,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        )
        .await;

        let (st, v) = body(
            s.req(Method::GET, "/v1/conversations/a")
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["id"], "a");
        assert_eq!(v["state"], "active");
        assert_eq!(v["runtime"], "host");
        assert!(v["created_at"].is_string() && v["last_used_at"].is_string());
        assert!(v["expires_at"].is_null());

        for _ in 0..2 {
            let r = s
                .req(Method::DELETE, "/v1/conversations/a")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::NO_CONTENT);
        }
        check_status(
            &s,
            Method::GET,
            "/v1/conversations/a",
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;
        // Reading from an absent conversation is 404 and does not create it.
        check_status(
            &s,
            Method::GET,
            "/v1/conversations/a/files/x",
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;
        assert_eq!(s.workspaces(), 4);
        s.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn post_opens_a_conversation_creating_it_once() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        // Eight concurrent first opens: exactly one says it created the conversation.
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let r = s.req(Method::POST, "/v1/conversations/fresh");
            tasks.push(tokio::spawn(
                async move { body(r.send().await.unwrap()).await },
            ));
        }
        let mut created = 0;
        for t in tasks {
            let (st, v) = t.await.unwrap();
            assert_eq!(v["created"] == true, st == StatusCode::CREATED, "{st} {v}");
            assert!(
                st == StatusCode::CREATED || st == StatusCode::OK,
                "{st} {v}"
            );
            created += usize::from(st == StatusCode::CREATED);
            assert_eq!(v["conversation"]["id"], "fresh", "{v}");
            // The host runtime presents the workspace at its host directory.
            let root = v["workspace_root"].as_str().unwrap();
            assert!(std::path::Path::new(root).is_dir(), "{v}");
        }
        assert_eq!(created, 1);
        assert_eq!(s.workspaces(), 1);
        assert_eq!(s.store.list(None).unwrap().len(), 1);
        // Invalid ids create nothing.
        check_status(
            &s,
            Method::POST,
            "/v1/conversations/a%20b",
            None,
            StatusCode::BAD_REQUEST,
            "invalid_id",
        )
        .await;
        assert_eq!(s.workspaces(), 1);
        s.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wrong_missing_or_revoked_keys_get_401_and_x_api_key_works() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let url = format!("{}/v1/conversations", s.base);
        // The key with its last hex digit changed.
        let last = if s.key.ends_with('0') { '1' } else { '0' };
        let wrong = format!("{}{last}", &s.key[..s.key.len() - 1]);
        assert_ne!(wrong, s.key);
        let cases: Vec<(&str, String)> = vec![
            ("", String::new()),
            ("authorization", format!("Bearer {wrong}")),
            ("authorization", "Bearer ".to_owned()),
            ("authorization", format!("Basic {}", s.key)),
            ("authorization", s.key.clone()),
            ("x-api-key", wrong.clone()),
            ("x-api-key", "sbk_".to_owned()),
        ];
        for (h, v) in cases {
            let mut r = s.client.get(&url);
            if !h.is_empty() {
                r = r.header(h, v.clone());
            }
            let resp = r.send().await.unwrap();
            let (st, body) = body(resp).await;
            assert_eq!(st, StatusCode::UNAUTHORIZED, "{h}: {v}: {body}");
            assert_eq!(body["code"], "unauthorized");
            assert!(!body.to_string().contains(&s.key));
        }
        let r = s
            .client
            .get(&url)
            .header("x-api-key", &s.key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);

        // Nothing was created by the refused calls.
        let r = s
            .client
            .post(format!("{}/v1/conversations/z/exec", s.base))
            .header("x-api-key", &wrong)
            .body(r#"{"command":"true"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(s.workspaces(), 0);

        let id = s.store.list_api_keys().unwrap()[0].id.clone();
        s.store.revoke_api_key(&id, Utc::now()).unwrap();
        let r = s.client.get(&url).bearer_auth(&s.key).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        s.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_reaches_only_its_tenants_conversations() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let other = s
            .store
            .create_api_key(&TenantId::new("globex").unwrap(), None, Utc::now())
            .unwrap()
            .key;
        let put = |key: &str, data: &'static str| {
            s.client
                .put(format!("{}/v1/conversations/shared/files/f.txt", s.base))
                .bearer_auth(key)
                .body(data)
                .send()
        };
        assert_eq!(
            put(&s.key, "acme").await.unwrap().status(),
            StatusCode::NO_CONTENT
        );
        // Globex does not see acme's conversation...
        let r = s
            .client
            .get(format!("{}/v1/conversations/shared", s.base))
            .bearer_auth(&other)
            .send()
            .await
            .unwrap();
        error(r, StatusCode::NOT_FOUND, "not_found").await;
        let r = s
            .client
            .get(format!("{}/v1/conversations/shared/files/f.txt", s.base))
            .bearer_auth(&other)
            .send()
            .await
            .unwrap();
        error(r, StatusCode::NOT_FOUND, "not_found").await;
        let (_, v) = body(
            s.client
                .get(format!("{}/v1/conversations", s.base))
                .bearer_auth(&other)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(v["conversations"], json!([]));
        // ...and the same id in its own tenant is another workspace.
        assert_eq!(
            put(&other, "globex").await.unwrap().status(),
            StatusCode::NO_CONTENT
        );
        let read = |key: String| {
            let c = s.client.clone();
            let url = format!("{}/v1/conversations/shared/files/f.txt", s.base);
            async move {
                c.get(url)
                    .bearer_auth(key)
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap()
            }
        };
        assert_eq!(read(s.key.clone()).await, "acme");
        assert_eq!(read(other.clone()).await, "globex");
        let r = s
            .client
            .post(format!("{}/v1/conversations/shared/exec", s.base))
            .bearer_auth(&other)
            .body(r#"{"command":"cat f.txt; ls .. | wc -l"}"#)
            .header("content-type", "application/json")
            .send()
            .await
            .unwrap();
        let (_, v) = body(r).await;
        assert!(v["stdout"].as_str().unwrap().starts_with("globex"), "{v}");
        // Destroying in one tenant leaves the other.
        let r = s
            .client
            .delete(format!("{}/v1/conversations/shared", s.base))
            .bearer_auth(&other)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        assert_eq!(read(s.key.clone()).await, "acme");
        s.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_json_is_400_wrong_shape_422_and_nothing_is_created() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let url = "/v1/conversations/m/exec";
        let send = |body: &'static str, ct: Option<&'static str>| {
            let mut r = s.req(Method::POST, url).body(body);
            if let Some(ct) = ct {
                r = r.header("content-type", ct);
            }
            r.send()
        };
        let json = Some("application/json");
        for (b, ct, status) in [
            ("{", json, StatusCode::BAD_REQUEST),
            ("not json", json, StatusCode::BAD_REQUEST),
            ("", json, StatusCode::BAD_REQUEST),
            (r#"{"command":"true"}"#, None, StatusCode::BAD_REQUEST),
            (
                r#"{"command":"true"}"#,
                Some("text/plain"),
                StatusCode::BAD_REQUEST,
            ),
            ("{}", json, StatusCode::UNPROCESSABLE_ENTITY),
            (r#"{"command":1}"#, json, StatusCode::UNPROCESSABLE_ENTITY),
            (
                r#"{"command":"true","bogus":1}"#,
                json,
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
            (
                r#"{"command":"true","timeout_ms":-1}"#,
                json,
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
            ("[]", json, StatusCode::UNPROCESSABLE_ENTITY),
        ] {
            let r = send(b, ct).await.unwrap();
            let (st, v) = body(r).await;
            assert_eq!(st, status, "{b:?} {ct:?}: {v}");
            assert_eq!(v["code"], "invalid_request", "{v}");
        }
        error(
            s.json(
                Method::POST,
                "/v1/conversations/m/grep",
                &json!({"pattern": "("}),
            )
            .send()
            .await
            .unwrap(),
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;
        assert_eq!(s.workspaces(), 0);
        assert!(s.store.list(None).unwrap().is_empty());
        s.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversized_bodies_are_413() {
    bounded(async {
        let config = ServerConfig {
            max_json_bytes: 1024,
            max_file_bytes: 4096,
            ..ServerConfig::default()
        };
        let s = Server::start(config, true).await;
        let big = json!({"command": "true", "stdin": "x".repeat(2048)});
        check_status(
            &s,
            Method::POST,
            "/v1/conversations/o/exec",
            Some(&big),
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
        )
        .await;
        error(
            s.req(Method::PUT, "/v1/conversations/o/files/big")
                .body(vec![0u8; 5000])
                .send()
                .await
                .unwrap(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
        )
        .await;
        // A file body may be larger than a JSON body.
        let r = s
            .req(Method::PUT, "/v1/conversations/o/files/ok")
            .body(vec![0u8; 3000])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        s.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalid_ids_and_paths_are_refused_creating_nothing() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        for id in ["-a", "a%20b", "a%3Ab", "%C3%A9", &"a".repeat(129), "a%00"] {
            for (method, path, body) in [
                (Method::POST, "exec", Some(json!({"command": "true"}))),
                (Method::PUT, "files/x", None),
                (Method::GET, "", None),
                (Method::DELETE, "", None),
                (Method::POST, "mkdir", Some(json!({"path": "d"}))),
            ] {
                let url = if path.is_empty() {
                    format!("/v1/conversations/{id}")
                } else {
                    format!("/v1/conversations/{id}/{path}")
                };
                let r = match body {
                    Some(b) => s.json(method.clone(), &url, &b),
                    None => s.req(method.clone(), &url).body("x"),
                };
                let (st, v) = body_of(r.send().await.unwrap()).await;
                assert_eq!(st, StatusCode::BAD_REQUEST, "{method} {url}: {v}");
                assert_eq!(v["code"], "invalid_id", "{url}: {v}");
            }
        }
        // "." and ".." as ids: HTTP clients resolve such segments themselves (WHATWG URLs), so
        // they are sent as written, over a raw connection, as `curl --path-as-is` would.
        let addr = s.base.trim_start_matches("http://").to_owned();
        for id in [".", ".."] {
            for (method, tail) in [("POST", "/exec"), ("POST", ""), ("PUT", "/files/x")] {
                let line = format!("{method} /v1/conversations/{id}{tail} HTTP/1.1");
                let raw = format!(
                    "{line}\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
                     Content-Type: application/json\r\nContent-Length: 18\r\n\
                     Connection: close\r\n\r\n{{\"command\":\"true\"}}",
                    s.key
                );
                let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                conn.write_all(raw.as_bytes()).await.unwrap();
                let mut answer = String::new();
                conn.read_to_string(&mut answer).await.unwrap();
                assert!(
                    answer.starts_with("HTTP/1.1 400") && answer.contains("invalid_id"),
                    "{line}: {answer}"
                );
            }
        }
        for p in ["..%2Fx", "a%2F..%2F..%2Fx", "%2Fetc%2Fhosts"] {
            let r = s
                .req(Method::PUT, &format!("/v1/conversations/ok/files/{p}"))
                .body("x")
                .send()
                .await
                .unwrap();
            let (st, v) = body_of(r).await;
            assert!(
                st == StatusCode::FORBIDDEN || st == StatusCode::BAD_REQUEST,
                "{p}: {st} {v}"
            );
        }
        assert_eq!(s.workspaces(), 0);
        assert!(s.store.list(None).unwrap().is_empty());
        s.stop().await;
    })
    .await;
}

async fn body_of(r: Response) -> (StatusCode, Value) {
    body(r).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_conversation_runs_in_arrival_order_others_in_parallel_and_a_full_queue_is_429() {
    bounded(async {
        let config = ServerConfig {
            max_queue: 2,
            ..ServerConfig::default()
        };
        let s = Arc::new(Server::start(config, true).await);
        let exec = |conv: &'static str, cmd: String| {
            let s = s.clone();
            async move {
                let r = s
                    .json(
                        Method::POST,
                        &format!("/v1/conversations/{conv}/exec"),
                        &json!({ "command": cmd }),
                    )
                    .send()
                    .await
                    .unwrap();
                let st = r.status();
                (st, body(r).await.1, Instant::now())
            }
        };
        // A slow command, then a fast one on the same conversation: the fast one waits.
        let t0 = Instant::now();
        let slow = tokio::spawn(exec("q", "sleep 2; echo 1 >> log".into()));
        tokio::time::sleep(Duration::from_millis(400)).await;
        let fast = tokio::spawn(exec("q", "echo 2 >> log; cat log".into()));
        tokio::time::sleep(Duration::from_millis(400)).await;
        // The queue holds 2: a third is refused at once.
        let (st, v, _) = exec("q", "true".into()).await;
        assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
        assert_eq!(v["code"], "busy");
        // Another conversation is not held up.
        let (st, _, other_done) = exec("other", "true".into()).await;
        assert_eq!(st, StatusCode::OK);
        let (_, _, slow_done) = slow.await.unwrap();
        let (_, v, fast_done) = fast.await.unwrap();
        assert!(other_done < slow_done);
        assert!(fast_done >= slow_done);
        assert!(fast_done - t0 >= Duration::from_millis(1900));
        assert_eq!(v["stdout"], "1\n2\n", "{v}");
        let s = Arc::into_inner(s).unwrap();
        s.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_loopback_server_without_keys_is_open_until_the_first_key() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), false).await;
        let r = s
            .req(Method::PUT, "/v1/conversations/a/files/x")
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        let records = s.store.list(None).unwrap();
        assert_eq!(records[0].tenant.as_str(), "local");
        let key = s
            .store
            .create_api_key(&TenantId::new("local").unwrap(), None, Utc::now())
            .unwrap()
            .key;
        let r = s
            .req(Method::GET, "/v1/conversations/a/files/x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        let r = s
            .req(Method::GET, "/v1/conversations/a/files/x")
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.text().await.unwrap(), "x");

        // A non-loopback address needs a key.
        let empty = Store::open_in_memory().unwrap();
        let any: SocketAddr = "0.0.0.0:7070".parse().unwrap();
        let err = sessionbox_server::check_listen(&any, &empty).unwrap_err();
        assert_eq!(err.code(), "invalid_request");
        // It says a key must exist first (the CLI adds how to create one when it prints it).
        assert!(err.to_string().contains("create an API key"), "{err}");
        sessionbox_server::check_listen(&"127.0.0.1:7070".parse().unwrap(), &empty).unwrap();
        sessionbox_server::check_listen(&"[::1]:7070".parse().unwrap(), &empty).unwrap();
        sessionbox_server::check_listen(&any, &s.store).unwrap();
        s.stop().await;
    })
    .await;
}

/// Operations counted in the audit log for one conversation.
fn audited_ops(store: &Store, op: &str) -> usize {
    store
        .audit_log(&AuditFilter::default())
        .unwrap()
        .iter()
        .filter(|r| r.entry.operation == op)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_warm_conversation_keeps_its_session_and_destroy_ends_it() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let exec = |cmd: &str| {
            s.json(
                Method::POST,
                "/v1/conversations/warm/exec",
                &json!({ "command": cmd }),
            )
        };
        for i in 0..5 {
            let (st, v) = body(exec(&format!("echo {i} >> log")).send().await.unwrap()).await;
            assert_eq!(st, StatusCode::OK, "{v}");
        }
        // One open for five requests: the session was kept between them.
        assert_eq!(audited_ops(&s.store, "open"), 1);
        assert_eq!(audited_ops(&s.store, "exec"), 5);
        let (_, v) = body(exec("cat log").send().await.unwrap()).await;
        assert_eq!(v["stdout"], "0\n1\n2\n3\n4\n");
        // Its usage, from the audit log: one open, six execs.
        let (st, v) = body(
            s.req(Method::GET, "/v1/conversations/warm")
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["usage"]["execs"], 6, "{v}");
        assert_eq!(v["usage"]["by_operation"]["open"], 1, "{v}");
        assert_eq!(v["usage"]["operations"], 7, "{v}");

        // Destroy takes the kept session out: the next request starts a new, empty conversation.
        let r = s
            .req(Method::DELETE, "/v1/conversations/warm")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        assert_eq!(s.workspaces(), 0);
        let (_, v) = body(exec("ls").send().await.unwrap()).await;
        assert_eq!(v["stdout"], "", "{v}");
        assert_eq!(audited_ops(&s.store, "open"), 2);
        s.stop().await;

        // With no sessions kept, every request opens its conversation.
        let s = Server::start(
            ServerConfig {
                max_open_sessions: 0,
                ..ServerConfig::default()
            },
            true,
        )
        .await;
        for _ in 0..3 {
            let r = s
                .json(
                    Method::POST,
                    "/v1/conversations/cold/exec",
                    &json!({ "command": "true" }),
                )
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
        }
        assert_eq!(audited_ops(&s.store, "open"), 3);
        s.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_call_is_audited_with_its_key_id_and_never_its_secrets() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let key_id = s.store.list_api_keys().unwrap()[0].id.clone();
        s.json(
            Method::POST,
            "/v1/conversations/au/exec",
            &json!({"command": "echo TOPSECRET", "env": {"TOKEN": "hunter2"}}),
        )
        .send()
        .await
        .unwrap();
        s.req(Method::GET, "/v1/conversations/au/files/missing")
            .send()
            .await
            .unwrap();
        // `http.*` records are written off the request path: wait for them.
        s.state.flush_audit().await;
        let log = s.store.audit_log(&AuditFilter::default()).unwrap();
        let http: Vec<_> = log
            .iter()
            .filter(|r| r.entry.operation.starts_with("http."))
            .collect();
        assert_eq!(http.len(), 2, "{log:#?}");
        let exec = http
            .iter()
            .find(|r| r.entry.operation == "http.exec")
            .unwrap();
        assert_eq!(exec.entry.outcome, "ok");
        assert!(
            exec.entry
                .detail
                .as_deref()
                .unwrap()
                .contains(&format!("key={key_id}"))
        );
        let read = http
            .iter()
            .find(|r| r.entry.operation == "http.read")
            .unwrap();
        assert_eq!(read.entry.outcome, "not_found");
        let all = format!("{log:?}");
        for secret in ["TOPSECRET", "hunter2", s.key.as_str()] {
            assert!(!all.contains(secret), "{secret} in the audit log");
        }
        s.stop().await;
    })
    .await;
}

/// The property names of a component schema of the OpenAPI document.
fn properties(doc: &Value, schema: &str) -> Vec<String> {
    let mut p: Vec<String> = doc["components"]["schemas"][schema]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("no schema {schema}"))
        .keys()
        .cloned()
        .collect();
    p.sort();
    p
}

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_openapi_document_lists_every_route_and_matches_the_responses() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let r = s
            .client
            .get(format!("{}/v1/openapi.json", s.base))
            .send()
            .await
            .unwrap();
        let (st, doc) = body(r).await;
        assert_eq!(st, StatusCode::OK);
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{doc}");
        let c = "/v1/conversations/{id}";
        let expected: Vec<(String, &str)> = vec![
            ("/healthz".into(), "get"),
            ("/readyz".into(), "get"),
            ("/v1/conversations".into(), "get"),
            (c.into(), "get"),
            (c.into(), "post"),
            (c.into(), "delete"),
            (format!("{c}/exec"), "post"),
            (format!("{c}/files/{{path}}"), "get"),
            (format!("{c}/files/{{path}}"), "put"),
            (format!("{c}/files/{{path}}"), "delete"),
            (format!("{c}/edit"), "post"),
            (format!("{c}/mkdir"), "post"),
            (format!("{c}/ls"), "get"),
            (format!("{c}/stat"), "get"),
            (format!("{c}/glob"), "get"),
            (format!("{c}/grep"), "post"),
            (format!("{c}/commands"), "get"),
            (format!("{c}/commands/{{cmd}}"), "get"),
            (format!("{c}/commands/{{cmd}}"), "delete"),
            (format!("{c}/commands/{{cmd}}/logs"), "get"),
            (format!("{c}/pty"), "get"),
            (format!("{c}/commands/{{cmd}}/stdin"), "post"),
            (format!("{c}/commands/{{cmd}}/stdin"), "delete"),
            (format!("{c}/watch"), "get"),
            (format!("{c}/files"), "post"),
            ("/v1/skills".into(), "get"),
            (format!("{c}/skills/{{name}}"), "get"),
            ("/v1/policy".into(), "get"),
            ("/v1/policy".into(), "put"),
            ("/v1/policy".into(), "delete"),
            (format!("{c}/policy"), "get"),
            (format!("{c}/policy"), "put"),
            (format!("{c}/policy"), "delete"),
            ("/v1/egress-log".into(), "get"),
            (format!("{c}/egress-log"), "get"),
            ("/metrics".into(), "get"),
            (format!("{c}/previews"), "post"),
            (format!("{c}/ports/{{port}}/{{path}}"), "get"),
            ("/v1/previews/{token}/{path}".into(), "get"),
            (format!("{c}/snapshots"), "post"),
            (format!("{c}/restore"), "post"),
            (format!("{c}/fork"), "post"),
            ("/v1/snapshots".into(), "get"),
            ("/v1/snapshots/{name}".into(), "get"),
            ("/v1/snapshots/{name}".into(), "delete"),
            ("/v1/snapshots/{name}/archive".into(), "get"),
            ("/v1/snapshots/{name}/archive".into(), "put"),
            ("/v1/snapshots/{name}/fork".into(), "post"),
            ("/v1/templates".into(), "get"),
            ("/v1/templates/{name}".into(), "put"),
            ("/v1/templates/{name}".into(), "delete"),
            ("/v1/templates/{name}/fork".into(), "post"),
            ("/v1/whoami".into(), "get"),
            ("/v1/audit".into(), "get"),
            ("/v1/installation".into(), "get"),
            ("/v1/installation/doctor".into(), "get"),
            (format!("{c}/pty/tickets"), "post"),
        ];
        let mut count = 0;
        for (path, ops) in doc["paths"].as_object().unwrap() {
            count += ops.as_object().unwrap().len();
            let _ = path;
        }
        assert_eq!(count, expected.len(), "{}", doc["paths"]);
        for (path, method) in &expected {
            assert!(
                doc["paths"][path.as_str()][*method].is_object(),
                "{method} {path} missing"
            );
        }
        let schemes = &doc["components"]["securitySchemes"];
        assert!(schemes["bearer"].is_object() && schemes["api_key"].is_object());

        // The documented shapes are the served ones.
        let base = "/v1/conversations/doc";
        let (_, v) = body(
            s.json(
                Method::POST,
                &format!("{base}/exec"),
                &json!({"command": "echo a > f.txt"}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        let mut exec_props = properties(&doc, "ExecResult");
        // Optional: the bytes when not UTF-8; the expiry of an earlier conversation of the id.
        exec_props.retain(|p| !p.ends_with("_base64") && p != "previous_expired_at");
        assert_eq!(keys(&v), exec_props);
        let (_, v) = body(
            s.req(Method::GET, &format!("{base}/ls"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(keys(&v), properties(&doc, "LsView"));
        assert_eq!(keys(&v["entries"][0]), properties(&doc, "DirEntry"));
        let (_, v) = body(
            s.req(Method::GET, &format!("{base}/stat?path=f.txt"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(keys(&v), properties(&doc, "FileStat"));
        let (_, v) = body(
            s.json(
                Method::POST,
                &format!("{base}/grep"),
                &json!({"pattern": "a"}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(keys(&v["matches"][0]), properties(&doc, "GrepMatch"));
        let (_, v) = body(
            s.json(
                Method::POST,
                &format!("{base}/edit"),
                &json!({"path": "f.txt", "old": "a", "new": "b"}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(keys(&v), properties(&doc, "EditResult"));
        let (_, v) = body(s.req(Method::GET, base).send().await.unwrap()).await;
        // `disk` only for a conversation with a disk quota (isolated as root): not this runtime's;
        // `memory` only while processes run (none does here).
        let mut conversation_props = properties(&doc, "Conversation");
        conversation_props.retain(|p| p != "disk" && p != "memory");
        assert_eq!(keys(&v), conversation_props);
        let (_, v) = body(s.req(Method::POST, base).send().await.unwrap()).await;
        let mut opened_props = properties(&doc, "OpenedConversation");
        opened_props.retain(|p| p != "previous_expired_at");
        assert_eq!(keys(&v), opened_props);
        let (_, v) = body(
            s.req(Method::GET, "/v1/conversations")
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(keys(&v), properties(&doc, "ConversationPage"));
        let (_, v) = body(
            s.req(Method::GET, "/v1/conversations/nope")
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(keys(&v), properties(&doc, "Error"));
        let (_, v) = body(
            s.json(
                Method::PUT,
                &format!("{base}/policy"),
                &json!({"profile": "allowlist", "allow": ["a.example:443"]}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(keys(&v), properties(&doc, "NetworkPolicy"));
        assert_eq!(
            properties(&doc, "NetworkPolicyRequest"),
            ["allow", "deny", "profile"]
        );
        let (_, v) = body(s.req(Method::GET, "/v1/egress-log").send().await.unwrap()).await;
        assert_eq!(keys(&v), properties(&doc, "EgressLog"));
        assert!(properties(&doc, "EgressVerdict").contains(&"verdict".to_owned()));

        // The new routes: event stream, background command, logs, upload.
        let exec_doc = &doc["paths"][format!("{c}/exec")]["post"]["responses"];
        assert!(
            exec_doc["200"]["content"]["text/event-stream"].is_object(),
            "{exec_doc}"
        );
        assert!(
            exec_doc["202"]["content"]["application/json"].is_object(),
            "{exec_doc}"
        );
        let mut ev = stream_exec(&s, "doc", &json!({"command": "echo x; echo y >&2"})).await;
        let all = ev.rest().await;
        for (name, data, _) in &all {
            let mut props = match name.as_str() {
                // `base64` appears only with bytes that are not UTF-8.
                "stdout" | "stderr" => vec!["text".to_owned()],
                "exit" => properties(&doc, "ExecExit"),
                other => panic!("unexpected event {other}"),
            };
            props.sort();
            assert_eq!(keys(data), props, "{name}");
        }
        assert_eq!(properties(&doc, "OutputText"), ["base64", "text"]);
        assert_eq!(all.len(), 3);
        let (st, v) = body(
            s.json(
                Method::POST,
                &format!("{base}/exec"),
                &json!({"command": "printf 'a\\377'", "background": true}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::ACCEPTED);
        assert_eq!(keys(&v), properties(&doc, "BackgroundCommand"));
        let id = v["id"].as_str().unwrap().to_owned();
        let done = until(10, || {
            let r = s.req(Method::GET, &format!("{base}/commands/{id}")).send();
            async { body(r.await.unwrap()).await.1["running"] == false }
        })
        .await;
        assert!(done);
        let (_, v) = body(
            s.req(Method::GET, &format!("{base}/commands/{id}/logs"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(keys(&v), properties(&doc, "CommandLogsView"));
        assert_eq!(keys(&v["stdout"]), properties(&doc, "OutputText"));
        assert_eq!(v["stdout"]["text"], "a\u{fffd}");
        assert_eq!(v["stdout"]["base64"], "Yf8=");
        let (_, v) = body(
            upload(&s, "doc", &[("file", Some("u.txt"), b"u")])
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(keys(&v), properties(&doc, "UploadView"));
        assert_eq!(keys(&v["files"][0]), properties(&doc, "UploadedFile"));
        s.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn odd_input_on_every_route_is_never_a_5xx() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        // An existing conversation, so the runtime sees the input too.
        s.req(Method::PUT, "/v1/conversations/w/files/a.txt")
            .body("a\n")
            .send()
            .await
            .unwrap();
        let odd = [
            "",
            "%00",
            "%0A",
            "..",
            "...",
            "a%2F..%2F..",
            "%2F",
            "%2Fproc%2Fself%2Fenviron",
            "%FF",
            "%C0%AE",
            "*",
            "[",
            "(",
            "\\",
            "~",
            "a.txt%00b",
            "%E2%80%AE",
            "x%20y",
        ];
        let long = "a".repeat(5000);
        for o in odd.iter().copied().chain([long.as_str()]) {
            let c = "/v1/conversations/w";
            let reqs = vec![
                s.req(Method::GET, &format!("{c}/files/{o}")),
                s.req(Method::PUT, &format!("{c}/files/{o}")).body("x"),
                s.req(Method::DELETE, &format!("{c}/files/{o}?recursive={o}")),
                s.req(Method::GET, &format!("{c}/ls?path={o}")),
                s.req(Method::GET, &format!("{c}/stat?path={o}")),
                s.req(Method::GET, &format!("{c}/glob?pattern={o}")),
                s.req(
                    Method::GET,
                    &format!("/v1/conversations?cursor={o}&limit={o}"),
                ),
                s.req(Method::GET, &format!("/v1/conversations/{o}")),
                s.json(
                    Method::POST,
                    &format!("{c}/grep"),
                    &json!({"pattern": o, "glob": o}),
                ),
                s.json(
                    Method::POST,
                    &format!("{c}/edit"),
                    &json!({"path": o, "old": o, "new": o}),
                ),
                s.json(
                    Method::POST,
                    &format!("{c}/exec"),
                    &json!({"command": "true", "cwd": o, "env": {o: o}}),
                ),
                s.json(Method::POST, &format!("{c}/mkdir"), &json!({"path": o})),
                s.req(Method::GET, &format!("{c}/files/a.txt"))
                    .header("range", format!("bytes={o}")),
                s.req(Method::GET, &format!("{c}/commands/{o}")),
                s.req(Method::DELETE, &format!("{c}/commands/{o}")),
                s.req(
                    Method::GET,
                    &format!("{c}/commands/{o}/logs?stdout_offset={o}&stderr_offset={o}"),
                ),
                upload(
                    &s,
                    "w",
                    &[("path", None, o.as_bytes()), ("file", Some(o), b"x")],
                ),
                upload(&s, "w", &[("file", Some(o), b"x")]),
                s.json(
                    Method::POST,
                    &format!("{c}/exec"),
                    &json!({"command": "true", "cwd": o, "background": true}),
                )
                .header("accept", "text/event-stream"),
                s.req(Method::POST, &format!("{c}/files"))
                    .header("content-type", format!("multipart/form-data; boundary={o}"))
                    .body(o.to_owned()),
                s.req(Method::GET, &format!("/v1/conversations/{o}/policy")),
                s.json(
                    Method::PUT,
                    &format!("/v1/conversations/{o}/policy"),
                    &json!({"profile": "allowlist", "allow": [o], "deny": [o]}),
                ),
                s.json(
                    Method::PUT,
                    "/v1/policy",
                    &json!({"profile": "allowlist", "allow": [o]}),
                ),
                s.req(Method::DELETE, &format!("/v1/conversations/{o}/policy")),
                s.req(
                    Method::GET,
                    &format!("/v1/conversations/{o}/egress-log?since={o}&limit={o}"),
                ),
                s.req(Method::GET, &format!("/v1/egress-log?since={o}")),
            ];
            for r in reqs {
                let r = r.send().await.unwrap();
                let url = r.url().to_string();
                let st = r.status();
                let text = r.text().await.unwrap();
                assert!(!st.is_server_error(), "{url} ({o:?}): {st} {text}");
                if !st.is_success() {
                    let v: Value = serde_json::from_str(&text).unwrap();
                    assert!(v["code"].is_string(), "{url}: {text}");
                }
            }
        }
        // Regular expressions and globs that do not parse are the caller's fault.
        error(
            s.json(
                Method::POST,
                "/v1/conversations/w/grep",
                &json!({"pattern": "("}),
            )
            .send()
            .await
            .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        )
        .await;
        s.stop().await;
    })
    .await;
}

// ---- Event-stream exec, background commands, uploads, metrics. ----

/// Server-sent events read as they arrive.
struct Events {
    resp: Response,
    buf: Vec<u8>,
    started: Instant,
}

impl Events {
    fn new(resp: Response) -> Events {
        Events {
            resp,
            buf: Vec::new(),
            started: Instant::now(),
        }
    }

    /// The next event: its name, its data as JSON, and when it arrived (since `new`). `None`
    /// at the end of the stream. Keep-alive comments are skipped.
    async fn next(&mut self) -> Option<(String, Value, Duration)> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block = String::from_utf8(self.buf.drain(..i + 2).collect()).unwrap();
                let mut name = "message".to_owned();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                if data.is_empty() {
                    continue;
                }
                let v = serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}"));
                return Some((name, v, self.started.elapsed()));
            }
            let chunk = self.resp.chunk().await.unwrap()?;
            self.buf.extend_from_slice(&chunk);
        }
    }

    /// Every remaining event.
    async fn rest(&mut self) -> Vec<(String, Value, Duration)> {
        let mut all = Vec::new();
        while let Some(e) = self.next().await {
            all.push(e);
        }
        all
    }
}

async fn stream_exec(s: &Server, conv: &str, body: &Value) -> Events {
    let r = s
        .json(
            Method::POST,
            &format!("/v1/conversations/{conv}/exec"),
            body,
        )
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    Events::new(r)
}

/// The text of every `stdout` (or `stderr`) event, in order.
fn stream_text(events: &[(String, Value, Duration)], name: &str) -> String {
    events
        .iter()
        .filter(|e| e.0 == name)
        .map(|e| e.1["text"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exec_as_an_event_stream_sends_output_while_the_command_runs() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let mut ev = stream_exec(
            &s,
            "sse",
            &json!({"command": "echo a; sleep 1; echo b >&2; printf '\\342\\202'; printf '\\254'; exit 3"}),
        )
        .await;
        let first = ev.next().await.unwrap();
        assert_eq!((first.0.as_str(), &first.1), ("stdout", &json!({"text": "a\n"})));
        let rest = ev.rest().await;
        let b = rest.iter().find(|e| e.0 == "stderr").expect("a stderr event");
        assert_eq!(b.1["text"], "b\n");
        // `a` came out a whole second before `b`: it was sent as it was written.
        assert!(
            b.2 >= first.2 + Duration::from_millis(700),
            "a at {:?}, b at {:?}",
            first.2,
            b.2
        );
        // The euro sign written in two pieces arrives whole.
        assert_eq!(stream_text(&rest, "stdout"), "€");
        let exit = rest.last().unwrap();
        assert_eq!(exit.0, "exit");
        assert_eq!(exit.1["exit_code"], 3);
        assert_eq!(exit.1["status"], json!({"code": 3}));
        assert_eq!(exit.1["timed_out"], false);
        assert!(exit.1["duration_ms"].as_u64().unwrap() >= 1000, "{}", exit.1);

        // Output past the limit is cut and said to be; a timeout is reported.
        let mut ev = stream_exec(
            &s,
            "sse",
            &json!({"command": "head -c 5000 /dev/zero | tr '\\0' x; sleep 5", "output_limit": 100, "timeout_ms": 300}),
        )
        .await;
        let all = ev.rest().await;
        assert_eq!(stream_text(&all, "stdout"), "x".repeat(100));
        let exit = &all.last().unwrap().1;
        assert_eq!(
            (exit["stdout_truncated"].clone(), exit["timed_out"].clone(), exit["exit_code"].clone()),
            (json!(true), json!(true), json!(124)),
            "{exit}"
        );

        // Bad input is a JSON error before any stream starts.
        error(
            s.json(Method::POST, "/v1/conversations/sse/exec", &json!({"command": ""}))
                .header("accept", "text/event-stream")
                .send()
                .await
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        )
        .await;
        s.stop().await;
    })
    .await;
}

/// The size of a workspace file, through the API (0 when absent).
async fn file_len(s: &Server, conv: &str, path: &str) -> usize {
    let r = s
        .req(
            Method::GET,
            &format!("/v1/conversations/{conv}/files/{path}"),
        )
        .send()
        .await
        .unwrap();
    if r.status() == StatusCode::NOT_FOUND {
        return 0;
    }
    r.bytes().await.unwrap().len()
}

/// Waits until `f` holds, up to `secs`.
async fn until<F: Future<Output = bool>>(secs: u64, mut f: impl FnMut() -> F) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Polls a background command's status until it has ended; returns that status.
async fn finished(s: &Server, path: &str) -> Value {
    for _ in 0..200 {
        let v = body(s.req(Method::GET, path).send().await.unwrap()).await.1;
        if v["running"] == false {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{path} still runs");
}

/// True while host process `pid` exists and is not a zombie.
fn host_pid_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

/// A command that writes its shell's pid, then grows `grow` every 50 ms until killed.
const GROWER: &str = "echo $$ > pid; echo started; while :; do echo x >> grow; sleep 0.05; done";

/// Checks that `grow` in `conv` stopped growing.
async fn stopped_growing(s: &Server, conv: &str) {
    let a = file_len(s, conv, "grow").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let b = file_len(s, conv, "grow").await;
    assert_eq!(a, b, "the killed command still writes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn background_commands_run_outside_the_queue_report_status_and_logs_and_are_killed() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let c = "/v1/conversations/bg";
        let (st, v) = body(
            s.json(
                Method::POST,
                &format!("{c}/exec"),
                &json!({"command": "for i in 1 2 3; do echo $i; sleep 0.3; done; echo done >&2; exit 4", "background": true}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{v}");
        assert_eq!(v["running"], true);
        let id = v["id"].as_str().unwrap().to_owned();

        // The conversation's queue is free meanwhile.
        let t = Instant::now();
        let (st, v) = body(
            s.json(Method::POST, &format!("{c}/exec"), &json!({"command": "echo quick"}))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!((st, v["stdout"].clone()), (StatusCode::OK, json!("quick\n")));
        assert!(t.elapsed() < Duration::from_millis(800), "{:?}", t.elapsed());

        // Poll the logs from the last offsets until it ends: each piece is new output.
        let (mut out, mut err, mut off_o, mut off_e, mut polls_with_output) =
            (String::new(), String::new(), 0, 0, 0);
        loop {
            let (st, l) = body(
                s.req(
                    Method::GET,
                    &format!("{c}/commands/{id}/logs?stdout_offset={off_o}&stderr_offset={off_e}"),
                )
                .send()
                .await
                .unwrap(),
            )
            .await;
            assert_eq!(st, StatusCode::OK, "{l}");
            let piece = l["stdout"]["text"].as_str().unwrap();
            if !piece.is_empty() {
                polls_with_output += 1;
            }
            out.push_str(piece);
            err.push_str(l["stderr"]["text"].as_str().unwrap());
            off_o = l["stdout_next_offset"].as_u64().unwrap();
            off_e = l["stderr_next_offset"].as_u64().unwrap();
            if l["running"] == false {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!((out.as_str(), err.as_str()), ("1\n2\n3\n", "done\n"));
        assert!(polls_with_output >= 2, "the output came in {polls_with_output} piece(s)");
        let (_, v) = body(
            s.req(Method::GET, &format!("{c}/commands/{id}"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            (v["running"].clone(), v["exit_code"].clone(), v["killed"].clone()),
            (json!(false), json!(4), json!(false)),
            "{v}"
        );
        assert_eq!(v["stdout_bytes"], 6);

        // Kill: the process group is gone and the marker stops growing.
        let (_, v) = body(
            s.json(Method::POST, &format!("{c}/exec"), &json!({"command": GROWER, "background": true}))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let id = v["id"].as_str().unwrap().to_owned();
        assert!(until(10, || async { file_len(&s, "bg", "grow").await > 4 }).await);
        let pid: u32 = {
            let r = s.req(Method::GET, &format!("{c}/files/pid")).send().await.unwrap();
            r.text().await.unwrap().trim().parse().unwrap()
        };
        assert!(host_pid_alive(pid));
        let (st, v) = body(
            s.req(Method::DELETE, &format!("{c}/commands/{id}"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!((v["running"].clone(), v["killed"].clone()), (json!(false), json!(true)));
        assert!(until(5, || async { !host_pid_alive(pid) }).await, "pid {pid} lives");
        stopped_growing(&s, "bg").await;

        // Bad offsets, unknown commands, another tenant: typed errors.
        check_status(&s, Method::GET, &format!("{c}/commands/{id}/logs?stdout_offset=999999"), None, StatusCode::BAD_REQUEST, "invalid_request").await;
        check_status(&s, Method::GET, &format!("{c}/commands/{id}/logs?stdout_offset=-1"), None, StatusCode::BAD_REQUEST, "invalid_request").await;
        for (m, path) in [
            (Method::GET, format!("{c}/commands/nope")),
            (Method::GET, format!("{c}/commands/nope/logs")),
            (Method::DELETE, format!("{c}/commands/nope")),
            (Method::GET, format!("/v1/conversations/other/commands/{id}")),
        ] {
            check_status(&s, m, &path, None, StatusCode::NOT_FOUND, "not_found").await;
        }
        let other = s
            .store
            .create_api_key(&TenantId::new("other").unwrap(), None, Utc::now())
            .unwrap()
            .key;
        error(
            s.client
                .get(format!("{}{c}/commands/{id}", s.base))
                .bearer_auth(&other)
                .send()
                .await
                .unwrap(),
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;

        // Output is bounded by the output limit, and said to be cut.
        let (_, v) = body(
            s.json(
                Method::POST,
                &format!("{c}/exec"),
                &json!({"command": "head -c 100000 /dev/zero", "background": true, "output_limit": 10}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        let id = v["id"].as_str().unwrap().to_owned();
        let v = finished(&s, &format!("{c}/commands/{id}")).await;
        assert_eq!((v["stdout_bytes"].clone(), v["stdout_truncated"].clone()), (json!(10), json!(true)), "{v}");

        // Destroying the conversation ends its background commands.
        s.json(Method::POST, &format!("{c}/exec"), &json!({"command": "rm -f grow pid"}))
            .send()
            .await
            .unwrap();
        let (_, v) = body(
            s.json(Method::POST, &format!("{c}/exec"), &json!({"command": GROWER, "background": true}))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let id = v["id"].as_str().unwrap().to_owned();
        assert!(until(10, || async { file_len(&s, "bg", "grow").await > 4 }).await);
        let r = s.req(Method::GET, &format!("{c}/files/pid")).send().await.unwrap();
        let pid: u32 = r.text().await.unwrap().trim().parse().unwrap();
        let r = s.req(Method::DELETE, c).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        assert!(until(5, || async { !host_pid_alive(pid) }).await, "pid {pid} lives");
        check_status(&s, Method::GET, &format!("{c}/commands/{id}"), None, StatusCode::NOT_FOUND, "not_found").await;
        assert_eq!(s.workspaces(), 0);
        s.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn closing_an_event_stream_kills_its_command() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let mut ev = stream_exec(&s, "gone", &json!({"command": GROWER})).await;
        let (name, v, _) = ev.next().await.unwrap();
        assert_eq!(
            (name.as_str(), v["text"].as_str()),
            ("stdout", Some("started\n"))
        );
        // The streaming command holds the conversation's turn: look at the files on the host.
        let ws = s.workspace("gone");
        let grow = || std::fs::metadata(ws.join("grow")).map_or(0, |m| m.len());
        assert!(until(10, || async { grow() > 4 }).await);
        let pid: u32 = std::fs::read_to_string(ws.join("pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(host_pid_alive(pid));
        drop(ev);
        assert!(
            until(5, || async { !host_pid_alive(pid) }).await,
            "pid {pid} lives"
        );
        stopped_growing(&s, "gone").await;
        s.stop().await;
    })
    .await;
}

/// A multipart body: `(field name, filename, content)` per part.
fn multipart(parts: &[(&str, Option<&str>, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "sbx-boundary-7f3a";
    let mut b = Vec::new();
    for (name, file, data) in parts {
        b.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        match file {
            Some(f) => b.extend_from_slice(
                format!(
                    "Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\n\
                     Content-Type: application/octet-stream\r\n\r\n"
                )
                .as_bytes(),
            ),
            None => b.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes(),
            ),
        }
        b.extend_from_slice(data);
        b.extend_from_slice(b"\r\n");
    }
    b.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), b)
}

fn upload(s: &Server, conv: &str, parts: &[(&str, Option<&str>, &[u8])]) -> RequestBuilder {
    let (ct, b) = multipart(parts);
    s.req(Method::POST, &format!("/v1/conversations/{conv}/files"))
        .header("content-type", ct)
        .body(b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multipart_upload_writes_several_files_each_through_the_path_policy() {
    bounded(async {
        let config = ServerConfig {
            max_file_bytes: 64 * 1024,
            ..ServerConfig::default()
        };
        let s = Server::start(config, true).await;
        let binary: Vec<u8> = (0..=255u8).collect();
        let r = upload(
            &s,
            "up",
            &[
                ("path", None, b"docs/a.txt"),
                ("file", Some("ignored-name.txt"), b"alpha\n"),
                ("file", Some("b.bin"), &binary),
            ],
        )
        .send()
        .await
        .unwrap();
        let (st, v) = body(r).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(
            v,
            json!({"files": [{"path": "docs/a.txt", "bytes": 6}, {"path": "b.bin", "bytes": 256}]})
        );
        let got = s
            .req(Method::GET, "/v1/conversations/up/files/docs/a.txt")
            .send()
            .await
            .unwrap();
        assert_eq!(got.bytes().await.unwrap().as_ref(), b"alpha\n");
        let got = s
            .req(Method::GET, "/v1/conversations/up/files/b.bin")
            .send()
            .await
            .unwrap();
        assert_eq!(got.bytes().await.unwrap().as_ref(), &binary[..]);
        assert_eq!(file_len(&s, "up", "ignored-name.txt").await, 0);

        // One bad path refuses the whole upload before anything is written or created.
        let before = s.workspaces();
        for bad in ["../escape.txt", "/etc/passwd", "a/../../b", ""] {
            let r = upload(
                &s,
                "fresh",
                &[
                    ("file", Some("ok.txt"), b"ok"),
                    ("path", None, bad.as_bytes()),
                    ("file", Some("x"), b"x"),
                ],
            )
            .send()
            .await
            .unwrap();
            let (st, v) = body(r).await;
            assert!(
                st == StatusCode::BAD_REQUEST || st == StatusCode::FORBIDDEN,
                "{bad:?}: {st} {v}"
            );
            assert!(v["code"].is_string(), "{v}");
        }
        assert_eq!(
            s.workspaces(),
            before,
            "a refused upload created a conversation"
        );
        assert_eq!(file_len(&s, "up", "ok.txt").await, 0);

        // Not multipart, no file, a stray field, a dangling path: 400. Too big: 413.
        error(
            s.req(Method::POST, "/v1/conversations/up/files")
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        )
        .await;
        for parts in [
            vec![],
            vec![("other", None, b"v".as_slice())],
            vec![
                ("file", Some("a"), b"a".as_slice()),
                ("path", None, b"b".as_slice()),
            ],
        ] {
            error(
                upload(&s, "up", &parts).send().await.unwrap(),
                StatusCode::BAD_REQUEST,
                "invalid_request",
            )
            .await;
        }
        let big = vec![b'z'; 70 * 1024];
        error(
            upload(&s, "up", &[("file", Some("big"), &big)])
                .send()
                .await
                .unwrap(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
        )
        .await;
        assert_eq!(file_len(&s, "up", "big").await, 0);
        s.stop().await;
    })
    .await;
}

/// The value of one series in a Prometheus text exposition (`None` when absent).
fn series(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_count_requests_execs_and_errors_by_route_and_need_a_key() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let r = s
            .client
            .get(format!("{}/metrics", s.base))
            .send()
            .await
            .unwrap();
        error(r, StatusCode::UNAUTHORIZED, "unauthorized").await;

        for _ in 0..2 {
            s.json(
                Method::POST,
                "/v1/conversations/secret-id-42/exec",
                &json!({"command": "true"}),
            )
            .send()
            .await
            .unwrap();
        }
        let mut ev = stream_exec(&s, "secret-id-42", &json!({"command": "echo s"})).await;
        ev.rest().await;
        s.req(Method::GET, "/v1/conversations/nope-7")
            .send()
            .await
            .unwrap();
        s.req(Method::GET, "/no/such/route").send().await.unwrap();

        let r = s.req(Method::GET, "/metrics").send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );
        let text = r.text().await.unwrap();
        let exec = r#"route="/v1/conversations/{id}/exec""#;
        assert_eq!(
            series(
                &text,
                &format!(r#"sessionbox_http_requests_total{{method="POST",{exec},status="200"}}"#)
            ),
            Some(3.0),
            "{text}"
        );
        assert_eq!(
            series(&text, r#"sessionbox_execs_total{mode="json"}"#),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            series(&text, r#"sessionbox_execs_total{mode="stream"}"#),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            series(&text, r#"sessionbox_http_errors_total{code="not_found"}"#),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            series(
                &text,
                r#"sessionbox_http_errors_total{code="unauthorized"}"#
            ),
            Some(1.0),
            "{text}"
        );
        assert!(
            series(
                &text,
                r#"sessionbox_http_requests_total{method="GET",route="unmatched",status="404"}"#
            )
            .is_some(),
            "{text}"
        );
        assert_eq!(
            series(
                &text,
                &format!(
                    r#"sessionbox_http_request_duration_seconds_count{{method="POST",{exec}}}"#
                )
            ),
            Some(3.0),
            "{text}"
        );
        assert_eq!(
            series(&text, "sessionbox_busy_conversations"),
            Some(0.0),
            "{text}"
        );
        assert_eq!(
            series(&text, "sessionbox_background_commands_running"),
            Some(0.0),
            "{text}"
        );
        assert!(
            series(&text, "sessionbox_live_conversations").is_some(),
            "{text}"
        );
        // No id or path becomes a label.
        assert!(
            !text.contains("secret-id-42") && !text.contains("nope-7"),
            "{text}"
        );
        s.stop().await;
    })
    .await;
}

/// Open mode (loopback, no key) against web pages. DNS rebinding: a page whose name now points
/// at 127.0.0.1 sends its own name as `Host`; a cross-site form post carries the page's
/// `Origin`. Both are refused with 403 and nothing runs or is written (checked on the host);
/// local callers (loopback `Host`, no or a loopback `Origin`) are served. A file read back is
/// served with `nosniff` and a sandboxing CSP, so an uploaded page cannot run script on the
/// API's origin.
#[tokio::test]
async fn open_mode_refuses_rebound_hosts_and_foreign_origins_and_files_cannot_script() {
    let s = Server::start(ServerConfig::default(), false).await;
    let run = |host: Option<&str>, origin: Option<&str>| {
        let mut r = s.json(
            Method::POST,
            "/v1/conversations/victim/exec",
            &json!({"command": "echo ran >> proof"}),
        );
        if let Some(h) = host {
            r = r.header("host", h);
        }
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        r.send()
    };
    let local_ws = s.dir.path().join("workspaces").join(
        sessionbox_core::ConversationRef::new(
            TenantId::new("local").unwrap(),
            sessionbox_core::ConversationId::new("victim").unwrap(),
        )
        .key
        .as_str(),
    );
    for (host, origin) in [
        (Some("evil.example"), None),
        (Some("evil.example:7070"), None),
        (Some("127.0.0.1.nip.example"), None),
        (None, Some("http://evil.example")),
        (None, Some("null")),
    ] {
        let r = run(host, origin).await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{host:?} {origin:?}");
        let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        assert_eq!(v["code"], "forbidden", "{v}");
        assert!(!local_ws.join("proof").exists(), "{host:?} {origin:?} ran");
    }
    // A multipart upload from a foreign page (a "simple" request a browser sends without
    // asking) is refused the same way.
    let (content_type, body) = multipart(&[
        ("path", None, b"x.html"),
        ("file", Some("x.html"), b"<script>alert(1)</script>"),
    ]);
    let r = s
        .req(Method::POST, "/v1/conversations/victim/files")
        .header("origin", "http://evil.example")
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(!local_ws.join("x.html").exists());
    // Local callers are served.
    let r = run(None, Some(&s.base)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        std::fs::read_to_string(local_ws.join("proof")).unwrap(),
        "ran\n"
    );
    let r = s
        .req(Method::PUT, "/v1/conversations/victim/files/x.html")
        .body("<script>alert(1)</script>")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = s
        .req(Method::GET, "/v1/conversations/victim/files/x.html")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    let csp = r.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("sandbox"), "{csp}");
    s.stop().await;
}

/// Revoking every key (say, the only one, after a leak) does not re-open the server: requests
/// without a key stay 401, and nothing is created.
#[tokio::test]
async fn revoking_every_key_never_reopens_the_server() {
    let s = Server::start(ServerConfig::default(), false).await;
    let k = s
        .store
        .create_api_key(&TenantId::new("acme").unwrap(), None, Utc::now())
        .unwrap();
    s.store.revoke_api_key(&k.record.id, Utc::now()).unwrap();
    let r = s
        .json(
            Method::POST,
            "/v1/conversations/after-revoke/exec",
            &json!({"command": "true"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(s.workspaces(), 0);
    s.stop().await;
}

/// A quiet command's event stream carries a `: keepalive` comment every few seconds, so that a
/// proxy in front of the server never sees a silent response; the events themselves are
/// unchanged by them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quiet_event_stream_carries_keepalive_comments() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let mut r = s
            .json(
                Method::POST,
                "/v1/conversations/quiet/exec",
                &json!({"command": "sleep 11; echo done"}),
            )
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let mut body = Vec::new();
        while let Some(chunk) = r.chunk().await.unwrap() {
            body.extend_from_slice(&chunk);
        }
        let body = String::from_utf8(body).unwrap();
        let comments = body.lines().filter(|l| *l == ": keepalive").count();
        assert!(
            (2..=3).contains(&comments),
            "{comments} keepalives in 11 s:\n{body}"
        );
        assert!(body.contains("\"text\":\"done\\n\""), "{body}");
        assert!(body.contains("event: exit"), "{body}");
    })
    .await;
}

/// Every route refuses a field or parameter it does not take with 422; a command, an
/// environment or stdin over its limit is 413 naming the limit (never a 500 from the kernel's
/// E2BIG); `stat` shows the mode in octal; refusals name this API's fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_fields_are_422_oversized_exec_input_is_413_and_errors_name_the_fields() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let c = "/v1/conversations/u";
        let r = s
            .json(
                Method::POST,
                &format!("{c}/exec"),
                &json!({"command": "mkdir d && touch d/x && echo 'one one' > a.txt"}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);

        for (method, path, body) in [
            (
                Method::POST,
                format!("{c}/grep"),
                Some(json!({"pattern": "x", "bogus": 1})),
            ),
            (
                Method::POST,
                format!("{c}/edit"),
                Some(json!({"path": "a.txt", "old": "one", "new": "1", "bogus": 1})),
            ),
            (
                Method::POST,
                format!("{c}/mkdir"),
                Some(json!({"path": "e", "bogus": 1})),
            ),
            (
                Method::PUT,
                "/v1/policy".to_owned(),
                Some(json!({"profile": "none", "bogus": 1})),
            ),
            (Method::GET, format!("{c}/ls?path=.&bogus=1"), None),
            (Method::GET, format!("{c}/stat?path=a.txt&bogus=1"), None),
            (Method::GET, format!("{c}/glob?pattern=*&bogus=1"), None),
            (Method::GET, format!("{c}/files/a.txt?bogus=1"), None),
            (Method::DELETE, format!("{c}/files/a.txt?bogus=1"), None),
            (Method::GET, "/v1/conversations?bogus=1".to_owned(), None),
        ] {
            let r = match &body {
                Some(b) => s.json(method.clone(), &path, b),
                None => s.req(method.clone(), &path),
            };
            let (st, v) = body_of(r.send().await.unwrap()).await;
            assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{method} {path}: {v}");
            assert_eq!(v["code"], "invalid_request", "{v}");
            assert!(v["message"].as_str().unwrap().contains("bogus"), "{v}");
        }
        // Nothing of the refused calls happened.
        assert!(s.workspace("u").join("a.txt").exists());
        assert!(!s.workspace("u").join("e").exists());

        let big = "a".repeat(sessionbox_core::MAX_COMMAND_BYTES + 1);
        let env = "a".repeat(sessionbox_core::MAX_ENV_BYTES);
        let stdin = "a".repeat(sessionbox_core::MAX_STDIN_BYTES + 1);
        for (body, limit) in [
            (json!({"command": big}), sessionbox_core::MAX_COMMAND_BYTES),
            (
                json!({"command": "true", "env": {"A": env}}),
                sessionbox_core::MAX_ENV_BYTES,
            ),
            (
                json!({"command": "wc -c", "stdin": stdin}),
                sessionbox_core::MAX_STDIN_BYTES,
            ),
        ] {
            for background in [false, true] {
                let mut body = body.clone();
                body["background"] = background.into();
                let r = s
                    .json(Method::POST, &format!("{c}/exec"), &body)
                    .send()
                    .await
                    .unwrap();
                let (st, v) = body_of(r).await;
                assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
                assert_eq!(v["code"], "too_large", "{v}");
                let m = v["message"].as_str().unwrap();
                assert!(m.contains(&format!("the limit is {limit} bytes")), "{m}");
            }
        }

        let r = s
            .req(Method::GET, &format!("{c}/stat?path=a.txt"))
            .send()
            .await
            .unwrap();
        let (st, v) = body_of(r).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["mode"], "0644", "{v}");

        let r = s
            .req(Method::DELETE, &format!("{c}/files/d"))
            .send()
            .await
            .unwrap();
        let (st, v) = body_of(r).await;
        assert_eq!(st, StatusCode::CONFLICT, "{v}");
        assert_eq!(
            v["message"],
            "conflict: d is a directory that is not empty; add `?recursive=1` to remove it and \
             everything in it"
        );
        let r = s
            .json(
                Method::POST,
                &format!("{c}/edit"),
                &json!({"path": "a.txt", "old": "one", "new": "1"}),
            )
            .send()
            .await
            .unwrap();
        let (st, v) = body_of(r).await;
        assert_eq!(st, StatusCode::CONFLICT, "{v}");
        let m = v["message"].as_str().unwrap();
        assert!(
            m.contains("occurs 2 times in a.txt; give more context in `old`, or set `replace_all`"),
            "{m}"
        );
        s.stop().await;
    })
    .await;
}

/// Attack: one conversation opens follower after follower on a chatty background command
/// (followers hold no turn of the conversation). Past the per-conversation limit the next one
/// is 429 `busy`, a JSON long poll counts too, and a closed follower gives its place back; a
/// follower that does not read holds the server to a few chunks, and another conversation's
/// exec stays quick meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn followers_of_command_output_are_bounded_per_conversation() {
    bounded(async {
        let s = Server::start(ServerConfig::default(), true).await;
        let c = "/v1/conversations/followed";
        let (st, v) = body(
            s.json(
                Method::POST,
                &format!("{c}/exec"),
                &json!({"command": "head -c 8000000 /dev/urandom; sleep 20", "background": true, "output_limit": 16000000}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{v}");
        let id = v["id"].as_str().unwrap().to_owned();
        let logs = format!("{c}/commands/{id}/logs?stdout_offset=0&stderr_offset=0");
        let follow = || {
            s.req(Method::GET, &logs)
                .header("accept", "text/event-stream")
                .send()
        };
        // Followers that never read their bodies.
        let mut held = Vec::new();
        for _ in 0..sessionbox_server::MAX_WAITERS_PER_CONVERSATION {
            let r = follow().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            held.push(r);
        }
        error(follow().await.unwrap(), StatusCode::TOO_MANY_REQUESTS, "busy").await;
        check_status(&s, Method::GET, &format!("{logs}&wait_ms=1000"), None, StatusCode::TOO_MANY_REQUESTS, "busy").await;
        // Another conversation is not held up by them.
        let t = Instant::now();
        let (st, _) = body(
            s.json(Method::POST, "/v1/conversations/other/exec", &json!({"command": "echo hi"}))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        // A closed follower gives its place back.
        drop(held.pop());
        let mut admitted = false;
        for _ in 0..50 {
            let r = follow().await.unwrap();
            if r.status() == StatusCode::OK {
                admitted = true;
                held.push(r);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(admitted, "the place of a closed follower was never given back");
        drop(held);
        s.req(Method::DELETE, c).send().await.unwrap();
    })
    .await;
}

/// CORS: off by default (a preflight from any origin gets no `Access-Control-Allow-Origin`, so
/// a browser hands the page nothing); with an origin configured, that origin's preflight and
/// requests are allowed (the key in `Authorization`, the MCP headers) and another origin's
/// are not. The origin rule refuses what a browser never sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cors_is_off_by_default_and_allows_only_the_configured_origins() {
    bounded(async {
        let preflight = |s: &Server, origin: &'static str| {
            s.client
                .request(Method::OPTIONS, format!("{}/v1/conversations", s.base))
                .header("origin", origin)
                .header("access-control-request-method", "GET")
                .header(
                    "access-control-request-headers",
                    "authorization, x-conversation-id",
                )
                .send()
        };
        let s = Server::start(ServerConfig::default(), true).await;
        let r = preflight(&s, "https://app.example.com").await.unwrap();
        assert!(
            r.headers().get("access-control-allow-origin").is_none(),
            "{:?}",
            r.headers()
        );
        s.stop().await;

        let s = Server::start(
            ServerConfig {
                cors_origins: vec!["https://app.example.com".into()],
                ..ServerConfig::default()
            },
            true,
        )
        .await;
        let r = preflight(&s, "https://app.example.com").await.unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        let h = r.headers();
        assert_eq!(h["access-control-allow-origin"], "https://app.example.com");
        let allowed = h["access-control-allow-headers"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            allowed.contains("authorization") && allowed.contains("x-conversation-id"),
            "{allowed}"
        );
        assert!(h.get("access-control-allow-credentials").is_none());
        let r = preflight(&s, "https://evil.example").await.unwrap();
        assert!(r.headers().get("access-control-allow-origin").is_none());
        // A real request from the allowed origin carries the header; the key still rules.
        let r = s
            .req(Method::GET, "/v1/conversations")
            .header("origin", "https://app.example.com")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.headers()["access-control-allow-origin"],
            "https://app.example.com"
        );
        let r = s
            .client
            .get(format!("{}/v1/conversations", s.base))
            .header("origin", "https://app.example.com")
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::UNAUTHORIZED,
            "CORS grants no access by itself"
        );
        s.stop().await;

        for ok in [
            "https://app.example.com",
            "http://localhost:5173",
            "http://[::1]:8080",
        ] {
            assert!(sessionbox_server::check_cors_origin(ok).is_ok(), "{ok}");
        }
        for bad in [
            "*",
            "app.example.com",
            "https://a.example/",
            "https://a.example/x",
            "ftp://a",
            "https://",
        ] {
            let e = sessionbox_server::check_cors_origin(bad).unwrap_err();
            assert_eq!(e.code(), "invalid_request", "{bad}");
        }
    })
    .await;
}
