//! The integration tests, one binary: each file beside this one is a module (test names are
//! `file::test`), sharing `common`.

mod common;

mod background;
mod egress;
mod endpoint_cases;
mod faults;
mod lifecycle;
mod server;
