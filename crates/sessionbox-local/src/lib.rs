//! sessionbox's local runtime: a conversation's commands run as host processes in its workspace.

pub mod host;
pub mod process;
pub mod sandbox;
