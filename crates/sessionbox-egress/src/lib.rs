//! sessionbox's egress gateway. See the crate README for what it enforces.
//!
//! - [`policy`]: network profiles, rules, validation, the hash, and the two-step check (name
//!   before DNS, then every address).
//! - [`target`]: what a request asks to reach, parsed as a connection would.

pub mod policy;
pub mod target;
