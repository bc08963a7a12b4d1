//! The schema, as an ordered list of migrations keyed on `PRAGMA user_version`.
//!
//! Migration `i` (0-based) takes a database from version `i` to `i + 1`.
//! Entries are append-only: once released, a migration is never edited; a
//! change to the schema is a new entry at the end.

use rusqlite::{Connection, TransactionBehavior};

use crate::StoreError;

/// Every migration, in order. The database's `user_version` is the number of
/// entries applied so far.
pub(crate) const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8];

/// Version 1: sandboxes, API keys, events.
///
/// Tables are `STRICT` so a value of the wrong type is refused instead of
/// silently stored. JSON columns are checked with `json_valid`; hashes must be
/// 32 bytes (SHA-256). Times are unix milliseconds.
const V1: &str = r#"
CREATE TABLE api_keys (
    id          TEXT    PRIMARY KEY NOT NULL,
    name        TEXT    NOT NULL,
    -- SHA-256 of the secret; the secret itself is never stored.
    hash        BLOB    NOT NULL UNIQUE CHECK (length(hash) = 32),
    is_admin    INTEGER NOT NULL CHECK (is_admin IN (0, 1)),
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
) STRICT;

CREATE TABLE sandboxes (
    id                 TEXT    PRIMARY KEY NOT NULL,
    state              TEXT    NOT NULL
                       CHECK (state IN ('creating', 'running', 'paused', 'stopping', 'dead')),
    state_reason       TEXT,
    tier               TEXT    NOT NULL,
    template           TEXT    NOT NULL,
    spec_json          TEXT    NOT NULL CHECK (json_valid(spec_json)),
    metadata_json      TEXT    NOT NULL DEFAULT '{}'
                       CHECK (json_valid(metadata_json) AND json_type(metadata_json) = 'object'),
    owner_key_id       TEXT    NOT NULL REFERENCES api_keys (id) ON DELETE RESTRICT,
    -- SHA-256 of the sandbox's access token; the token itself is never stored.
    access_token_hash  BLOB    NOT NULL CHECK (length(access_token_hash) = 32),
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    expires_at         INTEGER NOT NULL,
    supervisor_pid     INTEGER CHECK (supervisor_pid IS NULL OR supervisor_pid > 0),
    -- What teardown must release (cgroup, slot, mounts, ...), recorded before
    -- any of it is created.
    resources_json     TEXT    CHECK (resources_json IS NULL OR json_valid(resources_json))
) STRICT;

CREATE INDEX sandboxes_by_state   ON sandboxes (state);
-- Only live sandboxes can expire; dead rows accumulate and stay out of it.
CREATE INDEX sandboxes_by_expiry  ON sandboxes (expires_at) WHERE state <> 'dead';
-- Keyset pagination order.
CREATE INDEX sandboxes_by_created ON sandboxes (created_at, id);
CREATE INDEX sandboxes_by_owner   ON sandboxes (owner_key_id, created_at, id);

CREATE TABLE events (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    -- No foreign key: the audit trail outlives the sandbox row.
    sandbox_id   TEXT,
    request_id   TEXT,
    stream       TEXT    NOT NULL CHECK (stream IN ('access', 'security', 'runtime')),
    kind         TEXT    NOT NULL,
    at           INTEGER NOT NULL,
    detail_json  TEXT    NOT NULL CHECK (json_valid(detail_json))
) STRICT;

CREATE INDEX events_by_sandbox ON events (sandbox_id, seq);
"#;

/// Version 2: templates, the layers they stack, and the layers each
/// sandbox uses.
///
/// A layer is named by its `diff_id` (the SHA-256 of its uncompressed tar),
/// so the same content arriving gzip- or zstd-compressed is one layer. A
/// layer is referenced while a template stacks it or a sandbox that is not
/// dead runs on it; the collector removes the others (rows and files).
const V2: &str = r#"
CREATE TABLE layers (
    diff_id      TEXT    PRIMARY KEY NOT NULL
                 CHECK (diff_id GLOB 'sha256:*' AND length(diff_id) = 71),
    -- Bytes of regular files and entries unpacked.
    bytes        INTEGER NOT NULL CHECK (bytes >= 0),
    entries      INTEGER NOT NULL CHECK (entries >= 0),
    created_at   INTEGER NOT NULL
) STRICT;

