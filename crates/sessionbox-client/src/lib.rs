//! A Rust client of sessionbox's HTTP API (`sessionbox serve`): each conversation is a
//! [`sessionbox_core::Session`], so code written against the library runs unchanged against a
//! server.
//!
//! ```no_run
//! # async fn demo() -> sessionbox_core::Result<()> {
//! use sessionbox_client::Client;
//! use sessionbox_core::{ConversationId, ExecRequest, Session};
//!
//! let client = Client::new("http://127.0.0.1:7070", std::env::var("SESSIONBOX_API_KEY").ok())?;
//! let conv = client.open(&ConversationId::new("chat-42")?).await?;
//! conv.write("notes.txt", b"hello\n").await?;
//! let out = conv.exec(ExecRequest::new("wc -c notes.txt")).await?;
//! assert_eq!(out.stdout, b"6 notes.txt\n");
//! client.destroy(&ConversationId::new("chat-42")?).await?;
//! # Ok(()) }
//! ```
//!
//! Errors: the server's `{"code", "message"}` bodies come back as the matching
//! [`sessionbox_core::Error`] ([`Error::from_code`]); a server that cannot be reached or answers
//! something that is not the API is [`Error::Backend`]. The API key is sent only to the base
//! URL's origin (redirects are not followed) and never appears in errors or `Debug` output.
//!
//! Architecture invariant: this crate knows the wire format of the public API and nothing of
//! runtimes, stores or sandboxes; it depends on `sessionbox-core` alone.

use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::{Method, RequestBuilder};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sessionbox_core::{
    ConversationId, ConversationKey, DirEntry, EditRequest, EditResult, Error, ExecRequest,
    ExecResult, ExitStatus, FileStat, GrepMatch, GrepRequest, Result, Session,
};

/// Characters left as they are in a path segment: the unreserved ones (RFC 3986).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// A conversation id as a path segment (ids are `[A-Za-z0-9._-]`, never all dots).
fn segment(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// A conversation as the server describes it (`GET /v1/conversations/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ConversationInfo {
    /// The conversation id.
    pub id: String,
    /// `active`, ...
    pub state: String,
    /// The runtime that holds it (`isolated`, `host`, ...).
    pub runtime: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was last used.
    pub last_used_at: DateTime<Utc>,
    /// When it expires, if it does.
    pub expires_at: Option<DateTime<Utc>>,
}

