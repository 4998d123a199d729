//! The gateway's command line, defined once (feature `args`): the `sessionbox egress-gateway`
//! subcommand parses it and the `isolated` runtime builds it with [`GatewayArgs::to_argv`] when
//! it starts a conversation's gateway.
//!
//! ```
//! use clap::Parser;
//! use sessionbox_egress::GatewayArgs;
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     gateway: GatewayArgs,
//! }
//!
//! let args = GatewayArgs::conversation(3, "ab".repeat(32), Some(42));
//! let argv = std::iter::once("gateway".into()).chain(args.to_argv());
//! assert_eq!(Cli::try_parse_from(argv).unwrap().gateway, args);
//! ```

use std::ffi::OsString;
use std::net::SocketAddr;

/// Arguments of the egress gateway: a TCP address for remote runtimes, or one conversation's
/// inherited Unix socket.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(group(clap::ArgGroup::new("listener").required(true).args(["listen", "listen_fd"])))]
pub struct GatewayArgs {
    /// Serve remote runtimes on this TCP address; every request must carry a token from
    /// `sessionbox egress-token` in Proxy-Authorization.
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<SocketAddr>,
    /// Serve one conversation on this inherited listening Unix socket (the `isolated` runtime
    /// starts the gateway so).
    #[arg(long, value_name = "N", requires = "conversation_key")]
    pub listen_fd: Option<i32>,
    /// The conversation key that --listen-fd serves.
    #[arg(long, value_name = "KEY")]
    pub conversation_key: Option<String>,
    /// Exit when this process (the sandbox's monitor) exits.
    #[arg(long, value_name = "PID")]
    pub watch_pid: Option<i32>,
    /// Most connections served at once (1 or more; over it a connection is answered 503):
    /// overrides `[egress] max_connections` (default 256). The gateway's descriptor limit is
    /// set from it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: Option<u32>,
}

impl GatewayArgs {
    /// A gateway for one conversation (`key`) on the inherited listening socket `fd`, ending
    /// when `watch_pid` exits.
    #[must_use]
    pub fn conversation(fd: i32, key: impl Into<String>, watch_pid: Option<i32>) -> Self {
        GatewayArgs {
            listen: None,
            listen_fd: Some(fd),
            conversation_key: Some(key.into()),
            watch_pid,
            max_connections: None,
        }
    }

    /// These arguments with `--max-connections n` (`None`: the configured cap).
    #[must_use]
    pub fn with_max_connections(mut self, n: Option<u32>) -> Self {
        self.max_connections = n;
        self
    }

    /// The command line that parses back to these arguments (without the program name or the
    /// subcommand): every option that is set.
    #[must_use]
    pub fn to_argv(&self) -> Vec<OsString> {
        let mut argv: Vec<OsString> = Vec::new();
        let mut opt = |name: &str, value: String| {
            argv.push(name.into());
            argv.push(value.into());
        };
        if let Some(addr) = self.listen {
            opt("--listen", addr.to_string());
        }
        if let Some(fd) = self.listen_fd {
            opt("--listen-fd", fd.to_string());
        }
        if let Some(key) = &self.conversation_key {
            opt("--conversation-key", key.clone());
        }
        if let Some(pid) = self.watch_pid {
            opt("--watch-pid", pid.to_string());
        }
        if let Some(n) = self.max_connections {
            opt("--max-connections", n.to_string());
        }
        argv
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        gateway: GatewayArgs,
    }

    fn parse(argv: Vec<OsString>) -> Result<GatewayArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once(OsString::from("gateway")).chain(argv))
            .map(|c| c.gateway)
    }

    #[test]
    fn both_kinds_of_gateway_survive_to_argv_and_back() {
        let conv = GatewayArgs::conversation(3, "k".repeat(64), Some(77));
        assert_eq!(parse(conv.to_argv()).unwrap(), conv);
        let tcp = GatewayArgs {
            listen: Some("127.0.0.1:3128".parse().unwrap()),
            listen_fd: None,
            conversation_key: None,
            watch_pid: None,
            max_connections: Some(64),
        };
        assert_eq!(parse(tcp.to_argv()).unwrap(), tcp);
        let capped =
            GatewayArgs::conversation(3, "k".repeat(64), None).with_max_connections(Some(8));
        assert_eq!(parse(capped.to_argv()).unwrap(), capped);
    }

    #[test]
    fn a_cap_of_zero_connections_is_refused() {
        let argv = ["--listen", "127.0.0.1:0", "--max-connections", "0"].map(OsString::from);
        let e = parse(argv.to_vec()).unwrap_err();
        assert!(e.to_string().contains("--max-connections"), "{e}");
    }

    #[test]
    fn the_isolated_runtimes_argv_is_unchanged() {
        let argv = GatewayArgs::conversation(3, "abc", Some(9)).to_argv();
        let expected = [
            "--listen-fd",
            "3",
            "--conversation-key",
            "abc",
            "--watch-pid",
            "9",
        ];
        assert_eq!(argv, expected.map(OsString::from));
    }

    #[test]
    fn a_gateway_needs_a_listener_and_a_socket_needs_a_key() {
        assert!(parse(Vec::new()).is_err());
        let fd_only = ["--listen-fd", "3"].map(OsString::from).to_vec();
        assert!(parse(fd_only).is_err());
    }
}
