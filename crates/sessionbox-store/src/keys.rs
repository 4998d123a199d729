//! API keys of the HTTP server.
//!
//! A key is `sbk_<id>_<secret>`: `id` is 16 hex digits naming the key in listings and the audit
//! log, `secret` 64 hex digits (32 bytes from the kernel's `getrandom`). The whole key is shown
//! once, when it is made; the store keeps only its SHA-256 (a fast hash is enough for 256 random
//! bits), and [`Store::verify_api_key`] compares hashes in constant time.
//!
//! A key may be narrowed ([`KeyScope`]: one conversation or an id prefix, read-only) and may
//! expire. The store keeps and returns the scope; the server enforces it on every route.

use std::ops::Not;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sessionbox_core::{ConversationId, ConversationScope, Error, KeyScope, Result, TenantId};
use sha2::{Digest, Sha256};

use crate::db::Row;
use crate::{Store, time};

/// What every API key starts with, so leaked keys are easy to find by scanners.
pub const API_KEY_PREFIX: &str = "sbk_";

const ID_BYTES: usize = 8;
const SECRET_BYTES: usize = 32;

/// One API key as stored (without its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    /// The key's public id (16 hex digits).
    pub id: String,
    /// The tenant whose conversations it reaches.
    pub tenant: TenantId,
    /// A note for people (who or what uses it).
    pub label: Option<String>,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When it was revoked; `None` while it is valid.
    pub revoked_at: Option<DateTime<Utc>>,
    /// What it may reach within its tenant.
    #[serde(default)]
    pub scope: KeyScope,
    /// When it stops being accepted; `None` for never.
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
}

/// What a new key is made with beyond its tenant.
#[derive(Debug, Clone, Default)]
pub struct KeyOptions {
    /// A note for people: at most 200 characters, no control characters.
    pub label: Option<String>,
    /// What it may reach.
    pub scope: KeyScope,
    /// When it stops being accepted; must be later than its creation.
    pub expires_at: Option<DateTime<Utc>>,
}

/// What [`Store::verify_api_key`] found for a presented key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyCheck {
    /// Known, not revoked, not expired.
    Valid(ApiKeyRecord),
    /// Known and not revoked, but expired at this time.
    Expired(DateTime<Utc>),
    /// Unknown, malformed, wrong or revoked (which of these is not said).
    Invalid,
}

impl ApiKeyRecord {
    /// True when the key is accepted at `now`: not revoked, not expired.
    pub fn is_accepted_at(&self, now: DateTime<Utc>) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| at > now)
    }
}

/// A key just made by [`Store::create_api_key`]: the record and the secret, which is not kept.
#[derive(Debug, Clone)]
pub struct NewApiKey {
    /// The stored record.
    pub record: ApiKeyRecord,
    /// The whole key, `sbk_<id>_<secret>`. Show it once; it cannot be recovered.
    pub key: String,
}

const COLUMNS: &str =
    "id, tenant, label, created_at, revoked_at, conversation, id_prefix, read_only, expires_at";

