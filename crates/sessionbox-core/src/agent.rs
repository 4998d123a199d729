//! Where a conversation's in-sandbox agent listens, for what a front end relays to it as it is.
//!
//! Commands and file operations go through [`crate::Session`]'s methods. A few things are
//! streams a front end passes through rather than calls it makes: a terminal, a preview of a
//! port a command listens on, a watch of the workspace, a background command's stdin. For
//! those a session of a runtime whose sandbox runs the agent (`isolated`, `opensandbox`) gives
//! its [`AgentAccess`], and the front end talks to the agent itself (the wire format is
//! `sessionbox-execd`'s). Runtimes without an agent give none, and such a relay is refused
//! with [`no_agent`]'s error.

use std::fmt;
use std::path::PathBuf;

/// How to reach the agent: its socket or base URL, and its access token.
///
/// `Debug` never prints the token.
#[derive(Clone, PartialEq, Eq)]
pub struct AgentAccess {
    /// Where the agent listens.
    pub endpoint: AgentEndpoint,
    token: Option<String>,
}

/// Where an agent listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentEndpoint {
    /// A Unix socket on this machine (the `isolated` runtime).
    Unix(PathBuf),
    /// An `http://HOST:PORT[/PREFIX]` base URL (the `opensandbox` runtime: the sandbox's direct
    /// endpoint, or the server's proxy path for the agent's port).
    Http(String),
}

impl AgentAccess {
    /// Access to the agent at `endpoint`, with the `X-EXECD-ACCESS-TOKEN` value it checks, if
    /// any.
    pub fn new(endpoint: AgentEndpoint, token: Option<String>) -> Self {
        AgentAccess { endpoint, token }
    }

    /// The access token, for the one place that puts it in a request header.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }
}

impl fmt::Debug for AgentAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentAccess")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

/// The refusal of a relay (`what`: "terminals", "previews", ...) on a runtime whose sandbox
/// runs no agent.
pub fn no_agent(runtime: &str, what: &str) -> crate::Error {
    crate::Error::RuntimeUnavailable {
        runtime: runtime.to_owned(),
        reason: format!("this runtime gives no {what}: its conversations run no agent"),
        hint: "use the isolated or opensandbox runtime".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_prints_the_token() {
        let a = AgentAccess::new(
            AgentEndpoint::Http("http://h:1".into()),
            Some("s3cret".into()),
        );
        let shown = format!("{a:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("***"), "{shown}");
        assert_eq!(a.token(), Some("s3cret"));
    }
}
