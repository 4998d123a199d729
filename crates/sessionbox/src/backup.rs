//! `sessionbox backup` and `sessionbox restore`: the SQLite store copied out with SQLite's
//! online backup API, and a backup copied back in (only while no `serve` runs).

use std::path::Path;
use std::process::ExitCode;

use sessionbox_store::Store;

/// Copies the SQLite store of `data_dir` to `path`, a new file.
pub(crate) fn backup(
    data_dir: &Path,
    store_url: Option<&str>,
    path: &Path,
) -> anyhow::Result<ExitCode> {
    let (db, store) = open(data_dir, store_url)?;
    store.backup(path)?;
    outln!("backed up {} to {}", db.display(), path.display());
    Ok(ExitCode::SUCCESS)
}

/// Replaces the contents of the SQLite store of `data_dir` with the backup at `path`.
pub(crate) fn restore(
    data_dir: &Path,
    store_url: Option<&str>,
    path: &Path,
) -> anyhow::Result<ExitCode> {
    let db = existing_sqlite(data_dir, store_url)?;
    crate::serve::refuse_while_serving(data_dir)?;
    let store = Store::open(&db)?;
    store.restore(path)?;
    outln!(
        "restored {} from {}; run `sessionbox gc` to remove workspaces it has no record of",
        db.display(),
        path.display()
    );
    if !store.has_api_keys()? {
        warn!(
            "the restored store has never had an API key, so a loopback `serve` on it answers \
             requests without one (open mode); create a key with `sessionbox keys create \
             --tenant T` to close it"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The SQLite store file of `data_dir` and the store in it.
fn open(data_dir: &Path, store_url: Option<&str>) -> anyhow::Result<(std::path::PathBuf, Store)> {
    let db = existing_sqlite(data_dir, store_url)?;
    let store = Store::open(&db)?;
    Ok((db, store))
}

/// The SQLite store file of `data_dir`, refused when the store is PostgreSQL or the file does
/// not exist.
fn existing_sqlite(data_dir: &Path, store_url: Option<&str>) -> anyhow::Result<std::path::PathBuf> {
    if store_url.is_some() {
        anyhow::bail!(
            "the store is PostgreSQL (SESSIONBOX_STORE_URL or [store] url): back it up with \
             pg_dump and restore it with pg_restore"
        );
    }
    let db = data_dir.join("sessionbox.db");
    if !db.exists() {
        anyhow::bail!(
            "there is no store at {} to back up or restore into",
            db.display()
        );
    }
    Ok(db)
}