impl Store {
    /// Makes an API key for `tenant` that reaches all of its conversations and never expires.
    ///
    /// # Errors
    /// As [`Store::create_scoped_api_key`].
    pub fn create_api_key(
        &self,
        tenant: &TenantId,
        label: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<NewApiKey> {
        let options = KeyOptions {
            label: label.map(str::to_owned),
            ..KeyOptions::default()
        };
        self.create_scoped_api_key(tenant, &options, now)
    }

    /// Makes an API key for `tenant` with a scope and an expiry.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a label longer than 200 characters or with control
    /// characters, or an expiry not after `now`; [`Error::Backend`] when the kernel gives no
    /// random bytes or the database fails.
    pub fn create_scoped_api_key(
        &self,
        tenant: &TenantId,
        options: &KeyOptions,
        now: DateTime<Utc>,
    ) -> Result<NewApiKey> {
        if let Some(l) = &options.label
            && (l.chars().count() > 200 || l.chars().any(char::is_control))
        {
            return Err(Error::InvalidRequest(
                "a key label is at most 200 characters, without control characters".into(),
            ));
        }
        if let Some(at) = options.expires_at
            && at <= now
        {
            return Err(Error::InvalidRequest(
                "a key's expiry must be in the future".into(),
            ));
        }
        if let ConversationScope::Prefix(p) = &options.scope.conversations {
            // Checked again: a scope built by hand must keep the prefix rule too.
            ConversationScope::prefix(p)?;
        }
        let millis =
            |t: DateTime<Utc>| DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or(t);
        let id = hex(&random::<ID_BYTES>()?);
        let secret = hex(&random::<SECRET_BYTES>()?);
        let key = format!("{API_KEY_PREFIX}{id}_{secret}");
        let record = ApiKeyRecord {
            id,
            tenant: tenant.clone(),
            label: options.label.clone(),
            created_at: millis(now),
            revoked_at: None,
            scope: options.scope.clone(),
            expires_at: options.expires_at.map(millis),
        };
        let (conversation, prefix) = match &record.scope.conversations {
            ConversationScope::All => (None, None),
            ConversationScope::One(id) => (Some(id.as_str().to_owned()), None),
            ConversationScope::Prefix(p) => (None, Some(p.clone())),
        };
        self.read(|db| {
            db.execute(
                "store the API key",
                "INSERT INTO api_keys (id, tenant, label, hash, created_at, revoked_at,
                     conversation, id_prefix, read_only, expires_at)
                 VALUES ($1, $2, $3, $4, $5, NULL, $6, $7, $8, $9)
                 ON CONFLICT (id) DO NOTHING",
                &[
                    record.id.as_str().into(),
                    record.tenant.as_str().into(),
                    record.label.clone().into(),
                    hex(&Sha256::digest(key.as_bytes())).into(),
                    now.timestamp_millis().into(),
                    conversation.clone().into(),
                    prefix.clone().into(),
                    i64::from(record.scope.read_only).into(),
                    record.expires_at.map(|t| t.timestamp_millis()).into(),
                ],
            )
        })?;
        Ok(NewApiKey { record, key })
    }

    /// Every API key, revoked ones included, oldest first.
    ///
    /// # Errors
    /// [`Error::Backend`] when SQLite fails.
    pub fn list_api_keys(&self) -> Result<Vec<ApiKeyRecord>> {
        self.read(|db| {
            db.query(
                "list the API keys",
                &format!("SELECT {COLUMNS} FROM api_keys ORDER BY created_at, id"),
                &[],
            )?
            .iter()
            .map(key_record)
            .collect()
        })
    }

