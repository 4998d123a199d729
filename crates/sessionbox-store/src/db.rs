//! The two backends behind [`crate::Store`], reduced to what the store's methods need: run a
//! statement, run a query, in or out of a transaction, with values that are integers, text or
//! NULL.
//!
//! Every statement is written once, in PostgreSQL's placeholder style (`$1`, `$2`, ...) and in
//! the SQL both databases accept; [`lite_sql`] turns `$n` into SQLite's `?n`. Rows come back as
//! [`Row`]s of [`Val`]s, so the code that reads them is shared too.

use std::borrow::Cow;

use bytes::BytesMut;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use sessionbox_core::{Error, Result};

/// A value in or out of SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Val {
    Null,
    Int(i64),
    Text(String),
}

impl From<i64> for Val {
    fn from(v: i64) -> Self {
        Val::Int(v)
    }
}

impl From<&str> for Val {
    fn from(v: &str) -> Self {
        Val::Text(v.to_owned())
    }
}

impl From<String> for Val {
    fn from(v: String) -> Self {
        Val::Text(v)
    }
}

impl<T: Into<Val>> From<Option<T>> for Val {
    fn from(v: Option<T>) -> Self {
        v.map_or(Val::Null, Into::into)
    }
}

/// One row of a result.
#[derive(Debug, Clone)]
pub(crate) struct Row(pub Vec<Val>);

impl Row {
    fn get(&self, i: usize) -> Result<&Val> {
        self.0
            .get(i)
            .ok_or_else(|| Error::Backend(format!("the store returned no column {i}")))
    }

    pub(crate) fn int(&self, i: usize) -> Result<i64> {
        self.opt_int(i)?
            .ok_or_else(|| Error::Backend(format!("column {i} is NULL in the store")))
    }

    pub(crate) fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        match self.get(i)? {
            Val::Null => Ok(None),
            Val::Int(v) => Ok(Some(*v)),
            Val::Text(_) => Err(Error::Backend(format!(
                "column {i} holds text where the store expects a number"
            ))),
        }
    }

    pub(crate) fn text(&self, i: usize) -> Result<String> {
        self.opt_text(i)?
            .ok_or_else(|| Error::Backend(format!("column {i} is NULL in the store")))
    }

    pub(crate) fn opt_text(&self, i: usize) -> Result<Option<String>> {
        match self.get(i)? {
            Val::Null => Ok(None),
            Val::Text(v) => Ok(Some(v.clone())),
            Val::Int(_) => Err(Error::Backend(format!(
                "column {i} holds a number where the store expects text"
            ))),
        }
    }
}

/// A constraint a statement broke, told apart from other failures by
/// [`Db::execute_checked`], so a caller can say what it means instead of passing the
/// database's text on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Violation {
    /// A primary key or a `UNIQUE` constraint.
    Unique,
    /// A foreign key (a row referring to one that is absent, or a referred-to row deleted).
    ForeignKey,
}

/// Statements and queries on one connection or transaction.
pub(crate) trait Db {
    /// Runs a statement; returns how many rows it changed. `doing` names the operation in
    /// errors.
    fn execute(&mut self, doing: &str, sql: &str, params: &[Val]) -> Result<u64>;
    /// [`Db::execute`], with a broken unique or foreign-key constraint returned as
    /// `Ok(Err(violation))` rather than as an error. In PostgreSQL the transaction is then
    /// aborted: the caller may only end it (by returning an error).
    fn execute_checked(
        &mut self,
        doing: &str,
        sql: &str,
        params: &[Val],
    ) -> Result<std::result::Result<u64, Violation>>;
    /// Runs a query; returns its rows.
    fn query(&mut self, doing: &str, sql: &str, params: &[Val]) -> Result<Vec<Row>>;

    /// The first row of a query, if any.
    fn query_opt(&mut self, doing: &str, sql: &str, params: &[Val]) -> Result<Option<Row>> {
        Ok(self.query(doing, sql, params)?.into_iter().next())
    }
}

// ---- SQLite. ----

/// `$n` placeholders as SQLite's `?n`. Statements hold no `$` elsewhere.
pub(crate) fn lite_sql(sql: &str) -> Cow<'_, str> {
    if sql.contains('$') {
        Cow::Owned(sql.replace('$', "?"))
    } else {
        Cow::Borrowed(sql)
    }
}

impl rusqlite::ToSql for Val {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(match self {
            Val::Null => ToSqlOutput::Borrowed(ValueRef::Null),
            Val::Int(v) => ToSqlOutput::Borrowed(ValueRef::Integer(*v)),
            Val::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
        })
    }
}

/// A SQLite connection (or a transaction, through its `Deref`).
pub(crate) struct Lite<'a>(pub &'a rusqlite::Connection);

