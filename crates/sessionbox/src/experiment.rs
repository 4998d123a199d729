//! What `verify` and `bench` share: the inventory taken before and after a run (so that a run
//! proves it left nothing behind and removed nothing it did not make), fresh run ids, and the
//! description of the machine a run was on.

use std::collections::BTreeSet;

use sessionbox_manager::Manager;

/// What a runtime and the store hold: workspace keys, processes of conversations, record keys.
#[derive(Debug, Default)]
pub struct Inventory {
    workspaces: BTreeSet<String>,
    processes: BTreeSet<u32>,
    records: BTreeSet<String>,
}

impl Inventory {
    /// Takes the inventory of `manager`'s runtime and store.
    pub async fn take(manager: &Manager) -> anyhow::Result<Self> {
        let mut inv = Inventory::default();
        for c in manager.runtime().list().await? {
            inv.workspaces.insert(c.key.to_string());
            inv.processes.extend(c.processes);
        }
        for r in manager.list(None).await? {
            inv.records.insert(r.key.to_string());
        }
        Ok(inv)
    }

    /// An inventory of records alone, named by `names` (what a server's API shows).
    pub fn of_records(names: impl IntoIterator<Item = String>) -> Self {
        Inventory {
            records: names.into_iter().collect(),
            ..Inventory::default()
        }
    }

    /// True when a workspace or a record of `key` exists.
    pub fn holds(&self, key: &str) -> bool {
        self.workspaces.contains(key) || self.records.contains(key)
    }

    /// What is here now and was not in `before` ("workspace KEY", "record KEY", "process PID").
    pub fn added_since(&self, before: &Inventory) -> Vec<String> {
        let workspaces = self.workspaces.difference(&before.workspaces);
        let records = self.records.difference(&before.records);
        let processes = self.processes.difference(&before.processes);
        workspaces
            .map(|k| format!("workspace {k}"))
            .chain(records.map(|k| format!("record {k}")))
            .chain(processes.map(|p| format!("process {p}")))
            .collect()
    }

    /// Workspaces and records that were in `before` and are gone now (processes end on their
    /// own, so they are not counted).
    pub fn removed_since(&self, before: &Inventory) -> Vec<String> {
        let workspaces = before.workspaces.difference(&self.workspaces);
        let records = before.records.difference(&self.records);
        workspaces
            .map(|k| format!("workspace {k}"))
            .chain(records.map(|k| format!("record {k}")))
            .collect()
    }
}

/// A fresh run id: 12 hex digits from the clock, the pid and a random hasher key.
pub fn run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.write_u32(std::process::id());
    format!("{:012x}", h.finish() & 0xffff_ffff_ffff)
}

/// Where an experiment ran: OS, kernel, architecture, CPU, cores, sessionbox version.
pub fn environment() -> serde_json::Value {
    let os = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("PRETTY_NAME=")
                    .map(|v| v.trim_matches('"').to_owned())
            })
        })
        .unwrap_or_else(|| std::env::consts::OS.to_owned());
    let uname = rustix::system::uname();
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines().find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
    });
    serde_json::json!({
        "os": os,
        "kernel": uname.release().to_string_lossy(),
        "arch": std::env::consts::ARCH,
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "sessionbox_version": env!("CARGO_PKG_VERSION"),
    })
}
