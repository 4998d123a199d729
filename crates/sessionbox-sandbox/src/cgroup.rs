//! The sandbox's cgroups, host side: discovery (v1 per controller, or v2), creation beneath the
//! caller's own cgroup or the hierarchy root, limits, membership, killing and removal.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sessionbox_core::{Error, Result};

use super::{RUNTIME, SandboxLimits};

/// The controllers every sandbox needs.
pub(crate) const CONTROLLERS: [&str; 3] = ["pids", "memory", "cpu"];

/// CFS period written with the quota: 100 ms.
const CPU_PERIOD_US: u64 = 100_000;

/// How long [`Cgroups::kill_all`] keeps killing before giving up.
const KILL_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    V1,
    V2,
}

/// Where one controller can be used from this process.
#[derive(Debug, Clone)]
pub(crate) struct Location {
    pub controller: &'static str,
    pub version: Version,
    /// The hierarchy's mount point.
    pub mount: PathBuf,
    /// This process's own cgroup directory in that hierarchy (the mount point when it cannot be
    /// located).
    pub own: PathBuf,
}

fn unavailable(controller: &str, reason: String, hint: &str) -> Error {
    Error::RuntimeUnavailable {
        runtime: RUNTIME.into(),
        reason: format!("sandbox layer cgroup {controller}: {reason}"),
        hint: hint.into(),
    }
}

const HINT_MOUNT: &str = "mount the controller (cgroup v1 at /sys/fs/cgroup/<controller>, or cgroup v2 with it enabled in cgroup.subtree_control), or run on a host that has it";
/// What to do when no cgroup can be written: as root this is unusual (a read-only cgroupfs);
/// without root a cgroup must be delegated, or rlimit-only limits chosen.
pub(crate) const HINT_WRITE: &str = "delegate a cgroup with the pids, memory and cpu controllers to this user (`sessionbox doctor` prints the exact commands), or choose rlimit-only limits (`[isolated] limits = \"rlimit\"` in sessionbox.toml; weaker: per process, see `sessionbox doctor`), or run sessionbox as root";

/// The leaf cgroup v2 a non-root caller moves itself into when its own cgroup is the
/// delegated one (cgroup v2 lets only a cgroup without processes of its own enable
/// controllers for its children).
pub(crate) const V2_LEAF: &str = "sessionbox-main";

/// The cgroup v1 directory, beneath each hierarchy's root, that an administrator delegates to
/// a non-root `uid` (made and chowned to it): `sessionbox-<uid>`.
pub(crate) fn delegated_name(uid: u32) -> String {
    format!("sessionbox-{uid}")
}

/// Where to try creating a sandbox's cgroup in one hierarchy, nearest first.
///
/// As root: this process's own cgroup, then the hierarchy's root. Without root, only what the
/// caller may write: in cgroup v1 its own cgroup and the delegated `sessionbox-<uid>` beneath the
/// root (a v1 move checks only the destination's permissions); in cgroup v2 its own cgroup (its
/// parent when it is our [`V2_LEAF`]) and each writable ancestor below the root, because v2
/// moves a process only within a subtree whose common ancestor the caller may write (a cgroup
/// elsewhere is useless to it).
pub(crate) fn candidates(
    version: Version,
    mount: &Path,
    own: &Path,
    root: bool,
    uid: u32,
    writable: impl Fn(&Path) -> bool,
) -> Vec<PathBuf> {
    let mut out = vec![own.to_path_buf()];
    if root {
        if own != mount {
            out.push(mount.to_path_buf());
        }
        return out;
    }
    match version {
        Version::V1 => {
            let delegated = mount.join(delegated_name(uid));
            if delegated != own {
                out.push(delegated);
            }
            out.retain(|p| writable(p));
        }
        Version::V2 => {
            out.clear();
            let start = if own.file_name().is_some_and(|n| n == V2_LEAF) {
                own.parent().unwrap_or(own)
            } else {
                own
            };
            let mut at = Some(start);
            while let Some(dir) = at {
                if dir == mount || !dir.starts_with(mount) {
                    break;
                }
                if writable(&dir.join("cgroup.subtree_control"))
                    && writable(&dir.join("cgroup.procs"))
                {
                    out.push(dir.to_path_buf());
                }
                at = dir.parent();
            }
        }
    }
    out
}

/// True when this process may write `path` (`access(W_OK)`).
fn may_write(path: &Path) -> bool {
    rustix::fs::access(path, rustix::fs::Access::WRITE_OK).is_ok()
}

