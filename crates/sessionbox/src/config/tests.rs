//! Tests of the settings: file keys, precedence, limits and pool sizes.

use super::*;

#[test]
fn unknown_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sessionbox.toml");
    std::fs::write(&p, "runtme = \"host\"\n").unwrap();
    let err = FileConfig::load(&p, false).unwrap_err();
    assert!(format!("{err:#}").contains("runtme"), "{err:#}");
}

/// Found by the `config` fuzz target: a value the parser could not use was quoted in the
/// error, and a value under the wrong key may be a secret (a store URL with its password).
#[test]
fn an_error_never_shows_a_value_of_the_file() {
    let secret = "postgres://sessionbox:hunter2@db.example:5432/sb";
    for text in [
        format!("runtime = \"{secret}\"\n"),
        format!("store = \"{secret}\"\n"),
        format!("[isolated]\npids = \"{secret}\"\n"),
        format!("[isolated]\nlimits = \"{secret}\"\n"),
        format!("[egress]\nnameservers = [\"{secret}\"]\n"),
        format!("[store]\nurl = [\"{secret}\"]\n"),
        format!("[serve]\ncors_origins = \"{secret}\"\n"),
        "runtime = \"quote\\\"and\\\\slash hunter2\"\n".to_owned(),
    ] {
        let err = format!(
            "{:#}",
            FileConfig::parse(&text, Path::new("c.toml")).unwrap_err()
        );
        assert!(!err.contains("hunter2"), "{text:?}: {err}");
        assert!(err.contains("(line 1") || err.contains("(line 2"), "{err}");
    }
    // Keys are still named, and so is what was expected.
    let err = FileConfig::parse("runtme = \"host\"\n", Path::new("c.toml")).unwrap_err();
    assert!(format!("{err:#}").contains("runtme"), "{err:#}");
    let err = FileConfig::parse("runtime = \"hots\"\n", Path::new("c.toml")).unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains("not shown") && err.contains("`opensandbox`"),
        "{err}"
    );
}

#[test]
fn serve_settings_are_read_and_an_unknown_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sessionbox.toml");
    std::fs::write(
        &p,
        "[serve]\nmax_output_bytes_per_tenant = 10\nmax_output_bytes_total = 20\n\
         max_mcp_sessions_per_tenant = 3\ntls_cert = \"/etc/sb/cert.pem\"\n\
         tls_key = \"/etc/sb/key.pem\"\ninsecure_plain_http = false\n",
    )
    .unwrap();
    let c = FileConfig::load(&p, true).unwrap();
    assert_eq!(c.serve.tls_cert, Some(PathBuf::from("/etc/sb/cert.pem")));
    assert_eq!(c.serve.tls_key, Some(PathBuf::from("/etc/sb/key.pem")));
    assert_eq!(c.serve.insecure_plain_http, Some(false));
    assert_eq!(c.serve.max_output_bytes_per_tenant, Some(10));
    assert_eq!(c.serve.max_output_bytes_total, Some(20));
    assert_eq!(c.serve.max_mcp_sessions_per_tenant, Some(3));
    std::fs::write(&p, "[serve]\nmax_output_bytes = 1\n").unwrap();
    let err = FileConfig::load(&p, true).unwrap_err();
    assert!(format!("{err:#}").contains("max_output_bytes"), "{err:#}");
}

#[test]
fn opensandbox_pool_sizes_are_read_and_too_many_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sessionbox.toml");
    std::fs::write(
        &p,
        "[opensandbox]\npool_size = 2\n[opensandbox.pool_tenants]\nacme = 5\nquiet = 0\n",
    )
    .unwrap();
    let c = FileConfig::load(&p, true).unwrap();
    let sizes = c.opensandbox.pool_sizes().unwrap();
    assert_eq!(
        (sizes.of("other"), sizes.of("acme"), sizes.of("quiet")),
        (2, 5, 0)
    );
    assert!(
        FileConfig::default()
            .opensandbox
            .pool_sizes()
            .unwrap()
            .is_off()
    );
    std::fs::write(&p, "[opensandbox]\npool_size = 65\n").unwrap();
    let err = format!(
        "{:#}",
        FileConfig::load(&p, true)
            .unwrap()
            .opensandbox
            .pool_sizes()
            .unwrap_err()
    );
    assert!(err.contains("[opensandbox] pool size 65"), "{err}");
}

