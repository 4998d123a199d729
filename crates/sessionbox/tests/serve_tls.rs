//! `sessionbox serve` over TLS end to end: the real binary with a certificate made here (rcgen),
//! the REST client (`sessionbox-client`, trusting the test CA), the official MCP Python SDK over
//! https, certificate reloads on SIGHUP and on file change, and the refusal of plain HTTP on an
//! address that is not loopback.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sessionbox_core::{ConversationId, ExecRequest, Session};
use sessionbox_test_support::{serve_command, spawn_serve};

/// A test CA and the files of the certificates it signs.
struct Pki {
    dir: tempfile::TempDir,
    ca_params: rcgen::CertificateParams,
    ca_key: rcgen::KeyPair,
    ca_file: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(vec![]).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "sessionbox serve test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).unwrap();
        Pki {
            dir,
            ca_params,
            ca_key,
            ca_file,
        }
    }

    /// A server certificate for localhost and 127.0.0.1 with serial `serial`: (its DER, the
    /// certificate file, the key file), the files named after the serial.
    fn server(&self, serial: u64) -> (Vec<u8>, PathBuf, PathBuf) {
        let issuer = rcgen::Issuer::from_params(&self.ca_params, &self.ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .unwrap();
        params.serial_number = Some(rcgen::SerialNumber::from(serial));
        let cert = params.signed_by(&key, &issuer).unwrap();
        let cert_file = self.dir.path().join(format!("server-{serial}.crt"));
        let key_file = self.dir.path().join(format!("server-{serial}.key"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert.der().to_vec(), cert_file, key_file)
    }
}

fn cli(data: &Path) -> Command {
    std::fs::create_dir_all(data).unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_sessionbox"));
    c.arg("--data-dir")
        .arg(data)
        .args(["--runtime", "host"])
        .env_remove("SESSIONBOX_RUNTIME")
        .env_remove("SESSIONBOX_TENANT")
        .env_remove("SESSIONBOX_LISTEN")
        .env_remove("SESSIONBOX_TLS_CERT")
        .env_remove("SESSIONBOX_TLS_KEY")
        .stdin(Stdio::null());
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn create_key(data: &Path) -> String {
    let out: Output = cli(data)
        .args(["--tenant", "acme", "keys", "create", "--label", "tls"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

/// A running server, killed when dropped.
struct Served {
    child: Child,
    base: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `serve` on 127.0.0.1 with the host runtime and `extra` serve flags; its stderr into `log`.
fn serve(data: &Path, extra: &[&str], log: Option<&Path>) -> Served {
    std::fs::create_dir_all(data).unwrap();
    let mut cmd = serve_command(
        env!("CARGO_BIN_EXE_sessionbox"),
        data,
        &["--runtime", "host"],
    );
    cmd.args(extra);
    if let Some(log) = log {
        cmd.stderr(std::fs::File::create(log).unwrap())
            .env("SESSIONBOX_LOG", "info");
    }
    let (child, base) = spawn_serve(&mut cmd);
    Served { child, base }
}

/// The certificate `addr` presents now, on a new connection that trusts `ca`.
async fn served_certificate(addr: &str, ca: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let (_, conn) = tls.get_ref();
    assert_eq!(conn.alpn_protocol(), Some(&b"http/1.1"[..]));
    conn.peer_certificates().unwrap()[0].to_vec()
}

/// Waits until `addr` serves `want` (the DER of a certificate), for up to `within`.
async fn wait_for_certificate(addr: &str, ca: &Path, want: &[u8], within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if served_certificate(addr, ca).await == want {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn hangup(child: &Child) {
    rustix::process::kill_process(
        rustix::process::Pid::from_child(child),
        rustix::process::Signal::HUP,
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_over_tls_answers_the_rest_client_and_the_official_mcp_sdk() {
    sessionbox_test_support::require_python_package(
        "mcp.client.streamable_http",
        "mcp",
        "2.3.0",
        "run scripts/test (which installs it) or `python3 -m pip install mcp==2.3.0`",
    );
    let pki = Pki::new();
    let (_, cert, key) = pki.server(1);
    let d = tempfile::tempdir().unwrap();
    let api_key = create_key(d.path());
    let s = serve(
        d.path(),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
        None,
    );
    assert!(s.base.starts_with("https://127.0.0.1:"), "{}", s.base);
    let base = s.base.replace("127.0.0.1", "localhost");

    // The REST client, trusting the test CA: a conversation, a file, a command.
    let client = sessionbox_client::Client::new(&base, Some(api_key.clone()))
        .unwrap()
        .with_root_ca_file(&pki.ca_file)
        .unwrap();
    let conv = client
        .open(&ConversationId::new("tls-rest").unwrap())
        .await
        .unwrap();
    assert!(conv.created());
    conv.write("hello.txt", b"over https\n").await.unwrap();
    assert_eq!(conv.read("hello.txt").await.unwrap(), b"over https\n");
    let r = conv
        .exec(ExecRequest::new("cat hello.txt && echo done"))
        .await
        .unwrap();
    assert!(r.success(), "{r:?}");
    assert_eq!(text(&r.stdout), "over https\ndone\n");

    // Without the CA the same client refuses the server.
    let untrusting = sessionbox_client::Client::new(&base, Some(api_key.clone())).unwrap();
    let e = untrusting
        .open(&ConversationId::new("tls-rest").unwrap())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("did not answer"), "{e}");
    // Plain HTTP to the TLS port gets no answer.
    let plain = reqwest::Client::new()
        .get(s.base.replace("https://", "http://") + "/healthz")
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());

    // The official MCP Python SDK over https, trusting the CA.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/mcp_tls.py");
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .arg(script)
            .arg(format!("{base}/mcp"))
            .arg(&api_key)
            .arg(&pki.ca_file)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the Python client finishes in time")
    .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("OK"),
        "the Python client failed:\n{stdout}\n{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reloads_its_certificate_on_sighup_and_on_change_and_keeps_it_over_a_bad_one() {
    let pki = Pki::new();
    let (first, cert, key) = pki.server(1);
    let (second, cert2, key2) = pki.server(2);
    let (third, cert3, key3) = pki.server(3);
    let d = tempfile::tempdir().unwrap();

    // SIGHUP only (no polling): a change on disk alone is not picked up, SIGHUP picks it up.
    let log = d.path().join("hup.log");
    let s = serve(
        d.path(),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-poll-secs",
            "0",
        ],
        Some(&log),
    );
    let addr = s.base.trim_start_matches("https://").to_owned();
    assert_eq!(served_certificate(&addr, &pki.ca_file).await, first);
    std::fs::copy(&cert2, &cert).unwrap();
    std::fs::copy(&key2, &key).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        served_certificate(&addr, &pki.ca_file).await,
        first,
        "reloaded without SIGHUP although polling is off"
    );
    hangup(&s.child);
    assert!(
        wait_for_certificate(&addr, &pki.ca_file, &second, Duration::from_secs(10)).await,
        "SIGHUP did not load the new certificate"
    );

    // A bad pair (the key of another certificate): logged, and the good one stays.
    std::fs::copy(&key3, &key).unwrap();
    hangup(&s.child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .unwrap()
        .contains("was not loaded")
    {
        assert!(Instant::now() < deadline, "no warning about the bad pair");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("does not fit"), "{logged}");
    assert!(
        !logged.contains("PRIVATE KEY"),
        "key material in the log: {logged}"
    );
    assert_eq!(served_certificate(&addr, &pki.ca_file).await, second);
    // The old pair still serves requests.
    let client = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&pki.ca_file).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    let health = client
        .get(format!(
            "{}/healthz",
            s.base.replace("127.0.0.1", "localhost")
        ))
        .send()
        .await
        .unwrap();
    assert!(health.status().is_success(), "{}", health.status());
    drop(s);

    // Polling (every second): replacing the files is enough.
    let (_, cert, key) = pki.server(10);
    let s = serve(
        d.path(),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-poll-secs",
            "1",
        ],
        None,
    );
    let addr = s.base.trim_start_matches("https://").to_owned();
    // Replaced the way deployment tools do: a new file renamed over the old one.
    for (from, to) in [(&cert3, &cert), (&key3, &key)] {
        let tmp = to.with_extension("new");
        std::fs::copy(from, &tmp).unwrap();
        std::fs::rename(&tmp, to).unwrap();
    }
    assert!(
        wait_for_certificate(&addr, &pki.ca_file, &third, Duration::from_secs(10)).await,
        "a changed certificate file was not reloaded"
    );
}

#[test]
fn serve_refuses_plain_http_on_an_address_that_is_not_loopback() {
    let pki = Pki::new();
    let (_, cert, key) = pki.server(1);
    let d = tempfile::tempdir().unwrap();
    create_key(d.path()); // so that the key check passes and the transport check is reached

    let out = cli(d.path())
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for words in [
        "refusing to serve plain HTTP on 0.0.0.0",
        "--tls-cert",
        "--tls-key",
        "--insecure-plain-http",
        "insecure_plain_http = true",
    ] {
        assert!(err.contains(words), "{words:?} not in {err}");
    }

    // Only half a pair is a usage error.
    let out = cli(d.path())
        .args(["serve", "--listen", "0.0.0.0:0", "--tls-cert"])
        .arg(&cert)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("both a certificate and its key"));

    // A key that does not fit its certificate is refused at start, naming both files.
    let (_, _, other_key) = pki.server(2);
    let out = cli(d.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&cert)
        .arg("--tls-key")
        .arg(&other_key)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("does not fit"),
        "{}",
        text(&out.stderr)
    );

    // With TLS, or with the explicit opt-out (flag or file), it serves.
    let started = |cmd: &mut Command, scheme: &str| {
        let (mut child, base) = sessionbox_test_support::spawn_serve(cmd.stderr(Stdio::null()));
        let _ = child.kill();
        let _ = child.wait();
        assert!(base.starts_with(&format!("{scheme}://0.0.0.0:")), "{base}");
    };
    started(
        cli(d.path())
            .args(["serve", "--listen", "0.0.0.0:0", "--tls-cert"])
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key),
        "https",
    );
    started(
        cli(d.path()).args(["serve", "--listen", "0.0.0.0:0", "--insecure-plain-http"]),
        "http",
    );
    std::fs::write(
        d.path().join("sessionbox.toml"),
        "[serve]\ninsecure_plain_http = true\n",
    )
    .unwrap();
    started(
        cli(d.path()).args(["serve", "--listen", "0.0.0.0:0"]),
        "http",
    );
    // And the certificate can come from the file too.
    std::fs::write(
        d.path().join("sessionbox.toml"),
        format!(
            "[serve]\ntls_cert = {:?}\ntls_key = {:?}\n",
            cert.display().to_string(),
            key.display().to_string()
        ),
    )
    .unwrap();
    started(
        cli(d.path()).args(["serve", "--listen", "0.0.0.0:0"]),
        "https",
    );
}

#[test]
fn verify_via_https_passes_with_the_ca_file_and_refuses_the_server_without_it() {
    let pki = Pki::new();
    let (_, cert, key) = pki.server(1);
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    // Sandboxes left warm stop soon after the test.
    std::fs::write(
        data.join("sessionbox.toml"),
        "[isolated]\nidle_timeout_secs = 3\n",
    )
    .unwrap();
    let api_key = {
        let out = Command::new(env!("CARGO_BIN_EXE_sessionbox"))
            .arg("--data-dir")
            .arg(&data)
            .args(["--tenant", "acme", "keys", "create"])
            .env_remove("SESSIONBOX_RUNTIME")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).trim().to_owned()
    };
    // The default (isolated) runtime, as `verify` wants a security boundary.
    let mut cmd = serve_command(env!("CARGO_BIN_EXE_sessionbox"), &data, &[]);
    cmd.args(["--tls-cert", cert.to_str().unwrap()])
        .args(["--tls-key", key.to_str().unwrap()]);
    let (child, base) = spawn_serve(&mut cmd);
    let s = Served { child, base };
    let base = s.base.replace("127.0.0.1", "localhost");
    let verify = |ca: Option<&Path>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sessionbox"));
        c.args(["verify", "--via", &base, "--report-json"])
            .arg(d.path().join("verify.json"))
            .env("SESSIONBOX_API_KEY", &api_key)
            .env_remove("SESSIONBOX_CA_FILE")
            .stdin(Stdio::null());
        if let Some(ca) = ca {
            c.arg("--ca-file").arg(ca);
        }
        c.output().unwrap()
    };
    let out = verify(None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("did not answer"),
        "{}",
        text(&out.stderr)
    );
    let out = verify(Some(&pki.ca_file));
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path().join("verify.json")).unwrap()).unwrap();
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(report["via"], base.as_str());
}
