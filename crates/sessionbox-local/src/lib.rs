//! sessionbox's local runtimes: `host` (a directory per conversation) and, through the sandbox
//! launcher, `isolated`. Also the process runner every local command goes through.

pub mod host;
pub mod isolated;
pub mod process;
pub mod sandbox;
pub mod supervise;
