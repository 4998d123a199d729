//! sessionbox's local runtimes: `host` (a directory per conversation, commands run by the
//! [`supervise`] supervisor or directly) and `isolated` (a Linux sandbox per conversation,
//! launched by [`sessionbox_sandbox`] and served by the agent).

pub mod host;
pub mod host_agent;
pub mod host_volumes;
pub mod isolated;
pub mod log_relay;
pub mod supervise;
