//! Permission bits, ownership and `~`: changes land on the inode beneath the root and nowhere
//! else; setuid, setgid and sticky bits are refused.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::{Fixture, ROOT, code};
use sessionbox_core::Limits;
use sessionbox_fs::Workspace;

fn mode(p: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[test]
fn modes_round_trip_on_files_and_directories() {
    let f = Fixture::new();
    f.put("d/a.txt", b"a");
    for m in [0o755, 0o644, 0o600, 0o000, 0o777] {
        f.ws.set_permissions("d/a.txt", Some(m), None, None)
            .unwrap();
        assert_eq!(mode(&f.host("d/a.txt")), m);
        f.ws.set_permissions("/workspace/d", Some(m | 0o700), None, None)
            .unwrap();
        assert_eq!(mode(&f.host("d")), m | 0o700);
    }
    // None changes nothing.
    f.ws.set_permissions("d/a.txt", None, None, None).unwrap();
    assert_eq!(mode(&f.host("d/a.txt")), 0o777);
    // The root itself is a directory inside.
    f.ws.set_permissions(".", Some(0o750), None, None).unwrap();
    assert_eq!(mode(&f.host("")), 0o750);
}

#[test]
fn setuid_setgid_and_sticky_bits_are_refused_before_anything_changes() {
    let f = Fixture::new();
    f.put("a.txt", b"a");
    f.ws.set_permissions("a.txt", Some(0o644), None, None)
        .unwrap();
    for m in [0o4755, 0o2755, 0o1777, 0o10644] {
        assert_eq!(
            code(f.ws.set_permissions("a.txt", Some(m), None, None)),
            "invalid_request",
            "{m:o}"
        );
        assert_eq!(
            code(f.ws.write_with_mode("new.txt", b"x", Some(m))),
            "invalid_request"
        );
        assert_eq!(
            code(f.ws.mkdir_with("newdir", Some(m), None, None)),
            "invalid_request"
        );
    }
    assert_eq!(mode(&f.host("a.txt")), 0o644);
    assert!(!f.host("new.txt").exists());
    assert!(!f.host("newdir").exists());
}

#[test]
fn links_inside_are_followed_links_out_are_refused() {
    let f = Fixture::new();
    f.put("real.txt", b"r");
    f.link("real.txt", "in-link");
    f.ws.set_permissions("in-link", Some(0o600), None, None)
        .unwrap();
    assert_eq!(mode(&f.host("real.txt")), 0o600);

    let victim = f.outside("victim.txt");
    let before = mode(&victim);
    f.link(&victim, "abs-link");
    f.link("../outside/victim.txt", "rel-link");
    f.link(f.outside(""), "dir-link");
    for p in [
        "abs-link",
        "rel-link",
        "dir-link/victim.txt",
        "../outside/victim.txt",
    ] {
        assert_eq!(
            code(f.ws.set_permissions(p, Some(0o777), Some(0), Some(0))),
            "outside_workspace",
            "{p}"
        );
    }
    assert_eq!(mode(&victim), before);
    assert_eq!(mode(&f.outside("")), mode(&f.outside("")));
}

#[test]
fn hard_links_and_special_files_are_refused() {
    let f = Fixture::new();
    f.put("a.txt", b"a");
    std::fs::hard_link(f.host("a.txt"), f.host("b.txt")).unwrap();
    assert_eq!(
        code(f.ws.set_permissions("a.txt", Some(0o600), None, None)),
        "conflict"
    );
    assert_ne!(mode(&f.host("a.txt")), 0o600);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        f.host("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    assert_eq!(
        code(f.ws.set_permissions("fifo", Some(0o600), None, None)),
        "conflict"
    );
    assert_eq!(
        code(f.ws.set_permissions("missing", Some(0o600), None, None)),
        "not_found"
    );
}

#[test]
fn write_with_mode_sets_the_bits_exactly() {
    let f = Fixture::new();
    f.ws.write_with_mode("n/a.txt", b"1", Some(0o600)).unwrap();
    assert_eq!(mode(&f.host("n/a.txt")), 0o600);
    f.ws.write_with_mode("n/a.txt", b"2", Some(0o755)).unwrap();
    assert_eq!(mode(&f.host("n/a.txt")), 0o755);
    assert_eq!(std::fs::read(f.host("n/a.txt")).unwrap(), b"2");
    // None keeps the existing bits.
    f.ws.write_with_mode("n/a.txt", b"3", None).unwrap();
    assert_eq!(mode(&f.host("n/a.txt")), 0o755);
}

#[test]
fn mkdir_with_sets_only_a_new_leaf() {
    let f = Fixture::new();
    assert!(
        f.ws.mkdir_with("p/q/leaf", Some(0o700), None, None)
            .unwrap()
    );
    assert_eq!(mode(&f.host("p/q/leaf")), 0o700);
    assert_eq!(mode(&f.host("p")), 0o755, "parents keep the default");
    // An existing directory is left untouched.
    assert!(
        !f.ws
            .mkdir_with("p/q/leaf", Some(0o755), None, None)
            .unwrap()
    );
    assert_eq!(mode(&f.host("p/q/leaf")), 0o700);
    assert!(!f.ws.mkdir_with("p", Some(0o711), None, None).unwrap());
    assert_eq!(mode(&f.host("p")), 0o755);
    // Through a link that leads out: nothing is created outside.
    f.link(f.outside(""), "out");
    assert_eq!(
        code(f.ws.mkdir_with("out/x", Some(0o777), None, None)),
        "outside_workspace"
    );
    assert!(!f.outside("x").exists());
}

#[test]
fn ownership_changes_by_id_and_refusals_are_clear() {
    let f = Fixture::new();
    f.put("a.txt", b"a");
    let me = rustix::process::geteuid().as_raw();
    let my_group = rustix::process::getegid().as_raw();
    // To oneself: always allowed.
    f.ws.set_permissions("a.txt", None, Some(me), Some(my_group))
        .unwrap();
    if !is_root() {
        // Giving a file away needs root.
        assert_eq!(
            code(f.ws.set_permissions("a.txt", None, Some(0), None)),
            "invalid_request"
        );
        return;
    }
    f.ws.set_permissions("a.txt", Some(0o640), Some(65534), Some(65534))
        .unwrap();
    let md = std::fs::metadata(f.host("a.txt")).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 65534));
    assert_eq!(mode(&f.host("a.txt")), 0o640);
    assert!(
        f.ws.mkdir_with("owned", Some(0o750), Some(65534), None)
            .unwrap()
    );
    let md = std::fs::metadata(f.host("owned")).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 0));
    assert_eq!(mode(&f.host("owned")), 0o750);

    // As another user (one thread's credentials only): EPERM becomes a clear refusal.
    f.put("root-owned.txt", b"r");
    let ws = &f.ws;
    std::thread::scope(|s| {
        s.spawn(|| {
            rustix::thread::set_thread_res_gid(
                rustix::process::Gid::from_raw(65534),
                rustix::process::Gid::from_raw(65534),
                rustix::process::Gid::from_raw(65534),
            )
            .unwrap();
            rustix::thread::set_thread_res_uid(
                rustix::process::Uid::from_raw(65534),
                rustix::process::Uid::from_raw(65534),
                rustix::process::Uid::from_raw(65534),
            )
            .unwrap();
            let e = ws.set_permissions("root-owned.txt", None, Some(65534), None);
            assert_eq!(code(e), "invalid_request");
            let e = ws.set_permissions("root-owned.txt", Some(0o777), None, None);
            let e = e.unwrap_err();
            assert_eq!(e.code(), "invalid_request");
            assert!(e.to_string().contains("not permitted"), "{e}");
        })
        .join()
        .unwrap();
    });
    assert_eq!(mode(&f.host("root-owned.txt")), 0o644);
}

