//! The warm pool: sandboxes launched before any conversation asks for one, each bound to a new
//! conversation on its first open, so that the conversation's cold start is a bind (a few
//! renames and one store transaction) instead of a launch (a volume made and mounted, a uid
//! allocated, namespaces, cgroups, the agent started).
//!
//! A pool slot is a directory `pool/<tenant tag>.<random>` beneath the data directory, laid out
//! like a conversation's run directory (`lock`, `agent.sock`, `agent.log`, `sandbox.json`) plus
//! the slot's own `workspace/` (an empty directory, or the mount point of a fresh volume
//! `disk.img` with a disk quota) and `tenant` (the tenant's id). Its sandbox runs as a host uid
//! the store reserves for the slot ([`Directory::reserve_pool_uid`]), with the runtime's
//! default limits and idle timeout, no network and no skills, named `sbx-pool`. A slot is made
//! under `pool/.new-<name>` and renamed into place only when its sandbox runs, so a crash
//! mid-launch leaves a `.new-` directory that [`IsolatedRuntime::prune_pool`] removes.
//!
//! Binding a slot to conversation `key`, under the conversation's lock and the slot's:
//! 1. the uid reservation becomes the conversation's uid, in one store transaction
//!    ([`Directory::bind_pool_uid`]);
//! 2. the workspace moves to `workspaces/<key>` (a rename; with a disk quota the image is
//!    renamed to `disks/<key>.img` and its volume bound there, the slot's mount point
//!    unmounted); the sandbox's `/workspace` is the same directory or volume, so it sees the
//!    conversation's workspace;
//! 3. the sandbox's cgroups are renamed to the conversation's, its host name set to the
//!    conversation's (`sbx-<short key>`, through its UTS namespace);
//! 4. the slot's directory is exchanged with `run/<key>` (`renameat2(RENAME_EXCHANGE)`), which
//!    carries the socket, the record and the log with it (the log relay follows its
//!    directory), and what was `run/<key>` is removed. An opener that waited for the old lock
//!    sees its directory replaced and takes the new one's (`find_or_lock`).
//!
//! Only a conversation whose sandbox would be launched exactly like a pool's takes a slot: a
//! new one (no workspace, no image yet), whose network policy is `none`, with no skills and the
//! runtime's default idle timeout. Any other is launched as before. Nothing of the pool is left
//! in a bound sandbox: no command ever ran in it (its `/tmp`, processes and environment are
//! those of a fresh launch), and its uid, workspace, cgroups and host name are the
//! conversation's.
//!
//! Who fills it: [`IsolatedRuntime::refill_pool`], which long-lived processes (`serve`, `mcp`,
//! the bench) call after a bind and periodically (it also pings the pooled agents so that they
//! do not stop when idle); a one-shot CLI call only takes slots.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use sessionbox_core::{ConversationKey, ConversationRef, Error, Result, TenantId};

use super::launch::{
    Facts, Place, RunDir, agent_answers, hostname_of, kill_recorded, lock_file, read_record,
    write_atomic,
};
use super::{IsolatedRuntime, blocking, disk};
use crate::host::create_private_dir_all;

/// The prefix of a slot being made.
const NEW: &str = ".new-";
/// The host name of a pooled sandbox until it is bound.
const POOL_HOSTNAME: &str = "sbx-pool";

/// A slot taken for a bind: its directory and its lock (held).
struct Slot {
    path: PathBuf,
    name: String,
    _lock: File,
}

/// The tag of `tenant`'s slots: 16 hex digits of its SHA-256.
fn tenant_tag(tenant: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(tenant.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// 16 random hex digits (from the kernel's random source), naming a slot.
pub(super) fn random_hex() -> Result<String> {
    use std::io::Read;
    let mut b = [0u8; 8];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::Backend(format!("cannot read /dev/urandom: {e}")))?;
    Ok(b.iter().map(|b| format!("{b:02x}")).collect())
}

fn backend(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Backend(format!("cannot {what} {}: {e}", path.display()))
}

/// Takes `path`'s lock without waiting; `None` when another process holds it.
fn try_lock(path: &Path) -> Option<File> {
    let f = File::options().write(true).open(path.join("lock")).ok()?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).ok()?;
    Some(f)
}