CREATE TABLE templates (
    name         TEXT    PRIMARY KEY NOT NULL,
    -- sha256:<hex> of the image configuration: what `NAME@sha256:...` pins.
    digest       TEXT    NOT NULL CHECK (digest GLOB 'sha256:*' AND length(digest) = 71),
    -- Where it came from (an archive, an image reference, a build).
    source       TEXT    NOT NULL,
    -- What a sandbox of it starts with (env, working directory, user,
    -- command): a JSON object.
    config_json  TEXT    NOT NULL CHECK (json_valid(config_json) AND json_type(config_json) = 'object'),
    created_at   INTEGER NOT NULL
) STRICT;

CREATE TABLE template_layers (
    template     TEXT    NOT NULL REFERENCES templates (name) ON DELETE CASCADE,
    -- 0 is the bottom of the stack.
    position     INTEGER NOT NULL CHECK (position >= 0),
    diff_id      TEXT    NOT NULL REFERENCES layers (diff_id) ON DELETE RESTRICT,
    PRIMARY KEY (template, position)
) STRICT;

CREATE INDEX template_layers_by_layer ON template_layers (diff_id);

CREATE TABLE sandbox_layers (
    sandbox_id   TEXT    NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    diff_id      TEXT    NOT NULL REFERENCES layers (diff_id) ON DELETE RESTRICT,
    PRIMARY KEY (sandbox_id, diff_id)
) STRICT;

CREATE INDEX sandbox_layers_by_layer ON sandbox_layers (diff_id);
"#;

/// Version 3: the build cache.
///
/// A template build's step (a RUN or a COPY) is cached under its key (see
/// `airlock_build::cache`): the layer it made, or none when it changed
/// nothing. A cached layer is referenced, as a template's is, until the
/// entry is evicted (unused for a while, or on request).
const V3: &str = r#"
CREATE TABLE build_steps (
    key          TEXT    PRIMARY KEY NOT NULL
                 CHECK (key GLOB 'sha256:*' AND length(key) = 71),
    -- NULL: the step changed no file.
    diff_id      TEXT    REFERENCES layers (diff_id) ON DELETE RESTRICT,
    created_at   INTEGER NOT NULL,
    used_at      INTEGER NOT NULL
) STRICT;

CREATE INDEX build_steps_by_layer ON build_steps (diff_id);
"#;

/// Version 4: no tier's internals in the sandboxes table. The process
/// tier's supervisor pid lives in its own `resources_json`, as every
/// tier's records do.
const V4: &str = r#"
ALTER TABLE sandboxes DROP COLUMN supervisor_pid;
"#;

/// Version 5: a template's own tier, the one its sandboxes run on when a
/// create names none (NULL: the daemon's default).
const V5: &str = r#"
ALTER TABLE templates ADD COLUMN tier TEXT CHECK (tier IS NULL OR length(tier) BETWEEN 1 AND 32);
"#;

/// Version 6: snapshots, a tenant's frozen sandbox filesystems. A
/// snapshot stacks layers like a template (its source's template layers
/// and the sandbox's changes on top) but belongs to the key that took it;
/// its layers are referenced like a template's.
const V6: &str = r#"
CREATE TABLE snapshots (
    id             TEXT    PRIMARY KEY NOT NULL CHECK (id GLOB 'snap-*'),
    -- Unique per owner; NULL for an unnamed snapshot.
    name           TEXT    CHECK (name IS NULL OR length(name) BETWEEN 1 AND 128),
    owner_key_id   TEXT    NOT NULL,
    -- The sandbox it was taken of (it may be gone since).
    sandbox_id     TEXT    NOT NULL,
    -- The template that sandbox was created from, as it was named.
    template       TEXT    NOT NULL,
    tier           TEXT    NOT NULL,
    -- How its sandboxes start (an image configuration).
    config_json    TEXT    NOT NULL CHECK (json_valid(config_json) AND json_type(config_json) = 'object'),
    -- The sandbox's changes: entries and bytes of regular files as
    -- unpacked, then the zstd-compressed tar's size, digest and level.
    entries        INTEGER NOT NULL CHECK (entries >= 0),
    bytes          INTEGER NOT NULL CHECK (bytes >= 0),
    tar_bytes      INTEGER NOT NULL CHECK (tar_bytes >= 0),
    archive_bytes  INTEGER NOT NULL CHECK (archive_bytes >= 0),
    archive_digest TEXT    CHECK (archive_digest IS NULL OR (archive_digest GLOB 'sha256:*' AND length(archive_digest) = 71)),
    zstd_level     INTEGER NOT NULL,
    took_ms        INTEGER NOT NULL CHECK (took_ms >= 0),
    created_at     INTEGER NOT NULL,
    UNIQUE (owner_key_id, name)
) STRICT;

