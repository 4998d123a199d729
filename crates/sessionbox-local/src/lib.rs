//! sessionbox's local runtimes: `host` (a directory per conversation, commands run by the
//! [`supervise`] supervisor or directly) and `isolated` (a Linux sandbox per conversation,
//! launched by [`sessionbox_sandbox`] and served by the agent).

pub mod host;
pub mod isolated;
pub mod supervise;

/// The process runner, now its own crate. A compatibility re-export while other crates move
/// to `sessionbox_process`; to be removed.
pub use sessionbox_process as process;
/// The sandbox launcher, now its own crate. A compatibility re-export while other crates move
/// to `sessionbox_sandbox`; to be removed.
pub use sessionbox_sandbox as sandbox;
