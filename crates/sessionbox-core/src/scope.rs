//! What an API key may reach: its conversations (all of its tenant's, one, or those whose id
//! starts with a prefix) and whether it may change anything.
//!
//! A scope only narrows what its tenant could do; the tenant boundary itself is the key's
//! tenant and never depends on the scope. Each refusal is [`Error::Forbidden`] whose message
//! names the rule that refused, so a caller knows which key to use instead.
//!
//! ```
//! use sessionbox_core::{ConversationId, ConversationScope, KeyScope};
//! let scope = KeyScope {
//!     conversations: ConversationScope::prefix("alice-").unwrap(),
//!     read_only: true,
//! };
//! assert!(scope.check_conversation(&ConversationId::new("alice-1").unwrap()).is_ok());
//! let e = scope.check_conversation(&ConversationId::new("bob-1").unwrap()).unwrap_err();
//! assert_eq!(e.code(), "forbidden");
//! assert!(scope.check_write("exec").is_err());
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::ids::ConversationId;

/// The longest id prefix a key may be limited to, in bytes: short enough that a conversation
/// made for an MCP session under the prefix (`PREFIX` + `mcp-` + 16 hex digits) is still a
/// valid [`ConversationId`].
pub const MAX_ID_PREFIX_BYTES: usize = 100;

/// Which of its tenant's conversations a key reaches.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum ConversationScope {
    /// Every conversation of the tenant, and the tenant-wide routes (snapshots, policies, the
    /// egress log, metrics).
    #[default]
    All,
    /// This conversation only.
    One(ConversationId),
    /// Conversations whose id starts with this text (a valid id prefix, at most
    /// [`MAX_ID_PREFIX_BYTES`]).
    Prefix(String),
}

impl ConversationScope {
    /// A prefix scope, checked: non-empty, at most [`MAX_ID_PREFIX_BYTES`], and the start of a
    /// valid conversation id (first an ASCII letter or digit, then letters, digits, `.`, `_`,
    /// `-`).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the rule.
    pub fn prefix(prefix: &str) -> Result<Self, Error> {
        if prefix.is_empty()
            || prefix.len() > MAX_ID_PREFIX_BYTES
            || ConversationId::new(prefix).is_err()
        {
            return Err(Error::InvalidRequest(format!(
                "an id prefix is 1-{MAX_ID_PREFIX_BYTES} characters that could start a \
                 conversation id: {}",
                ConversationId::RULE
            )));
        }
        Ok(ConversationScope::Prefix(prefix.to_owned()))
    }

    /// True when `id` is one of the conversations this scope reaches.
    pub fn covers(&self, id: &ConversationId) -> bool {
        match self {
            ConversationScope::All => true,
            ConversationScope::One(one) => one == id,
            ConversationScope::Prefix(p) => id.as_str().starts_with(p.as_str()),
        }
    }
}

/// What an API key may do within its tenant. The default is everything.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KeyScope {
    /// The conversations it reaches.
    pub conversations: ConversationScope,
    /// True when it may only read: files, listings, command output, records. Running a
    /// command, writing, editing, making, destroying, snapshots and terminals are refused.
    pub read_only: bool,
}

impl KeyScope {
    /// True when the scope narrows nothing.
    pub fn is_full(&self) -> bool {
        self.conversations == ConversationScope::All && !self.read_only
    }

    /// Refuses a conversation this scope does not reach.
    ///
    /// # Errors
    /// [`Error::Forbidden`] naming the rule.
    pub fn check_conversation(&self, id: &ConversationId) -> Result<(), Error> {
        if self.conversations.covers(id) {
            return Ok(());
        }
        Err(Error::Forbidden(format!(
            "this API key is limited to {}; conversation {:?} is not one of them",
            self.conversations,
            id.as_str()
        )))
    }

    /// Refuses `operation` (a word such as "exec" or "write") to a read-only key.
    ///
    /// # Errors
    /// [`Error::Forbidden`] naming the rule.
    pub fn check_write(&self, operation: &str) -> Result<(), Error> {
        if !self.read_only {
            return Ok(());
        }
        Err(Error::Forbidden(format!(
            "this API key is read-only; {operation} changes things: use a key that is not \
             read-only"
        )))
    }

