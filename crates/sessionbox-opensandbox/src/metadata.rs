//! Sandbox metadata as `opensandbox-server` 1.1.1 accepts it (it becomes container labels).
//!
//! A key is a name of at most 63 characters matching `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`,
//! optionally after a DNS-subdomain prefix and `/`; keys under `opensandbox.io/` are reserved.
//! A value is at most 63 characters of `[A-Za-z0-9._-]`, starting and ending with a letter or
//! digit (or empty). The real server answers 400 `SANDBOX::INVALID_METADATA_LABEL` to anything
//! else, so [`Metadata`] refuses it before a request is made.

use std::collections::BTreeMap;

use crate::error::OpenSandboxError;

/// The most characters of a metadata value (and of a key's name).
pub const MAX_VALUE_LEN: usize = 63;
/// Keys with this prefix are the server's own.
pub(crate) const RESERVED_PREFIX: &str = "opensandbox.io/";

/// Validated sandbox metadata.
///
/// ```
/// use sessionbox_opensandbox::Metadata;
/// let mut m = Metadata::new();
/// m.insert("sessionbox.managed", "true").unwrap();
/// assert!(m.insert("sessionbox.key", &"a".repeat(64)).is_err()); // never sent
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata(BTreeMap<String, String>);

fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_VALUE_LEN
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// True when the server accepts `key` as a metadata key.
pub fn is_valid_key(key: &str) -> bool {
    if key.starts_with(RESERVED_PREFIX) {
        return false;
    }
    match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_name(name),
        None => is_name(key),
    }
}

/// True when the server accepts `value` as a metadata value.
pub fn is_valid_value(value: &str) -> bool {
    value.is_empty() || is_name(value)
}

impl Metadata {
    /// No metadata.
    pub fn new() -> Self {
        Metadata::default()
    }

    /// Adds a pair.
    ///
    /// # Errors
    /// [`OpenSandboxError::InvalidInput`] naming the rule when the key or value would be
    /// refused by the server.
    pub fn insert(&mut self, key: &str, value: &str) -> Result<(), OpenSandboxError> {
        if !is_valid_key(key) {
            return Err(OpenSandboxError::InvalidInput(format!(
                "metadata key {:?} is not accepted by OpenSandbox: at most 63 characters of \
                 A-Z a-z 0-9 - _ . starting and ending with a letter or digit, optionally after a \
                 DNS prefix and '/', not under {RESERVED_PREFIX}",
                crate::endpoint::printable(&crate::lifecycle::truncate(key, 80))
            )));
        }
        if !is_valid_value(value) {
            return Err(OpenSandboxError::InvalidInput(format!(
                "metadata value {:?} ({} characters) is not accepted by OpenSandbox: at most 63 \
                 characters of A-Z a-z 0-9 - _ . starting and ending with a letter or digit",
                crate::endpoint::printable(&crate::lifecycle::truncate(value, 80)),
                value.chars().count()
            )));
        }
        self.0.insert(key.to_owned(), value.to_owned());
        Ok(())
    }

    /// The pairs.
    pub fn as_map(&self) -> &BTreeMap<String, String> {
        &self.0
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The list filter's `metadata` query value: `k=v&k2=v2`, each part form-encoded.
    pub fn to_query(&self) -> String {
        let mut out = String::new();
        for (k, v) in &self.0 {
            if !out.is_empty() {
                out.push('&');
            }
            out.push_str(&form(k));
            out.push('=');
            out.push_str(&form(v));
        }
        out
    }
}

fn form(s: &str) -> String {
    // Keys and values are validated to [A-Za-z0-9._/-], none of which needs encoding except '/'
    // (left as is: parse_qsl reads it literally).
    s.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_follow_the_real_servers_rule() {
        for ok in ["", "a", "a.b_c-d", &"a".repeat(63), "0abc9"] {
            assert!(is_valid_value(ok), "{ok:?}");
        }
        for bad in [
            &"a".repeat(64) as &str,
            "-a",
            "a-",
            ".a",
            "a b",
            "a/b",
            "é",
            "a\n",
            "a=b",
            "a&b",
        ] {
            assert!(!is_valid_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn keys_follow_the_real_servers_rule() {
        for ok in ["sessionbox.managed", "example.com/name", "a"] {
            assert!(is_valid_key(ok), "{ok:?}");
        }
        for bad in [
            "",
            "opensandbox.io/x",
            "Bad_Prefix/x",
            &"k".repeat(64),
            "a/b/c",
            "-a",
        ] {
            assert!(!is_valid_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_64_character_value_is_refused_before_sending() {
        let mut m = Metadata::new();
        let e = m.insert("k", &"a".repeat(64)).unwrap_err();
        assert!(e.to_string().contains("64 characters"), "{e}");
        assert!(m.is_empty());
    }

    #[test]
    fn query_joins_pairs() {
        let mut m = Metadata::new();
        m.insert("b", "2").unwrap();
        m.insert("a", "1").unwrap();
        assert_eq!(m.to_query(), "a=1&b=2");
    }
}
