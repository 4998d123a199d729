//! Conversation and tenant ids, and the key derived from them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::Error;

/// Which kind of id an [`Error::InvalidId`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdKind {
    /// A [`ConversationId`].
    Conversation,
    /// A [`TenantId`].
    Tenant,
    /// A [`ConversationKey`].
    Key,
}

impl fmt::Display for IdKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdKind::Conversation => "conversation id",
            IdKind::Tenant => "tenant id",
            IdKind::Key => "conversation key",
        })
    }
}

const CONVERSATION_RULE: &str = "a conversation id is 1-128 characters; the first is an ASCII letter or digit; the rest are ASCII letters, digits, '.', '_' or '-'";
const TENANT_RULE: &str = "a tenant id is 1-64 characters; the first is an ASCII letter or digit; the rest are ASCII letters, digits, '.', '_' or '-'";
const KEY_RULE: &str = "a conversation key is 64 lowercase hexadecimal characters";

/// Checks the shared id alphabet. Never trims or rewrites: the input is taken byte for byte.
fn check_id(value: &str, max: usize, kind: IdKind, rule: &'static str) -> Result<(), Error> {
    let bytes = value.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= max
        && bytes[0].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidId {
            kind,
            value: value.to_owned(),
            rule,
        })
    }
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $max:expr, $kind:expr, $rule:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The longest valid id, in bytes (all valid ids are ASCII).
            pub const MAX_LEN: usize = $max;
            /// The rule an id must follow, in words; error messages quote it.
            pub const RULE: &'static str = $rule;

            /// Validates `value` and wraps it. The input is never trimmed or rewritten.
            ///
            /// # Errors
            /// [`Error::InvalidId`] naming the rule when `value` breaks it.
            pub fn new(value: impl Into<String>) -> Result<Self, Error> {
                let value = value.into();
                check_id(&value, $max, $kind, $rule)?;
                Ok(Self(value))
            }

            /// The id as given.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self, Error> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = Error;
            fn try_from(s: String) -> Result<Self, Error> {
                Self::new(s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

string_id!(
    /// A caller's stable name for one conversation, unique within a tenant.
    ///
    /// Rule (`shared/cases/conversation-ids.json`): 1-128 characters; the first an ASCII letter or
    /// digit; the rest ASCII letters, digits, `.`, `_` or `-`. So `.`, `..`, separators, colons,
    /// whitespace and non-ASCII look-alikes are refused, and an id can never act as a path.
    ///
    /// ```
    /// use sessionbox_core::ConversationId;
    /// assert!(ConversationId::new("thread.2026-07").is_ok());
    /// assert!(ConversationId::new("../another-conversation").is_err());
    /// assert!(ConversationId::new("conv\n").is_err()); // never trimmed
    /// ```
    ConversationId,
    128,
    IdKind::Conversation,
    CONVERSATION_RULE
);

string_id!(
    /// A tenant: the namespace in which conversation ids are unique. Same alphabet as
    /// [`ConversationId`], 1-64 characters. [`TenantId::default`] is `default`.
    ///
    /// ```
    /// use sessionbox_core::TenantId;
    /// assert_eq!(TenantId::default().as_str(), "default");
    /// assert!(TenantId::new("acme:prod").is_err());
    /// ```
    TenantId,
    64,
    IdKind::Tenant,
    TENANT_RULE
);

impl Default for TenantId {
    fn default() -> Self {
        TenantId(Self::DEFAULT.to_owned())
    }
}

impl TenantId {
    /// The tenant used when none is named.
    pub const DEFAULT: &'static str = "default";
}

/// The opaque key of a conversation: lowercase hex SHA-256 of `tenant + "\n" + conversation id`.
///
/// It is the store's primary key and the on-disk name of the workspace, so a caller's id never
/// becomes a path by itself, and two tenants using the same id never meet.
///
/// ```
/// use sessionbox_core::{ConversationId, ConversationKey, TenantId};
/// let a = ConversationKey::derive(&TenantId::new("acme").unwrap(), &ConversationId::new("c1").unwrap());
/// let b = ConversationKey::derive(&TenantId::new("globex").unwrap(), &ConversationId::new("c1").unwrap());
/// assert_ne!(a, b);
/// assert_eq!(a.as_str().len(), 64);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ConversationKey(String);

impl ConversationKey {
    /// Derives the key of `id` within `tenant`.
    pub fn derive(tenant: &TenantId, id: &ConversationId) -> Self {
        let mut h = Sha256::new();
        h.update(tenant.as_str().as_bytes());
        h.update(b"\n");
        h.update(id.as_str().as_bytes());
        let digest = h.finalize();
        let mut s = String::with_capacity(64);
        for b in digest {
            s.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            s.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
        }
        ConversationKey(s)
    }

    /// Parses a key as stored (64 lowercase hex characters).
    ///
    /// # Errors
    /// [`Error::InvalidId`] for anything else.
    pub fn parse(s: &str) -> Result<Self, Error> {
        if s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            Ok(ConversationKey(s.to_owned()))
        } else {
            Err(Error::InvalidId {
                kind: IdKind::Key,
                value: s.to_owned(),
                rule: KEY_RULE,
            })
        }
    }

    /// The 64 hex characters.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex characters, for logs and sandbox host names.
    pub fn short(&self) -> &str {
        &self.0[..12]
    }
}

impl TryFrom<String> for ConversationKey {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        Self::parse(&s)
    }
}