    /// Refuses a tenant-wide route (`what`, such as "snapshots") to a key limited to some
    /// conversations: such routes reach every conversation's data.
    ///
    /// # Errors
    /// [`Error::Forbidden`] naming the rule.
    pub fn check_tenant_wide(&self, what: &str) -> Result<(), Error> {
        if self.conversations == ConversationScope::All {
            return Ok(());
        }
        Err(Error::Forbidden(format!(
            "this API key is limited to {}; {what} reaches the whole tenant: use a key that is \
             not limited to conversations",
            self.conversations
        )))
    }
}

impl fmt::Display for ConversationScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConversationScope::All => f.write_str("every conversation"),
            ConversationScope::One(id) => write!(f, "conversation {:?}", id.as_str()),
            ConversationScope::Prefix(p) => write!(f, "conversations whose id starts with {p:?}"),
        }
    }
}

impl fmt::Display for KeyScope {
    /// `every conversation`, `conversation "a", read-only`, ...
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.conversations)?;
        if self.read_only {
            f.write_str(", read-only")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ConversationId {
        ConversationId::new(s).unwrap()
    }

    #[test]
    fn a_prefix_is_checked_and_matches_only_ids_that_start_with_it() {
        let p = ConversationScope::prefix("team-a.").unwrap();
        assert!(p.covers(&id("team-a.1")));
        assert!(p.covers(&id("team-a.")));
        assert!(!p.covers(&id("team-b.1")));
        assert!(!p.covers(&id("team-a")), "shorter than the prefix");
        assert!(!p.covers(&id("Team-a.1")), "ids are case-sensitive");
        for bad in [
            "",
            "-x",
            "a/b",
            "a b",
            "é",
            &"a".repeat(MAX_ID_PREFIX_BYTES + 1),
        ] {
            assert_eq!(
                ConversationScope::prefix(bad).unwrap_err().code(),
                "invalid_request",
                "{bad:?}"
            );
        }
        assert!(ConversationScope::prefix(&"a".repeat(MAX_ID_PREFIX_BYTES)).is_ok());
    }

    #[test]
    fn each_refusal_is_forbidden_and_names_its_rule() {
        let one = KeyScope {
            conversations: ConversationScope::One(id("c1")),
            read_only: false,
        };
        assert!(!one.is_full());
        assert!(one.check_conversation(&id("c1")).is_ok());
        let e = one.check_conversation(&id("c2")).unwrap_err();
        assert_eq!(e.code(), "forbidden");
        assert!(
            e.to_string().contains("limited to conversation \"c1\""),
            "{e}"
        );
        assert!(one.check_write("exec").is_ok());
        let e = one.check_tenant_wide("snapshots").unwrap_err();
        assert!(
            e.to_string().contains("snapshots reaches the whole tenant"),
            "{e}"
        );

        let ro = KeyScope {
            conversations: ConversationScope::All,
            read_only: true,
        };
        assert!(!ro.is_full());
        assert!(ro.check_tenant_wide("snapshots").is_ok());
        let e = ro.check_write("exec").unwrap_err();
        assert!(e.to_string().contains("read-only; exec"), "{e}");
        assert_eq!(ro.to_string(), "every conversation, read-only");
        assert!(KeyScope::default().is_full());
    }

    #[test]
    fn a_scope_round_trips_through_json() {
        for s in [
            KeyScope::default(),
            KeyScope {
                conversations: ConversationScope::One(id("c1")),
                read_only: true,
            },
            KeyScope {
                conversations: ConversationScope::prefix("p-").unwrap(),
                read_only: false,
            },
        ] {
            let text = serde_json::to_string(&s).unwrap();
            assert_eq!(
                serde_json::from_str::<KeyScope>(&text).unwrap(),
                s,
                "{text}"
            );
        }
    }
}
