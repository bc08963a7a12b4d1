//! The daemon's durable state, in one SQLite file in WAL mode.
//!
//! What the store holds:
//! - **sandboxes**: id, state and why, tier, template, the full validated
//!   spec as JSON, user metadata, the owning API key, expiry, the supervisor
//!   pid and the resources teardown must release (recorded before they are
//!   created, so a crashed daemon can still release them);
//! - **API keys**: id, name, admin flag, creation and revocation times, and
//!   the SHA-256 hash of the secret;
//! - **templates and layers**: each template's name, image digest, source,
//!   start configuration and stack of layers (by `diff_id`), the layers
//!   unpacked in the layer store, and the layers each sandbox runs on, so
//!   the collector knows what nothing references;
//! - **snapshots**: a tenant's frozen sandbox filesystems, each a stack of
//!   layers (its source's template and the sandbox's changes) owned by the
//!   key that took it, with the sizes and time of taking it;
//! - **events**: the queryable copy of the audit trail (access, security and
//!   runtime streams), tied together by sandbox id and request id. Events
//!   have no foreign key, so a sandbox's trail outlives its row.
//!
//! What it never holds: a plaintext secret. API key secrets and sandbox
//! access tokens are shown to their owner once and only their SHA-256 is
//! written; a test reads the database files byte by byte to check that.
//!
//! [`Store`] is synchronous. It is `Send` but not `Sync` (it owns one
//! `rusqlite::Connection`): the daemon keeps it on a dedicated thread or
//! behind a mutex and calls it from `spawn_blocking`. Several `Store`s, in one
//! process or several, may open the same file at once: WAL lets readers run
//! beside the one writer, and writers wait for each other up to
//! [`BUSY_TIMEOUT`].
//!
//! The schema is versioned with `PRAGMA user_version` and migrated on open.
#![forbid(unsafe_code)]

mod builds;
mod error;
mod events;
mod keys;
mod pools;
mod sandboxes;
mod schema;
mod secret;
mod snapshots;
mod templates;
mod types;
mod volumes;

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags};

pub use builds::CachedStep;
pub use error::{Entity, StoreError};
pub use pools::{PoolRow, POOL_KEY_ID};
pub use secret::{
    hash_secret, is_key_secret, new_sandbox_id, new_secret, KEY_SECRET_PREFIX,
    LEGACY_KEY_SECRET_PREFIX,
};
pub use snapshots::{
    new_snapshot_id, NewSnapshot, SnapshotFilter, SnapshotQuota, SnapshotQuotaExceeded,
    SnapshotRow, SnapshotUsage,
};
pub use templates::{LayerRow, NewTemplate, TemplateRow};
pub use types::{
    EventRow, KeyRow, ListQuery, NewEvent, NewSandbox, Page, ParseEnumError, SandboxRow, State,
    Stream,
};
pub use volumes::{new_volume_id, VolumeRow};

/// How long a write waits for another connection's write to finish before
/// failing with `SQLITE_BUSY`.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The schema version a freshly opened store is at.
pub const SCHEMA_VERSION: i64 = schema::MIGRATIONS.len() as i64;

/// A handle on the state database. See the crate documentation for the
/// threading rules (`Send`, not `Sync`).
#[derive(Debug)]
pub struct Store {
    conn: Connection,
}

// The daemon moves the store into a worker thread; keep that possible.
const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<Store>();
};

impl Store {
    /// Opens (creating if needed, mode 0600) the database file at `path`,
    /// switches it to WAL and migrates it to [`SCHEMA_VERSION`]. The parent
    /// directory must exist.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        // Create the file ourselves so it is private from the first byte;
        // SQLite gives the -wal and -shm files the same mode.
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|source| StoreError::Open {
                path: path.to_owned(),
                source,
            })?;
        // No SQLITE_OPEN_URI: the path is a path, never a `file:` URI.
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        Store::setup(Connection::open_with_flags(path, flags)?, true)
    }

    /// Opens a private in-memory database (for tests): same schema, no WAL.
    pub fn open_in_memory() -> Result<Store, StoreError> {
        Store::setup(Connection::open_in_memory()?, false)
    }

    fn setup(mut conn: Connection, wal: bool) -> Result<Store, StoreError> {
        conn.busy_timeout(BUSY_TIMEOUT)?;
        if wal {
            let mode: String =
                conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(StoreError::NoWal { mode });
            }
        }
        // NORMAL in WAL mode: a commit is durable once the WAL is synced at
        // checkpoint; a power cut may lose the last transactions but never
        // corrupts the file.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        schema::migrate(&mut conn, schema::MIGRATIONS)?;
        Ok(Store { conn })
    }

    /// The schema version of the open database.
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        Ok(self
            .conn
            .pragma_query_value(None, "user_version", |row| row.get(0))?)
    }
}

