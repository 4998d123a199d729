//! The agent's command line, defined once (feature `args`): the agent parses it
//! (`sessionbox-agent`, `sessionbox agent`) and a runtime that launches the agent builds it with
//! [`AgentArgs::to_argv`], so the two cannot drift apart.
//!
//! ```
//! use clap::Parser;
//! use sessionbox_execd::agent_args::AgentArgs;
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     args: AgentArgs,
//! }
//!
//! let args = AgentArgs {
//!     listen_fd: Some(3),
//!     idle_timeout: 600,
//!     ..AgentArgs::default()
//! };
//! let argv = args.to_argv();
//! let parsed = Cli::try_parse_from(std::iter::once("agent".into()).chain(argv)).unwrap();
//! assert_eq!(parsed.args, args);
//! ```

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use sessionbox_core::Limits;

/// Default listening address: TCP port 44772 (upstream execd's) on loopback only. Upstream
/// listens on every interface; an agent started with no flags on a host must not offer
/// unauthenticated command execution to the network, so another address is asked for
/// explicitly, and a non-loopback one needs a token or [`AgentArgs::insecure_no_token`].
pub const DEFAULT_LISTEN: &str = "tcp:127.0.0.1:44772";
/// Default most terminals (`POST /pty` sessions whose shell has not ended) an agent keeps at once.
pub const DEFAULT_MAX_TERMINALS: usize = 8;
/// Default workspace root.
pub const DEFAULT_ROOT: &str = "/workspace";

/// The agent's options. [`Default`] is what an empty command line gives.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct AgentArgs {
    /// Where to listen: unix:/PATH or tcp:HOST:PORT.
    #[arg(long, default_value = DEFAULT_LISTEN, value_name = "ADDR")]
    pub listen: String,
    /// Serve on this inherited, already bound and listening Unix socket descriptor instead.
    #[arg(long, value_name = "N", conflicts_with = "listen")]
    pub listen_fd: Option<i32>,
    /// The workspace directory; file operations and command working directories are confined
    /// to it, and it is how paths are presented.
    #[arg(long, default_value = DEFAULT_ROOT, value_name = "DIR")]
    pub root: PathBuf,
    /// File holding the access token every request must carry (X-EXECD-ACCESS-TOKEN).
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Serve a non-loopback TCP address without an access token. Only where something else
    /// guards that address (an OpenSandbox container, reached only through its server); without
    /// it such an address needs a token.
    #[arg(long)]
    pub insecure_no_token: bool,
    /// Exit cleanly after this many seconds with no request and no running command (0: never).
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    pub idle_timeout: u64,
    /// File-operation limits as JSON (`sessionbox_core::Limits`; absent fields keep their
    /// defaults), e.g. '{"max_file_bytes": 1048576}'.
    #[arg(long, value_name = "JSON", value_parser = parse_limits)]
    pub limits: Option<Limits>,
    /// Relay connections to this loopback address (the proxy commands are given) to the
    /// egress gateway's Unix socket --egress-socket.
    #[arg(long, value_name = "HOST:PORT", requires = "egress_socket")]
    pub egress_listen: Option<SocketAddr>,
    /// The egress gateway's Unix socket (see --egress-listen).
    #[arg(long, value_name = "PATH", requires = "egress_listen")]
    pub egress_socket: Option<PathBuf>,
    /// Started as root, become this user before serving (`UID:GID`, both numbers, neither 0):
    /// no supplementary groups, an empty bounding set, `no_new_privs`, and of the capabilities
    /// only those of file ownership it holds (`CHOWN`, `FOWNER`, `DAC_OVERRIDE`) for
    /// the agent's own file API, which every command loses when it `exec`s: commands hold no
    /// privilege. For a container whose runtime starts the agent as root (OpenSandbox's
    /// bootstrap).
    #[arg(long, value_name = "UID:GID", value_parser = parse_user)]
    pub user: Option<(u32, u32)>,
    /// With at least one: before serving, the agent confines itself and every command it runs
    /// with Landlock to reading and executing anywhere but writing only beneath these
    /// directories (and to the usual character devices and terminals in `/dev`). A kernel
    /// without Landlock makes the agent exit rather than serve unconfined.
    #[arg(long, value_name = "DIR")]
    pub writable: Vec<PathBuf>,
    /// Most terminals (`POST /pty` sessions whose shell has not ended) at once; one more is
    /// refused with 429.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_TERMINALS)]
    pub max_terminals: usize,
}

impl Default for AgentArgs {
    fn default() -> Self {
        AgentArgs {
            listen: DEFAULT_LISTEN.to_owned(),
            listen_fd: None,
            root: PathBuf::from(DEFAULT_ROOT),
            token_file: None,
            insecure_no_token: false,
            idle_timeout: 0,
            limits: None,
            egress_listen: None,
            egress_socket: None,
            user: None,
            writable: Vec::new(),
            max_terminals: DEFAULT_MAX_TERMINALS,
        }
    }
}

