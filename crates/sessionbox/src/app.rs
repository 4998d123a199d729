//! What the commands past the first ones share: the settings (data directory, file, tenant,
//! runtime), the conversation a command names with the runtime it runs on, and the [`App`]
//! (manager, tenant, runtime name) built from them.

use std::path::PathBuf;

use anyhow::Context;
use sessionbox::config::{self, FileConfig, RuntimeKind};
use sessionbox::runtime::{self, BuildOptions};
use sessionbox_core::{ConversationRef, TenantId};
use sessionbox_manager::Manager;
use sessionbox_store::{LifecyclePolicy, Store};

use crate::cli::Globals;
use crate::off_runtime;

/// Everything a subcommand on the manager needs.
pub(crate) struct App {
    /// The manager of the store and the runtime.
    pub manager: Manager,
    /// The tenant the command acts for.
    pub tenant: TenantId,
    /// The runtime's name.
    pub runtime_name: &'static str,
    /// Tenants whose warm pool a long-lived process fills from its start: those named in
    /// `[isolated.pool_tenants]` (or `[opensandbox.pool_tenants]` for that runtime) with a
    /// size, and the command's tenant when `pool_size` is set.
    pub warm_tenants: Vec<TenantId>,
}

/// The settings every command past the first ones reads: the data directory, the
/// configuration file, the tenant and the runtime asked for (flag, file, default).
pub(crate) struct Settings {
    pub(crate) data_dir: PathBuf,
    pub(crate) file: FileConfig,
    pub(crate) tenant: TenantId,
    pub(crate) kind: RuntimeKind,
    pub(crate) store_url: Option<String>,
}

impl Settings {
    /// Reads the settings: flags, then the file, then defaults.
    pub(crate) fn load(globals: &Globals) -> anyhow::Result<Settings> {
        let data_dir = config::data_dir(globals.data_dir.clone())?;
        let (config_path, required) = match &globals.config {
            Some(p) => (p.clone(), true),
            None => (data_dir.join("sessionbox.toml"), false),
        };
        let file = FileConfig::load(&config_path, required)?;
        let tenant = globals
            .tenant
            .clone()
            .or(file.tenant.clone())
            .unwrap_or_else(|| TenantId::DEFAULT.to_owned());
        let tenant = TenantId::new(tenant)?;
        let kind = globals
            .runtime
            .or(file.runtime)
            .unwrap_or(RuntimeKind::Isolated);
        let store_url = file.store_url();
        Ok(Settings {
            data_dir,
            file,
            tenant,
            kind,
            store_url,
        })
    }

    /// The SQLite store file.
    pub(crate) fn db(&self) -> PathBuf {
        self.data_dir.join("sessionbox.db")
    }

    /// The store, opened outside the async runtime.
    pub(crate) fn open_store(&self) -> anyhow::Result<Store> {
        let (url, db) = (self.store_url.as_deref(), self.db());
        Ok(off_runtime(|| Store::open_configured(url, &db))?)
    }
}

/// The conversation `id` names in the tenant, and the runtime it runs on. An existing
/// conversation keeps the runtime that created it: without `--runtime` (or SESSIONBOX_RUNTIME)
/// its record names the runtime, whatever the configured default; a runtime given explicitly
/// that differs is refused by the store. The store is opened here only when it exists (and
/// returned, to be used again), so bad input still creates nothing.
pub(crate) async fn conversation(
    globals: &Globals,
    settings: &Settings,
    id: &str,
) -> anyhow::Result<(ConversationRef, RuntimeKind, Option<Store>)> {
    let conv = ConversationRef::new(settings.tenant.clone(), id.parse()?);
    let mut kind = settings.kind;
    let mut store = None;
    if globals.runtime.is_none() && (settings.store_url.is_some() || settings.db().exists()) {
        let opened = settings.open_store()?;
        let key = conv.key.clone();
        let recorded = opened.run(move |s| s.get(&key)).await?;
        if let Some(r) = recorded
            && let Ok(k) = <RuntimeKind as clap::ValueEnum>::from_str(&r.runtime, false)
        {
            kind = k;
        }
        store = Some(opened);
    }
    Ok((conv, kind, store))
}

/// [`App::warm_tenants`] of `settings` for the runtime `kind` (only `isolated` and
/// `opensandbox` keep a pool).
fn warm_tenants(settings: &Settings, kind: RuntimeKind) -> anyhow::Result<Vec<TenantId>> {
    let (section, pool_size, pool_tenants) = match kind {
        RuntimeKind::Isolated => (
            "isolated",
            settings.file.isolated.pool_size,
            &settings.file.isolated.pool_tenants,
        ),
        RuntimeKind::Opensandbox => (
            "opensandbox",
            settings.file.opensandbox.pool_size,
            &settings.file.opensandbox.pool_tenants,
        ),
        RuntimeKind::Host | RuntimeKind::Aio => return Ok(Vec::new()),
    };
    let mut tenants = Vec::new();
    if pool_size.unwrap_or(0) > 0 {
        tenants.push(settings.tenant.clone());
    }
    for (name, &n) in pool_tenants {
        if n > 0 {
            tenants.push(
                TenantId::new(name.clone())
                    .with_context(|| format!("[{section}.pool_tenants] {name:?}"))?,
            );
        }
    }
    Ok(tenants)
}

impl App {
    /// The manager on `kind`'s runtime over the store (`store` if already open).
    pub(crate) fn build(
        globals: &Globals,
        settings: &Settings,
        lifecycle: LifecyclePolicy,
        kind: RuntimeKind,
        store: Option<Store>,
    ) -> anyhow::Result<App> {
        let skills = settings
            .file
            .skills
            .resolve(std::env::var("SESSIONBOX_SKILLS_DIR").ok().as_deref())?;
        let store = match store {
            Some(s) => s,
            None => settings.open_store()?,
        };
        let options = BuildOptions {
            exe: std::env::current_exe().context("cannot find the sessionbox executable")?,
            endpoint: globals.endpoint.as_deref(),
            config_path: globals.config.as_deref(),
            skills: skills.clone(),
        };
        let runtime =
            runtime::build_runtime(kind, &settings.file, &store, &settings.data_dir, &options)?;
        Ok(App {
            manager: Manager::new(store, runtime)
                .with_lifecycle(lifecycle)
                .with_log_retention(settings.file.log_retention())
                .with_skills(skills)
                .with_snapshots(settings.file.snapshots(&settings.data_dir)),
            tenant: settings.tenant.clone(),
            runtime_name: kind.name(),
            warm_tenants: warm_tenants(settings, kind)?,
        })
    }
}