/// Now, in unix milliseconds (0 if the clock is before 1970).
pub(crate) fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Checks a page size: `None` is `default`, otherwise 1..=[`ListQuery::MAX_LIMIT`].
/// Reads column `index` of `row`, stored as JSON text, into `T`.
pub(crate) fn json_column<T: serde::de::DeserializeOwned>(
    row: &rusqlite::Row<'_>,
    index: usize,
) -> rusqlite::Result<T> {
    let text: String = row.get(index)?;
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(index, rusqlite::types::Type::Text, Box::new(e))
    })
}

pub(crate) fn check_limit(limit: Option<u32>, default: u32) -> Result<u32, StoreError> {
    match limit {
        None => Ok(default),
        Some(n @ 1..=ListQuery::MAX_LIMIT) => Ok(n),
        Some(n) => Err(StoreError::InvalidLimit(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_database_is_at_the_latest_version() {
        let store = Store::open_in_memory().unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(SCHEMA_VERSION, schema::MIGRATIONS.len() as i64);
    }

    #[test]
    fn a_file_store_has_its_pragmas() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let text = |name: &str| -> String {
            store
                .conn
                .pragma_query_value(None, name, |r| r.get(0))
                .unwrap()
        };
        let int = |name: &str| -> i64 {
            store
                .conn
                .pragma_query_value(None, name, |r| r.get(0))
                .unwrap()
        };
        assert_eq!(text("journal_mode"), "wal");
        assert_eq!(int("synchronous"), 1, "NORMAL");
        assert_eq!(int("foreign_keys"), 1);
        assert_eq!(int("busy_timeout"), 5000);
        assert_eq!(int("user_version"), SCHEMA_VERSION);
    }

    #[test]
    fn migrating_again_is_a_no_op() {
        let mut store = Store::open_in_memory().unwrap();
        schema::migrate(&mut store.conn, schema::MIGRATIONS).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    }

    #[test]
    fn migrations_apply_in_order_and_resume() {
        let mut conn = Connection::open_in_memory().unwrap();
        let first = ["CREATE TABLE a (x INTEGER) STRICT;"];
        schema::migrate(&mut conn, &first).unwrap();
        let both = [first[0], "ALTER TABLE a ADD COLUMN y TEXT;"];
        schema::migrate(&mut conn, &both).unwrap();
        let v: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, 2);
        conn.execute("INSERT INTO a (x, y) VALUES (1, 'one')", [])
            .unwrap();
    }

    #[test]
    fn a_failing_migration_rolls_back_all_of_its_batch() {
        let mut conn = Connection::open_in_memory().unwrap();
        let broken = ["CREATE TABLE a (x INTEGER);", "THIS IS NOT SQL;"];
        assert!(matches!(
            schema::migrate(&mut conn, &broken),
            Err(StoreError::Sqlite(_))
        ));
        let v: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, 0);
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name = 'a'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(
            tables, 0,
            "the first migration of the batch was rolled back"
        );
    }

    #[test]
    fn a_newer_or_foreign_schema_is_refused() {
        for found in [SCHEMA_VERSION + 1, -1] {
            let mut conn = Connection::open_in_memory().unwrap();
            conn.pragma_update(None, "user_version", found).unwrap();
            match schema::migrate(&mut conn, schema::MIGRATIONS) {
                Err(StoreError::SchemaVersion {
                    found: f,
                    supported,
                }) => {
                    assert_eq!(f, found);
                    assert_eq!(supported, SCHEMA_VERSION);
                }
                other => panic!("expected SchemaVersion, got {other:?}"),
            }
        }
    }

    #[test]
    fn limits() {
        assert_eq!(check_limit(None, 100).unwrap(), 100);
        assert_eq!(check_limit(Some(1), 100).unwrap(), 1);
        assert_eq!(check_limit(Some(1000), 100).unwrap(), 1000);
        assert!(matches!(
            check_limit(Some(0), 100),
            Err(StoreError::InvalidLimit(0))
        ));
        assert!(matches!(
            check_limit(Some(1001), 100),
            Err(StoreError::InvalidLimit(1001))
        ));
    }
}