/// Finds each of [`CONTROLLERS`], v1 first (a controller bound to a v1 hierarchy is not usable in
/// v2). Returns the locations found and the controllers missing.
pub(crate) fn discover() -> (Vec<Location>, Vec<&'static str>) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for controller in CONTROLLERS {
        match locate(controller, &mountinfo, &own) {
            Some(l) => found.push(l),
            None => missing.push(controller),
        }
    }
    (found, missing)
}

/// One mountinfo line's root, mount point, file system type and super options.
fn mount_fields(line: &str) -> Option<(&str, &str, &str, &str)> {
    let (pre, post) = line.split_once(" - ")?;
    let pre: Vec<&str> = pre.split(' ').collect();
    let post: Vec<&str> = post.split(' ').collect();
    Some((
        pre.get(3)?,
        pre.get(4)?,
        post.first()?,
        post.get(2).unwrap_or(&""),
    ))
}

/// Mountinfo escapes spaces and a few other bytes as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// This process's cgroup directory given the hierarchy's mount (root, mount point) and its path
/// from `/proc/self/cgroup`.
fn own_dir(root: &str, mount: &Path, path: &str) -> PathBuf {
    let rel = if root == "/" {
        Some(path)
    } else {
        path.strip_prefix(root)
            .filter(|r| r.is_empty() || r.starts_with('/'))
    };
    match rel {
        Some(r) => {
            let r = r.trim_start_matches('/');
            if r.is_empty() || r.split('/').any(|c| c == "..") {
                mount.to_path_buf()
            } else {
                mount.join(r)
            }
        }
        None => mount.to_path_buf(),
    }
}

fn locate(controller: &'static str, mountinfo: &str, own: &str) -> Option<Location> {
    // cgroup v1: a hierarchy whose super options name the controller.
    for line in mountinfo.lines() {
        let Some((root, mnt, fstype, opts)) = mount_fields(line) else {
            continue;
        };
        if fstype != "cgroup" || !opts.split(',').any(|o| o == controller) {
            continue;
        }
        let mount = PathBuf::from(unescape(mnt));
        let path = own.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            ctrls.split(',').any(|c| c == controller).then_some(path)
        });
        let own = path.map_or_else(|| mount.clone(), |p| own_dir(root, &mount, p));
        return Some(Location {
            controller,
            version: Version::V1,
            mount,
            own,
        });
    }
    // cgroup v2: the unified hierarchy, when the controller is available there.
    for line in mountinfo.lines() {
        let Some((root, mnt, fstype, _)) = mount_fields(line) else {
            continue;
        };
        if fstype != "cgroup2" {
            continue;
        }
        let mount = PathBuf::from(unescape(mnt));
        let avail = std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
        if !avail.split_whitespace().any(|c| c == controller) {
            continue;
        }
        let path = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .map(str::to_owned);
        let own = path.map_or_else(|| mount.clone(), |p| own_dir(root, &mount, &p));
        return Some(Location {
            controller,
            version: Version::V2,
            mount,
            own,
        });
    }
    None
}

/// The directories of one sandbox's cgroups.
#[derive(Debug)]
pub(crate) struct Cgroups {
    dirs: Vec<Dir>,
}

#[derive(Debug)]
struct Dir {
    path: PathBuf,
    version: Version,
    controllers: Vec<&'static str>,
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value)
}

fn io_err(controller: &str, what: &str, path: &Path, e: io::Error) -> Error {
    unavailable(
        controller,
        format!("cannot {what} {}: {e}", path.display()),
        HINT_WRITE,
    )
}

/// True when the cgroup at `dir` has no process (or does not exist).
fn empty(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.procs")).map_or(true, |s| s.trim().is_empty())
}

/// Creates `<parent>/<name>`; a stale empty cgroup of that name is replaced, one with processes
/// is refused.
fn make(parent: &Path, name: &str) -> io::Result<PathBuf> {
    let dir = parent.join(name);
    match std::fs::create_dir(&dir) {
        Ok(()) => Ok(dir),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            if !empty(&dir) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "exists and has processes",
                ));
            }
            std::fs::remove_dir(&dir)?;
            std::fs::create_dir(&dir)?;
            Ok(dir)
        }
        Err(e) => Err(e),
    }
}

