//! The one error type of the store.

use std::fmt;
use std::path::PathBuf;

/// What kind of record an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entity {
    /// A row of `sandboxes`.
    Sandbox,
    /// A row of `api_keys`.
    ApiKey,
    /// A row of `templates`.
    Template,
    /// A row of `layers`.
    Layer,
    /// A row of `snapshots`.
    Snapshot,
    /// A row of `pools`.
    Pool,
    /// A row of `volumes`.
    Volume,
}

impl fmt::Display for Entity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Entity::Sandbox => "sandbox",
            Entity::ApiKey => "API key",
            Entity::Template => "template",
            Entity::Layer => "layer",
            Entity::Snapshot => "snapshot",
            Entity::Pool => "pool",
            Entity::Volume => "volume",
        })
    }
}

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database file could not be created or opened.
    #[error("cannot open the state database {path}")]
    Open {
        /// The file that was being opened.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The database refused WAL mode (e.g. a file system without shared
    /// memory support).
    #[error("the state database cannot use WAL journaling (it reports journal mode {mode:?})")]
    NoWal {
        /// The journal mode SQLite kept.
        mode: String,
    },
    /// The file's schema version is not one this build knows how to migrate
    /// from: written by a newer airlock, or not an airlock database.
    #[error("the state database has schema version {found}, but this build understands versions 0 to {supported}")]
    SchemaVersion {
        /// `PRAGMA user_version` of the file.
        found: i64,
        /// The newest version this build has migrations for.
        supported: i64,
    },
    /// A record with this id does not exist.
    #[error("{kind} {id} does not exist")]
    NotFound {
        /// The table.
        kind: Entity,
        /// The id looked up.
        id: String,
    },
    /// A record with this id already exists.
    #[error("{kind} {id} already exists")]
    AlreadyExists {
        /// The table.
        kind: Entity,
        /// The id that collided.
        id: String,
    },
    /// The record is still used by a sandbox that is not dead.
    #[error("{kind} {id} is mounted by sandbox {user}")]
    InUse {
        /// The table.
        kind: Entity,
        /// The record.
        id: String,
        /// One sandbox that uses it.
        user: String,
    },
    /// A new sandbox names an owner key that is not in the store.
    #[error("the owner API key {0} does not exist")]
    UnknownOwner(String),
    /// A new snapshot would take its owner past its quota.
    #[error("{0}")]
    SnapshotQuota(crate::SnapshotQuotaExceeded),
    /// A new volume would take its owner past the most volumes a key may
    /// keep.
    #[error("a key may keep at most {0} volumes; delete one first")]
    VolumeQuota(u64),
    /// A pagination cursor was not one this store handed out.
    #[error("the pagination cursor is malformed")]
    InvalidCursor,
    /// A page size outside 1..=1000.
    #[error("the page limit {0} is outside 1 to 1000")]
    InvalidLimit(u32),
    /// A JSON text column was given text that is not JSON, or not the JSON
    /// shape the column holds.
    #[error("{field} is not {expected}")]
    InvalidJson {
        /// The column.
        field: &'static str,
        /// What it must be, e.g. "a JSON object".
        expected: &'static str,
    },
    /// The kernel did not hand out random bytes.
    #[error("cannot read random bytes from the kernel")]
    Random(#[source] std::io::Error),
    /// SQLite reported an error (busy past the timeout, I/O, corruption, a
    /// stored value this build cannot read, ...).
    #[error("the state database failed")]
    Sqlite(#[from] rusqlite::Error),
}

impl StoreError {
    /// Whether the database is unavailable rather than wrong: busy or
    /// locked past the busy timeout, or the disk under it failing (I/O
    /// error, full, cannot open, out of memory). Trying again later may
    /// work, so the API answers 503; every other failure is an internal
    /// error.
    pub fn is_unavailable(&self) -> bool {
        use rusqlite::ErrorCode;
        match self {
            StoreError::Open { .. } => true,
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => matches!(
                e.code,
                ErrorCode::DatabaseBusy
                    | ErrorCode::DatabaseLocked
                    | ErrorCode::SystemIoFailure
                    | ErrorCode::DiskFull
                    | ErrorCode::CannotOpen
                    | ErrorCode::OutOfMemory
                    | ErrorCode::FileLockingProtocolFailed
            ),
            _ => false,
        }
    }
}
