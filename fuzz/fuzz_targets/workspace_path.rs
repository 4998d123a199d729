//! The workspace path policy (`sessionbox_core::WorkspacePath::resolve`) and the file layer's
//! resolution beneath the workspace descriptor (`sessionbox_fs::Workspace`): every path a caller
//! gives to a file operation or as a working directory.
//!
//! Input: one flags byte (which presented root, `~` expansion or not), then the path.
//! Properties:
//! - lexical: an accepted path is normalised (no empty, `.` or `..` component, no NUL) and is
//!   what a component-wise normalisation of the path against the root gives, never a place
//!   outside the root (the oracle here is written independently of path.rs); for relative
//!   paths the policy and the oracle agree both ways (a `..` that climbs above the root is
//!   refused even when the path comes back in);
//! - on disk, in a workspace with links out of it (see `sessionbox_fuzz::Fixture`): a directory
//!   opened through the workspace is the root or beneath it; a read never returns the bytes of
//!   the files outside; a listing never shows what is outside.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sessionbox_core::{MAX_PATH_BYTES, WorkspacePath};
use sessionbox_fuzz::{OUTSIDE, ROOTS, beneath, fd_path, fixture};

/// The components of `input` against `root` after a component-wise normalisation, or `None`
/// when they are not inside `root` (or the path is not one the policy takes at all). A
/// relative path may not climb above the root even to come back (`a/../../ws/x`), as the policy
/// says; an absolute one is only normalised here, so the policy may be stricter with it.
fn oracle<'a>(root: &'a str, input: &'a str) -> Option<Vec<&'a str>> {
    if input.is_empty() || input.contains('\0') || input.len() > MAX_PATH_BYTES {
        return None;
    }
    let root_parts: Vec<&str> = if input.starts_with('/') {
        root.split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect()
    } else {
        Vec::new()
    };
    let mut full: Vec<&str> = Vec::new();
    for c in input.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                full.pop()?;
            }
            c => full.push(c),
        }
    }
    full.starts_with(&root_parts)
        .then(|| full[root_parts.len()..].to_vec())
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Ok(input) = std::str::from_utf8(rest) else {
        return;
    };
    let which = usize::from(flags) % ROOTS.len();
    let home = flags & 0x80 != 0;
    let root = ROOTS[which];

    // The lexical policy alone.
    match WorkspacePath::resolve(root, input) {
        Ok(p) => {
            let want = oracle(root, input);
            let got: Vec<&str> = p.components().collect();
            assert_eq!(
                Some(got),
                want,
                "{root:?} + {input:?} resolved to {:?}",
                p.as_str()
            );
            assert!(!p.as_str().contains('\0'));
            assert!(p.as_str().split('/').all(|c| !matches!(c, "." | "..")));
            assert!(p.is_root() || p.as_str().split('/').all(|c| !c.is_empty()));
            let presented = p.presented(root);
            let r = root.trim_end_matches('/');
            assert!(
                presented == r || presented == "/" || presented.starts_with(&format!("{r}/")),
                "{presented:?} is not under {root:?}"
            );
            // Resolving the presented form again is the same path (a fixed point).
            assert_eq!(
                WorkspacePath::resolve(root, &presented).expect("presented"),
                p
            );
        }
        Err(e) => {
            assert!(
                matches!(e.code(), "invalid_path" | "outside_workspace"),
                "{e}"
            );
            // Relative paths: the policy refuses only what is outside or invalid.
            if !input.starts_with('/') {
                assert_eq!(oracle(root, input), None, "{input:?} refused: {e}");
            }
        }
    }

    // The file layer: its own resolve, then the kernel beneath the root descriptor.
    let fx = fixture();
    let ws = &fx.workspaces[which + if home { ROOTS.len() } else { 0 }];
    let resolved = ws.resolve(input);
    if !home {
        assert_eq!(
            resolved.as_ref().map_err(|e| e.code()),
            WorkspacePath::resolve(ws.presented_root(), input)
                .as_ref()
                .map_err(|e| e.code())
        );
    } else if let Ok(p) = &resolved {
        let expanded = match input.strip_prefix('~') {
            Some(r) if r.is_empty() || r.starts_with('/') => {
                format!("{}{r}", ws.presented_root().trim_end_matches('/'))
            }
            _ => input.to_owned(),
        };
        let expanded = if expanded.is_empty() {
            "/".to_owned()
        } else {
            expanded
        };
        let want = oracle(ws.presented_root(), &expanded);
        assert_eq!(
            Some(p.components().collect::<Vec<_>>()),
            want,
            "~ {input:?}"
        );
    }
    if let Ok(fd) = ws.open_dir(input) {
        let at = fd_path(&fd);
        assert!(
            beneath(&at, &fx.root),
            "{input:?} opened {at:?}, outside {:?}",
            fx.root
        );
    }
    if let Ok(bytes) = ws.read(input) {
        assert!(
            bytes != OUTSIDE,
            "{input:?} read a file outside the workspace"
        );
        assert!(!bytes.starts_with(b"root:"), "{input:?} read /etc/passwd");
    }
    if let Ok(entries) = ws.list(input) {
        for e in entries {
            assert!(
                !matches!(e.name.as_str(), "outside.txt" | "ws-evil" | "etc" | "proc"),
                "{input:?} listed {:?}, which is outside",
                e.name
            );
        }
    }
    let _ = ws.stat(input);
});