impl AgentArgs {
    /// The command line that parses back to these options (without the program name or any
    /// subcommand before them). `listen` is left out when `listen_fd` is set (the two
    /// conflict); every other option that is set is written, `--root` and `--idle-timeout`
    /// always.
    #[must_use]
    pub fn to_argv(&self) -> Vec<OsString> {
        let mut argv: Vec<OsString> = Vec::new();
        let mut opt = |name: &str, value: OsString| {
            argv.push(name.into());
            argv.push(value);
        };
        match self.listen_fd {
            Some(fd) => opt("--listen-fd", fd.to_string().into()),
            None => opt("--listen", self.listen.clone().into()),
        }
        opt("--root", self.root.clone().into());
        if let Some(path) = &self.token_file {
            opt("--token-file", path.clone().into());
        }
        opt("--idle-timeout", self.idle_timeout.to_string().into());
        if let Some(limits) = &self.limits {
            // Limits is plain numbers: it always serialises.
            let json = serde_json::to_string(limits).unwrap_or_default();
            opt("--limits", json.into());
        }
        if let Some(addr) = self.egress_listen {
            opt("--egress-listen", addr.to_string().into());
        }
        if let Some(path) = &self.egress_socket {
            opt("--egress-socket", path.clone().into());
        }
        if let Some((uid, gid)) = self.user {
            opt("--user", format!("{uid}:{gid}").into());
        }
        for dir in &self.writable {
            opt("--writable", dir.clone().into());
        }
        if self.max_terminals != DEFAULT_MAX_TERMINALS {
            opt("--max-terminals", self.max_terminals.to_string().into());
        }
        if self.insecure_no_token {
            argv.push("--insecure-no-token".into());
        }
        argv
    }
}

/// `UID:GID`, two decimal numbers, neither 0 (the point is to stop being root).
fn parse_user(s: &str) -> Result<(u32, u32), String> {
    let (u, g) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected UID:GID, e.g. 1000:1000"))?;
    let num = |x: &str| {
        x.parse::<u32>()
            .map_err(|_| format!("{s:?}: {x:?} is not a number (expected UID:GID, e.g. 1000:1000)"))
    };
    let (uid, gid) = (num(u)?, num(g)?);
    if uid == 0 || gid == 0 {
        return Err(format!("{s:?}: the user and group must not be root (0)"));
    }
    Ok((uid, gid))
}

fn parse_limits(json: &str) -> Result<Limits, String> {
    serde_json::from_str(json).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: AgentArgs,
    }

    fn parse(argv: Vec<OsString>) -> Result<AgentArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once(OsString::from("agent")).chain(argv)).map(|c| c.args)
    }

    #[test]
    fn every_option_survives_to_argv_and_back() {
        let full = AgentArgs {
            listen: DEFAULT_LISTEN.into(),
            listen_fd: Some(3),
            root: "/workspace".into(),
            token_file: Some("/run/token".into()),
            insecure_no_token: true,
            idle_timeout: 600,
            limits: Some(Limits {
                max_file_bytes: 1234,
                ..Limits::default()
            }),
            egress_listen: Some("127.0.0.1:3128".parse().unwrap()),
            egress_socket: Some("/.sessionbox/egress/gateway.sock".into()),
            user: Some((1000, 1001)),
            writable: vec!["/workspace".into(), "/tmp".into()],
            max_terminals: 3,
        };
        assert_eq!(parse(full.to_argv()).unwrap(), full);
        for bad in ["0:0", "1000:0", "0:1000", "1000", "a:b", "1000:"] {
            assert!(
                parse(vec!["--user".into(), bad.into()]).is_err(),
                "--user {bad} was accepted"
            );
        }
        let tcp = AgentArgs {
            listen: "tcp:127.0.0.1:0".into(),
            root: "/w".into(),
            ..AgentArgs::default()
        };
        assert_eq!(parse(tcp.to_argv()).unwrap(), tcp);
        assert_eq!(
            parse(AgentArgs::default().to_argv()).unwrap(),
            AgentArgs::default()
        );
        assert_eq!(parse(Vec::new()).unwrap(), AgentArgs::default());
    }

    #[test]
    fn what_the_isolated_runtime_wrote_by_hand_parses_the_same() {
        // As the runtime wrote the limits: every field, serialised.
        let limits = serde_json::to_string(&Limits {
            max_file_bytes: 7,
            ..Limits::default()
        })
        .unwrap();
        let argv = [
            "--listen-fd",
            "3",
            "--root",
            "/workspace",
            "--idle-timeout",
            "600",
            "--limits",
            &limits,
            "--egress-listen",
            "127.0.0.1:3128",
            "--egress-socket",
            "/.sessionbox/egress/gateway.sock",
        ]
        .map(OsString::from)
        .to_vec();
        let args = parse(argv.clone()).unwrap();
        assert_eq!(args.to_argv(), argv);
        assert_eq!(args.limits.unwrap().max_file_bytes, 7);
    }

    #[test]
    fn bad_limits_and_a_lone_relay_option_are_refused() {
        let argv = |a: &[&str]| a.iter().map(OsString::from).collect();
        assert!(parse(argv(&["--limits", "{\"nope\": 1}"])).is_err());
        assert!(parse(argv(&["--egress-listen", "127.0.0.1:1"])).is_err());
        assert!(parse(argv(&["--listen", "unix:/s", "--listen-fd", "3"])).is_err());
    }
}