CREATE INDEX snapshots_by_sandbox ON snapshots (sandbox_id);

CREATE TABLE snapshot_layers (
    snapshot     TEXT    NOT NULL REFERENCES snapshots (id) ON DELETE CASCADE,
    position     INTEGER NOT NULL CHECK (position >= 0),
    diff_id      TEXT    NOT NULL REFERENCES layers (diff_id) ON DELETE RESTRICT,
    PRIMARY KEY (snapshot, position)
) STRICT;

CREATE INDEX snapshot_layers_by_layer ON snapshot_layers (diff_id);
"#;

/// Version 7: warm pools, and the key their members belong to until a
/// create claims one. The key's hash is random bytes: no secret is ever
/// given out for it, so nobody signs in as it.
const V7: &str = r#"
CREATE TABLE pools (
    name        TEXT    PRIMARY KEY NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
    template    TEXT    NOT NULL CHECK (length(template) BETWEEN 1 AND 256),
    -- NULL: the template's tier.
    tier        TEXT    CHECK (tier IS NULL OR length(tier) BETWEEN 1 AND 32),
    -- Whether members have an egress path (for creates with network).
    networked   INTEGER NOT NULL CHECK (networked IN (0, 1)),
    min_ready   INTEGER NOT NULL CHECK (min_ready >= 0),
    max         INTEGER NOT NULL CHECK (max >= 1 AND max >= min_ready),
    refill      INTEGER NOT NULL CHECK (refill >= 1),
    updated_at  INTEGER NOT NULL
) STRICT;

INSERT INTO api_keys (id, name, hash, is_admin, created_at)
VALUES ('key-pool', 'warm pool members (internal)', randomblob(32), 0, 0);
"#;

/// Version 8: named volumes, a tenant's directories that outlive its
/// sandboxes. Which sandboxes mount one is in their specs (`volumes`).
const V8: &str = r#"
CREATE TABLE volumes (
    id            TEXT    PRIMARY KEY NOT NULL CHECK (id GLOB 'vol-*'),
    name          TEXT    NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    owner_key_id  TEXT    NOT NULL,
    quota_bytes   INTEGER NOT NULL CHECK (quota_bytes > 0),
    created_at    INTEGER NOT NULL,
    UNIQUE (owner_key_id, name)
) STRICT;
"#;

/// Brings the database up to `migrations.len()`, applying the missing
/// migrations and the version bump in one immediate transaction, so a crash
/// or a failing migration leaves the previous version intact and two
/// processes opening the same file at once do not both migrate.
pub(crate) fn migrate(conn: &mut Connection, migrations: &[&str]) -> Result<(), StoreError> {
    let supported = i64::try_from(migrations.len()).unwrap_or(i64::MAX);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
    let start = match usize::try_from(found) {
        Ok(start) if start <= migrations.len() => start,
        _ => return Err(StoreError::SchemaVersion { found, supported }),
    };
    if start == migrations.len() {
        return Ok(());
    }
    for sql in &migrations[start..] {
        tx.execute_batch(sql)?;
    }
    tx.pragma_update(None, "user_version", supported)?;
    tx.commit()?;
    Ok(())
}