#[test]
fn home_expansion_is_off_by_default_and_stays_beneath_the_root() {
    let f = Fixture::new();
    f.put("x.txt", b"x");
    // Off: `~` is an ordinary name.
    assert_eq!(f.ws.resolve("~/x.txt").unwrap().as_str(), "~/x.txt");

    let ws = Workspace::open(&f.host(""), ROOT, Limits::default())
        .unwrap()
        .with_home_expansion();
    assert_eq!(ws.resolve("~/x.txt").unwrap().as_str(), "x.txt");
    assert_eq!(ws.resolve("~").unwrap().as_str(), "");
    assert_eq!(ws.resolve("~/").unwrap().as_str(), "");
    assert_eq!(ws.read("~/x.txt").unwrap(), b"x");
    // Only a leading `~` or `~/`.
    assert_eq!(ws.resolve("~user/x").unwrap().as_str(), "~user/x");
    assert_eq!(ws.resolve("a/~/x").unwrap().as_str(), "a/~/x");
    assert_eq!(ws.resolve("/workspace/~").unwrap().as_str(), "~");
    // Still the path policy.
    for p in ["~/..", "~/../..", "~/../outside/victim.txt", "~/a/../../x"] {
        assert_eq!(code(ws.resolve(p)), "outside_workspace", "{p}");
        assert_eq!(code(ws.read(p)), "outside_workspace", "{p}");
    }
}
