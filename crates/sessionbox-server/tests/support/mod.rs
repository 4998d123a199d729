//! What the scoped-key and dashboard tests share: a real server on 127.0.0.1:0 with the
//! `host` runtime, a real SQLite store, snapshots on, and a key of tenant `acme` that reaches
//! everything.

#![allow(dead_code)] // Each test binary uses part of it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use reqwest::{Client, Method, RequestBuilder};
use serde_json::Value;
use sessionbox_core::{ConversationScope, KeyScope, Runtime, TenantId};
use sessionbox_local::host::{HostConfig, HostRuntime};
use sessionbox_manager::{Manager, SnapshotConfig};
use sessionbox_server::{AppState, ServerConfig};
use sessionbox_store::{KeyOptions, Store};

pub(crate) struct Server {
    pub base: String,
    pub client: Client,
    pub store: Store,
    pub dir: tempfile::TempDir,
    /// A key of tenant `acme` that reaches everything.
    pub admin: String,
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
    pub state: AppState,
}

impl Server {
    pub(crate) async fn start() -> Server {
        Self::start_with(ServerConfig::default()).await
    }

    /// A server with `config` (its preview key set, as `serve` sets one).
    pub(crate) async fn start_with(config: ServerConfig) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
        let runtime: Arc<dyn Runtime> =
            Arc::new(HostRuntime::new(HostConfig::new(dir.path())).unwrap());
        let admin = store
            .create_api_key(&acme(), Some("admin"), Utc::now())
            .unwrap()
            .key;
        let manager = Manager::new(store.clone(), runtime)
            .with_snapshots(SnapshotConfig::new(dir.path().join("snapshots")));
        let state = AppState::new(
            manager,
            ServerConfig {
                preview_key: Some(sessionbox_egress::token::TokenKey::from_bytes([7; 32])),
                ..config
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let task = tokio::spawn(sessionbox_server::serve(
            listener,
            state.clone(),
            std::future::pending(),
        ));
        Server {
            base: format!("http://{addr}"),
            client: Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            store,
            dir,
            admin,
            task,
            state,
        }
    }

    pub(crate) fn key(&self, conversations: ConversationScope, read_only: bool) -> String {
        let options = KeyOptions {
            label: Some("scoped".into()),
            scope: KeyScope {
                conversations,
                read_only,
            },
            expires_at: None,
        };
        self.store
            .create_scoped_api_key(&acme(), &options, Utc::now())
            .unwrap()
            .key
    }

    pub(crate) fn req(&self, key: &str, method: Method, path: &str) -> RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key)
    }

    /// Writes `text` to `path` of conversation `id` with the admin key.
    pub(crate) async fn put(&self, id: &str, path: &str, text: &str) {
        let r = self
            .req(
                &self.admin,
                Method::PUT,
                &format!("/v1/conversations/{id}/files/{path}"),
            )
            .body(text.to_owned())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }

    /// The text of `path` in conversation `id`, read with the admin key.
    pub(crate) async fn text(&self, id: &str, path: &str) -> String {
        self.req(
            &self.admin,
            Method::GET,
            &format!("/v1/conversations/{id}/files/{path}"),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
    }

    /// The ids of the tenant's conversations as `key` lists them.
    pub(crate) async fn listed(&self, key: &str) -> Vec<String> {
        let v: Value = self
            .req(key, Method::GET, "/v1/conversations")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .map(|t| serde_json::from_str(&t).unwrap())
            .unwrap();
        let mut ids: Vec<String> = v["conversations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    }

    /// Every (method, path template) of the OpenAPI document, and the MCP routes.
    pub(crate) async fn routes(&self) -> Vec<(Method, String)> {
        let doc: Value = self
            .client
            .get(format!("{}/v1/openapi.json", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .map(|t| serde_json::from_str(&t).unwrap())
            .unwrap();
        let mut routes = Vec::new();
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for method in ops.as_object().unwrap().keys() {
                routes.push((method.to_uppercase().parse().unwrap(), path.clone()));
            }
        }
        assert!(routes.len() > 50, "{routes:?}");
        for path in ["/mcp", "/mcp/new", "/mcp/conversations/{id}"] {
            routes.push((Method::POST, path.to_owned()));
        }
        routes
    }
}

pub(crate) fn acme() -> TenantId {
    TenantId::new("acme").unwrap()
}