    /// The key `id`, revoked or not; `None` when there is none.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn api_key(&self, id: &str) -> Result<Option<ApiKeyRecord>> {
        self.read(|db| {
            db.query_opt(
                "read the API key",
                &format!("SELECT {COLUMNS} FROM api_keys WHERE id = $1"),
                &[id.into()],
            )?
            .map(|r| key_record(&r))
            .transpose()
        })
    }

    /// Revokes the key `id`; it is refused from then on. Revoking a revoked key is a no-op.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such key; [`Error::Backend`].
    pub fn revoke_api_key(&self, id: &str, now: DateTime<Utc>) -> Result<()> {
        let n = self.read(|db| {
            db.execute(
                "revoke the API key",
                "UPDATE api_keys SET revoked_at = coalesce(revoked_at, $2) WHERE id = $1",
                &[id.into(), now.timestamp_millis().into()],
            )
        })?;
        if n == 0 {
            return Err(Error::NotFound(format!("API key {id:?}")));
        }
        Ok(())
    }

    /// True once any key has been made, revoked ones included: a server that has had keys
    /// keeps requiring one, so revoking every key (say, after a leak) never re-opens it to
    /// requests without a key.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn has_api_keys(&self) -> Result<bool> {
        self.read(|db| {
            Ok(db
                .query("count the API keys", "SELECT id FROM api_keys LIMIT 1", &[])?
                .is_empty()
                .not())
        })
    }

    /// What a presented key is at `now`: valid (with its record), expired, or invalid. The
    /// hashes are compared in constant time; the key itself is never stored or logged. An
    /// expired key is only reported as such when its secret matches.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database fails.
    pub fn verify_api_key(&self, presented: &str, now: DateTime<Utc>) -> Result<KeyCheck> {
        let Some(id) = presented
            .strip_prefix(API_KEY_PREFIX)
            .and_then(|rest| rest.split_once('_'))
            .map(|(id, _)| id)
            .filter(|id| id.len() == 2 * ID_BYTES && id.bytes().all(|b| b.is_ascii_hexdigit()))
        else {
            return Ok(KeyCheck::Invalid);
        };
        let found: Option<(ApiKeyRecord, String)> = self.read(|db| {
            db.query_opt(
                "read the API key",
                &format!("SELECT {COLUMNS}, hash FROM api_keys WHERE id = $1"),
                &[id.into()],
            )?
            .map(|r| Ok((key_record(&r)?, r.text(9)?)))
            .transpose()
        })?;
        let Some((record, stored)) = found else {
            return Ok(KeyCheck::Invalid);
        };
        let hash = hex(&Sha256::digest(presented.as_bytes()));
        if !constant_time_eq(hash.as_bytes(), stored.as_bytes()) || record.revoked_at.is_some() {
            return Ok(KeyCheck::Invalid);
        }
        if let Some(at) = record.expires_at
            && at <= now
        {
            return Ok(KeyCheck::Expired(at));
        }
        Ok(KeyCheck::Valid(record))
    }
}

fn key_record(r: &Row) -> Result<ApiKeyRecord> {
    Ok(ApiKeyRecord {
        id: r.text(0)?,
        tenant: r.text(1)?.parse()?,
        label: r.opt_text(2)?,
        created_at: time(r.int(3)?)?,
        revoked_at: r.opt_int(4)?.map(time).transpose()?,
        scope: KeyScope {
            conversations: match (r.opt_text(5)?, r.opt_text(6)?) {
                (Some(id), _) => ConversationScope::One(ConversationId::new(id)?),
                (None, Some(p)) => ConversationScope::prefix(&p)?,
                (None, None) => ConversationScope::All,
            },
            read_only: r.int(7)? != 0,
        },
        expires_at: r.opt_int(8)?.map(time).transpose()?,
    })
}

/// Equal-length byte strings compared without an early exit.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

