//! Snapshots, restore, fork, templates, import and export, retention and the tenant's cap,
//! over the real `host` runtime and a real SQLite store: what each leaves in the workspaces
//! and in the snapshot directory, and that a refusal changes nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sessionbox_core::{ConversationId, ConversationRef, Error, Session, TenantId};
use sessionbox_local::host::{HostConfig, HostRuntime};
use sessionbox_manager::{DEFAULT_TEMPLATE, ForkFrom, GcOptions, Manager, SnapshotConfig};
use sessionbox_store::Store;

struct Fixture {
    _dir: tempfile::TempDir,
    snapshots: PathBuf,
    m: Manager,
}

fn fixture(tweak: impl FnOnce(&mut SnapshotConfig)) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("sessionbox.db")).unwrap();
    let runtime = HostRuntime::new(HostConfig::new(dir.path())).unwrap();
    let snapshots = dir.path().join("snapshots");
    let mut config = SnapshotConfig::new(&snapshots);
    tweak(&mut config);
    let m = Manager::new(store, Arc::new(runtime)).with_snapshots(config);
    Fixture {
        _dir: dir,
        snapshots,
        m,
    }
}

fn conv(id: &str) -> ConversationRef {
    ConversationRef::parse("default", id).unwrap()
}

fn tenant() -> TenantId {
    TenantId::new("default").unwrap()
}

async fn write(m: &Manager, c: &ConversationRef, path: &str, data: &[u8]) {
    let s = m.open(c).await.unwrap();
    s.write(path, data).await.unwrap();
    Box::new(s).close().await.unwrap();
}

async fn read(m: &Manager, c: &ConversationRef, path: &str) -> Result<Vec<u8>, Error> {
    let s = m.open(c).await.unwrap();
    let r = s.read(path).await;
    Box::new(s).close().await.unwrap();
    r
}

