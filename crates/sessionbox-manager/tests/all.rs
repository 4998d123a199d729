//! The integration tests, one binary: each file beside this one is a module (test names are
//! `file::test`); `pg` is the store tests' private PostgreSQL cluster.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them); support modules are `pub` for the files that use them,
// and a test binary has no public API.
#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "../../sessionbox-store/tests/support/pg.rs"]
mod pg;

mod directory;
mod gc;
mod manager;
mod open;
mod skills;
mod snapshots;