/// [`try_lock`], tried for up to 20 ms: a slot's lock is also held, for a moment, by any child
/// process another thread of this process is forking (the descriptor is closed only when the
/// child executes), which must not make a free slot look taken.
fn lock_soon(path: &Path) -> Option<File> {
    for _ in 0..10 {
        if let Some(f) = try_lock(path) {
            return Some(f);
        }
        if !path.join("lock").exists() {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    None
}

/// Ends a slot's sandbox and removes its volume and directory. Blocks.
fn remove_slot(path: &Path) -> Result<()> {
    kill_recorded(path);
    disk::remove_volume(&path.join("workspace"), &path.join("disk.img"))?;
    sessionbox_fs::remove_tree(path)
        .map(drop)
        .map_err(|e| backend("remove the pool slot", path, e))
}

/// Sets the host name of the UTS namespace `init_pid` is in. The calling thread is not
/// changed: a short-lived thread joins the namespace.
fn set_hostname(init_pid: u32, name: &str) -> Result<()> {
    let ns_path = format!("/proc/{init_pid}/ns/uts");
    let ns = File::open(&ns_path).map_err(|e| backend("open", Path::new(&ns_path), e))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&ns),
                Some(rustix::thread::LinkNameSpaceType::HostNameAndNISDomainName),
            )?;
            rustix::system::sethostname(name.as_bytes())
        })
        .join()
    })
    .map_err(|_| Error::Backend("the host name thread panicked".into()))?
    .map_err(|e| Error::Backend(format!("cannot set the sandbox's host name: {e}")))
}

/// What [`IsolatedRuntime::scan_pool`] found of one tenant's slots.
struct Scan {
    /// Slots whose agent answers, free (not locked by anyone).
    live: Vec<(String, PathBuf)>,
    /// Holders of the slots removed because their sandbox had died.
    removed: Vec<String>,
    /// Slots locked by someone else.
    busy: usize,
}

impl IsolatedRuntime {
    fn pool_dir(&self) -> PathBuf {
        self.run.with_file_name("pool")
    }

    /// The name under which the store reserves slot `name`'s uid.
    fn holder(&self, name: &str) -> String {
        format!("isolated:{}:{name}", self.instance)
    }

    /// Binds a warm sandbox of the tenant's pool to `conversation` when it may take one (see
    /// the module documentation), with the conversation's `lock` held; gives the lock back
    /// (`Err`) when it may not, or the pool is empty, so that the caller launches.
    pub(super) async fn bind_from_pool(
        &self,
        conversation: &ConversationRef,
        network: bool,
        lock: File,
    ) -> Result<std::result::Result<RunDir, File>> {
        let key = &conversation.key;
        if network || self.config.pool.of(conversation.tenant.as_str()) == 0 {
            return Ok(Err(lock));
        }
        if self.workspace_dir(key).exists() || self.disk_image(key).exists() {
            return Ok(Err(lock));
        }
        let own = self.directory.idle_timeout(key).await.ok().flatten();
        if own.is_some_and(|d| d != self.config.idle_timeout) {
            return Ok(Err(lock));
        }
        if self.skills && !self.directory.skill_binds(key).await?.is_empty() {
            return Ok(Err(lock));
        }
        let (this, tag) = (self.clone(), tenant_tag(conversation.tenant.as_str()));
        let (slot, removed) = blocking(move || this.take_slot(&tag)).await?;
        self.release_holders(removed).await;
        let Some(slot) = slot else {
            return Ok(Err(lock));
        };
        if rustix::process::geteuid().is_root()
            && let Err(e) = self
                .directory
                .bind_pool_uid(&self.holder(&slot.name), key)
                .await
        {
            tracing::warn!("cannot give a pooled sandbox's uid to {}: {e}", key.short());
            return Ok(Err(lock));
        }
        let (this, key) = (self.clone(), key.clone());
        let run_dir = blocking(move || {
            let r = this.bind_slot(&slot, &key);
            if r.is_err() {
                // Never offered again half-bound; the conversation keeps its uid and its next
                // open launches a sandbox of its own.
                let _ = remove_slot(&slot.path);
            }
            drop(lock);
            r
        })
        .await?;
        Ok(Ok(run_dir))
    }

