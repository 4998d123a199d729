//! Glob and grep requests: the checks a front end or a remote runtime makes before it opens a
//! conversation (`sessionbox_core::patterns`), and the file layer's `glob` and `grep`
//! (`sessionbox_fs::Workspace`) that walk a workspace with them.
//!
//! Input: a flags byte (presented root, `~` expansion, case-insensitive, which fields are
//! given), then `PATTERN \x1f GLOB \x1f PATH`. PATTERN is tried as a glob and as a regular
//! expression.
//! Properties:
//! - a glob accepted by `check_glob` normalises to a relative pattern with no empty, `.` or
//!   `..` component, and compiles;
//! - the checks agree with the workspace: what `check_glob` / `check_grep` refuse, `glob` /
//!   `grep` refuse with the same error code, and a request the workspace refuses as invalid is
//!   refused by the check too (one set of rules, one set of messages);
//! - every match is a workspace-relative path inside the workspace, never a file reached
//!   through a link out, and no matched line is the content of a file outside.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sessionbox_core::GrepRequest;
use sessionbox_core::patterns::{check_glob, check_grep, glob_matcher, normalize_glob};
use sessionbox_fuzz::{ROOTS, fields, fixture};

/// The names at the top of the fixture's workspace.
const TOP: &[&str] = &[
    "marker.txt",
    "a",
    "src",
    ".hidden",
    "....",
    "in",
    "leak",
    "up",
    "r",
    "loop",
];

/// The code of errors decided by the request alone. (`outside_workspace` and `invalid_path`
/// also come from the kernel, for a link out or a name too long, which no check can know.)
fn request_error(code: &str) -> bool {
    code == "invalid_request"
}

fn inside(path: &str) -> bool {
    !path.starts_with('/')
        && path.split('/').all(|c| !matches!(c, "" | "." | ".."))
        && path
            .split('/')
            .next()
            .is_some_and(|first| TOP.contains(&first))
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let f = fields(rest, 3);
    let Ok(pattern) = std::str::from_utf8(f[0]) else {
        return;
    };
    let glob = std::str::from_utf8(f[1]).ok().filter(|_| flags & 0x02 != 0);
    let path = std::str::from_utf8(f[2]).ok().filter(|_| flags & 0x04 != 0);
    let which = usize::from(flags >> 3) % ROOTS.len();
    let fx = fixture();
    // No `~` expansion: the front-end checks know nothing of it.
    let ws = &fx.workspaces[which];
    let root = ws.presented_root();

    // The glob alone.
    let checked = check_glob(root, pattern);
    if checked.is_ok() {
        let norm = normalize_glob(root, pattern).expect("check_glob accepted it");
        assert!(
            !norm.is_empty() && !norm.starts_with('/'),
            "{pattern:?} -> {norm:?}"
        );
        assert!(
            norm.split('/').all(|c| !matches!(c, "" | "." | "..")),
            "{pattern:?} -> {norm:?}"
        );
        glob_matcher(&norm).expect("check_glob accepted it");
    }
    match (ws.glob(pattern), &checked) {
        (Ok(found), Ok(())) => {
            for m in found {
                assert!(inside(&m), "glob {pattern:?} matched {m:?}");
            }
        }
        (Err(e), Err(c)) => assert_eq!(e.code(), c.code(), "glob {pattern:?}: {e} / {c}"),
        (Err(e), Ok(())) => {
            assert!(
                !request_error(e.code()),
                "glob {pattern:?}: the workspace refused ({e}), the check did not"
            )
        }
        (Ok(_), Err(c)) => {
            panic!("glob {pattern:?}: the check refused ({c}), the workspace did not")
        }
    }

    // The search.
    let mut req = GrepRequest::new(pattern);
    req.case_insensitive = flags & 0x01 != 0;
    req.glob = glob.map(str::to_owned);
    req.path = path.map(str::to_owned);
    req.max_matches = Some(64);
    let checked = check_grep(root, &req);
    match (ws.grep(&req), &checked) {
        (Ok(found), Ok(())) => {
            for m in found {
                assert!(inside(&m.path), "grep {req:?} matched in {:?}", m.path);
                assert!(
                    !m.line.contains("OUTSIDE-THE-WORKSPACE"),
                    "grep {req:?} read outside"
                );
            }
        }
        (Err(e), Err(c)) => assert_eq!(e.code(), c.code(), "grep {req:?}: {e} / {c}"),
        (Err(e), Ok(())) => {
            assert!(
                !request_error(e.code()),
                "grep {req:?}: the workspace refused ({e}), the check did not"
            )
        }
        (Ok(_), Err(c)) => panic!("grep {req:?}: the check refused ({c}), the workspace did not"),
    }
});
