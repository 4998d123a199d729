//! The integration tests, one binary: each file beside this one is a module (test names are
//! `file::test`); `pg` is the store tests' private PostgreSQL cluster.

#[path = "../../sessionbox-store/tests/support/pg.rs"]
mod pg;

mod directory;
mod gc;
mod manager;
mod open;
mod skills;
