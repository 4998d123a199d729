//! Proxy tokens for remote runtimes: a short-lived, signed statement "conversation K, policy
//! hash H, valid until T", carried in `Proxy-Authorization` and checked on every request.
//!
//! Format: `sbx1.<base64url(JSON payload)>.<base64url(HMAC-SHA256(key, "sbx1." + payload))>`.
//! The key is 32 random bytes kept in the data directory ([`TokenKey::load_or_create`]); it is
//! never logged, and a token's text never reaches a log line (only its conversation does).
//!
//! ```
//! use sessionbox_egress::token::TokenKey;
//! let key = TokenKey::from_bytes([7; 32]);
//! let t = key.issue("k".repeat(64).as_str(), "h", 1_000, 60);
//! let claims = key.verify(&t, 1_030).unwrap();
//! assert_eq!(claims.policy_hash, "h");
//! assert!(key.verify(&t, 1_061).is_err()); // expired
//! ```

use std::io::Write;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

const PREFIX: &str = "sbx1.";

/// What a valid token states.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The conversation key (hex SHA-256 of tenant and id).
    #[serde(rename = "c")]
    pub conversation: String,
    /// The hash of the policy it was issued under.
    #[serde(rename = "h")]
    pub policy_hash: String,
    /// Expiry, seconds since the Unix epoch.
    #[serde(rename = "e")]
    pub expires: u64,
}

const PREVIEW_PREFIX: &str = "sbxp1.";

/// What a preview link token states: one port of one conversation, until a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviewClaims {
    /// The conversation's tenant.
    #[serde(rename = "t")]
    pub tenant: String,
    /// The conversation's id.
    #[serde(rename = "i")]
    pub conversation: String,
    /// The port inside the sandbox.
    #[serde(rename = "p")]
    pub port: u16,
    /// When the conversation's record was made (milliseconds since the epoch): the link
    /// reaches that conversation only, not one made again under its id after a destroy.
    #[serde(rename = "g")]
    pub created: i64,
    /// Expiry, seconds since the Unix epoch.
    #[serde(rename = "e")]
    pub expires: u64,
    /// The id of the key that made the link: the link works only while that key does.
    #[serde(rename = "k", default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
}

const TERMINAL_PREFIX: &str = "sbxt1.";

/// What a terminal ticket states: one terminal of one conversation, opened once, before a
/// time, on behalf of a key. For clients that cannot send a key on a WebSocket (browsers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalClaims {
    /// The conversation's tenant.
    #[serde(rename = "t")]
    pub tenant: String,
    /// The conversation's id.
    #[serde(rename = "i")]
    pub conversation: String,
    /// The id of the key it was issued to, for the audit log.
    #[serde(rename = "k")]
    pub key_id: Option<String>,
    /// Random, so the server can refuse a second use.
    #[serde(rename = "n")]
    pub nonce: String,
    /// Expiry, seconds since the Unix epoch.
    #[serde(rename = "e")]
    pub expires: u64,
}

/// Why a token was refused (never carries the token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not a token of this format.
    #[error("the token is malformed")]
    Malformed,
    /// The signature does not match.
    #[error("the token's signature does not match")]
    BadSignature,
    /// It expired.
    #[error("the token expired; ask for a new one")]
    Expired,
}