#[test]
fn file_settings_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sessionbox.toml");
    std::fs::write(
        &p,
        "runtime = \"host\"\ntenant = \"acme\"\n[limits]\nmax_file_bytes = 10\n[host]\nkill_grace_ms = 5\n",
    )
    .unwrap();
    let c = FileConfig::load(&p, true).unwrap();
    assert_eq!(c.runtime, Some(RuntimeKind::Host));
    assert_eq!(c.tenant.as_deref(), Some("acme"));
    assert_eq!(c.limits.unwrap().max_file_bytes, 10);
    assert_eq!(c.limits.unwrap().max_entries, Limits::default().max_entries);
    assert_eq!(c.host.kill_grace_ms, Some(5));
}

#[test]
fn the_gateway_connection_cap_is_read_and_zero_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sessionbox.toml");
    std::fs::write(&p, "[egress]\nmax_connections = 32\n").unwrap();
    let c = FileConfig::load(&p, true).unwrap();
    assert_eq!(c.egress.max_connections.map(|n| n.get()), Some(32));
    std::fs::write(&p, "[egress]\nmax_connections_per_source = 8\n").unwrap();
    let c = FileConfig::load(&p, true).unwrap();
    assert_eq!(
        c.egress.max_connections_per_source.map(|n| n.get()),
        Some(8)
    );
    std::fs::write(&p, "[egress]\nmax_connections = 0\n").unwrap();
    let err = format!("{:#}", FileConfig::load(&p, true).unwrap_err());
    assert!(err.contains("line 2") && err.contains("nonzero"), "{err}");
}

#[test]
fn opensandbox_settings_are_read_and_a_key_there_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sessionbox.toml");
    std::fs::write(
        &p,
        "runtime = \"opensandbox\"\n[opensandbox]\nendpoint = \"http://127.0.0.1:8080\"\n\
         timeout_secs = 600\nmemory = \"512Mi\"\nnetwork_policy = true\n\
         egress_gateway = \"egress.internal.example:3128\"\n",
    )
    .unwrap();
    let c = FileConfig::load(&p, true).unwrap();
    assert_eq!(c.runtime, Some(RuntimeKind::Opensandbox));
    assert_eq!(c.opensandbox.network_policy, Some(true));
    assert_eq!(
        c.opensandbox.egress_gateway.as_deref(),
        Some("egress.internal.example:3128")
    );
    assert_eq!(
        c.opensandbox.endpoint.as_deref(),
        Some("http://127.0.0.1:8080")
    );
    assert_eq!(c.opensandbox.timeout_secs, Some(600));
    std::fs::write(&p, "[opensandbox]\napi_key = \"s3cret\"\n").unwrap();
    let err = format!("{:#}", FileConfig::load(&p, true).unwrap_err());
    assert!(err.contains("api_key") && err.contains("line 2"), "{err}");
    assert!(
        !err.contains("s3cret"),
        "the error quotes the secret: {err}"
    );
}

#[test]
fn an_unknown_key_in_limits_is_refused_like_everywhere_else() {
    let e = toml::from_str::<FileConfig>("[limits]\nbogus = 1\n").unwrap_err();
    assert!(e.to_string().contains("bogus"), "{e}");
}

#[test]
fn the_disk_quota_defaults_to_1_gib_and_100k_inodes_and_bad_values_are_refused() {
    use sessionbox_local::isolated::DiskQuota;
    let parse = |t: &str| {
        toml::from_str::<FileConfig>(t)
            .unwrap()
            .isolated
            .disk_quota()
    };
    assert_eq!(
        parse("").unwrap(),
        Some(DiskQuota::new(1 << 30, 100_000).unwrap())
    );
    assert_eq!(
        parse("[isolated]\ndisk_bytes = 67108864\ndisk_inodes = 2000\n").unwrap(),
        Some(DiskQuota::new(64 << 20, 2000).unwrap())
    );
    assert_eq!(parse("[isolated]\ndisk_bytes = 0\n").unwrap(), None);
    let e = parse("[isolated]\ndisk_bytes = 1000\n").unwrap_err();
    assert!(format!("{e:#}").contains("disk_bytes"), "{e:#}");
    let e = parse("[isolated]\ndisk_bytes = 67108864\ndisk_inodes = 10000000\n").unwrap_err();
    assert!(format!("{e:#}").contains("inodes"), "{e:#}");
    assert!(toml::from_str::<FileConfig>("[isolated]\ndisk_byte = 1\n").is_err());
}

