//! Tests of image copies and layer names.

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;

use super::*;

/// A sparse file of 64 MiB with data at three places.
fn sparse(path: &Path) -> Vec<(u64, Vec<u8>)> {
    let mut f = File::create(path).unwrap();
    f.set_len(64 << 20).unwrap();
    let parts = vec![
        (0u64, vec![1u8; 5000]),
        (10 << 20, vec![2u8; 1 << 20]),
        ((64 << 20) - 4096, vec![3u8; 4096]),
    ];
    for (at, data) in &parts {
        f.seek(SeekFrom::Start(*at)).unwrap();
        f.write_all(data).unwrap();
    }
    f.sync_all().unwrap();
    parts
}

#[test]
fn an_image_copy_keeps_every_byte_and_its_holes() {
    let dir = tempfile::tempdir().unwrap();
    let (from, to) = (dir.path().join("a.img"), dir.path().join("b.img"));
    sparse(&from);
    let how = copy_image(&File::open(&from).unwrap(), &to).unwrap();
    assert_eq!(fs::read(&from).unwrap(), fs::read(&to).unwrap());
    let (a, b) = (fs::metadata(&from).unwrap(), fs::metadata(&to).unwrap());
    assert_eq!(b.len(), a.len());
    assert_eq!(b.mode() & 0o777, 0o600, "a disk image is root's alone");
    if how == Copied::Extents {
        // Data extents only: about 1 MiB of 64, never the whole length.
        assert!(
            b.blocks() * 512 < 4 << 20,
            "{} bytes allocated",
            b.blocks() * 512
        );
    }
    // It never writes over a file that exists.
    assert!(copy_image(&File::open(&from).unwrap(), &to).is_err());
}

/// On XFS (reflinks) the copy is a reflink that shares the blocks: writing the copy leaves
/// the origin as it was. Needs root and `mkfs.xfs` (scripts/test installs xfsprogs).
#[test]
fn on_a_file_system_with_reflinks_a_copy_is_a_reflink_and_shares_nothing_writable() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: mounting a test XFS needs root (CI runs as root)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("xfs.img");
    File::create(&image).unwrap().set_len(512 << 20).unwrap();
    let made = std::process::Command::new("mkfs.xfs")
        .arg("-q")
        .arg(&image)
        .status()
        .expect("mkfs.xfs (xfsprogs) is installed");
    assert!(made.success());
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "xfs", "-o", "loop"])
        .arg(&image)
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(mounted.success(), "cannot mount the test XFS");
    let (from, to) = (mnt.join("a.img"), mnt.join("b.img"));
    let parts = sparse(&from);
    let how = copy_image(&File::open(&from).unwrap(), &to);
    // Checked after the test XFS is unmounted, so a failure leaves no mount behind.
    let reflinked = how.as_ref().is_ok_and(|h| *h == Copied::Reflink);
    let mut f = fs::OpenOptions::new().write(true).open(&to).unwrap();
    f.write_all(b"changed").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let origin = fs::read(&from).unwrap();
    let _ = super::disk::unmount_volume(&mnt);
    assert!(reflinked, "{how:?}");
    assert_eq!(&origin[..5000], &parts[0].1[..], "the origin changed");
}

#[test]
fn a_layer_name_is_checked() {
    for ok in ["a", "0f3c9e", "snap_1-2", &"x".repeat(64)] {
        assert!(check_layer_name(ok).is_ok(), "{ok}");
    }
    for bad in [
        "",
        "../x",
        "a/b",
        "a.img",
        ".hidden",
        &"x".repeat(65),
        "a b",
    ] {
        let e = check_layer_name(bad).unwrap_err();
        assert_eq!(e.code(), "invalid_request", "{bad}");
    }
}
