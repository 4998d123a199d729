//! The composition root of the `sessionbox` command line, as a library: the settings
//! ([`config`]), the one place runtimes are built ([`runtime`]), what the isolation experiment
//! and the benchmark share ([`experiment`]), and the command line's output channels
//! ([`messages`]: `out!`, `outln!`, `warn!`, `error!`).
//!
//! The `sessionbox` binary maps its subcommands onto these; `sessionbox-bench` and the tests
//! build their runtimes through [`runtime::build_runtime`] too, so they measure and test the
//! runtime the command line runs.

pub mod config;
pub mod experiment;
pub mod messages;
pub mod runtime;
