//! Online backup and restore of a SQLite store (SQLite's backup API).

use std::fs::OpenOptions;
use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;
use sessionbox_core::{Error, Result};

use crate::{Backend, SCHEMA_VERSION, Store, lock, schema, sql_error};

impl Store {
    /// Copies the SQLite store to `dest` with SQLite's online backup API, while other
    /// connections (a running server) keep reading and writing: the copy is a consistent
    /// snapshot. `dest` must not exist; it is made with mode 0600.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a PostgreSQL store (use `pg_dump`) or an existing `dest`;
    /// [`Error::Backend`] when the copy fails.
    pub fn backup(&self, dest: &Path) -> Result<()> {
        let Backend::Sqlite { conn, .. } = &self.backend else {
            return Err(Error::InvalidRequest(
                "backup copies a SQLite store; back up a PostgreSQL store with pg_dump".into(),
            ));
        };
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        options.open(dest).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                Error::InvalidRequest(format!(
                    "{} exists; give a new file for the backup",
                    dest.display()
                ))
            } else {
                Error::Backend(format!("cannot create {}: {e}", dest.display()))
            }
        })?;
        let mut out = Connection::open(dest).map_err(sql_error("open the backup file"))?;
        let conn = lock(conn);
        {
            let backup = rusqlite::backup::Backup::new(&conn, &mut out)
                .map_err(sql_error("start the backup"))?;
            backup
                .run_to_completion(256, Duration::from_millis(5), None)
                .map_err(sql_error("copy the store"))?;
        }
        drop(conn);
        // The copy is a plain (rollback-journal) file, complete on its own.
        out.pragma_update(None, "journal_mode", "DELETE")
            .map_err(sql_error("finish the backup file"))?;
        Ok(())
    }

    /// Replaces the SQLite store's contents with the backup at `src` (made by
    /// [`Store::backup`]), with SQLite's online backup API. The backup is checked first: it
    /// must be a sessionbox store whose schema this build understands; it is migrated after the
    /// copy. Run it with no server using the store: conversations recorded since the backup
    /// are forgotten (their workspaces become orphans that `sessionbox gc` reports and removes).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a PostgreSQL store or a file that is not a sessionbox
    /// store; [`Error::Backend`] when the copy fails.
    pub fn restore(&self, src: &Path) -> Result<()> {
        let Backend::Sqlite { conn, .. } = &self.backend else {
            return Err(Error::InvalidRequest(
                "restore replaces a SQLite store; restore a PostgreSQL store with pg_restore or \
                 psql"
                    .into(),
            ));
        };
        let from = Connection::open_with_flags(src, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| {
                Error::InvalidRequest(format!("cannot open the backup {}: {e}", src.display()))
            })?;
        let version: u32 = from
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| {
                Error::InvalidRequest(format!("{} is not a SQLite database: {e}", src.display()))
            })?;
        let has_table: bool = from
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'conversations')",
                [],
                |r| r.get(0),
            )
            .map_err(sql_error("inspect the backup"))?;
        if version == 0 || !has_table {
            return Err(Error::InvalidRequest(format!(
                "{} is not a sessionbox store backup",
                src.display()
            )));
        }
        if version > SCHEMA_VERSION {
            return Err(schema_too_new(version));
        }
        let mut conn = lock(conn);
        {
            let backup = rusqlite::backup::Backup::new(&from, &mut conn)
                .map_err(sql_error("start the restore"))?;
            backup
                .run_to_completion(256, Duration::from_millis(5), None)
                .map_err(sql_error("copy the backup into the store"))?;
        }
        conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
            .map_err(sql_error("switch to WAL mode"))?;
        schema::migrate(&mut conn)
    }
}

fn schema_too_new(version: u32) -> Error {
    Error::InvalidRequest(format!(
        "the backup's schema version is {version}, newer than the {SCHEMA_VERSION} this \
         sessionbox understands; restore it with a newer sessionbox"
    ))
}