    /// A free, live slot of the tenant tagged `tag`, locked; removes the dead ones it meets
    /// (their holders are returned, for their uids to be released). Blocks.
    fn take_slot(&self, tag: &str) -> Result<(Option<Slot>, Vec<String>)> {
        let mut removed = Vec::new();
        for (name, path) in self.slots(tag)? {
            let Some(lock) = lock_soon(&path) else {
                continue;
            };
            // Taken and exchanged away by another process between the listing and the lock.
            if read_record(&path).is_none() {
                continue;
            }
            let run_dir = RunDir::open(&path)?;
            if !agent_answers(&run_dir.socket()) {
                remove_slot(&path)?;
                removed.push(self.holder(&name));
                continue;
            }
            return Ok((
                Some(Slot {
                    path,
                    name,
                    _lock: lock,
                }),
                removed,
            ));
        }
        Ok((None, removed))
    }

    /// The slots of the tenant tagged `tag` (every slot with `None`), by name. Blocks.
    fn slots_matching(&self, tag: Option<&str>) -> Result<Vec<(String, PathBuf)>> {
        let pool = self.pool_dir();
        let entries = match fs::read_dir(&pool) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(backend("list", &pool, e)),
        };
        let mut slots: Vec<_> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| match tag {
                Some(t) => n.strip_prefix(t).is_some_and(|r| r.starts_with('.')),
                None => true,
            })
            .map(|n| (n.clone(), pool.join(n)))
            .collect();
        slots.sort();
        Ok(slots)
    }

    fn slots(&self, tag: &str) -> Result<Vec<(String, PathBuf)>> {
        self.slots_matching(Some(tag))
    }

    /// Makes `slot`'s sandbox `key`'s (steps 2 to 4 of the module documentation) and returns
    /// the conversation's run directory. Blocks.
    fn bind_slot(&self, slot: &Slot, key: &ConversationKey) -> Result<RunDir> {
        let slot_ws = slot.path.join("workspace");
        let slot_img = slot.path.join("disk.img");
        let workspace = self.workspace_dir(key);
        if slot_img.exists() {
            let image = self.disk_image(key);
            fs::rename(&slot_img, &image).map_err(|e| backend("move", &slot_img, e))?;
            {
                use std::os::unix::fs::DirBuilderExt;
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&workspace)
                    .map_err(|e| backend("create", &workspace, e))?;
            }
            rustix::mount::mount_bind(&slot_ws, &workspace)
                .map_err(|e| backend("bind the pooled volume at", &workspace, e))?;
            rustix::mount::unmount(&slot_ws, rustix::mount::UnmountFlags::DETACH)
                .map_err(|e| backend("unmount", &slot_ws, e))?;
        } else {
            fs::rename(&slot_ws, &workspace).map_err(|e| backend("move", &slot_ws, e))?;
        }
        let mut record = read_record(&slot.path)
            .ok_or_else(|| Error::Backend("a pooled sandbox has no record".into()))?;
        let name = self.cgroup_name(key);
        record.cgroups = record
            .cgroups
            .iter()
            .map(|d| {
                // Renamed where the hierarchy allows it (cgroup v1 does); the record names
                // where each is, so nothing depends on the name.
                let to = d.with_file_name(&name);
                match fs::rename(d, &to) {
                    Ok(()) => to,
                    Err(_) => d.clone(),
                }
            })
            .collect();
        set_hostname(record.init_pid, &hostname_of(key))?;
        write_atomic(
            &slot.path.join("sandbox.json"),
            &serde_json::to_vec(&record).map_err(Error::backend)?,
        )?;
        let _ = fs::remove_file(slot.path.join("tenant"));
        let run = self.run_dir(key);
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            &slot.path,
            rustix::fs::CWD,
            &run,
            rustix::fs::RenameFlags::EXCHANGE,
        )
        .map_err(|e| backend("move the pooled sandbox to", &run, e))?;
        // What was the conversation's run directory (its lock) is now at the slot's path.
        sessionbox_fs::remove_tree(&slot.path).map_err(|e| backend("remove", &slot.path, e))?;
        // With a disk quota, the slot's empty mount point came along.
        let _ = fs::remove_dir(run.join("workspace"));
        RunDir::open(&run)
    }

    /// Releases the uid reservations of `holders` (their slots were removed).
    async fn release_holders(&self, holders: Vec<String>) {
        for h in holders {
            if let Err(e) = self.directory.release_pool_uid(&h).await {
                tracing::warn!("cannot release the uid of pool slot {h}: {e}");
            }
        }
    }

    /// Finds the live, free slots of the tenant tagged `tag` and removes its dead ones.
    /// Blocks.
    fn scan_pool(&self, tag: &str) -> Result<Scan> {
        let mut scan = Scan {
            live: Vec::new(),
            removed: Vec::new(),
            busy: 0,
        };
        for (name, path) in self.slots(tag)? {
            // Locked: being bound (it goes) or held for a moment by a child another thread
            // forked (it stays): counted, so that a refill does not launch one too many.
            let Some(_lock) = try_lock(&path) else {
                scan.busy += 1;
                continue;
            };
            if read_record(&path).is_none() {
                continue;
            }
            let run_dir = RunDir::open(&path)?;
            if agent_answers(&run_dir.socket()) {
                scan.live.push((name, path));
            } else {
                remove_slot(&path)?;
                scan.removed.push(self.holder(&name));
            }
        }
        Ok(scan)
    }

    /// Fills `tenant`'s pool up to its size: removes slots whose sandbox died, pings the live
    /// ones (a request keeps an agent from stopping when idle) and launches the missing ones.
    /// Returns how many it launched. Concurrent calls in one process are serialised.
    ///
    /// # Errors
    /// The launch's errors (a uid range that is full, a volume that cannot be made).
    pub async fn refill_pool(&self, tenant: &TenantId) -> Result<usize> {
        let size = self.config.pool.of(tenant.as_str());
        if size == 0 {
            return Ok(0);
        }
        let _one = self.pool_refill.lock().await;
        let (this, tag) = (self.clone(), tenant_tag(tenant.as_str()));
        let scan = blocking(move || this.scan_pool(&tag)).await?;
        self.release_holders(scan.removed).await;
        for (_, path) in &scan.live {
            let Ok(dir) = RunDir::open(path) else {
                continue;
            };
            let client = sessionbox_execd::ExecdClient::builder(sessionbox_execd::Endpoint::Unix(
                dir.socket(),
            ))
            .request_timeout(Some(super::PING_TIMEOUT))
            .build();
            if let Ok(c) = client {
                let _ = c.ping().await;
            }
        }
        let mut launched = 0;
        for _ in scan.live.len() + scan.busy..size {
            self.launch_slot(tenant).await?;
            launched += 1;
        }
        Ok(launched)
    }

    /// Launches one slot of `tenant`'s pool. The `.new-` directory exists (and is locked)
    /// before the uid is reserved, so [`IsolatedRuntime::prune_pool`] never releases the
    /// reservation of a slot being made.
    async fn launch_slot(&self, tenant: &TenantId) -> Result<()> {
        let name = format!("{}.{}", tenant_tag(tenant.as_str()), random_hex()?);
        let holder = self.holder(&name);
        let (this, n, t) = (self.clone(), name.clone(), tenant.as_str().to_owned());
        let (tmp, lock) = blocking(move || {
            let pool = this.pool_dir();
            create_private_dir_all(&pool)?;
            let tmp = pool.join(format!("{NEW}{n}"));
            create_private_dir_all(&tmp)?;
            let lock = lock_file(&tmp.join("lock"))?;
            fs::write(tmp.join("tenant"), t.as_bytes())
                .map_err(|e| backend("write", &tmp.join("tenant"), e))?;
            Ok((tmp, lock))
        })
        .await?;
        let euid = rustix::process::geteuid();
        let uid = if euid.is_root() {
            match self
                .directory
                .reserve_pool_uid(&holder, self.config.uids.clone())
                .await
            {
                Ok(uid) => uid,
                Err(e) => {
                    let _ = fs::remove_dir_all(&tmp);
                    return Err(e);
                }
            }
        } else {
            euid.as_raw()
        };
        let this = self.clone();
        let made = blocking(move || {
            let r = this.make_slot(&tmp, &name, uid);
            if r.is_err() {
                let _ = remove_slot(&tmp);
            }
            drop(lock);
            r
        })
        .await;
        if made.is_err() {
            self.release_holders(vec![holder]).await;
        }
        made
    }

    /// Launches a slot's sandbox in `tmp` and renames the slot into place. Blocks.
    fn make_slot(&self, tmp: &Path, name: &str, uid: u32) -> Result<()> {
        let run_dir = RunDir::open(tmp)?;
        let place = Place {
            workspace: tmp.join("workspace"),
            image: tmp.join("disk.img"),
            cgroup: format!(
                "sessionbox-{}-pool-{}",
                self.instance,
                name.replace('.', "")
            ),
            hostname: POOL_HOSTNAME.to_owned(),
        };
        let facts = Facts {
            uid,
            idle_timeout: self.config.idle_timeout,
            // As a conversation without skills gets them when skills are configured.
            skill_binds: self.skills.then(Vec::new),
        };
        let launch = self.build_spec(&place, tmp, &run_dir, false, facts)?;
        self.launch_and_record(None, tmp, launch)?;
        let to = self.pool_dir().join(name);
        fs::rename(tmp, &to).map_err(|e| backend("move the pool slot to", &to, e))
    }

    /// Removes what the pool should not hold: slots whose sandbox died, slots left half-made
    /// by a process that died, slots beyond their tenant's pool size (every slot with
    /// `drain`), and uid reservations whose slot is gone. Slots in use (locked) are left.
    /// Returns how many slots it removed.
    ///
    /// # Errors
    /// [`Error::Backend`] when the pool directory cannot be read or a slot removed.
    pub async fn prune_pool(&self, drain: bool) -> Result<usize> {
        let this = self.clone();
        let (removed, holders, present) = blocking(move || {
            let mut removed = 0;
            let mut holders = Vec::new();
            let mut present = std::collections::BTreeSet::new();
            let mut kept: std::collections::BTreeMap<String, usize> = Default::default();
            for (name, path) in this.slots_matching(None)? {
                let base = name.strip_prefix(NEW).unwrap_or(&name).to_owned();
                let Some(_lock) = try_lock(&path) else {
                    present.insert(this.holder(&base));
                    continue;
                };
                let tenant = fs::read_to_string(path.join("tenant")).unwrap_or_default();
                let size = this.config.pool.of(&tenant);
                let live = !name.starts_with(NEW)
                    && read_record(&path).is_some()
                    && RunDir::open(&path).is_ok_and(|d| agent_answers(&d.socket()));
                let count = kept.entry(tenant).or_default();
                if live && !drain && *count < size {
                    *count += 1;
                    present.insert(this.holder(&base));
                    continue;
                }
                remove_slot(&path)?;
                holders.push(this.holder(&base));
                removed += 1;
            }
            Ok((removed, holders, present))
        })
        .await?;
        self.release_holders(holders).await;
        // Reservations of this data directory whose slot is gone (a crash between the
        // removal of a slot and the release of its uid).
        let prefix = self.holder("");
        let stale: Vec<String> = self
            .directory
            .pool_uid_holders()
            .await?
            .into_iter()
            .filter(|h| h.starts_with(&prefix) && !present.contains(h))
            .collect();
        // A slot being made now has its `.new-` directory (hence is in `present`) before its
        // reservation exists; one listed after the scan above is looked for again.
        let mut gone = Vec::new();
        for h in stale {
            let name = &h[prefix.len()..];
            let pool = self.pool_dir();
            if !pool.join(name).exists() && !pool.join(format!("{NEW}{name}")).exists() {
                gone.push(h);
            }
        }
        self.release_holders(gone).await;
        Ok(removed)
    }
}
