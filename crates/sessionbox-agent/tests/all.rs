//! The integration tests, one binary: each file beside this one is a module (test names are
//! `file::test`), sharing `common`.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them); support modules are `pub` for the files that use them,
// and a test binary has no public API.
#![allow(clippy::unwrap_used, unreachable_pub)]

mod common;

mod archive;
mod background;
mod bash_session;
mod commands;
mod files;
mod http;
mod init;
mod proxy;
mod pty;
mod sdk;
mod stdin;
mod watch;