impl Cgroups {
    /// Creates the sandbox's cgroups named `name` and writes `limits` into them.
    ///
    /// Each hierarchy's directory is made beneath this process's own cgroup, or at the hierarchy
    /// root when that is not possible (read-only, or cgroup v2's no-internal-process rule).
    pub(crate) fn create(name: &str, limits: &SandboxLimits) -> Result<Cgroups> {
        let (found, missing) = discover();
        if let Some(c) = missing.first() {
            return Err(unavailable(
                c,
                "the controller is not available (neither a cgroup v1 hierarchy nor in cgroup v2's cgroup.controllers)".into(),
                HINT_MOUNT,
            ));
        }
        let mut cg = Cgroups { dirs: Vec::new() };
        match cg.create_dirs(name, &found) {
            Ok(()) => {}
            Err(e) => {
                let _ = cg.remove();
                return Err(e);
            }
        }
        if let Err(e) = cg.write_limits(limits) {
            let _ = cg.remove();
            return Err(e);
        }
        Ok(cg)
    }

    fn create_dirs(&mut self, name: &str, found: &[Location]) -> Result<()> {
        // One directory per v1 hierarchy (controllers may share one, like cpu,cpuacct), plus one
        // for everything in v2.
        let mut groups: Vec<(Version, PathBuf, PathBuf, Vec<&'static str>)> = Vec::new();
        for l in found {
            match groups
                .iter_mut()
                .find(|g| g.0 == l.version && g.1 == l.mount)
            {
                Some(g) => g.3.push(l.controller),
                None => groups.push((
                    l.version,
                    l.mount.clone(),
                    l.own.clone(),
                    vec![l.controller],
                )),
            }
        }
        let euid = rustix::process::geteuid();
        let root = euid.is_root();
        for (version, mount, own, controllers) in groups {
            let shown = controllers.join(",");
            let candidates = candidates(version, &mount, &own, root, euid.as_raw(), may_write);
            let mut last_err = None;
            let mut made = None;
            for parent in &candidates {
                if version == Version::V2 {
                    // Controllers must be enabled for the children of `parent`. This fails with
                    // EBUSY when `parent` has processes of its own (and is not the root).
                    let want: Vec<String> = controllers.iter().map(|c| format!("+{c}")).collect();
                    let enabled = std::fs::read_to_string(parent.join("cgroup.subtree_control"))
                        .unwrap_or_default();
                    let needed = controllers
                        .iter()
                        .any(|c| !enabled.split_whitespace().any(|e| e == *c));
                    if needed {
                        let mut r = write(&parent.join("cgroup.subtree_control"), &want.join(" "));
                        // Without root, our own delegated cgroup holds this process: move it
                        // into a leaf of its own (v2's no-internal-process rule), then enable.
                        if !root
                            && *parent == own
                            && r.as_ref().err().and_then(io::Error::raw_os_error)
                                == Some(libc::EBUSY)
                        {
                            r = move_self_to_leaf(parent).and_then(|()| {
                                write(&parent.join("cgroup.subtree_control"), &want.join(" "))
                            });
                        }
                        if let Err(e) = r {
                            last_err = Some((parent.clone(), "enable controllers in", e));
                            continue;
                        }
                    }
                }
                match make(parent, name) {
                    Ok(dir) => {
                        made = Some(dir);
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        return Err(Error::AlreadyExists(format!(
                            "cgroup {} (another sandbox with this cgroup name is running)",
                            parent.join(name).display()
                        )));
                    }
                    Err(e) => last_err = Some((parent.clone(), "create a cgroup in", e)),
                }
            }
            match made {
                Some(path) => self.dirs.push(Dir {
                    path,
                    version,
                    controllers,
                }),
                None => {
                    return Err(match last_err {
                        Some((p, what, e)) => io_err(&shown, what, &p, e),
                        None => unavailable(
                            &shown,
                            format!(
                                "not running as root, and no cgroup in {} is delegated to uid {} (tried {})",
                                mount.display(),
                                euid.as_raw(),
                                match version {
                                    Version::V1 => format!(
                                        "{} and {}",
                                        own.display(),
                                        mount.join(delegated_name(euid.as_raw())).display()
                                    ),
                                    Version::V2 => format!(
                                        "{} and its ancestors: none has cgroup.procs and cgroup.subtree_control writable by this user",
                                        own.display()
                                    ),
                                }
                            ),
                            HINT_WRITE,
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    fn write_limits(&self, l: &SandboxLimits) -> Result<()> {
        let quota = ((l.cpu * CPU_PERIOD_US as f64).round() as u64).max(1000);
        for d in &self.dirs {
            let set = |controller: &str, file: &str, value: String| -> Result<()> {
                let p = d.path.join(file);
                write(&p, &value).map_err(|e| io_err(controller, "write the limit", &p, e))
            };
            for c in &d.controllers {
                match (d.version, *c) {
                    (Version::V1, "pids") | (Version::V2, "pids") => {
                        set(c, "pids.max", l.pids.to_string())?
                    }
                    (Version::V1, "memory") => {
                        set(c, "memory.limit_in_bytes", l.memory_bytes.to_string())?;
                        // Without swap accounting (swapaccount=0) the file is absent; with it,
                        // memory+swap gets the same limit so nothing can be swapped out past it.
                        if d.path.join("memory.memsw.limit_in_bytes").exists() {
                            set(c, "memory.memsw.limit_in_bytes", l.memory_bytes.to_string())?;
                        }
                        // v1 counts socket buffers only once a TCP limit is set, and only for
                        // sockets made after: set before any process of the sandbox runs.
                        // A kernel without kernel-memory accounting (`cgroup.memory=nokmem`)
                        // has no such file: its sandboxes' TCP buffers are bounded only by the
                        // host's pool, as with rlimit-only limits.
                        if d.path.join("memory.kmem.tcp.limit_in_bytes").exists() {
                            set(c, "memory.kmem.tcp.limit_in_bytes", l.tcp_bytes.to_string())?;
                        }
                    }
                    (Version::V2, "memory") => {
                        set(c, "memory.max", l.memory_bytes.to_string())?;
                        if d.path.join("memory.swap.max").exists() {
                            set(c, "memory.swap.max", "0".into())?;
                        }
                    }
                    (Version::V1, "cpu") => {
                        set(c, "cpu.cfs_period_us", CPU_PERIOD_US.to_string())?;
                        set(c, "cpu.cfs_quota_us", quota.to_string())?;
                    }
                    (Version::V2, "cpu") => set(c, "cpu.max", format!("{quota} {CPU_PERIOD_US}"))?,
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// No cgroup at all (rlimit-only limits): every query answers empty, and killing is done
    /// through the sandbox's PID namespace instead.
    pub(crate) fn none() -> Cgroups {
        Cgroups { dirs: Vec::new() }
    }

    /// True for [`Cgroups::none`].
    pub(crate) fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }

    /// Adds `pid` to the cgroup v2 directory, if any (v1 directories are joined by the monitor
    /// itself, see `launch_with`).
    pub(crate) fn add_process_v2(&self, pid: u32) -> Result<()> {
        for d in self.dirs.iter().filter(|d| d.version == Version::V2) {
            let p = d.path.join("cgroup.procs");
            write(&p, &pid.to_string())
                .map_err(|e| io_err(&d.controllers.join(","), "add the init to", &p, e))?;
        }
        Ok(())
    }

    /// The cgroup v1 directories.
    pub(crate) fn v1_paths(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .filter(|d| d.version == Version::V1)
            .map(|d| d.path.clone())
            .collect()
    }

    /// True when `pid` is in every directory.
    pub(crate) fn holds(&self, pid: u32) -> bool {
        self.dirs.iter().all(|d| {
            std::fs::read_to_string(d.path.join("cgroup.procs"))
                .is_ok_and(|s| s.split_whitespace().any(|p| p == pid.to_string()))
        })
    }

    /// The directories.
    pub(crate) fn paths(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.path.clone()).collect()
    }

    /// Every pid in any of the directories.
    pub(crate) fn pids(&self) -> BTreeSet<u32> {
        let mut out = BTreeSet::new();
        for d in &self.dirs {
            if let Ok(s) = std::fs::read_to_string(d.path.join("cgroup.procs")) {
                out.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
        out
    }

    /// Sends `SIGKILL` to every process in the cgroups until they are empty (at most
    /// [`KILL_DEADLINE`]); returns how many distinct processes were found in them meanwhile
    /// (some die of another's death, such as the PID namespace going with its init, before they
    /// are signalled themselves).
    pub(crate) fn kill_all(&self) -> usize {
        let me = std::process::id();
        let mut seen = BTreeSet::new();
        let until = Instant::now() + KILL_DEADLINE;
        loop {
            // cgroup v2 (5.14+) kills the whole subtree at once.
            for d in self.dirs.iter().filter(|d| d.version == Version::V2) {
                let _ = write(&d.path.join("cgroup.kill"), "1");
            }
            let pids: Vec<u32> = self
                .pids()
                .into_iter()
                .filter(|p| *p != me && *p > 1)
                .collect();
            if pids.is_empty() || Instant::now() >= until {
                break;
            }
            for p in pids {
                seen.insert(p);
                if let Some(pid) = rustix::process::Pid::from_raw(p as i32) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        seen.len()
    }

    /// Removes the directories (retrying while the last processes finish exiting). Directories
    /// already gone are fine.
    pub(crate) fn remove(&self) -> Result<()> {
        for d in &self.dirs {
            let until = Instant::now() + Duration::from_secs(5);
            loop {
                match std::fs::remove_dir(&d.path) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e) if Instant::now() < until && e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => {
                        return Err(Error::Backend(format!(
                            "cannot remove the sandbox cgroup {}: {e}",
                            d.path.display()
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Moves this whole process into `<dir>/`[`V2_LEAF`] (created when missing).
fn move_self_to_leaf(dir: &Path) -> io::Result<()> {
    let leaf = dir.join(V2_LEAF);
    match std::fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    write(&leaf.join("cgroup.procs"), &std::process::id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_tries_its_own_cgroup_then_the_hierarchy_root() {
        let m = Path::new("/sys/fs/cgroup/memory");
        let own = m.join("a");
        let c = candidates(Version::V1, m, &own, true, 0, |_| false);
        assert_eq!(c, vec![own.clone(), m.to_path_buf()]);
        assert_eq!(
            candidates(Version::V2, m, m, true, 0, |_| false),
            vec![m.to_path_buf()]
        );
    }

    #[test]
    fn without_root_v1_uses_only_writable_cgroups_and_the_delegated_one() {
        let m = Path::new("/sys/fs/cgroup/memory");
        let own = m.join("user.slice");
        let delegated = m.join("sessionbox-1001");
        // Nothing writable: nothing to try (the caller reports how to delegate).
        assert!(candidates(Version::V1, m, &own, false, 1001, |_| false).is_empty());
        // The administrator made and chowned sessionbox-1001.
        let c = candidates(Version::V1, m, &own, false, 1001, |p| p == delegated);
        assert_eq!(c, vec![delegated.clone()]);
        // Its own cgroup was delegated: that first. The root is never a candidate.
        let c = candidates(Version::V1, m, &own, false, 1001, |_| true);
        assert_eq!(c, vec![own, delegated]);
    }

    #[test]
    fn without_root_v2_walks_up_the_writable_ancestors_below_the_root() {
        let m = Path::new("/sys/fs/cgroup");
        let svc = m.join("user.slice/user-1001.slice/user@1001.service");
        let scope = svc.join("app.slice/run-1.scope");
        let delegated = |p: &Path| p.starts_with(&svc);
        let c = candidates(Version::V2, m, &scope, false, 1001, delegated);
        assert_eq!(c, vec![scope.clone(), svc.join("app.slice"), svc.clone()]);
        // Once moved into its leaf, the leaf's parent is the delegated cgroup again.
        let c = candidates(Version::V2, m, &scope.join(V2_LEAF), false, 1001, delegated);
        assert_eq!(c[0], scope);
        // Not delegated: nothing; the root itself never.
        assert!(candidates(Version::V2, m, &scope, false, 1001, |_| false).is_empty());
        assert!(candidates(Version::V2, m, m, false, 1001, |_| true).is_empty());
    }

    #[test]
    fn own_dir_follows_the_mount_root() {
        let m = Path::new("/sys/fs/cgroup/memory");
        assert_eq!(own_dir("/", m, "/a/b"), m.join("a/b"));
        assert_eq!(own_dir("/", m, "/"), m);
        assert_eq!(own_dir("/a", m, "/a/b"), m.join("b"));
        assert_eq!(own_dir("/a", m, "/ab"), m);
        assert_eq!(own_dir("/", m, "/../x"), m);
    }

    #[test]
    fn mountinfo_lines_are_parsed() {
        let l = "35 27 0:30 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory";
        assert_eq!(
            mount_fields(l),
            Some(("/", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"))
        );
        assert_eq!(unescape("/a\\040b"), "/a b");
        let info = format!("{l}\n");
        let loc = locate("memory", &info, "4:memory:/x/y\n").unwrap();
        assert_eq!(loc.version, Version::V1);
        assert_eq!(loc.own, Path::new("/sys/fs/cgroup/memory/x/y"));
        assert!(locate("pids", &info, "").is_none());
    }
}
