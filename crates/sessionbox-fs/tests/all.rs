//! The integration tests, one binary: each file beside this one is a module (test names are
//! `file::test`), sharing `common`.

mod common;

mod ops;
mod perm;
mod remove_tree;
mod security;
