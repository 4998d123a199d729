//! What the fuzz targets share: how an input is cut into fields, and the workspace on disk that
//! the path and pattern targets resolve in. See docs/fuzzing.md for the targets and their
//! properties.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sessionbox_core::Limits;
use sessionbox_fs::Workspace;

/// The byte between the fields of one input (ASCII unit separator): seeds stay readable text
/// (`pattern\x1fglob\x1fpath`), and libFuzzer finds the byte by itself.
pub const SEP: u8 = 0x1f;

/// The first `n` fields of `data`, split at [`SEP`]; the last field takes the rest (separators
/// included), and missing fields are empty.
pub fn fields(data: &[u8], n: usize) -> Vec<&[u8]> {
    let mut out: Vec<&[u8]> = data.splitn(n, |b| *b == SEP).collect();
    out.resize(n, &[]);
    out
}

/// [`fields`] as text; `None` when a field is not UTF-8 (every parser here takes `&str`).
pub fn text_fields(data: &[u8], n: usize) -> Option<Vec<&str>> {
    fields(data, n)
        .into_iter()
        .map(|f| std::str::from_utf8(f).ok())
        .collect()
}

/// The roots a workspace is presented under: the isolated runtime's, the filesystem root,
/// a host directory, one with a trailing slash.
pub const ROOTS: &[&str] = &[
    "/workspace",
    "/",
    "/data/workspaces/ab12",
    "/workspace/",
    "/w",
];

/// What a file outside the workspace holds; no operation through the workspace may return it.
pub const OUTSIDE: &[u8] = b"OUTSIDE-THE-WORKSPACE";

/// A workspace on disk with links out of it, made once per process (and removed at exit):
///
/// ```text
/// BASE/outside.txt            OUTSIDE
/// BASE/ws-evil/secret.txt     OUTSIDE (a sibling whose name starts with the root's)
/// BASE/ws/                    the workspace
///   marker.txt, a/b/c.txt, src/main.rs, .hidden, ....  (inside)
///   in -> a                   a link that stays inside
///   leak -> BASE/outside.txt  absolute, out
///   up -> ..                  relative, out
///   a/up -> ../..             out from below
///   r -> /                    the filesystem root
///   loop -> loop
/// ```
#[derive(Debug)]
pub struct Fixture {
    /// BASE/ws, as the kernel names it (no links in it).
    pub root: PathBuf,
    /// One workspace per [`ROOTS`] entry, then the same with home expansion (`~`).
    pub workspaces: Vec<Workspace>,
}

static FIXTURE: OnceLock<Fixture> = OnceLock::new();
static BASE: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn remove_base() {
    if let Some(base) = BASE.get() {
        let _ = std::fs::remove_dir_all(base);
    }
}

/// The fixture, made on first use.
pub fn fixture() -> &'static Fixture {
    FIXTURE.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("sessionbox-fuzz-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        make(&base).expect("make the fuzz workspace");
        let base = base.canonicalize().expect("canonical base");
        BASE.set(base.clone()).expect("the base is set once");
        // SAFETY: `remove_base` is an `extern "C" fn()` that only reads a OnceLock and removes a
        // directory; registering it has no other effect.
        unsafe { libc::atexit(remove_base) };
        let root = base.join("ws");
        let mut workspaces = Vec::new();
        for home in [false, true] {
            for presented in ROOTS {
                let ws = Workspace::open(&root, presented, Limits::default()).expect("open");
                workspaces.push(if home { ws.with_home_expansion() } else { ws });
            }
        }
        Fixture { root, workspaces }
    })
}

fn make(base: &Path) -> std::io::Result<()> {
    let ws = base.join("ws");
    for d in ["a/b", "src"] {
        std::fs::create_dir_all(ws.join(d))?;
    }
    std::fs::create_dir_all(base.join("ws-evil"))?;
    std::fs::write(base.join("outside.txt"), OUTSIDE)?;
    std::fs::write(base.join("ws-evil/secret.txt"), OUTSIDE)?;
    std::fs::write(ws.join("marker.txt"), b"inside\n")?;
    std::fs::write(ws.join("a/b/c.txt"), b"fn deep() {}\n")?;
    std::fs::write(
        ws.join("src/main.rs"),
        b"fn main() {\n    println!(\"hi\");\n}\n",
    )?;
    std::fs::write(ws.join(".hidden"), b"secret-ish but inside\n")?;
    std::fs::write(ws.join("...."), b"four dots\n")?;
    symlink("a", ws.join("in"))?;
    symlink(base.join("outside.txt"), ws.join("leak"))?;
    symlink("..", ws.join("up"))?;
    symlink("../..", ws.join("a/up"))?;
    symlink("/", ws.join("r"))?;
    symlink("loop", ws.join("loop"))?;
    Ok(())
}

/// Whether `p` is `root` or beneath it, component by component.
pub fn beneath(p: &Path, root: &Path) -> bool {
    p.starts_with(root)
}

/// Where an open descriptor really is (`/proc/self/fd/N`).
pub fn fd_path(fd: &impl std::os::fd::AsRawFd) -> PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("read /proc/self/fd")
}