/// A client of one sessionbox server, for one API key (hence one tenant). Cheap to clone.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    /// Every server's base URL (one, or several replicas of one service), used in turn.
    bases: std::sync::Arc<[String]>,
    next: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    key: Option<String>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Client {
    /// A client of the server at `base` (`http://HOST:PORT` or `https://...`, no query or
    /// fragment), sending `api_key` as `Authorization: Bearer` (none for an open loopback
    /// server).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a URL that is not plain `http` or `https`.
    pub fn new(base: &str, api_key: Option<String>) -> Result<Client> {
        let url = url::Url::parse(base).map_err(|e| {
            Error::InvalidRequest(format!(
                "server URL {base:?} ({e}) must be http:// or https://HOST[:PORT][/PREFIX]"
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https")
            || url.host().is_none()
            || url.query().is_some()
            || url.fragment().is_some()
            || !url.username().is_empty()
            || url.password().is_some()
        {
            return Err(Error::InvalidRequest(format!(
                "server URL {base:?} must be http:// or https://HOST[:PORT][/PREFIX] with no \
                 user, query or fragment"
            )));
        }
        let http = http_client(Vec::new())?;
        let base = url.as_str().trim_end_matches('/').to_owned();
        Ok(Client {
            http,
            bases: vec![base.clone()].into(),
            next: std::sync::Arc::default(),
            base,
            key: api_key.filter(|k| !k.is_empty()),
        })
    }

    /// The same client, also trusting the CA certificates in the PEM file `path` (one or more
    /// `CERTIFICATE` blocks) for `https://` servers: for a server whose certificate a private
    /// CA signed. The system's roots stay trusted.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the file when it cannot be read or holds no PEM
    /// certificate.
    pub fn with_root_ca_file(mut self, path: &std::path::Path) -> Result<Client> {
        let bad =
            |why: String| Error::InvalidRequest(format!("the CA file {}: {why}", path.display()));
        let pem = std::fs::read(path).map_err(|e| bad(format!("cannot be read: {e}")))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| bad(format!("is not PEM: {e}")))?;
        if certs.is_empty() {
            return Err(bad("holds no CERTIFICATE block".into()));
        }
        self.http = http_client(certs)?;
        Ok(self)
    }

    /// A client of several replicas of one service (sharing one store), each request sent to
    /// the next in turn, so that requests on one conversation reach every replica. The errors
    /// name the first URL.
    ///
    /// # Errors
    /// As [`Client::new`], for any URL; [`Error::InvalidRequest`] when `bases` is empty.
    pub fn with_replicas(bases: &[String], api_key: Option<String>) -> Result<Client> {
        let Some(first) = bases.first() else {
            return Err(Error::InvalidRequest("no server URL given".into()));
        };
        let mut c = Client::new(first, api_key.clone())?;
        let mut all = Vec::with_capacity(bases.len());
        for b in bases {
            all.push(Client::new(b, api_key.clone())?.base);
        }
        c.bases = all.into();
        Ok(c)
    }

    /// The base URL of the next request.
    fn pick(&self) -> &str {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.bases[i % self.bases.len()]
    }

    fn url(&self, id: &ConversationId, tail: &str) -> String {
        format!(
            "{}/v1/conversations/{}{tail}",
            self.pick(),
            segment(id.as_str())
        )
    }

    fn request(&self, method: Method, url: String) -> RequestBuilder {
        let r = self.http.request(method, url);
        match &self.key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    /// Sends `r`; a non-2xx answer becomes the error it carries.
    async fn send(&self, r: RequestBuilder, timeout: Duration) -> Result<reqwest::Response> {
        let resp = r.timeout(timeout).send().await.map_err(|e| {
            Error::Backend(format!(
                "the sessionbox server at {} did not answer: {}",
                self.base,
                e.without_url()
            ))
        })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = resp.bytes().await.unwrap_or_default();
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) if v["code"].is_string() => Err(Error::from_code(
                v["code"].as_str().unwrap_or_default(),
                v["message"].as_str().unwrap_or_default(),
            )),
            _ => Err(Error::Backend(format!(
                "the server at {} answered {status} without an API error body",
                self.base
            ))),
        }
    }

    async fn json<T: DeserializeOwned>(&self, r: RequestBuilder, timeout: Duration) -> Result<T> {
        let resp = self.send(r, timeout).await?;
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| Error::Backend(format!("reading the server's answer: {e}")))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| Error::Backend(format!("the server's answer is not the API's: {e}")))
    }

    /// Opens conversation `id`, creating it when it does not exist
    /// (`POST /v1/conversations/{id}`).
    ///
    /// # Errors
    /// As the server answers: [`Error::InvalidId`] never reaches it (the id is typed), a
    /// refused key is [`Error::Unauthorized`]-coded ([`Error::from_code`]), a full queue is
    /// `busy`.
    pub async fn open(&self, id: &ConversationId) -> Result<RemoteConversation> {
        #[derive(Deserialize)]
        struct Opened {
            created: bool,
            workspace_root: String,
            key: ConversationKey,
        }
        let o: Opened = self
            .json(self.request(Method::POST, self.url(id, "")), CALL_TIMEOUT)
            .await?;
        Ok(RemoteConversation {
            client: self.clone(),
            id: id.clone(),
            key: o.key,
            root: o.workspace_root,
            created: o.created,
        })
    }

    /// The conversation, or `None` when it does not exist.
    ///
    /// # Errors
    /// As the server answers.
    pub async fn get(&self, id: &ConversationId) -> Result<Option<ConversationInfo>> {
        match self
            .json(self.request(Method::GET, self.url(id, "")), CALL_TIMEOUT)
            .await
        {
            Ok(c) => Ok(Some(c)),
            Err(Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every conversation of the key's tenant, following the pages.
    ///
    /// # Errors
    /// As the server answers.
    pub async fn list(&self) -> Result<Vec<ConversationInfo>> {
        #[derive(Deserialize)]
        struct Page {
            conversations: Vec<ConversationInfo>,
            next_cursor: Option<String>,
        }
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut r = self
                .request(Method::GET, format!("{}/v1/conversations", self.pick()))
                .query(&[("limit", "1000")]);
            if let Some(c) = &cursor {
                r = r.query(&[("cursor", c)]);
            }
            let page: Page = self.json(r, CALL_TIMEOUT).await?;
            all.extend(page.conversations);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return Ok(all),
            }
        }
    }

    /// Destroys conversation `id` (processes, sandbox, workspace, record); succeeds also when
    /// it did not exist.
    ///
    /// # Errors
    /// As the server answers.
    pub async fn destroy(&self, id: &ConversationId) -> Result<()> {
        self.send(self.request(Method::DELETE, self.url(id, "")), CALL_TIMEOUT)
            .await
            .map(drop)
    }

    /// Takes snapshot `name` of conversation `id` (`POST .../snapshots`); answers the
    /// snapshot as the server shows it.
    ///
    /// # Errors
    /// As the server answers: `already_exists`, `too_large`, `not_found`.
    pub async fn snapshot(&self, id: &ConversationId, name: &str) -> Result<Value> {
        let r = self
            .request(Method::POST, self.url(id, "/snapshots"))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(json!({ "name": name }).to_string());
        self.json(r, CALL_TIMEOUT).await
    }

    /// Makes conversation `to` from conversation `id` as it is now (`POST .../fork`).
    ///
    /// # Errors
    /// As the server answers: `already_exists` when `to` exists.
    pub async fn fork(&self, id: &ConversationId, to: &ConversationId) -> Result<Value> {
        let r = self
            .request(Method::POST, self.url(id, "/fork"))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(json!({ "to": to.as_str() }).to_string());
        self.json(r, CALL_TIMEOUT).await
    }

    /// Makes conversation `to` from snapshot `name` (`POST /v1/snapshots/{name}/fork`).
    ///
    /// # Errors
    /// As the server answers.
    pub async fn fork_snapshot(&self, name: &str, to: &ConversationId) -> Result<Value> {
        let url = format!("{}/v1/snapshots/{}/fork", self.pick(), segment(name));
        let r = self
            .request(Method::POST, url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(json!({ "to": to.as_str() }).to_string());
        self.json(r, CALL_TIMEOUT).await
    }

    /// Deletes snapshot `name` (`DELETE /v1/snapshots/{name}`); succeeds when absent.
    ///
    /// # Errors
    /// As the server answers: `conflict` while a template names it.
    pub async fn delete_snapshot(&self, name: &str) -> Result<()> {
        let url = format!("{}/v1/snapshots/{}", self.pick(), segment(name));
        self.send(self.request(Method::DELETE, url), CALL_TIMEOUT)
            .await
            .map(drop)
    }
}

/// How long a call other than exec may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// One conversation on a server; a [`Session`]. Holds no server-side resource: `close` only
/// drops it.
#[derive(Debug)]
pub struct RemoteConversation {
    client: Client,
    id: ConversationId,
    key: ConversationKey,
    root: String,
    created: bool,
}

impl RemoteConversation {
    /// True when the [`Client::open`] that returned this created the conversation.
    pub fn created(&self) -> bool {
        self.created
    }

    /// The conversation id.
    pub fn id(&self) -> &ConversationId {
        &self.id
    }

    /// `.../files/{path}` with the whole path as one percent-encoded segment (`/` as `%2F`),
    /// so that no URL parser on the way resolves its `.` and `..` (WHATWG URLs resolve even
    /// `%2E%2E`): the server's path policy sees the path as written.
    fn file_url(&self, path: &str) -> Result<String> {
        if path.is_empty() {
            return Err(Error::InvalidPath {
                path: String::new(),
                reason: "the path is empty".into(),
            });
        }
        // A path of only dots would still be a dot segment: "./.." means the same and is not.
        let path = if path.bytes().all(|b| b == b'.') {
            format!("./{path}")
        } else {
            path.to_owned()
        };
        let encoded = utf8_percent_encode(&path, SEGMENT);
        Ok(self.client.url(&self.id, &format!("/files/{encoded}")))
    }

    fn call(&self, method: Method, tail: &str) -> RequestBuilder {
        self.client.request(method, self.client.url(&self.id, tail))
    }
}

#[derive(Deserialize)]
struct ExecView {
    status: ExitStatus,
    stdout: String,
    stdout_base64: Option<String>,
    stderr: String,
    stderr_base64: Option<String>,
    stdout_truncated: bool,
    stderr_truncated: bool,
    timed_out: bool,
    duration_ms: u64,
}

fn bytes_of(text: String, b64: Option<String>) -> Result<Vec<u8>> {
    match b64 {
        None => Ok(text.into_bytes()),
        Some(b) => BASE64
            .decode(b)
            .map_err(|e| Error::Backend(format!("the server sent invalid base64 output: {e}"))),
    }
}

#[async_trait]
impl Session for RemoteConversation {
    fn key(&self) -> &ConversationKey {
        &self.key
    }

    fn workspace_root(&self) -> &str {
        &self.root
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecResult> {
        let mut body = json!({
            "command": request.command,
            "env": request.env,
            "timeout_ms": u64::try_from(request.timeout.as_millis()).unwrap_or(u64::MAX),
            "output_limit": request.output_limit,
        });
        if let Some(cwd) = &request.cwd {
            body["cwd"] = json!(cwd);
        }
        if let Some(stdin) = &request.stdin {
            body["stdin_base64"] = json!(BASE64.encode(stdin));
        }
        let r = self
            .call(Method::POST, "/exec")
            .header("content-type", "application/json")
            .body(body.to_string());
        // The command's own timeout, plus time for the sandbox to start and answer.
        let v: ExecView = self
            .client
            .json(r, request.timeout + Duration::from_secs(60))
            .await?;
        Ok(ExecResult {
            status: v.status,
            stdout: bytes_of(v.stdout, v.stdout_base64)?,
            stderr: bytes_of(v.stderr, v.stderr_base64)?,
            stdout_truncated: v.stdout_truncated,
            stderr_truncated: v.stderr_truncated,
            timed_out: v.timed_out,
            duration: Duration::from_millis(v.duration_ms),
        })
    }

    async fn read(&self, path: &str) -> Result<Vec<u8>> {
        let r = self.client.request(Method::GET, self.file_url(path)?);
        let resp = self.client.send(r, CALL_TIMEOUT).await?;
        resp.bytes()
            .await
            .map(|b| b.to_vec())
            .map_err(|e| Error::Backend(format!("reading {path:?} from the server: {e}")))
    }

    async fn write(&self, path: &str, data: &[u8]) -> Result<()> {
        let r = self
            .client
            .request(Method::PUT, self.file_url(path)?)
            .body(data.to_vec());
        self.client.send(r, CALL_TIMEOUT).await.map(drop)
    }

    async fn edit(&self, path: &str, edit: &EditRequest) -> Result<EditResult> {
        let body = json!({"path": path, "old": edit.old, "new": edit.new, "replace_all": edit.replace_all});
        let r = self
            .call(Method::POST, "/edit")
            .header("content-type", "application/json")
            .body(body.to_string());
        self.client.json(r, CALL_TIMEOUT).await
    }

    async fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        #[derive(Deserialize)]
        struct Ls {
            entries: Vec<DirEntry>,
        }
        let r = self.call(Method::GET, "/ls").query(&[("path", path)]);
        Ok(self.client.json::<Ls>(r, CALL_TIMEOUT).await?.entries)
    }

    async fn glob(&self, pattern: &str) -> Result<Vec<String>> {
        #[derive(Deserialize)]
        struct Glob {
            paths: Vec<String>,
        }
        let r = self
            .call(Method::GET, "/glob")
            .query(&[("pattern", pattern)]);
        Ok(self.client.json::<Glob>(r, CALL_TIMEOUT).await?.paths)
    }

    async fn grep(&self, request: &GrepRequest) -> Result<Vec<GrepMatch>> {
        #[derive(Deserialize)]
        struct Grep {
            matches: Vec<GrepMatch>,
        }
        let body = serde_json::to_string(request)
            .map_err(|e| Error::InvalidRequest(format!("grep request: {e}")))?;
        let r = self
            .call(Method::POST, "/grep")
            .header("content-type", "application/json")
            .body(body);
        Ok(self.client.json::<Grep>(r, CALL_TIMEOUT).await?.matches)
    }

    async fn stat(&self, path: &str) -> Result<FileStat> {
        let r = self.call(Method::GET, "/stat").query(&[("path", path)]);
        self.client.json(r, CALL_TIMEOUT).await
    }

    async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        let mut r = self.client.request(Method::DELETE, self.file_url(path)?);
        if recursive {
            r = r.query(&[("recursive", "1")]);
        }
        self.client.send(r, CALL_TIMEOUT).await.map(drop)
    }

    async fn mkdir(&self, path: &str) -> Result<()> {
        let r = self
            .call(Method::POST, "/mkdir")
            .header("content-type", "application/json")
            .body(json!({"path": path}).to_string());
        self.client.send(r, CALL_TIMEOUT).await.map(drop)
    }

    async fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

/// The HTTP client of [`Client`]: no redirects, a 10 s connect timeout, the system's roots and
/// `extra_roots`.
fn http_client(extra_roots: Vec<reqwest::Certificate>) -> Result<reqwest::Client> {
    let mut b = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10));
    for c in extra_roots {
        b = b.add_root_certificate(c);
    }
    b.build()
        .map_err(|e| Error::Backend(format!("cannot build the HTTP client: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(segment("a.txt"), "a.txt");
        assert_eq!(segment("a b/c"), "a%20b%2Fc");
        assert_eq!(segment("é"), "%C3%A9");
    }

    #[test]
    fn only_plain_http_urls_are_accepted_and_the_key_is_never_shown() {
        for bad in [
            "ftp://h",
            "http://u:p@h",
            "http://h/?q=1",
            "http://h/#f",
            "not a url",
            "unix:/tmp/s",
        ] {
            assert!(
                matches!(Client::new(bad, None), Err(Error::InvalidRequest(_))),
                "{bad}"
            );
        }
        let c = Client::new("http://127.0.0.1:7070/", Some("sbk_secret".into())).unwrap();
        assert_eq!(c.base, "http://127.0.0.1:7070");
        assert!(!format!("{c:?}").contains("sbk_secret"));
    }
}