#[test]
fn isolated_limits_default_to_cgroups_and_rlimit_only_is_a_choice() {
    use sessionbox_sandbox::LimitMode;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sessionbox.toml");
    std::fs::write(
        &p,
        "[isolated]
pids = 64
",
    )
    .unwrap();
    let l = FileConfig::load(&p, true)
        .unwrap()
        .isolated
        .sandbox_limits();
    assert_eq!(l.mode, LimitMode::Cgroup);
    assert_eq!((l.pids, l.nproc), (64, 64));
    std::fs::write(
        &p,
        "[isolated]
limits = \"rlimit\"
cpu_secs = 60
memory_bytes = 1073741824
",
    )
    .unwrap();
    let l = FileConfig::load(&p, true)
        .unwrap()
        .isolated
        .sandbox_limits();
    assert_eq!(l.mode, LimitMode::Rlimit);
    assert_eq!((l.cpu_secs, l.memory_bytes), (60, 1 << 30));
    std::fs::write(
        &p,
        "[isolated]
limits = \"none\"
",
    )
    .unwrap();
    let err = format!("{:#}", FileConfig::load(&p, true).unwrap_err());
    assert!(err.contains("cgroup") && err.contains("rlimit"), "{err}");
}

#[test]
fn lifecycle_defaults_and_tenant_overrides_are_read() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sessionbox.toml");
    std::fs::write(
        &p,
        "[isolated]\nidle_timeout_secs = 30\n[lifecycle]\nttl_secs = 3600\n\
         [lifecycle.tenants.acme]\nttl_secs = 60\nmax_lifetime_secs = 120\n\
         [store]\nurl = \"postgres://sb@db:5432/sb\"\n",
    )
    .unwrap();
    let c = FileConfig::load(&p, true).unwrap();
    let policy = c.lifecycle().unwrap();
    let d = policy.for_tenant(&sessionbox_core::TenantId::new("other").unwrap());
    assert_eq!(d.idle_timeout, Some(Duration::from_secs(30)));
    assert_eq!(d.ttl, Some(Duration::from_secs(3600)));
    assert_eq!(d.max_lifetime, None);
    let a = policy.for_tenant(&sessionbox_core::TenantId::new("acme").unwrap());
    assert_eq!(a.idle_timeout, Some(Duration::from_secs(30)));
    assert_eq!(a.ttl, Some(Duration::from_secs(60)));
    assert_eq!(a.max_lifetime, Some(Duration::from_secs(120)));
    assert_eq!(c.store.url.as_deref(), Some("postgres://sb@db:5432/sb"));
    std::fs::write(&p, "[lifecycle.tenants.acme]\nttl = 1\n").unwrap();
    assert!(FileConfig::load(&p, true).is_err());
}

#[test]
fn skills_directories_come_from_the_file_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sessionbox.toml");
    std::fs::write(
        &p,
        "[skills]\nmax_files = 7\n[skills.tenants]\nacme = [\"/srv/acme\"]\ndefault = [\"/srv/d\"]\n",
    )
    .unwrap();
    let c = FileConfig::load(&p, true).unwrap();
    let acme = sessionbox_core::TenantId::new("acme").unwrap();
    let def = sessionbox_core::TenantId::new("default").unwrap();
    let s = c.skills.resolve(None).unwrap();
    assert_eq!(s.roots(&acme), [PathBuf::from("/srv/acme")]);
    assert_eq!(s.roots(&def), [PathBuf::from("/srv/d")]);
    assert_eq!(s.limits().max_files, 7);
    let s = c.skills.resolve(Some("/a:/b")).unwrap();
    assert_eq!(s.roots(&def), [PathBuf::from("/a"), PathBuf::from("/b")]);
    assert!(c.skills.resolve(Some("rel")).is_err());
    std::fs::write(&p, "[skills]\ndirs = []\n").unwrap();
    assert!(
        FileConfig::load(&p, true).is_err(),
        "unknown keys are refused"
    );
}

#[test]
fn a_missing_file_is_empty_unless_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("none.toml");
    assert!(FileConfig::load(&p, false).is_ok());
    assert!(FileConfig::load(&p, true).is_err());
}
