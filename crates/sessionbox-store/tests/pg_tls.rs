//! The PostgreSQL store over TLS: a private cluster with `ssl=on` and a CA and server
//! certificate made here (rcgen), so the shared test server is not reconfigured.

#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "support/pg.rs"]
mod pg;

use sessionbox_core::TenantId;
use sessionbox_store::Store;

/// A CA named `ca_name`, and a server certificate it signed for `names`: (CA PEM, server cert PEM, key PEM).
fn ca_and_server(ca_name: &str, names: &[&str]) -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(vec![]).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, ca_name);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// Opens the store at `url` and proves it works: a key made and found again.
fn works(url: &str) {
    let store = Store::connect(url).unwrap_or_else(|e| panic!("connect {url}: {e}"));
    let made = store
        .create_api_key(
            &TenantId::new("tls").unwrap(),
            Some("t"),
            chrono::Utc::now(),
        )
        .unwrap();
    assert!(store.has_api_keys().unwrap());
    assert!(!made.key.is_empty());
}

fn refused(url: &str) -> String {
    match Store::connect(url) {
        Ok(_) => panic!("{url} connected"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_store_verifies_the_server_certificate_as_sslmode_asks() {
    let (ca, cert, key) = ca_and_server("sessionbox test CA", &["localhost"]);
    let (other_ca, _, _) = ca_and_server("another CA", &["localhost"]);
    let admin = match pg::start_tls_cluster(&cert, &key) {
        Ok(url) => url,
        Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("PostgreSQL is needed by this test: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED (PostgreSQL is missing: {why}; scripts/test installs it)");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    let other_file = dir.path().join("other-ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    std::fs::write(&other_file, &other_ca).unwrap();
    let port = admin
        .rsplit_once(':')
        .and_then(|(_, p)| p.split('/').next())
        .unwrap()
        .to_owned();
    let url =
        |host: &str, query: &str| format!("postgres://postgres@{host}:{port}/postgres?{query}");
    let ca_q = format!("sslrootcert={}", ca_file.display());
    let other_q = format!("sslrootcert={}", other_file.display());

    // Proof that the session is encrypted: the server says so for our own backend.
    let mut probe = postgres::Client::connect(&admin, postgres::NoTls).unwrap();
    let admin_ssl: bool = probe
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        !admin_ssl,
        "the admin connection is plain: the check below means something"
    );

    // verify-full with the right CA and the certificate's name connects, and TLS is in use.
    works(&url("localhost", &format!("sslmode=verify-full&{ca_q}")));
    works(&url("localhost", &format!("sslmode=verify-ca&{ca_q}")));
    works(&url("127.0.0.1", &format!("sslmode=verify-ca&{ca_q}")));
    works(&url("127.0.0.1", "sslmode=require"));
    works(&format!(
        "host=localhost port={port} user=postgres dbname=postgres sslmode=verify-full \
         sslrootcert={}",
        ca_file.display()
    ));
    // A live encrypted session, seen from the server.
    let store = Store::connect(&url("localhost", &format!("sslmode=verify-full&{ca_q}"))).unwrap();
    let encrypted: i64 = probe
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
             WHERE ssl AND backend_type = 'client backend' AND version LIKE 'TLS%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        encrypted >= 1,
        "no TLS session on the server while the store is open"
    );
    drop(store);

    // A wrong CA: refused, saying why.
    let e = refused(&url("localhost", &format!("sslmode=verify-full&{other_q}")));
    assert!(
        e.contains("could not connect to the PostgreSQL store") && e.contains("UnknownIssuer"),
        "{e}"
    );
    let e = refused(&url("localhost", &format!("sslmode=verify-ca&{other_q}")));
    assert!(e.contains("UnknownIssuer"), "{e}");
    // require with a CA checks the chain too (as libpq).
    let e = refused(&url("localhost", &format!("sslmode=require&{other_q}")));
    assert!(e.contains("UnknownIssuer"), "{e}");

    // The right CA but another host name than the certificate's: verify-full refuses.
    let e = refused(&url("127.0.0.1", &format!("sslmode=verify-full&{ca_q}")));
    assert!(
        e.contains("could not connect to the PostgreSQL store") && e.contains("not valid for name"),
        "{e}"
    );
    // Neither the URL nor the CA file's contents leak into the error.
    assert!(!e.contains("sslrootcert") && !e.contains("BEGIN"), "{e}");
}

#[test]
fn sslmode_require_fails_against_a_server_without_tls_and_disable_stays_plain() {
    let Some(db) = pg::database() else { return };
    let mut c = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    let ssl: String = c.query_one("SHOW ssl", &[]).unwrap().get(0);
    assert_eq!(
        ssl, "off",
        "this test needs the shared test server without TLS"
    );
    drop(c);
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let e = refused(&format!("{}{sep}sslmode=require", db.url));
    assert!(
        e.contains("could not connect to the PostgreSQL store") && e.contains("TLS"),
        "{e}"
    );
    works(&format!("{}{sep}sslmode=disable", db.url));
    works(&db.url);
}