/// The names in the snapshot directory.
fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_restores_the_workspace_as_it_was() {
    let f = fixture(|_| {});
    let a = conv("a");
    write(&f.m, &a, "src/main.rs", b"fn main() {}\n").await;
    write(&f.m, &a, "odd bytes", b"\x00\xff\x01").await;
    write(&f.m, &a, "empty", b"").await;
    let r = f.m.snapshot(&a, "v1", None).await.unwrap();
    assert_eq!((r.files, r.bytes, r.directories), (3, 16, 1), "{r:?}");
    assert_eq!(r.origin.as_ref().map(|o| o.as_str()), Some("a"));
    assert!(r.stored_bytes > 0 && r.expires_at.is_some());
    assert_eq!(files(&f.snapshots), [format!("{}.tar.zst", r.id)]);

    // Changed, added, removed: all undone by the restore.
    write(&f.m, &a, "src/main.rs", b"broken").await;
    write(&f.m, &a, "new.txt", b"later").await;
    let s = f.m.open(&a).await.unwrap();
    s.remove("empty", false).await.unwrap();
    Box::new(s).close().await.unwrap();
    let stats = f.m.restore(&a, "v1").await.unwrap();
    assert_eq!(stats.files, 3);
    assert_eq!(
        read(&f.m, &a, "src/main.rs").await.unwrap(),
        b"fn main() {}\n"
    );
    assert_eq!(read(&f.m, &a, "odd bytes").await.unwrap(), b"\x00\xff\x01");
    assert_eq!(read(&f.m, &a, "empty").await.unwrap(), b"");
    assert!(matches!(
        read(&f.m, &a, "new.txt").await,
        Err(Error::NotFound(_))
    ));

    // The name is taken: refused, nothing added.
    let e = f.m.snapshot(&a, "v1", None).await.unwrap_err();
    assert!(matches!(e, Error::AlreadyExists(_)), "{e:?}");
    assert_eq!(files(&f.snapshots).len(), 1);
    // Bad names and absent things are typed.
    for bad in ["", "../x", ".hidden", "a b"] {
        let e = f.m.snapshot(&a, bad, None).await.unwrap_err();
        assert_eq!(e.code(), "invalid_request", "{bad:?}");
    }
    let e = f.m.restore(&a, "nope").await.unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e:?}");
    let e = f.m.snapshot(&conv("absent"), "v2", None).await.unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e:?}");
    assert_eq!(files(&f.snapshots).len(), 1, "a refusal leaves no file");

    assert!(f.m.delete_snapshot(&tenant(), "v1").await.unwrap());
    assert!(!f.m.delete_snapshot(&tenant(), "v1").await.unwrap());
    assert!(files(&f.snapshots).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_share_nothing_writable_with_their_origin() {
    let f = fixture(|_| {});
    let a = conv("origin");
    write(&f.m, &a, "state.txt", b"at the snapshot").await;
    f.m.snapshot(&a, "s", None).await.unwrap();
    write(&f.m, &a, "state.txt", b"after the snapshot").await;

    let from_snapshot = conv("from-snapshot");
    let live = conv("live");
    f.m.fork(&ForkFrom::Snapshot("s".into()), &from_snapshot)
        .await
        .unwrap();
    f.m.fork(&ForkFrom::Conversation(a.id.clone()), &live)
        .await
        .unwrap();
    assert_eq!(
        read(&f.m, &from_snapshot, "state.txt").await.unwrap(),
        b"at the snapshot"
    );
    assert_eq!(
        read(&f.m, &live, "state.txt").await.unwrap(),
        b"after the snapshot"
    );
    // Writes in each stay in each.
    write(&f.m, &a, "state.txt", b"origin later").await;
    write(&f.m, &live, "state.txt", b"live later").await;
    write(&f.m, &from_snapshot, "state.txt", b"fork later").await;
    assert_eq!(read(&f.m, &a, "state.txt").await.unwrap(), b"origin later");
    assert_eq!(read(&f.m, &live, "state.txt").await.unwrap(), b"live later");
    assert_eq!(
        read(&f.m, &from_snapshot, "state.txt").await.unwrap(),
        b"fork later"
    );
    // Different workspaces on disk, not links to one.
    let loc = |c: &ConversationRef| PathBuf::from(f.m.runtime().workspace_location(&c.key));
    assert_ne!(loc(&a), loc(&live));
    use std::os::unix::fs::MetadataExt;
    let ino = |c: &ConversationRef| std::fs::metadata(loc(c).join("state.txt")).unwrap().ino();
    assert_ne!(ino(&a), ino(&live));

    // Into an existing conversation: refused, and it is left as it was.
    let e =
        f.m.fork(&ForkFrom::Snapshot("s".into()), &live)
            .await
            .unwrap_err();
    assert!(matches!(e, Error::AlreadyExists(_)), "{e:?}");
    assert_eq!(read(&f.m, &live, "state.txt").await.unwrap(), b"live later");
    let e =
        f.m.fork(&ForkFrom::Conversation(a.id.clone()), &a)
            .await
            .unwrap_err();
    assert_eq!(e.code(), "invalid_request");
    // From something absent: refused, nothing made.
    let ghost = conv("ghost");
    let e =
        f.m.fork(&ForkFrom::Snapshot("nope".into()), &ghost)
            .await
            .unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e:?}");
    let e =
        f.m.fork(
            &ForkFrom::Conversation(ConversationId::new("nobody").unwrap()),
            &ghost,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e:?}");
    assert!(f.m.store().get(&ghost.key).unwrap().is_none());
    // Only the snapshot's archive is kept: forks leave no temporary file.
    assert_eq!(files(&f.snapshots).len(), 1, "{:?}", files(&f.snapshots));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_default_template_starts_every_new_conversation_and_pins_its_snapshot() {
    let f = fixture(|_| {});
    let base = conv("base");
    write(&f.m, &base, "deps/installed", b"yes").await;
    f.m.snapshot(&base, "deps", None).await.unwrap();
    let existing = conv("existing");
    write(&f.m, &existing, "mine", b"1").await;

    f.m.set_template(&tenant(), DEFAULT_TEMPLATE, "deps")
        .await
        .unwrap();
    f.m.set_template(&tenant(), "named", "deps").await.unwrap();
    assert_eq!(
        f.m.templates(&tenant()).await.unwrap(),
        [
            (DEFAULT_TEMPLATE.to_owned(), "deps".to_owned()),
            ("named".to_owned(), "deps".to_owned())
        ]
    );
    let e = f.m.set_template(&tenant(), "x", "nope").await.unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e:?}");

    // A new conversation starts with the template's files; one that existed is untouched.
    let fresh = conv("fresh");
    assert_eq!(read(&f.m, &fresh, "deps/installed").await.unwrap(), b"yes");
    assert!(read(&f.m, &existing, "deps/installed").await.is_err());
    assert_eq!(read(&f.m, &existing, "mine").await.unwrap(), b"1");
    // A named template too.
    let named = conv("named-start");
    f.m.create_from_template(&named, "named").await.unwrap();
    assert_eq!(read(&f.m, &named, "deps/installed").await.unwrap(), b"yes");
    // Another tenant has no template.
    let other = ConversationRef::parse("other", "fresh").unwrap();
    let s = f.m.open(&other).await.unwrap();
    assert!(s.read("deps/installed").await.is_err());
    Box::new(s).close().await.unwrap();

    // A template pins its snapshot.
    let e = f.m.delete_snapshot(&tenant(), "deps").await.unwrap_err();
    assert!(matches!(e, Error::Conflict(_)), "{e:?}");
    assert!(
        f.m.remove_template(&tenant(), DEFAULT_TEMPLATE)
            .await
            .unwrap()
    );
    assert!(f.m.remove_template(&tenant(), "named").await.unwrap());
    assert!(!f.m.remove_template(&tenant(), "named").await.unwrap());
    let after = conv("after");
    assert!(read(&f.m, &after, "deps/installed").await.is_err());
    assert!(f.m.delete_snapshot(&tenant(), "deps").await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tenant_cap_refuses_a_snapshot_past_it_and_keeps_nothing() {
    let f = fixture(|_| {});
    let a = conv("a");
    write(&f.m, &a, "x", &[b'x'; 100]).await;
    let first = f.m.snapshot(&a, "one", None).await.unwrap();
    // Room for that one and a byte, not two.
    let mut config = f.m.snapshot_config().unwrap().clone();
    config.tenant_cap_bytes = Some(first.stored_bytes + 1);
    let capped = f.m.clone().with_snapshots(config);
    let e = capped.snapshot(&a, "two", None).await.unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e:?}");
    assert_eq!(files(&f.snapshots), [format!("{}.tar.zst", first.id)]);
    assert_eq!(f.m.snapshots(&tenant()).await.unwrap().len(), 1);
    // Another tenant has its own allowance.
    let b = ConversationRef::parse("other", "b").unwrap();
    write(&f.m, &b, "x", &[b'x'; 100]).await;
    capped.snapshot(&b, "one", None).await.unwrap();
    // The largest archive: refused before it is kept.
    let g = fixture(|c| c.max_archive_bytes = 4096);
    write(&g.m, &a, "big", &[b'y'; 8192]).await;
    let e = g.m.snapshot(&a, "big", None).await.unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e:?}");
    assert!(files(&g.snapshots).is_empty(), "{:?}", files(&g.snapshots));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exported_archive_imports_and_a_hostile_one_is_refused() {
    let f = fixture(|_| {});
    let a = conv("a");
    write(&f.m, &a, "dir/file", b"contents").await;
    f.m.snapshot(&a, "v1", None).await.unwrap();
    let (record, mut archive) = f.m.snapshot_archive(&tenant(), "v1").await.unwrap();
    let exported = f._dir.path().join("v1.tar.zst");
    let mut out = std::fs::File::create(&exported).unwrap();
    std::io::copy(&mut archive, &mut out).unwrap();
    assert_eq!(
        std::fs::metadata(&exported).unwrap().len(),
        record.stored_bytes
    );

    let imported =
        f.m.import_snapshot(&tenant(), "copied", &exported, None)
            .await
            .unwrap();
    assert_eq!((imported.files, imported.bytes), (1, 8));
    assert_eq!(imported.runtime, "import");
    assert!(imported.origin.is_none());
    let b = conv("b");
    f.m.fork(&ForkFrom::Snapshot("copied".into()), &b)
        .await
        .unwrap();
    assert_eq!(read(&f.m, &b, "dir/file").await.unwrap(), b"contents");

    // A plain tar imports too; one that climbs out, or writes through its own link, does
    // not, and leaves nothing.
    let before = files(&f.snapshots);
    let hostile = [
        ("../escape", tar::EntryType::Regular, ""),
        ("link", tar::EntryType::Symlink, "/tmp"),
    ];
    for (i, entries) in [&hostile[..1], &hostile[1..]].iter().enumerate() {
        let mut tail: Vec<(&str, tar::EntryType, &str)> = entries.to_vec();
        if i == 1 {
            tail.push(("link/owned", tar::EntryType::Regular, ""));
        }
        let path = f._dir.path().join(format!("hostile-{i}.tar"));
        std::fs::write(&path, raw_tar(&tail)).unwrap();
        let e =
            f.m.import_snapshot(&tenant(), &format!("hostile-{i}"), &path, None)
                .await
                .unwrap_err();
        assert_eq!(e.code(), "invalid_request", "{e}");
    }
    let not_an_archive = f._dir.path().join("noise");
    std::fs::write(&not_an_archive, [0x41u8; 4096]).unwrap();
    let e =
        f.m.import_snapshot(&tenant(), "noise", &not_an_archive, None)
            .await
            .unwrap_err();
    assert_eq!(e.code(), "invalid_request", "{e}");
    assert_eq!(files(&f.snapshots), before, "refusals leave no file");
    assert_eq!(f.m.snapshots(&tenant()).await.unwrap().len(), 2);
}

/// A tar of (path, kind, link target) entries, names written raw into the header.
fn raw_tar(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, kind, link) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_size(0);
        h.set_mode(0o644);
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_cksum();
        b.append(&h, &[][..]).unwrap();
    }
    b.into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn garbage_collection_removes_expired_snapshots_orphans_and_stale_temporaries() {
    let f = fixture(|_| {});
    let a = conv("a");
    write(&f.m, &a, "x", b"1").await;
    let gone =
        f.m.snapshot(&a, "short", Some(Duration::from_millis(1)))
            .await
            .unwrap();
    let kept = f.m.snapshot(&a, "kept", None).await.unwrap();
    // A short-lived one pinned by a template stays.
    let pinned =
        f.m.snapshot(&a, "pinned", Some(Duration::from_millis(1)))
            .await
            .unwrap();
    f.m.set_template(&tenant(), "t", "pinned").await.unwrap();
    // Kept until deleted: zero means no expiry.
    let forever =
        f.m.snapshot(&a, "forever", Some(Duration::ZERO))
            .await
            .unwrap();
    assert!(forever.expires_at.is_none(), "{forever:?}");
    tokio::time::sleep(Duration::from_millis(20)).await;
    // An archive no record names, and temporary files, old and new.
    let old = std::time::SystemTime::now() - Duration::from_secs(7200);
    let orphan = f.snapshots.join(format!("{}.tar.zst", "0".repeat(26)));
    let stale = f.snapshots.join(".snapshot-1-1.tmp");
    let fresh = f.snapshots.join(".snapshot-2-2.tmp");
    for p in [&orphan, &stale, &fresh] {
        std::fs::write(p, b"x").unwrap();
    }
    for p in [&orphan, &stale] {
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    let dry =
        f.m.collect_garbage(GcOptions {
            dry_run: true,
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(dry.snapshots_expired, ["default/short"]);
    assert_eq!(dry.snapshot_files_removed, 2);
    assert!(
        orphan.exists() && stale.exists(),
        "a dry run removes nothing"
    );

    let report =
        f.m.collect_garbage(GcOptions {
            dry_run: false,
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(report.snapshots_expired, ["default/short"]);
    assert_eq!(report.snapshot_files_removed, 2);
    let mut want = vec![
        ".snapshot-2-2.tmp".to_owned(),
        format!("{}.tar.zst", kept.id),
        format!("{}.tar.zst", pinned.id),
        format!("{}.tar.zst", forever.id),
    ];
    want.sort();
    assert_eq!(files(&f.snapshots), want);
    assert!(!f.snapshots.join(format!("{}.tar.zst", gone.id)).exists());

    // Everything deleted and destroyed: nothing is left behind.
    f.m.remove_template(&tenant(), "t").await.unwrap();
    f.m.delete_snapshot(&tenant(), "kept").await.unwrap();
    f.m.delete_snapshot(&tenant(), "pinned").await.unwrap();
    f.m.delete_snapshot(&tenant(), "forever").await.unwrap();
    std::fs::remove_file(&fresh).unwrap();
    f.m.destroy(&a).await.unwrap();
    assert!(files(&f.snapshots).is_empty(), "{:?}", files(&f.snapshots));
    assert!(f.m.runtime().list().await.unwrap().is_empty());
}

/// The attack: tenant A keeps as many snapshot operations running as it can, four takes of a
/// 48 MiB incompressible workspace at once, in a loop. The slots are the process's: before each
/// tenant had a share, A held all four and tenant B, whose conversations start from a default
/// template, could not create one (through `serve`, 17 of 19 creations while the attack ran were
/// refused busy). Now A holds at most half: A's extra operations are refused naming its share,
/// and each of B's creations meanwhile succeeds and starts from B's template.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_running_snapshots_in_a_loop_leaves_slots_for_another_tenants_template_starts() {
    let f = fixture(|_| {});
    let a = TenantId::new("hog").unwrap();
    let b = TenantId::new("bystander").unwrap();
    let noise: Vec<u8> = {
        use std::io::Read;
        let mut v = vec![0u8; 48 << 20];
        std::fs::File::open("/dev/urandom")
            .unwrap()
            .read_exact(&mut v)
            .unwrap();
        v
    };
    let a_convs: Vec<ConversationRef> = (0..4)
        .map(|i| ConversationRef::new(a.clone(), ConversationId::new(format!("big{i}")).unwrap()))
        .collect();
    for c in &a_convs {
        write(&f.m, c, "noise.bin", &noise).await;
    }
    let base = ConversationRef::new(b.clone(), ConversationId::new("base").unwrap());
    write(&f.m, &base, "hello.txt", b"from the template\n").await;
    f.m.snapshot(&base, "base", None).await.unwrap();
    f.m.set_template(&b, DEFAULT_TEMPLATE, "base")
        .await
        .unwrap();

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attack: Vec<_> = a_convs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (m, c, a, stop) = (f.m.clone(), c.clone(), a.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut taken, mut refused) = (0u32, 0u32);
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    n += 1;
                    let name = format!("s{i}-{n}");
                    match m.snapshot(&c, &name, None).await {
                        Ok(_) => {
                            taken += 1;
                            m.delete_snapshot(&a, &name).await.unwrap();
                        }
                        Err(Error::Busy(why)) => {
                            assert!(why.contains("this tenant"), "{why}");
                            refused += 1;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                (taken, refused)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..10 {
        let c = ConversationRef::new(b.clone(), ConversationId::new(format!("new{i}")).unwrap());
        let got = read(&f.m, &c, "hello.txt").await;
        assert_eq!(
            got.as_deref().ok(),
            Some(&b"from the template\n"[..]),
            "B's creation {i} while A snapshots: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (mut taken, mut refused) = (0, 0);
    for t in attack {
        let (t, r) = t.await.unwrap();
        taken += t;
        refused += r;
    }
    eprintln!("A: {taken} snapshots taken, {refused} refused for its share");
    assert!(
        taken > 0 && refused > 0,
        "the attack ran at its share: {taken} {refused}"
    );
}
