//! A PostgreSQL server for tests, and a fresh database in it per test.
//!
//! The server is `SESSIONBOX_TEST_PG_URL` when set (scripts/test starts one: a private cluster
//! in a temporary directory); otherwise a private cluster is started here, once per test
//! process, from the Debian package's binaries (`/usr/lib/postgresql/*/bin`), as the `postgres`
//! user when running as root, listening on 127.0.0.1 on a free port, with its data in a new
//! temporary directory. A watchdog stops it and removes that directory when the test process
//! exits. Each [`TestDb`] is a new database, dropped when the value drops.
//!
//! When PostgreSQL is missing, [`database`] panics under `CI=true` (the suite must not pass
//! without it) and otherwise returns `None`, after saying so on stderr.
//!
//! Shared by several crates' tests through `#[path]`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The environment variable naming a server (a superuser URL ending in a database that
/// exists, such as `postgres://postgres@127.0.0.1:5433/postgres`).
pub const URL_ENV: &str = "SESSIONBOX_TEST_PG_URL";

/// A database of its own for one test.
pub struct TestDb {
    /// Its URL.
    pub url: String,
    admin: String,
    name: String,
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.admin, postgres::NoTls) {
            let _ = c.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// A new, empty database, or `None` when PostgreSQL is missing outside CI.
pub fn database() -> Option<TestDb> {
    let admin = match server() {
        Ok(url) => url.clone(),
        Err(why) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!(
                    "PostgreSQL is needed by this test and is missing: {why}. scripts/test \
                     installs and starts it"
                );
            }
            eprintln!("SKIPPED (PostgreSQL is missing: {why}; scripts/test installs it)");
            return None;
        }
    };
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "sbtest_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    );
    let mut c =
        postgres::Client::connect(&admin, postgres::NoTls).expect("connect to the test server");
    c.batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("create a test database");
    let base = admin
        .rsplit_once('/')
        .map(|(b, _)| b.to_owned())
        .expect("the test server URL names a database");
    Some(TestDb {
        url: format!("{base}/{name}"),
        admin,
        name,
    })
}

fn server() -> Result<&'static String, String> {
    static SERVER: OnceLock<Result<String, String>> = OnceLock::new();
    SERVER
        .get_or_init(|| match std::env::var(URL_ENV) {
            Ok(url) if !url.is_empty() => Ok(url),
            _ => start_private_cluster(),
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn pg_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The postgres user's uid and gid, from /etc/passwd (read only).
fn pg_ids() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&"postgres"))
            .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
    })
}

/// Runs `program` as the postgres user when this process is root (PostgreSQL refuses to run
/// as root).
fn as_pg_user(program: &Path) -> Command {
    let mut c = Command::new(program);
    if rustix::process::geteuid().is_root()
        && let Some((uid, gid)) = pg_ids()
    {
        use std::os::unix::process::CommandExt;
        c.uid(uid).gid(gid);
    }
    c
}

fn start_private_cluster() -> Result<String, String> {
    start_cluster(None)
}

/// A private cluster of its own (as the one [`database`] may start) with `ssl=on`, presenting
/// `cert_pem` (the server's certificate, then any intermediates) and `key_pem`: its superuser
/// URL, without `sslmode` (plain connections are accepted too). Stopped and removed when the
/// test process exits.
pub fn start_tls_cluster(cert_pem: &str, key_pem: &str) -> Result<String, String> {
    start_cluster(Some((cert_pem, key_pem)))
}

