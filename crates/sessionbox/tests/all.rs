//! The integration tests, one binary: each file beside this one is a module (test names are
//! `file::test`), sharing `support` (the isolated runtime's host-side helpers), `exact` (the
//! shared exact-output cases) and `pg` (the store tests' private PostgreSQL cluster) once.
//!
//! Three files stay binaries of their own (see Cargo.toml): `architecture.rs`, which reads the
//! workspace with cargo, and `isolated_escape.rs` and `egress_containment.rs`, whose bomb and
//! flood tests assert how fast another conversation and the host answer while an attack runs, so
//! they share the machine with no other file's tests.

// Integration tests may unwrap (clippy.toml says so, but clippy counts only `#[test]` functions
// as tests, not the helpers beside them); support modules are `pub` for the files that use them,
// and a test binary has no public API.
#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "support/exact.rs"]
mod exact;
#[path = "../../sessionbox-store/tests/support/pg.rs"]
mod pg;
/// Host-side helpers of the isolated-runtime files (see `support/mod.rs`).
#[allow(dead_code)]
mod support;

mod background;
mod cli;
mod cli_containment;
mod cli_manners;
mod egress;
mod egress_sidecar;
mod faults;
mod faults_agent;
mod faults_gateway;
mod isolated_gc;
mod isolated_lifecycle;
mod isolated_pool;
mod mcp_stdio;
mod opensandbox_hardened;
mod replicas;
mod serve;
mod serve_tls;
mod shell;
mod skills;
mod snapshots;
mod stdin;
mod watch;
