//! The REST API end to end: a real server on 127.0.0.1:0, a real HTTP client (reqwest), the
//! real `host` runtime and a real SQLite store. (The `isolated` runtime needs the `sessionbox`
//! binary; `crates/sessionbox/tests/serve.rs` drives `sessionbox serve` with it.)

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

struct Server {
    base: String,
    client: Client,
    store: Store,
    dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    /// Key of tenant `acme`.
    key: String,
}

impl Server {
    async fn start(mut config: ServerConfig, with_key: bool) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
        let runtime: Arc<dyn Runtime> =
            Arc::new(HostRuntime::new(HostConfig::new(dir.path())).unwrap());
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
        let task = tokio::spawn(sessionbox_server::serve(listener, state, async {
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
        error(
            s.req(Method::GET, "/no/such/route").send().await.unwrap(),
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;
        error(
            s.req(Method::PATCH, "/v1/conversations/a")
                .send()
                .await
                .unwrap(),
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
            error(
                s.json(Method::POST, "/v1/conversations/c1/exec", &bad)
                    .send()
                    .await
                    .unwrap(),
                StatusCode::BAD_REQUEST,
                "invalid_request",
            )
            .await;
        }
        error(
            s.json(
                Method::POST,
                "/v1/conversations/c1/exec",
                &json!({"command": "true", "cwd": "../x"}),
            )
            .send()
            .await
            .unwrap(),
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
        error(
            s.json(
                Method::POST,
                &format!("{base}/edit"),
                &json!({"path": "dir/a.txt", "old": "e", "new": "E"}),
            )
            .send()
            .await
            .unwrap(),
            StatusCode::CONFLICT,
            "conflict",
        )
        .await;
        error(
            s.json(
                Method::POST,
                &format!("{base}/edit"),
                &json!({"path": "nope.txt", "old": "e", "new": "E"}),
            )
            .send()
            .await
            .unwrap(),
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
        error(
            s.req(Method::GET, &format!("{base}/files/bin.dat"))
                .send()
                .await
                .unwrap(),
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
        error(
            s.req(Method::DELETE, &format!("{base}/files/dir"))
                .send()
                .await
                .unwrap(),
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
        error(
            s.req(Method::GET, "/v1/conversations?limit=0")
                .send()
                .await
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        )
        .await;
        error(
            s.req(Method::GET, "/v1/conversations?limit=x")
                .send()
                .await
                .unwrap(),
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
        error(
            s.req(Method::GET, "/v1/conversations/a")
                .send()
                .await
                .unwrap(),
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;
        // Reading from an absent conversation is 404 and does not create it.
        error(
            s.req(Method::GET, "/v1/conversations/a/files/x")
                .send()
                .await
                .unwrap(),
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
        error(
            s.req(Method::POST, "/v1/conversations/a%20b")
                .send()
                .await
                .unwrap(),
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
        error(
            s.json(Method::POST, "/v1/conversations/o/exec", &big)
                .send()
                .await
                .unwrap(),
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
        assert!(err.to_string().contains("keys create"), "{err}");
        sessionbox_server::check_listen(&"127.0.0.1:7070".parse().unwrap(), &empty).unwrap();
        sessionbox_server::check_listen(&"[::1]:7070".parse().unwrap(), &empty).unwrap();
        sessionbox_server::check_listen(&any, &s.store).unwrap();
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
        exec_props.retain(|p| !p.ends_with("_base64"));
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
        assert_eq!(keys(&v), properties(&doc, "Conversation"));
        let (_, v) = body(s.req(Method::POST, base).send().await.unwrap()).await;
        assert_eq!(keys(&v), properties(&doc, "OpenedConversation"));
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