/// The signing key.
#[derive(Clone)]
pub struct TokenKey([u8; 32]);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    /// A key from bytes (tests, and keys derived from another secret).
    pub fn from_bytes(b: [u8; 32]) -> Self {
        TokenKey(b)
    }

    /// Reads the key file, or creates it (0600, 32 bytes from `/dev/urandom`) when absent.
    ///
    /// # Errors
    /// An I/O error, or a file that is not 32 bytes.
    pub fn load_or_create(path: &Path) -> std::io::Result<Self> {
        match std::fs::read(path) {
            Ok(b) => <[u8; 32]>::try_from(b.as_slice())
                .map(TokenKey)
                .map_err(|_| {
                    std::io::Error::other(format!("{} is not a 32-byte key", path.display()))
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                use std::io::Read;
                use std::os::unix::fs::OpenOptionsExt;
                let mut b = [0u8; 32];
                std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path);
                match &mut f {
                    Ok(f) => f.write_all(&b)?,
                    // Another process made it first: use theirs.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        return Self::load_or_create(path);
                    }
                    Err(_) => return f.map(|_| TokenKey(b)),
                }
                Ok(TokenKey(b))
            }
            Err(e) => Err(e),
        }
    }

    /// The MAC of `prefix` and `payload`: each kind of token signs under its own prefix, so
    /// no token of one kind is ever a valid token of another.
    fn mac_of(&self, prefix: &str, payload: &str) -> Hmac<Sha256> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).expect("any key length");
        m.update(prefix.as_bytes());
        m.update(payload.as_bytes());
        m
    }

    /// Issues a preview link token: "port `port` of conversation `id` of `tenant`, until
    /// `now + ttl_secs`" (`sbxp1.<base64url(JSON)>.<base64url(HMAC-SHA256)>`). Whoever holds
    /// it may reach that port through `serve` until it expires, and nothing else.
    pub fn issue_preview(&self, claims: &PreviewClaims) -> String {
        self.sign(PREVIEW_PREFIX, claims)
    }

    /// Checks a preview link token's signature (in constant time) and expiry at `now`.
    ///
    /// # Errors
    /// [`TokenError`].
    pub fn verify_preview(&self, token: &str, now: u64) -> Result<PreviewClaims, TokenError> {
        let claims: PreviewClaims = self.open(PREVIEW_PREFIX, token)?;
        if now >= claims.expires {
            return Err(TokenError::Expired);
        }
        Ok(claims)
    }

    /// Issues a terminal ticket (`sbxt1.<base64url(JSON)>.<base64url(HMAC-SHA256)>`).
    pub fn issue_terminal(&self, claims: &TerminalClaims) -> String {
        self.sign(TERMINAL_PREFIX, claims)
    }

    /// Checks a terminal ticket's signature (in constant time) and expiry at `now`; whether it
    /// was used already is the caller's to check (by its nonce).
    ///
    /// # Errors
    /// [`TokenError`].
    pub fn verify_terminal(&self, token: &str, now: u64) -> Result<TerminalClaims, TokenError> {
        let claims: TerminalClaims = self.open(TERMINAL_PREFIX, token)?;
        if now >= claims.expires {
            return Err(TokenError::Expired);
        }
        Ok(claims)
    }

    /// `prefix`, `claims` as base64url JSON, and their MAC.
    fn sign(&self, prefix: &str, claims: &impl Serialize) -> String {
        let payload = B64.encode(serde_json::to_vec(claims).unwrap_or_default());
        let sig = B64.encode(self.mac_of(prefix, &payload).finalize().into_bytes());
        format!("{prefix}{payload}.{sig}")
    }

    /// The claims of a token [`TokenKey::sign`] made under `prefix`, once its MAC is checked
    /// (in constant time, before the payload is parsed).
    fn open<T: for<'de> Deserialize<'de>>(
        &self,
        prefix: &str,
        token: &str,
    ) -> Result<T, TokenError> {
        let rest = token.strip_prefix(prefix).ok_or(TokenError::Malformed)?;
        let (payload, sig) = rest.split_once('.').ok_or(TokenError::Malformed)?;
        let sig = B64.decode(sig).map_err(|_| TokenError::Malformed)?;
        self.mac_of(prefix, payload)
            .verify_slice(&sig)
            .map_err(|_| TokenError::BadSignature)?;
        B64.decode(payload)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(TokenError::Malformed)
    }

    /// The access token of the agent in `conversation`'s remote sandbox (a conversation key):
    /// 64 hex digits, HMAC-SHA256 of the key over a prefix of its own (so it can never be
    /// mistaken for, or forged from, a proxy token) and the conversation key. The same for every
    /// process holding the key, so any CLI call or server replica can reach the agent (the
    /// binary derives the key from the OpenSandbox API key, which every replica holds); it is
    /// handed to the sandbox once, at create, and to no command.
    pub fn agent_token(&self, conversation: &str) -> String {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).expect("any key length");
        m.update(b"sessionbox agent token\n");
        m.update(conversation.as_bytes());
        m.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Issues a token for `conversation` under `policy_hash`, valid `ttl_secs` from `now`.
    pub fn issue(&self, conversation: &str, policy_hash: &str, now: u64, ttl_secs: u64) -> String {
        let claims = Claims {
            conversation: conversation.to_owned(),
            policy_hash: policy_hash.to_owned(),
            expires: now.saturating_add(ttl_secs),
        };
        self.sign(PREFIX, &claims)
    }

    /// Checks the signature (in constant time) and the expiry at `now`.
    ///
    /// # Errors
    /// [`TokenError`].
    pub fn verify(&self, token: &str, now: u64) -> Result<Claims, TokenError> {
        let claims: Claims = self.open(PREFIX, token)?;
        if now >= claims.expires {
            return Err(TokenError::Expired);
        }
        Ok(claims)
    }
}

