//! The schema, as an ordered, append-only list of migrations, each in two dialects.
//!
//! Migration `i` (0-based) takes the database from version `i` to `i + 1`: in SQLite the version
//! is `PRAGMA user_version`, in PostgreSQL the one row of `sessionbox_schema`. Each step runs in
//! its own transaction together with the version bump (in PostgreSQL under an advisory lock, so
//! replicas starting together migrate once), so a crash leaves the previous version and the next
//! open resumes. Never edit or reorder a step that has shipped; append a new one instead. The
//! two dialects of a step make the same tables, columns and constraints (integers are `BIGINT`
//! in PostgreSQL; times are unix milliseconds in both).

use rusqlite::{Connection, TransactionBehavior};
use sessionbox_core::{Error, Result};

use crate::pg::{CLASS_GLOBAL, GLOBAL_MIGRATE, pg_error};
use crate::sql_error;

/// One migration: the SQLite and the PostgreSQL text.
struct Step {
    sqlite: &'static str,
    postgres: &'static str,
}

/// The migrations, oldest first. Append only.
const MIGRATIONS: &[Step] = &[
    // 1: conversations and the audit log.
    Step {
        sqlite: "CREATE TABLE conversations (
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
        postgres: "CREATE TABLE conversations (
        key             TEXT PRIMARY KEY NOT NULL CHECK (length(key) = 64),
        tenant          TEXT NOT NULL,
        conversation_id TEXT NOT NULL,
        runtime         TEXT NOT NULL,
        sandbox_ref     TEXT,
        state           TEXT NOT NULL CHECK (state IN ('active', 'destroying')),
        created_at      BIGINT NOT NULL,
        last_used_at    BIGINT NOT NULL,
        expires_at      BIGINT,
        UNIQUE (tenant, conversation_id)
    );
    CREATE INDEX conversations_by_last_use ON conversations (last_used_at);
    CREATE TABLE audit (
        id               BIGSERIAL PRIMARY KEY,
        at               BIGINT NOT NULL,
        tenant           TEXT NOT NULL,
        conversation_key TEXT,
        operation        TEXT NOT NULL,
        outcome          TEXT NOT NULL,
        detail           TEXT
    );
    CREATE INDEX audit_by_tenant ON audit (tenant, at);
    CREATE INDEX audit_by_key ON audit (conversation_key, at);",
    },
    // 2: one sandbox uid per conversation, for the isolated runtime.
    Step {
        sqlite: "CREATE TABLE sandbox_uids (
        uid              INTEGER PRIMARY KEY,
        conversation_key TEXT UNIQUE NOT NULL REFERENCES conversations (key) ON DELETE CASCADE
    );",
        postgres: "CREATE TABLE sandbox_uids (
        uid              BIGINT PRIMARY KEY,
        conversation_key TEXT UNIQUE NOT NULL REFERENCES conversations (key) ON DELETE CASCADE
    );",
    },
    // 3: API keys of the HTTP server: only a hash of each secret is kept.
    Step {
        sqlite: "CREATE TABLE api_keys (
        id         TEXT PRIMARY KEY NOT NULL,
        tenant     TEXT NOT NULL,
        label      TEXT,
        hash       TEXT NOT NULL CHECK (length(hash) = 64),
        created_at INTEGER NOT NULL,
        revoked_at INTEGER
    );
    CREATE INDEX api_keys_by_tenant ON api_keys (tenant);",
        postgres: "CREATE TABLE api_keys (
        id         TEXT PRIMARY KEY NOT NULL,
        tenant     TEXT NOT NULL,
        label      TEXT,
        hash       TEXT NOT NULL CHECK (length(hash) = 64),
        created_at BIGINT NOT NULL,
        revoked_at BIGINT
    );
    CREATE INDEX api_keys_by_tenant ON api_keys (tenant);",
    },
    // 4: the remote sandbox of each conversation of a remote runtime (opensandbox): its id and
    // the expiry we set on it, which is the source of truth (the server's may lag or be lost).
    // No foreign key: the runtime keeps it on its own, beside the conversation record.
    Step {
        sqlite: "CREATE TABLE remote_sandboxes (
        conversation_key TEXT PRIMARY KEY NOT NULL CHECK (length(conversation_key) = 64),
        runtime          TEXT NOT NULL,
        sandbox_id       TEXT NOT NULL,
        created_at       INTEGER NOT NULL,
        expires_at       INTEGER
    );
    CREATE INDEX remote_sandboxes_by_runtime ON remote_sandboxes (runtime);",
        postgres: "CREATE TABLE remote_sandboxes (
        conversation_key TEXT PRIMARY KEY NOT NULL CHECK (length(conversation_key) = 64),
        runtime          TEXT NOT NULL,
        sandbox_id       TEXT NOT NULL,
        created_at       BIGINT NOT NULL,
        expires_at       BIGINT
    );
    CREATE INDEX remote_sandboxes_by_runtime ON remote_sandboxes (runtime);",
    },
    // 5: egress: network policies per tenant or conversation, and the gateway's verdicts.
    Step {
        sqlite: "CREATE TABLE egress_policies (
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
        postgres: "CREATE TABLE egress_policies (
        scope           TEXT PRIMARY KEY NOT NULL,
        tenant          TEXT NOT NULL,
        conversation_id TEXT,
        policy          TEXT NOT NULL,
        hash            TEXT NOT NULL CHECK (length(hash) = 64),
        updated_at      BIGINT NOT NULL
    );
    CREATE TABLE egress_log (
        id               BIGSERIAL PRIMARY KEY,
        at               BIGINT NOT NULL,
        tenant           TEXT NOT NULL,
        conversation_key TEXT NOT NULL,
        allowed          BIGINT NOT NULL CHECK (allowed IN (0, 1)),
        method           TEXT NOT NULL,
        target           TEXT NOT NULL,
        address          TEXT,
        rule             TEXT NOT NULL,
        bytes_up         BIGINT NOT NULL,
        bytes_down       BIGINT NOT NULL,
        duration_ms      BIGINT NOT NULL,
        end_reason       TEXT
    );
    CREATE INDEX egress_log_by_key ON egress_log (conversation_key, at);
    CREATE INDEX egress_log_by_tenant ON egress_log (tenant, at);",
    },
    // 6: skill bootstrap runs, one row per conversation and skill.
    Step {
        sqlite: "CREATE TABLE skill_bootstraps (
        conversation_key TEXT NOT NULL REFERENCES conversations (key) ON DELETE CASCADE,
        skill            TEXT NOT NULL,
        digest           TEXT NOT NULL,
        state            TEXT NOT NULL CHECK (state IN ('running', 'ok', 'failed')),
        exit_code        INTEGER,
        runs             INTEGER NOT NULL DEFAULT 0,
        updated_at       INTEGER NOT NULL,
        PRIMARY KEY (conversation_key, skill)
    );",
        postgres: "CREATE TABLE skill_bootstraps (
        conversation_key TEXT NOT NULL REFERENCES conversations (key) ON DELETE CASCADE,
        skill            TEXT NOT NULL,
        digest           TEXT NOT NULL,
        state            TEXT NOT NULL CHECK (state IN ('running', 'ok', 'failed')),
        exit_code        BIGINT,
        runs             BIGINT NOT NULL DEFAULT 0,
        updated_at       BIGINT NOT NULL,
        PRIMARY KEY (conversation_key, skill)
    );",
    },
    // 7: lifecycle. The policy a conversation was created with (idle timeout, time to live
    // renewed on use, maximum lifetime), a generation telling a record from a later one of the
    // same key, when its state last changed (a destroy claimed long ago and not finished is
    // stuck), and the keys garbage collection is clearing (no record may be made meanwhile).
    Step {
        sqlite: "ALTER TABLE conversations ADD COLUMN idle_timeout_ms INTEGER;
    ALTER TABLE conversations ADD COLUMN ttl_ms INTEGER;
    ALTER TABLE conversations ADD COLUMN max_lifetime_ms INTEGER;
    ALTER TABLE conversations ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE conversations ADD COLUMN state_since INTEGER;
    CREATE INDEX conversations_by_expiry ON conversations (expires_at);
    CREATE TABLE gc_claims (
        key        TEXT PRIMARY KEY NOT NULL CHECK (length(key) = 64),
        claimed_at INTEGER NOT NULL
    );",
        postgres: "ALTER TABLE conversations ADD COLUMN idle_timeout_ms BIGINT;
    ALTER TABLE conversations ADD COLUMN ttl_ms BIGINT;
    ALTER TABLE conversations ADD COLUMN max_lifetime_ms BIGINT;
    ALTER TABLE conversations ADD COLUMN generation BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE conversations ADD COLUMN state_since BIGINT;
    CREATE INDEX conversations_by_expiry ON conversations (expires_at);
    CREATE TABLE gc_claims (
        key        TEXT PRIMARY KEY NOT NULL CHECK (length(key) = 64),
        claimed_at BIGINT NOT NULL
    );",
    },
    // 8: notices of expired conversations, so the next use of the id says the old one expired
    // and its files are gone (see `expired.rs`).
    Step {
        sqlite: "CREATE TABLE expired_conversations (
        key             TEXT PRIMARY KEY NOT NULL CHECK (length(key) = 64),
        tenant          TEXT NOT NULL,
        conversation_id TEXT NOT NULL,
        expired_at      INTEGER NOT NULL,
        destroyed_at    INTEGER NOT NULL
    );
    CREATE INDEX expired_conversations_by_time ON expired_conversations (destroyed_at);",
        postgres: "CREATE TABLE expired_conversations (
        key             TEXT PRIMARY KEY NOT NULL CHECK (length(key) = 64),
        tenant          TEXT NOT NULL,
        conversation_id TEXT NOT NULL,
        expired_at      BIGINT NOT NULL,
        destroyed_at    BIGINT NOT NULL
    );
    CREATE INDEX expired_conversations_by_time ON expired_conversations (destroyed_at);",
    },
    // 9: bounded logs. An egress log row stands for `count` identical verdicts (the gateway
    // aggregates a flood); both logs get an index on their time, for pruning by age.
    Step {
        sqlite:
            "ALTER TABLE egress_log ADD COLUMN count INTEGER NOT NULL DEFAULT 1 CHECK (count >= 1);
    CREATE INDEX egress_log_by_at ON egress_log (at);
    CREATE INDEX audit_by_at ON audit (at);",
        postgres:
            "ALTER TABLE egress_log ADD COLUMN count BIGINT NOT NULL DEFAULT 1 CHECK (count >= 1);
    CREATE INDEX egress_log_by_at ON egress_log (at);
    CREATE INDEX audit_by_at ON audit (at);",
    },
    // 10: sandbox uids reserved by a warm pool's sandboxes before any conversation owns them
    // (`holder` names the pool slot); a bind moves the uid to `sandbox_uids` in one
    // transaction (see `uids.rs`).
    Step {
        sqlite: "CREATE TABLE sandbox_uid_reservations (
        uid         INTEGER PRIMARY KEY,
        holder      TEXT UNIQUE NOT NULL CHECK (length(holder) BETWEEN 1 AND 128),
        reserved_at INTEGER NOT NULL
    );",
        postgres: "CREATE TABLE sandbox_uid_reservations (
        uid         BIGINT PRIMARY KEY,
        holder      TEXT UNIQUE NOT NULL CHECK (length(holder) BETWEEN 1 AND 128),
        reserved_at BIGINT NOT NULL
    );",
    },
    // 11: the warm pool of a remote runtime (opensandbox): sandboxes made ahead, owned by no
    // conversation yet, per tenant; a bind moves one to `remote_sandboxes` in one transaction
    // (see `pool.rs`).
    Step {
        sqlite: "CREATE TABLE remote_pool_slots (
        slot       TEXT PRIMARY KEY NOT NULL CHECK (length(slot) BETWEEN 1 AND 63),
        runtime    TEXT NOT NULL,
        tenant     TEXT NOT NULL,
        sandbox_id TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER
    );
    CREATE INDEX remote_pool_slots_by_tenant ON remote_pool_slots (runtime, tenant, created_at);",
        postgres: "CREATE TABLE remote_pool_slots (
        slot       TEXT PRIMARY KEY NOT NULL CHECK (length(slot) BETWEEN 1 AND 63),
        runtime    TEXT NOT NULL,
        tenant     TEXT NOT NULL,
        sandbox_id TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT
    );
    CREATE INDEX remote_pool_slots_by_tenant ON remote_pool_slots (runtime, tenant, created_at);",
    },
    // 12: snapshots of workspaces (the archives are files the manager keeps; these are their
    // records), unique by name within a tenant, and templates: a tenant's names for its
    // snapshots. A template pins its snapshot: deleting a snapshot a template names is refused
    // (see `snapshots.rs`).
    Step {
        sqlite: "CREATE TABLE snapshots (
        id           TEXT PRIMARY KEY NOT NULL CHECK (length(id) BETWEEN 1 AND 64),
        tenant       TEXT NOT NULL,
        name         TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
        origin       TEXT,
        runtime      TEXT NOT NULL,
        bytes        INTEGER NOT NULL CHECK (bytes >= 0),
        files        INTEGER NOT NULL CHECK (files >= 0),
        directories  INTEGER NOT NULL CHECK (directories >= 0),
        links        INTEGER NOT NULL CHECK (links >= 0),
        stored_bytes INTEGER NOT NULL CHECK (stored_bytes >= 0),
        created_at   INTEGER NOT NULL,
        expires_at   INTEGER,
        UNIQUE (tenant, name)
    );
    CREATE INDEX snapshots_by_expiry ON snapshots (expires_at);
    CREATE TABLE snapshot_templates (
        tenant   TEXT NOT NULL,
        name     TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
        snapshot TEXT NOT NULL,
        PRIMARY KEY (tenant, name),
        FOREIGN KEY (tenant, snapshot) REFERENCES snapshots (tenant, name) ON DELETE RESTRICT
    );
    CREATE INDEX snapshot_templates_by_snapshot ON snapshot_templates (tenant, snapshot);",
        postgres: "CREATE TABLE snapshots (
        id           TEXT PRIMARY KEY NOT NULL CHECK (length(id) BETWEEN 1 AND 64),
        tenant       TEXT NOT NULL,
        name         TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
        origin       TEXT,
        runtime      TEXT NOT NULL,
        bytes        BIGINT NOT NULL CHECK (bytes >= 0),
        files        BIGINT NOT NULL CHECK (files >= 0),
        directories  BIGINT NOT NULL CHECK (directories >= 0),
        links        BIGINT NOT NULL CHECK (links >= 0),
        stored_bytes BIGINT NOT NULL CHECK (stored_bytes >= 0),
        created_at   BIGINT NOT NULL,
        expires_at   BIGINT,
        UNIQUE (tenant, name)
    );
    CREATE INDEX snapshots_by_expiry ON snapshots (expires_at);
    CREATE TABLE snapshot_templates (
        tenant   TEXT NOT NULL,
        name     TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
        snapshot TEXT NOT NULL,
        PRIMARY KEY (tenant, name),
        FOREIGN KEY (tenant, snapshot) REFERENCES snapshots (tenant, name) ON DELETE RESTRICT
    );
    CREATE INDEX snapshot_templates_by_snapshot ON snapshot_templates (tenant, snapshot);",
    },
    // 13: scoped, expiring API keys: a key may be limited to one conversation or to ids with a
    // prefix (never both), to reading, and may expire. Keys made before keep their full reach.
    Step {
        sqlite: "ALTER TABLE api_keys ADD COLUMN conversation TEXT;
    ALTER TABLE api_keys ADD COLUMN id_prefix TEXT
        CHECK (id_prefix IS NULL OR length(id_prefix) BETWEEN 1 AND 100);
    ALTER TABLE api_keys ADD COLUMN read_only INTEGER NOT NULL DEFAULT 0
        CHECK (read_only IN (0, 1));
    ALTER TABLE api_keys ADD COLUMN expires_at INTEGER;",
        postgres: "ALTER TABLE api_keys
        ADD COLUMN conversation TEXT,
        ADD COLUMN id_prefix TEXT
            CHECK (id_prefix IS NULL OR length(id_prefix) BETWEEN 1 AND 100),
        ADD COLUMN read_only BIGINT NOT NULL DEFAULT 0 CHECK (read_only IN (0, 1)),
        ADD COLUMN expires_at BIGINT,
        ADD CONSTRAINT api_keys_one_scope CHECK (conversation IS NULL OR id_prefix IS NULL);",
    },
];

