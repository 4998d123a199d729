//! sessionbox's egress gateway. See the crate README for what it enforces.
//!
//! - [`policy`]: network profiles, rules, validation, the hash, and the two-step check (name
//!   before DNS, then every address).
//! - [`target`]: what a request asks to reach, parsed as a connection would.
//! - [`gateway`]: the proxy (CONNECT and absolute-form HTTP on hyper).
//! - [`verdicts`]: verdicts aggregated per conversation before they are written (a flood
//!   becomes one row with a count; a cap on rows per conversation per second).
//! - [`token`]: signed, short-lived proxy tokens for remote runtimes.
//! - [`opensandbox`]: the policy as an OpenSandbox `networkPolicy`.
//! - `args` (feature `args`, on by default): the gateway's command line, `GatewayArgs`.

mod accept;
#[cfg(feature = "args")]
pub mod args;
pub mod gateway;
pub mod host;
pub mod opensandbox;
pub mod policy;
pub mod ranges;
pub mod target;
pub mod token;
pub mod verdicts;

#[cfg(feature = "args")]
pub use args::GatewayArgs;
pub use gateway::{Auth, Control, Gateway, GatewayConfig, LogEntry};
pub use policy::{Policy, PolicyError, Rule, Verdict};
pub use verdicts::{Aggregator, AggregatorConfig, VerdictRow};