/// The proxy URL a remote sandbox's commands use: `http://sessionbox:TOKEN@GATEWAY`, where
/// `gateway` is `host:port` as the sandbox reaches it. Clients send the token as the password
/// of `Proxy-Authorization: Basic` (read back by [`from_proxy_authorization`]). A token is
/// `sbx1.` and base64url text, so it needs no escaping in a URL.
pub fn proxy_url(gateway: &str, token: &str) -> String {
    format!("http://sessionbox:{token}@{gateway}")
}

/// The environment that points a command at `proxy_url`: `HTTP_PROXY`, `HTTPS_PROXY` and
/// `ALL_PROXY` in both cases, and `NO_PROXY` (both cases) for loopback only. The values carry
/// a token: they go into a command's environment and nowhere else (never a log line, an
/// error or the audit).
pub fn proxy_env(proxy_url: &str) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for k in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.push((k.to_owned(), proxy_url.to_owned()));
        env.push((k.to_ascii_lowercase(), proxy_url.to_owned()));
    }
    for k in ["NO_PROXY", "no_proxy"] {
        env.push((k.to_owned(), "localhost,127.0.0.1,::1".to_owned()));
    }
    env
}

/// How commands in remote sandboxes reach the egress gateway (`sessionbox egress-gateway
/// --listen`): its address as the sandboxes see it, and the key that signs their tokens (the
/// gateway's data directory's `egress.key`). Used by every remote runtime (`opensandbox`,
/// `aio`) to give a command the proxy variables with a token of its own.
#[derive(Debug, Clone)]
pub struct GatewayAccess {
    host: crate::target::Host,
    port: u16,
    key: TokenKey,
}

impl GatewayAccess {
    /// `address` is `HOST:PORT` as the sandboxes reach the gateway (a name, an IPv4 address,
    /// or an IPv6 address in brackets).
    ///
    /// # Errors
    /// [`crate::PolicyError`] naming the address when it is not `HOST:PORT`.
    pub fn new(address: &str, key: TokenKey) -> Result<Self, crate::PolicyError> {
        let target = crate::target::parse_authority(address)?;
        Ok(GatewayAccess {
            host: target.host,
            port: target.port,
            key,
        })
    }

    /// `host:port`, as commands get it in their proxy URL.
    pub fn address(&self) -> String {
        crate::target::Target {
            host: self.host.clone(),
            port: self.port,
        }
        .to_string()
    }

    /// The gateway's host as a `networkPolicy` target names it: the name, or the address
    /// without brackets.
    pub fn host(&self) -> String {
        match &self.host {
            crate::target::Host::Name(n) => n.clone(),
            crate::target::Host::Ip(ip) => ip.to_string(),
        }
    }

    /// The gateway's TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The gateway's host name; `None` for an address.
    pub fn host_name(&self) -> Option<&str> {
        match &self.host {
            crate::target::Host::Name(n) => Some(n),
            crate::target::Host::Ip(_) => None,
        }
    }

