//! The schema, as an ordered, append-only list of migrations.
//!
//! Migration `i` (0-based) takes the database from `PRAGMA user_version = i` to `i + 1`. Each
//! runs in its own IMMEDIATE transaction together with the `user_version` bump, so a crash leaves
//! the previous version and the next open resumes. Never edit or reorder a step that has shipped;
//! append a new one (for example a table of a new runtime) instead.

use rusqlite::{Connection, TransactionBehavior};
use sessionbox_core::{Error, Result};

use crate::sql_error;

/// The migrations, oldest first. Append only.
const MIGRATIONS: &[&str] = &[
    // 1: conversations and the audit log.
    "CREATE TABLE conversations (
        key             TEXT PRIMARY KEY NOT NULL CHECK (length(key) = 64),
        tenant          TEXT NOT NULL,
        conversation_id TEXT NOT NULL,
        runtime         TEXT NOT NULL,
        sandbox_ref     TEXT,
        state           TEXT NOT NULL CHECK (state IN ('active', 'destroying')),
        created_at      INTEGER NOT NULL,
        last_used_at    INTEGER NOT NULL,
        expires_at      INTEGER,
        UNIQUE (tenant, conversation_id)
    );
    CREATE INDEX conversations_by_last_use ON conversations (last_used_at);
    CREATE TABLE audit (
        id               INTEGER PRIMARY KEY AUTOINCREMENT,
        at               INTEGER NOT NULL,
        tenant           TEXT NOT NULL,
        conversation_key TEXT,
        operation        TEXT NOT NULL,
        outcome          TEXT NOT NULL,
        detail           TEXT
    );
    CREATE INDEX audit_by_tenant ON audit (tenant, at);
    CREATE INDEX audit_by_key ON audit (conversation_key, at);",
    // 2: one sandbox uid per conversation, for the isolated runtime.
    "CREATE TABLE sandbox_uids (
        uid              INTEGER PRIMARY KEY,
        conversation_key TEXT UNIQUE NOT NULL REFERENCES conversations (key) ON DELETE CASCADE
    );",
    // 3: API keys of the HTTP server: only a hash of each secret is kept.
    "CREATE TABLE api_keys (
        id         TEXT PRIMARY KEY NOT NULL,
        tenant     TEXT NOT NULL,
        label      TEXT,
        hash       TEXT NOT NULL CHECK (length(hash) = 64),
        created_at INTEGER NOT NULL,
        revoked_at INTEGER
    );
    CREATE INDEX api_keys_by_tenant ON api_keys (tenant);",
    // 4: the remote sandbox of each conversation of a remote runtime (opensandbox): its id and
    // the expiry we set on it, which is the source of truth (the server's may lag or be lost).
    // No foreign key: the runtime keeps it on its own, beside the conversation record.
    "CREATE TABLE remote_sandboxes (
        conversation_key TEXT PRIMARY KEY NOT NULL CHECK (length(conversation_key) = 64),
        runtime          TEXT NOT NULL,
        sandbox_id       TEXT NOT NULL,
        created_at       INTEGER NOT NULL,
        expires_at       INTEGER
    );
    CREATE INDEX remote_sandboxes_by_runtime ON remote_sandboxes (runtime);",
    // 5: egress: network policies per tenant or conversation, and the gateway's verdicts.
    "CREATE TABLE egress_policies (
        scope           TEXT PRIMARY KEY NOT NULL,
        tenant          TEXT NOT NULL,
        conversation_id TEXT,
        policy          TEXT NOT NULL,
        hash            TEXT NOT NULL CHECK (length(hash) = 64),
        updated_at      INTEGER NOT NULL
    );
    CREATE TABLE egress_log (
        id               INTEGER PRIMARY KEY AUTOINCREMENT,
        at               INTEGER NOT NULL,
        tenant           TEXT NOT NULL,
        conversation_key TEXT NOT NULL,
        allowed          INTEGER NOT NULL CHECK (allowed IN (0, 1)),
        method           TEXT NOT NULL,
        target           TEXT NOT NULL,
        address          TEXT,
        rule             TEXT NOT NULL,
        bytes_up         INTEGER NOT NULL,
        bytes_down       INTEGER NOT NULL,
        duration_ms      INTEGER NOT NULL,
        end_reason       TEXT
    );
    CREATE INDEX egress_log_by_key ON egress_log (conversation_key, at);
    CREATE INDEX egress_log_by_tenant ON egress_log (tenant, at);",
    // 6: skill bootstrap runs, one row per conversation and skill.
    "CREATE TABLE skill_bootstraps (
        conversation_key TEXT NOT NULL REFERENCES conversations (key) ON DELETE CASCADE,
        skill            TEXT NOT NULL,
        digest           TEXT NOT NULL,
        state            TEXT NOT NULL CHECK (state IN ('running', 'ok', 'failed')),
        exit_code        INTEGER,
        runs             INTEGER NOT NULL DEFAULT 0,
        updated_at       INTEGER NOT NULL,
        PRIMARY KEY (conversation_key, skill)
    );",
];

/// The schema version this build writes: the number of migrations.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Brings the database up to [`SCHEMA_VERSION`]; a no-op when it is there already.
///
/// # Errors
/// [`Error::Backend`] when the database is newer than this build, or a step fails.
pub(crate) fn migrate(conn: &mut Connection) -> Result<()> {
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql_error("start a migration"))?;
        let version: u32 = tx
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(sql_error("read the schema version"))?;
        if version > SCHEMA_VERSION {
            return Err(Error::Backend(format!(
                "the store's schema version is {version}, newer than the {SCHEMA_VERSION} this \
                 sessionbox understands; upgrade sessionbox, or use another store file"
            )));
        }
        let Some(step) = MIGRATIONS.get(version as usize) else {
            return Ok(()); // up to date; dropping `tx` ends it without changes
        };
        tx.execute_batch(step)
            .map_err(sql_error(&format!("apply migration {}", version + 1)))?;
        tx.pragma_update(None, "user_version", version + 1)
            .map_err(sql_error("record the schema version"))?;
        tx.commit()
            .map_err(sql_error(&format!("commit migration {}", version + 1)))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_database_is_upgraded_step_by_step() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        migrate(&mut conn).unwrap();
        let version: u32 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        conn.prepare("SELECT uid, conversation_key FROM sandbox_uids")
            .unwrap();
        migrate(&mut conn).unwrap(); // and again: a no-op
    }
}