impl From<ConversationKey> for String {
    fn from(k: ConversationKey) -> String {
        k.0
    }
}

impl fmt::Display for ConversationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A conversation named in full: tenant, id and the derived key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConversationRef {
    /// The tenant.
    pub tenant: TenantId,
    /// The caller's id within the tenant.
    pub id: ConversationId,
    /// `ConversationKey::derive(&tenant, &id)`.
    pub key: ConversationKey,
}

impl ConversationRef {
    /// Names `id` within `tenant` and derives its key.
    pub fn new(tenant: TenantId, id: ConversationId) -> Self {
        let key = ConversationKey::derive(&tenant, &id);
        ConversationRef { tenant, id, key }
    }

    /// Validates both strings and names the conversation.
    ///
    /// # Errors
    /// [`Error::InvalidId`] when either id breaks its rule.
    pub fn parse(tenant: &str, id: &str) -> Result<Self, Error> {
        Ok(Self::new(TenantId::new(tenant)?, ConversationId::new(id)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Cases {
        valid: Vec<String>,
        invalid: Vec<Invalid>,
    }
    #[derive(Deserialize)]
    struct Invalid {
        id: String,
        why: String,
    }

    fn cases() -> Cases {
        serde_json::from_str(include_str!("../tests/cases/conversation-ids.json")).unwrap()
    }

    #[test]
    fn every_shared_valid_conversation_id_is_accepted_unchanged() {
        for id in cases().valid {
            let parsed = ConversationId::new(id.clone()).unwrap_or_else(|e| panic!("{id:?}: {e}"));
            assert_eq!(parsed.as_str(), id);
        }
    }

    #[test]
    fn every_shared_invalid_conversation_id_is_refused_with_the_rule() {
        for case in cases().invalid {
            let err = ConversationId::new(case.id.clone())
                .expect_err(&format!("{:?} ({}) was accepted", case.id, case.why));
            assert_eq!(err.code(), "invalid_id");
            assert!(err.to_string().contains("1-128 characters"), "{err}");
        }
    }

    #[test]
    fn the_whole_kind_of_bad_character_is_refused_not_only_the_listed_ones() {
        for b in 0u8..=255 {
            let c = char::from(b);
            let ok = c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
            let id = format!("a{c}");
            assert_eq!(ConversationId::new(id.clone()).is_ok(), ok, "{id:?}");
            assert_eq!(TenantId::new(id.clone()).is_ok(), ok, "{id:?}");
        }
        for lead in ['.', '_', '-'] {
            assert!(ConversationId::new(format!("{lead}a")).is_err());
        }
    }

    #[test]
    fn tenant_ids_stop_at_64_characters() {
        assert!(TenantId::new("t".repeat(64)).is_ok());
        let err = TenantId::new("t".repeat(65)).unwrap_err();
        assert!(err.to_string().contains("1-64"), "{err}");
    }

    #[test]
    fn key_is_sha256_of_tenant_newline_id() {
        // printf 'default\nconversation-a' | sha256sum
        let k = ConversationKey::derive(
            &TenantId::default(),
            &ConversationId::new("conversation-a").unwrap(),
        );
        assert_eq!(
            k.as_str(),
            "494b61c43c470497f34402cf4c15d9605eb723b68bb55e3178470f68913db0b6"
        );
        assert_eq!(ConversationKey::parse(k.as_str()).unwrap(), k);
        assert!(ConversationKey::parse(&k.as_str().to_uppercase()).is_err());
        assert!(ConversationKey::parse("../x").is_err());
    }

    #[test]
    fn ids_that_would_collide_by_concatenation_get_different_keys() {
        let a = ConversationRef::parse("ab", "c").unwrap();
        let b = ConversationRef::parse("a", "bc").unwrap();
        assert_ne!(a.key, b.key);
    }

    #[test]
    fn serde_validates_ids() {
        let bad: Result<ConversationId, _> = serde_json::from_str("\"../x\"");
        assert!(bad.is_err());
        let good: ConversationId = serde_json::from_str("\"x.y\"").unwrap();
        assert_eq!(good.as_str(), "x.y");
    }
}
