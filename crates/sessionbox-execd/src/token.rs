//! The execd access token, kept out of logs and error messages.

use std::fmt;

/// The value of the `X-EXECD-ACCESS-TOKEN` header.
///
/// `Debug` and `Display` print `***`; the only way to the text is [`AccessToken::expose`].
///
/// ```
/// use sessionbox_execd::AccessToken;
/// let t = AccessToken::new("s3cret");
/// assert_eq!(format!("{t} {t:?}"), "*** ***");
/// assert_eq!(t.expose(), "s3cret");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct AccessToken(String);

impl AccessToken {
    /// Wraps a token.
    pub fn new(token: impl Into<String>) -> Self {
        AccessToken(token.into())
    }

    /// The token text, for the one place that puts it in a header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Compares a presented header value with this token in time independent of where they
    /// differ (for the server side).
    pub fn matches(&self, presented: &[u8]) -> bool {
        let mine = self.0.as_bytes();
        let mut diff = (mine.len() ^ presented.len()) as u64;
        for (i, &b) in mine.iter().enumerate() {
            diff |= u64::from(b ^ presented.get(i).copied().unwrap_or(0));
        }
        diff == 0
    }

    /// Replaces every occurrence of the token in `text` with `***` (for messages that echo what
    /// a server said).
    pub fn redact(&self, text: &str) -> String {
        if self.0.is_empty() {
            text.to_owned()
        } else {
            text.replace(&self.0, "***")
        }
    }
}

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl From<String> for AccessToken {
    fn from(s: String) -> Self {
        AccessToken(s)
    }
}

impl From<&str> for AccessToken {
    fn from(s: &str) -> Self {
        AccessToken(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_and_redacts() {
        let t = AccessToken::new("abc");
        assert!(t.matches(b"abc"));
        assert!(!t.matches(b"abd"));
        assert!(!t.matches(b"ab"));
        assert!(!t.matches(b"abcd"));
        assert_eq!(t.redact("x abc y"), "x *** y");
        assert_eq!(format!("{:?}", Some(t)), "Some(***)");
    }
}