fn start_cluster(tls: Option<(&str, &str)>) -> Result<String, String> {
    let bin = pg_bin().ok_or("no /usr/lib/postgresql/*/bin/initdb")?;
    let dir = tempfile::Builder::new()
        .prefix("sessionbox-pg-")
        .tempdir()
        .map_err(|e| e.to_string())?
        .keep();
    if rustix::process::geteuid().is_root() {
        let (uid, gid) = pg_ids().ok_or("no postgres user")?;
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
            .map_err(|e| format!("cannot give the cluster directory to postgres: {e}"))?;
    }
    let data = dir.join("data");
    let out = as_pg_user(&bin.join("initdb"))
        .args(["-D"])
        .arg(&data)
        .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
        .stdout(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut ssl = "";
    if let Some((cert, key)) = tls {
        // The server's defaults: server.crt and server.key in the data directory, the key
        // readable by its owner only.
        use std::os::unix::fs::PermissionsExt;
        for (name, pem, mode) in [("server.crt", cert, 0o644), ("server.key", key, 0o600)] {
            let path = data.join(name);
            std::fs::write(&path, pem).map_err(|e| e.to_string())?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| e.to_string())?;
            if rustix::process::geteuid().is_root() {
                let (uid, gid) = pg_ids().ok_or("no postgres user")?;
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(|e| e.to_string())?;
            }
        }
        ssl = "-c ssl=on";
    }
    let port = free_port();
    // The watchdog stops the server and removes its directory once this test process is gone.
    let script = format!(
        "{postgres} -D {data} -p {port} -k {dir} -c listen_addresses=127.0.0.1 -c fsync=off \
         -c max_connections=300 {ssl} >{dir}/log 2>&1 & pg=$!; \
         while [ -d /proc/{parent} ] && kill -0 $pg 2>/dev/null; do sleep 1; done; \
         kill -INT $pg 2>/dev/null; wait $pg; rm -rf {dir}; sleep 2; rm -rf {dir}",
        postgres = bin.join("postgres").display(),
        data = data.display(),
        dir = dir.display(),
        parent = std::process::id(),
    );
    let mut cmd = as_pg_user(Path::new("/bin/sh"));
    cmd.args(["-c", &script]);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match postgres::Client::connect(&url, postgres::NoTls) {
            Ok(_) => return Ok(url),
            Err(e) if Instant::now() > deadline => {
                return Err(format!("the private PostgreSQL did not start: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// A private cluster of one test's own, which the test may stop, start and restart with
/// `pg_ctl` (the shared server of [`database`] must never be restarted: other tests use it).
/// Made with the Debian package's binaries, as the `postgres` user when running as root, on a
/// free port of 127.0.0.1, its data in a new temporary directory; stopped and removed when
/// dropped, and by a watchdog when the test process dies first.
pub struct OwnCluster {
    /// Its superuser URL (`postgres://postgres@127.0.0.1:PORT/postgres`).
    pub url: String,
    bin: PathBuf,
    dir: PathBuf,
}

impl OwnCluster {
    /// A new running cluster, or `None` when PostgreSQL is missing outside CI (under
    /// `CI=true` it panics instead).
    pub fn start() -> Option<OwnCluster> {
        match OwnCluster::try_start() {
            Ok(c) => Some(c),
            Err(why) => {
                if std::env::var("CI").is_ok_and(|v| v == "true") {
                    panic!(
                        "PostgreSQL is needed by this test and is missing: {why}. scripts/test \
                         installs it"
                    );
                }
                eprintln!("SKIPPED (PostgreSQL is missing: {why}; scripts/test installs it)");
                None
            }
        }
    }

    fn try_start() -> Result<OwnCluster, String> {
        let bin = pg_bin().ok_or("no /usr/lib/postgresql/*/bin/initdb")?;
        let dir = tempfile::Builder::new()
            .prefix("sessionbox-pg-own-")
            .tempdir()
            .map_err(|e| e.to_string())?
            .keep();
        if rustix::process::geteuid().is_root() {
            let (uid, gid) = pg_ids().ok_or("no postgres user")?;
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| format!("cannot give the cluster directory to postgres: {e}"))?;
        }
        let out = as_pg_user(&bin.join("initdb"))
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let port = free_port();
        let cluster = OwnCluster {
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            bin,
            dir,
        };
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300",
            cluster.dir.display()
        );
        cluster.pg_ctl(&["start", "-w", "-t", "60", "-o", &opts])?;
        // The watchdog: once this test process is gone, the cluster goes too.
        let script = format!(
            "while [ -d /proc/{parent} ]; do sleep 1; done; \
             {pg_ctl} -D {dir}/data -m immediate stop >/dev/null 2>&1; rm -rf {dir}",
            parent = std::process::id(),
            pg_ctl = cluster.bin.join("pg_ctl").display(),
            dir = cluster.dir.display(),
        );
        as_pg_user(Path::new("/bin/sh"))
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        Ok(cluster)
    }

    /// `pg_ctl -D DATA -l LOG ARGS...` as the postgres user; `Err` with its output on failure.
    fn pg_ctl(&self, args: &[&str]) -> Result<(), String> {
        let out = as_pg_user(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .arg("-l")
            .arg(self.dir.join("log"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl {args:?} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// `pg_ctl restart -m MODE` (`fast`: sessions are ended cleanly; `immediate`: the server
    /// stops at once and recovers from its log on start), waiting until it accepts connections.
    pub fn restart(&self, mode: &str) {
        self.pg_ctl(&["restart", "-m", mode, "-w", "-t", "60"])
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// `pg_ctl stop -m MODE`.
    pub fn stop(&self, mode: &str) {
        self.pg_ctl(&["stop", "-m", mode, "-w", "-t", "60"])
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// `pg_ctl start` again after [`OwnCluster::stop`] (with the options it was first started
    /// with), waiting until it accepts connections.
    pub fn start_again(&self) {
        let opts = std::fs::read_to_string(self.dir.join("data/postmaster.opts"))
            .ok()
            .and_then(|o| {
                // `.../postgres "-D" "..." "-p" "N" ...`: the options after the program.
                let rest = o.trim().split_once(' ')?.1.to_owned();
                Some(rest.replace('"', ""))
            })
            .unwrap_or_default();
        let opts: Vec<&str> = opts.split_whitespace().collect();
        // Drop `-D DIR` (pg_ctl gives it).
        let mut kept = Vec::new();
        let mut skip = false;
        for o in opts {
            if skip {
                skip = false;
                continue;
            }
            if o == "-D" {
                skip = true;
                continue;
            }
            kept.push(o);
        }
        let joined = kept.join(" ");
        self.pg_ctl(&["start", "-w", "-t", "60", "-o", &joined])
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w", "-t", "30"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