impl Db for Lite<'_> {
    fn execute(&mut self, doing: &str, sql: &str, params: &[Val]) -> Result<u64> {
        let mut stmt = self
            .0
            .prepare_cached(&lite_sql(sql))
            .map_err(crate::sql_error(doing))?;
        stmt.execute(rusqlite::params_from_iter(params))
            .map(|n| n as u64)
            .map_err(crate::sql_error(doing))
    }

    fn execute_checked(
        &mut self,
        doing: &str,
        sql: &str,
        params: &[Val],
    ) -> Result<std::result::Result<u64, Violation>> {
        use rusqlite::ffi;
        let mut stmt = self
            .0
            .prepare_cached(&lite_sql(sql))
            .map_err(crate::sql_error(doing))?;
        match stmt.execute(rusqlite::params_from_iter(params)) {
            Ok(n) => Ok(Ok(n as u64)),
            Err(rusqlite::Error::SqliteFailure(f, _))
                if f.extended_code == ffi::SQLITE_CONSTRAINT_FOREIGNKEY =>
            {
                Ok(Err(Violation::ForeignKey))
            }
            // SQLite carries out `ON DELETE RESTRICT` as a trigger raising this fixed text (the
            // store defines no triggers of its own).
            Err(rusqlite::Error::SqliteFailure(f, Some(m)))
                if f.extended_code == ffi::SQLITE_CONSTRAINT_TRIGGER
                    && m == "FOREIGN KEY constraint failed" =>
            {
                Ok(Err(Violation::ForeignKey))
            }
            Err(rusqlite::Error::SqliteFailure(f, _))
                if f.extended_code == ffi::SQLITE_CONSTRAINT_UNIQUE
                    || f.extended_code == ffi::SQLITE_CONSTRAINT_PRIMARYKEY =>
            {
                Ok(Err(Violation::Unique))
            }
            Err(e) => Err(crate::sql_error(doing)(e)),
        }
    }

    fn query(&mut self, doing: &str, sql: &str, params: &[Val]) -> Result<Vec<Row>> {
        use rusqlite::types::ValueRef;
        let mut stmt = self
            .0
            .prepare_cached(&lite_sql(sql))
            .map_err(crate::sql_error(doing))?;
        let n = stmt.column_count();
        let mut rows = stmt
            .query(rusqlite::params_from_iter(params))
            .map_err(crate::sql_error(doing))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next().map_err(crate::sql_error(doing))? {
            let mut row = Vec::with_capacity(n);
            for i in 0..n {
                row.push(match r.get_ref(i).map_err(crate::sql_error(doing))? {
                    ValueRef::Null => Val::Null,
                    ValueRef::Integer(v) => Val::Int(v),
                    ValueRef::Text(t) => Val::Text(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Real(f) => Val::Int(f as i64),
                    ValueRef::Blob(_) => {
                        return Err(Error::Backend(format!(
                            "could not {doing}: column {i} holds a blob"
                        )));
                    }
                });
            }
            out.push(Row(row));
        }
        Ok(out)
    }
}

// ---- PostgreSQL. ----

impl ToSql for Val {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Val::Null => Ok(IsNull::Yes),
            Val::Int(v) => match *ty {
                Type::INT4 => i32::try_from(*v)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*v)?.to_sql(ty, out),
                Type::BOOL => (*v != 0).to_sql(ty, out),
                _ => v.to_sql(ty, out),
            },
            Val::Text(s) => s.as_str().to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// A PostgreSQL client or transaction.
pub(crate) struct Pg<'a, C: postgres::GenericClient>(pub &'a mut C);

fn pg_params(params: &[Val]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|v| v as &(dyn ToSql + Sync)).collect()
}

