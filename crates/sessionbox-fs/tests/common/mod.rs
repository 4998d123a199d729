//! Shared fixtures: a workspace directory and an "outside" directory side by side in one
//! temporary directory, so the effect of an operation outside the workspace can be checked.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sessionbox_core::{Error, Limits};
use sessionbox_fs::Workspace;

pub const ROOT: &str = "/workspace";

pub struct Fixture {
    pub base: tempfile::TempDir,
    pub ws: Workspace,
}

impl Fixture {
    pub fn new() -> Self {
        Self::with_limits(Limits::default())
    }

    pub fn with_limits(limits: Limits) -> Self {
        let base = tempfile::tempdir().unwrap();
        std::fs::create_dir(base.path().join("ws")).unwrap();
        std::fs::create_dir(base.path().join("outside")).unwrap();
        std::fs::write(base.path().join("outside/victim.txt"), b"VICTIM").unwrap();
        let ws = Workspace::open(&base.path().join("ws"), ROOT, limits).unwrap();
        Fixture { base, ws }
    }

    /// Host path of `rel` inside the workspace (test set-up only).
    pub fn host(&self, rel: &str) -> PathBuf {
        self.base.path().join("ws").join(rel)
    }

    /// Host path of `rel` in the directory next to the workspace.
    pub fn outside(&self, rel: &str) -> PathBuf {
        self.base.path().join("outside").join(rel)
    }

    pub fn put(&self, rel: &str, data: &[u8]) {
        let p = self.host(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }

    pub fn link(&self, target: impl AsRef<Path>, rel: &str) {
        let p = self.host(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, p).unwrap();
    }

    /// Everything under the temporary directory except the workspace itself.
    pub fn outside_snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut m = snapshot(self.base.path());
        let ws = self.base.path().join("ws");
        m.retain(|p, _| !p.starts_with(&ws));
        m
    }
}

/// Every path below `dir` (links not followed) with its content (files), target (links) or
/// nothing (directories).
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut m = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                m.insert(p, t.into_os_string().into_encoded_bytes());
            } else if ft.is_dir() {
                m.insert(p.clone(), b"<dir>".to_vec());
                stack.push(p);
            } else {
                m.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    m
}

/// The error code of a result that must have failed.
#[track_caller]
pub fn code<T: std::fmt::Debug>(r: Result<T, Error>) -> &'static str {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.code(),
    }
}
