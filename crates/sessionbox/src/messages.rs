//! The command line's two channels, as ripgrep keeps them: a command's results go to standard
//! output through [`out!`](crate::out) and [`outln!`](crate::outln), and every diagnostic goes
//! to standard error through [`warn!`](crate::warn) and [`error!`](crate::error), so each one
//! has the same shape: `warning: …` or `error: …`, one line, no trailing period.
//!
//! A command's own bytes (a command's stderr passed on byte for byte, `edit`'s count of
//! replacements) are not diagnostics and are written as they are.

use std::fmt;
use std::io::Write;

/// The exit status of a command whose reader went away (`sessionbox ... | head`): 141, what a
/// shell reports for a process ended by SIGPIPE, the way other Unix tools end there.
pub const EXIT_BROKEN_PIPE: u8 = 141;

/// `println!` for a command's results: see [`print_out`].
#[macro_export]
macro_rules! outln {
    () => {
        $crate::messages::print_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::messages::print_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` for a command's results: see [`print_out`].
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::messages::print_out(format_args!($($arg)*))
    };
}

/// A warning on standard error: `warning: …` (the command goes on).
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => {
        $crate::messages::print_diagnostic($crate::messages::Level::Warning, format_args!($($arg)*))
    };
}

/// An error on standard error: `error: …` (the command ends with a failure status).
#[macro_export]
macro_rules! error {
    ($($arg:tt)*) => {
        $crate::messages::print_diagnostic($crate::messages::Level::Error, format_args!($($arg)*))
    };
}

/// How serious a diagnostic is: its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// `warning: `: something the user should know; the command goes on.
    Warning,
    /// `error: `: why the command failed.
    Error,
}

impl Level {
    fn prefix(self) -> &'static str {
        match self {
            Level::Warning => "warning",
            Level::Error => "error",
        }
    }
}

/// Writes a command's result to standard output. When the reader has gone away (a broken
/// pipe), the program ends quietly with [`EXIT_BROKEN_PIPE`] instead of panicking as
/// `println!` does; any other write error ends it with status 1 and says so.
pub fn print_out(args: fmt::Arguments<'_>) {
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(EXIT_BROKEN_PIPE.into());
        }
        print_diagnostic(
            Level::Error,
            format_args!("cannot write to standard output: {e}"),
        );
        std::process::exit(1);
    }
}

/// Writes one diagnostic line to standard error, prefixed by its level. A standard error that
/// cannot be written to is ignored: there is nowhere left to say so.
pub fn print_diagnostic(level: Level, args: fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{}: {args}", level.prefix());
}