/// The schema version this build writes: the number of migrations.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

fn too_new(version: u32) -> Error {
    Error::Backend(format!(
        "the store's schema version is {version}, newer than the {SCHEMA_VERSION} this \
         sessionbox understands; upgrade sessionbox, or use another store"
    ))
}

/// Brings a SQLite database up to [`SCHEMA_VERSION`]; a no-op when it is there already.
///
/// # Errors
/// [`Error::Backend`] when the database is newer than this build, or a step fails.
pub(crate) fn migrate(conn: &mut Connection) -> Result<()> {
    // Up to date (every open but the first after an upgrade): a plain read, without taking
    // the write lock that a migration needs.
    let version: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sql_error("read the schema version"))?;
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql_error("start a migration"))?;
        let version: u32 = tx
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(sql_error("read the schema version"))?;
        if version > SCHEMA_VERSION {
            return Err(too_new(version));
        }
        let Some(step) = MIGRATIONS.get(version as usize) else {
            return Ok(()); // up to date; dropping `tx` ends it without changes
        };
        tx.execute_batch(step.sqlite)
            .map_err(sql_error(&format!("apply migration {}", version + 1)))?;
        tx.pragma_update(None, "user_version", version + 1)
            .map_err(sql_error("record the schema version"))?;
        tx.commit()
            .map_err(sql_error(&format!("commit migration {}", version + 1)))?;
    }
}