impl<C: postgres::GenericClient> Db for Pg<'_, C> {
    fn execute(&mut self, doing: &str, sql: &str, params: &[Val]) -> Result<u64> {
        self.0
            .execute(sql, &pg_params(params))
            .map_err(crate::pg::pg_error(doing))
    }

    fn execute_checked(
        &mut self,
        doing: &str,
        sql: &str,
        params: &[Val],
    ) -> Result<std::result::Result<u64, Violation>> {
        use postgres::error::SqlState;
        match self.0.execute(sql, &pg_params(params)) {
            Ok(n) => Ok(Ok(n)),
            Err(e) if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) => {
                Ok(Err(Violation::ForeignKey))
            }
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => Ok(Err(Violation::Unique)),
            Err(e) => Err(crate::pg::pg_error(doing)(e)),
        }
    }

    fn query(&mut self, doing: &str, sql: &str, params: &[Val]) -> Result<Vec<Row>> {
        let rows = self
            .0
            .query(sql, &pg_params(params))
            .map_err(crate::pg::pg_error(doing))?;
        rows.iter()
            .map(|r| {
                let mut row = Vec::with_capacity(r.len());
                for (i, col) in r.columns().iter().enumerate() {
                    let get = |e: postgres::Error| {
                        Error::Backend(format!("could not {doing}: column {i}: {e}"))
                    };
                    row.push(match *col.type_() {
                        Type::INT8 => r.try_get::<_, Option<i64>>(i).map_err(get)?.into(),
                        Type::INT4 => r
                            .try_get::<_, Option<i32>>(i)
                            .map_err(get)?
                            .map(i64::from)
                            .into(),
                        Type::INT2 => r
                            .try_get::<_, Option<i16>>(i)
                            .map_err(get)?
                            .map(i64::from)
                            .into(),
                        Type::BOOL => r
                            .try_get::<_, Option<bool>>(i)
                            .map_err(get)?
                            .map(i64::from)
                            .into(),
                        _ => r.try_get::<_, Option<String>>(i).map_err(get)?.into(),
                    });
                }
                Ok(Row(row))
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(unreachable_pub, missing_docs, missing_debug_implementations)]
#[path = "../tests/support/pg.rs"]
mod test_pg;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_sqlite_numbered_parameters() {
        assert_eq!(lite_sql("a = $1 AND b = $12"), "a = ?1 AND b = ?12");
        assert!(matches!(lite_sql("SELECT 1"), Cow::Borrowed(_)));
    }

    #[test]
    fn broken_unique_and_foreign_keys_are_told_apart_from_other_failures() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "foreign_keys", true).unwrap();
        conn.execute_batch(
            "CREATE TABLE p (id TEXT PRIMARY KEY, u TEXT UNIQUE);
             CREATE TABLE c (p TEXT NOT NULL REFERENCES p (id) ON DELETE RESTRICT);",
        )
        .unwrap();
        let mut db = Lite(&conn);
        let run = |db: &mut Lite<'_>, sql: &str| db.execute_checked("test", sql, &[]);
        assert_eq!(
            run(&mut db, "INSERT INTO p VALUES ('a', 'x')").unwrap(),
            Ok(1)
        );
        for dup in [
            "INSERT INTO p VALUES ('a', 'y')",
            "INSERT INTO p VALUES ('b', 'x')",
        ] {
            assert_eq!(run(&mut db, dup).unwrap(), Err(Violation::Unique), "{dup}");
        }
        assert_eq!(
            run(&mut db, "INSERT INTO c VALUES ('absent')").unwrap(),
            Err(Violation::ForeignKey)
        );
        assert_eq!(run(&mut db, "INSERT INTO c VALUES ('a')").unwrap(), Ok(1));
        assert_eq!(
            run(&mut db, "DELETE FROM p WHERE id = 'a'").unwrap(),
            Err(Violation::ForeignKey)
        );
        let other = run(&mut db, "INSERT INTO p VALUES (NULL)").unwrap_err();
        assert_eq!(other.code(), "backend_error");
    }

    #[test]
    fn broken_unique_and_foreign_keys_are_told_apart_in_postgresql_too() {
        let Some(d) = super::test_pg::database() else {
            return;
        };
        let mut client = postgres::Client::connect(&d.url, postgres::NoTls).unwrap();
        client
            .batch_execute(
                "CREATE TABLE p (id TEXT PRIMARY KEY, u TEXT UNIQUE);
                 CREATE TABLE c (p TEXT NOT NULL REFERENCES p (id) ON DELETE RESTRICT);",
            )
            .unwrap();
        let mut db = Pg(&mut client);
        let mut run = |sql: &str| db.execute_checked("test", sql, &[]);
        assert_eq!(run("INSERT INTO p VALUES ('a', 'x')").unwrap(), Ok(1));
        assert_eq!(
            run("INSERT INTO p VALUES ('a', 'y')").unwrap(),
            Err(Violation::Unique)
        );
        assert_eq!(
            run("INSERT INTO p VALUES ('b', 'x')").unwrap(),
            Err(Violation::Unique)
        );
        assert_eq!(
            run("INSERT INTO c VALUES ('absent')").unwrap(),
            Err(Violation::ForeignKey)
        );
        assert_eq!(run("INSERT INTO c VALUES ('a')").unwrap(), Ok(1));
        assert_eq!(
            run("DELETE FROM p WHERE id = 'a'").unwrap(),
            Err(Violation::ForeignKey)
        );
        let other = run("INSERT INTO p VALUES (NULL)").unwrap_err();
        assert_eq!(other.code(), "backend_error");
    }
}