    /// The environment for one command of `conversation` (a conversation key) under `policy`:
    /// [`proxy_env`] with a fresh token valid `ttl` from now; empty for the profile `none`,
    /// which has no network to reach. The values carry the token: put them into that command's
    /// environment and nowhere else.
    pub fn command_env(
        &self,
        conversation: &str,
        policy: &crate::Policy,
        ttl: std::time::Duration,
    ) -> Vec<(String, String)> {
        if policy.is_none() {
            return Vec::new();
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let token = self
            .key
            .issue(conversation, &policy.hash(), now, ttl.as_secs().max(1));
        proxy_env(&proxy_url(&self.address(), &token))
    }
}

/// The token in a `Proxy-Authorization` value: `Bearer TOKEN`, or `Basic` with the token as the
/// password (what `http://user:TOKEN@gateway:port` in `HTTPS_PROXY` makes clients send).
pub fn from_proxy_authorization(value: &str) -> Option<String> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(rest.trim().to_owned());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest.trim())
            .ok()?;
        let text = String::from_utf8(decoded).ok()?;
        return text.split_once(':').map(|(_, p)| p.to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_ticket_is_its_own_kind_and_expires() {
        let key = TokenKey::from_bytes([3; 32]);
        let claims = TerminalClaims {
            tenant: "acme".into(),
            conversation: "c1".into(),
            key_id: Some("0123".into()),
            nonce: "n1".into(),
            expires: 160,
        };
        let t = key.issue_terminal(&claims);
        assert_eq!(key.verify_terminal(&t, 100), Ok(claims.clone()));
        assert_eq!(key.verify_terminal(&t, 160), Err(TokenError::Expired));
        // Not a preview link, and a preview link is not a ticket.
        assert_eq!(key.verify_preview(&t, 100), Err(TokenError::Malformed));
        let other = TokenKey::from_bytes([4; 32]);
        assert_eq!(
            other.verify_terminal(&t, 100),
            Err(TokenError::BadSignature)
        );
    }

    #[test]
    fn a_tampered_or_foreign_token_is_refused() {
        let key = TokenKey::from_bytes([1; 32]);
        let t = key.issue("conv", "hash", 100, 60);
        assert!(key.verify(&t, 120).is_ok());
        // Another key.
        assert_eq!(
            TokenKey::from_bytes([2; 32]).verify(&t, 120),
            Err(TokenError::BadSignature)
        );
        // A payload swapped for another conversation's, keeping the signature.
        let other = key.issue("other", "hash", 100, 60);
        let (_, sig) = t.rsplit_once('.').unwrap();
        let (head, _) = other.rsplit_once('.').unwrap();
        assert_eq!(
            key.verify(&format!("{head}.{sig}"), 120),
            Err(TokenError::BadSignature)
        );
        assert_eq!(key.verify("nope", 120), Err(TokenError::Malformed));
        assert_eq!(key.verify(&t, 160), Err(TokenError::Expired));
    }

    #[test]
    fn a_preview_token_names_one_port_and_is_never_a_proxy_token() {
        let key = TokenKey::from_bytes([1; 32]);
        let claims = PreviewClaims {
            tenant: "t".into(),
            conversation: "c".into(),
            port: 8000,
            created: 1,
            expires: 160,
            key_id: Some("0123456789abcdef".into()),
        };
        let t = key.issue_preview(&claims);
        assert_eq!(key.verify_preview(&t, 120), Ok(claims.clone()));
        assert_eq!(key.verify_preview(&t, 160), Err(TokenError::Expired));
        // Neither kind passes as the other, even with the prefix swapped.
        let proxy = key.issue("c", "h", 100, 60);
        assert_eq!(key.verify(&t, 120), Err(TokenError::Malformed));
        assert_eq!(key.verify_preview(&proxy, 120), Err(TokenError::Malformed));
        let disguised = t.replacen("sbxp1.", "sbx1.", 1);
        assert_eq!(key.verify(&disguised, 120), Err(TokenError::BadSignature));
        // Another port, same signature.
        let other = key.issue_preview(&PreviewClaims {
            port: 8001,
            ..claims
        });
        let (_, sig) = t.rsplit_once('.').unwrap();
        let (head, _) = other.rsplit_once('.').unwrap();
        assert_eq!(
            key.verify_preview(&format!("{head}.{sig}"), 120),
            Err(TokenError::BadSignature)
        );
    }

    #[test]
    fn proxy_authorization_carries_the_token_as_bearer_or_basic_password() {
        assert_eq!(
            from_proxy_authorization("Bearer abc").as_deref(),
            Some("abc")
        );
        let basic = base64::engine::general_purpose::STANDARD.encode("sessionbox:abc");
        assert_eq!(
            from_proxy_authorization(&format!("Basic {basic}")).as_deref(),
            Some("abc")
        );
        assert_eq!(from_proxy_authorization("Digest x"), None);
    }

    #[test]
    fn the_proxy_url_carries_the_token_as_the_basic_password() {
        let key = TokenKey::from_bytes([3; 32]);
        let t = key.issue("conv", "hash", 100, 60);
        let url = proxy_url("egress.internal.example:3128", &t);
        let parsed = url::Url::parse(&url).unwrap();
        assert_eq!(parsed.username(), "sessionbox");
        assert_eq!(
            parsed.password(),
            Some(t.as_str()),
            "no escaping changed it"
        );
        assert_eq!(parsed.host_str(), Some("egress.internal.example"));
        assert_eq!(parsed.port(), Some(3128));
        // What a client sends for that URL is read back to the same, valid token.
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("sessionbox:{t}"));
        let back = from_proxy_authorization(&format!("Basic {basic}")).unwrap();
        assert_eq!(key.verify(&back, 120).unwrap().conversation, "conv");
        let env = proxy_env(&url);
        for k in ["HTTP_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"] {
            assert!(env.iter().any(|(n, v)| n == k && *v == url), "{k}");
        }
        assert!(env.iter().any(|(n, _)| n == "NO_PROXY"));
    }

    #[test]
    fn the_key_file_is_created_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("egress.key");
        let a = TokenKey::load_or_create(&p).unwrap();
        let b = TokenKey::load_or_create(&p).unwrap();
        assert_eq!(a.0, b.0);
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