/// Brings a PostgreSQL database up to [`SCHEMA_VERSION`], one step per transaction, each under
/// a global advisory lock so that replicas starting at once migrate once.
///
/// # Errors
/// [`Error::Backend`] when the database is newer than this build, or a step fails.
pub(crate) fn migrate_pg(client: &mut postgres::Client) -> Result<()> {
    loop {
        let mut tx = client
            .transaction()
            .map_err(pg_error("start a migration"))?;
        tx.execute(
            "SELECT pg_advisory_xact_lock($1, $2)",
            &[&CLASS_GLOBAL, &GLOBAL_MIGRATE],
        )
        .map_err(pg_error("lock the schema"))?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS sessionbox_schema (version BIGINT NOT NULL);
             INSERT INTO sessionbox_schema (version)
                 SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM sessionbox_schema);",
        )
        .map_err(pg_error("make the schema version table"))?;
        let version: i64 = tx
            .query_one("SELECT version FROM sessionbox_schema", &[])
            .map_err(pg_error("read the schema version"))?
            .get(0);
        let version = u32::try_from(version).unwrap_or(u32::MAX);
        if version > SCHEMA_VERSION {
            return Err(too_new(version));
        }
        let Some(step) = MIGRATIONS.get(version as usize) else {
            tx.commit().map_err(pg_error("commit the schema check"))?;
            return Ok(());
        };
        tx.batch_execute(step.postgres)
            .map_err(pg_error(&format!("apply migration {}", version + 1)))?;
        tx.execute(
            "UPDATE sessionbox_schema SET version = $1",
            &[&i64::from(version + 1)],
        )
        .map_err(pg_error("record the schema version"))?;
        tx.commit()
            .map_err(pg_error(&format!("commit migration {}", version + 1)))?;
    }
}