pub(crate) fn random<const N: usize>() -> Result<[u8; N]> {
    let mut buf = [0u8; N];
    let mut filled = 0;
    while filled < N {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(Error::Backend(format!(
                    "the kernel gave no random bytes for an API key: {e}"
                )));
            }
        }
    }
    Ok(buf)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_verified_by_hash_until_revoked() {
        let store = Store::open_in_memory().unwrap();
        let acme = TenantId::new("acme").unwrap();
        assert!(!store.has_api_keys().unwrap());
        let k = store.create_api_key(&acme, Some("ci"), Utc::now()).unwrap();
        assert!(k.key.starts_with(API_KEY_PREFIX));
        assert_eq!(k.key.len(), API_KEY_PREFIX.len() + 16 + 1 + 64);
        assert!(store.has_api_keys().unwrap());
        assert_eq!(
            store.verify_api_key(&k.key, Utc::now()).unwrap(),
            KeyCheck::Valid(k.record.clone())
        );

        // The secret is not stored.
        let stored: Vec<String> = store
            .read(|db| db.query("read", "SELECT hash FROM api_keys", &[]))
            .unwrap()
            .iter()
            .map(|r| r.text(0).unwrap())
            .collect();
        assert!(!stored.iter().any(|h| k.key.contains(h.as_str())));

        // One changed character, a truncation, another format: refused.
        let mut wrong = k.key.clone().into_bytes();
        let last = wrong.len() - 1;
        wrong[last] = if wrong[last] == b'0' { b'1' } else { b'0' };
        let wrong = String::from_utf8(wrong).unwrap();
        for bad in [
            wrong.as_str(),
            &k.key[..k.key.len() - 1],
            "",
            "sbk_",
            "Bearer x",
            &k.record.id,
        ] {
            assert_eq!(
                store.verify_api_key(bad, Utc::now()).unwrap(),
                KeyCheck::Invalid,
                "{bad}"
            );
        }

        assert_eq!(store.list_api_keys().unwrap(), vec![k.record.clone()]);
        store.revoke_api_key(&k.record.id, Utc::now()).unwrap();
        store.revoke_api_key(&k.record.id, Utc::now()).unwrap();
        assert_eq!(
            store.verify_api_key(&k.key, Utc::now()).unwrap(),
            KeyCheck::Invalid
        );
        assert!(
            store.has_api_keys().unwrap(),
            "a store that has had a key keeps requiring one after every key is revoked"
        );
        assert!(store.list_api_keys().unwrap()[0].revoked_at.is_some());
        assert_eq!(
            store.revoke_api_key("0000", Utc::now()).unwrap_err().code(),
            "not_found"
        );
    }

    #[test]
    fn keys_are_distinct_and_labels_checked() {
        let store = Store::open_in_memory().unwrap();
        let t = TenantId::new("t").unwrap();
        let a = store.create_api_key(&t, None, Utc::now()).unwrap();
        let b = store.create_api_key(&t, None, Utc::now()).unwrap();
        assert_ne!(a.key, b.key);
        assert_ne!(a.record.id, b.record.id);
        assert_eq!(
            store
                .create_api_key(&t, Some("a\nb"), Utc::now())
                .unwrap_err()
                .code(),
            "invalid_request"
        );
    }

    #[test]
    fn a_scope_and_an_expiry_are_kept_and_an_expired_key_is_refused() {
        let store = Store::open_in_memory().unwrap();
        let t = TenantId::new("t").unwrap();
        let now = Utc::now();
        let hour = chrono::Duration::hours(1);
        let scopes = [
            KeyScope {
                conversations: ConversationScope::One(ConversationId::new("c1").unwrap()),
                read_only: false,
            },
            KeyScope {
                conversations: ConversationScope::prefix("team-").unwrap(),
                read_only: true,
            },
        ];
        for scope in scopes {
            let options = KeyOptions {
                label: None,
                scope: scope.clone(),
                expires_at: Some(now + hour),
            };
            let k = store.create_scoped_api_key(&t, &options, now).unwrap();
            let KeyCheck::Valid(found) = store.verify_api_key(&k.key, now).unwrap() else {
                panic!("a fresh key is valid");
            };
            assert_eq!(found.scope, scope);
            assert_eq!(found, k.record);
            assert!(store.list_api_keys().unwrap().contains(&k.record));
            // At and after its expiry it is refused, and says so.
            assert_eq!(
                store.verify_api_key(&k.key, now + hour).unwrap(),
                KeyCheck::Expired(k.record.expires_at.unwrap())
            );
            // A wrong secret for an expired key's id says nothing about the key.
            let mut wrong = k.key.clone();
            wrong.pop();
            wrong.push(if k.key.ends_with('0') { '1' } else { '0' });
            assert_eq!(
                store.verify_api_key(&wrong, now + hour).unwrap(),
                KeyCheck::Invalid
            );
        }
        let past = KeyOptions {
            expires_at: Some(now),
            ..KeyOptions::default()
        };
        assert_eq!(
            store
                .create_scoped_api_key(&t, &past, now)
                .unwrap_err()
                .code(),
            "invalid_request"
        );
        let bad_prefix = KeyOptions {
            scope: KeyScope {
                conversations: ConversationScope::Prefix("../".into()),
                read_only: false,
            },
            ..KeyOptions::default()
        };
        assert_eq!(
            store
                .create_scoped_api_key(&t, &bad_prefix, now)
                .unwrap_err()
                .code(),
            "invalid_request"
        );
    }
}