/// The schema version of a PostgreSQL database (0 before the first migration).
pub(crate) fn version_pg(client: &mut postgres::Client) -> Result<u32> {
    let rows = client
        .query("SELECT version FROM sessionbox_schema", &[])
        .map_err(pg_error("read the schema version"))?;
    Ok(rows
        .first()
        .map_or(0, |r| u32::try_from(r.get::<_, i64>(0)).unwrap_or(u32::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_database_is_upgraded_step_by_step() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(MIGRATIONS[0].sqlite).unwrap();
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

    #[test]
    fn a_database_before_snapshots_gets_their_tables_and_keeps_its_records() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "foreign_keys", true).unwrap();
        for step in &MIGRATIONS[..11] {
            conn.execute_batch(step.sqlite).unwrap();
        }
        conn.pragma_update(None, "user_version", 11).unwrap();
        conn.execute(
            "INSERT INTO conversations (key, tenant, conversation_id, runtime, state, created_at,
                 last_used_at)
             VALUES (?1, 'acme', 'c1', 'host', 'active', 1, 1)",
            [&"a".repeat(64)],
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let version: u32 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let kept: i64 = conn
            .query_row("SELECT COUNT(*) FROM conversations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(kept, 1);
        conn.execute_batch(
            "INSERT INTO snapshots (id, tenant, name, runtime, bytes, files, directories, links,
                 stored_bytes, created_at)
             VALUES ('s1', 'acme', 'base', 'host', 0, 0, 0, 0, 0, 1);
             INSERT INTO snapshot_templates (tenant, name, snapshot) VALUES ('acme', 't', 'base');",
        )
        .unwrap();
        // The template pins its snapshot, and names only a snapshot of its own tenant.
        assert!(
            conn.execute("DELETE FROM snapshots WHERE id = 's1'", [])
                .is_err()
        );
        assert!(
            conn.execute(
                "INSERT INTO snapshot_templates (tenant, name, snapshot) VALUES ('other', 't', 'base')",
                [],
            )
            .is_err()
        );
    }
}
