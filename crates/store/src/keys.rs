//! The `api_keys` table.

use rusqlite::{params, ErrorCode, OptionalExtension, Row};

use crate::secret::{hash_secret, hashes_match, new_secret, random_id};
use crate::{now_millis, Entity, KeyRow, Store, StoreError, KEY_SECRET_PREFIX};

const COLUMNS: &str = "id, name, created_at, revoked_at, is_admin";

fn key_from_row(row: &Row<'_>) -> rusqlite::Result<KeyRow> {
    Ok(KeyRow {
        id: row.get(0)?,
        name: row.get(1)?,
        created_at: row.get(2)?,
        revoked_at: row.get(3)?,
        is_admin: row.get(4)?,
    })
}

impl Store {
    /// Creates an API key. Returns its record and its secret: `e2b_` and 64
    /// lowercase hex digits (256 random bits). The secret is not stored anywhere (only
    /// its SHA-256 is), so this is the one time it can be shown.
    pub fn create_key(&self, name: &str, is_admin: bool) -> Result<(KeyRow, String), StoreError> {
        let secret = new_secret(KEY_SECRET_PREFIX)?;
        let hash = hash_secret(&secret);
        let created_at = now_millis();
        // Ids have 48 random bits; a collision is unlikely but harmless:
        // draw again.
        let mut attempts = 0;
        loop {
            let id = random_id("key-", 6)?;
            let inserted = self
                .conn
                .prepare_cached(
                    "INSERT INTO api_keys (id, name, hash, is_admin, created_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![id, name, hash.as_slice(), is_admin, created_at]);
            match inserted {
                Ok(_) => {
                    let row = KeyRow {
                        id,
                        name: name.to_owned(),
                        created_at,
                        revoked_at: None,
                        is_admin,
                    };
                    return Ok((row, secret));
                }
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == ErrorCode::ConstraintViolation
                        && e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                        && attempts < 3 =>
                {
                    attempts += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The key whose secret is `secret`, unless it is unknown or revoked.
    pub fn verify_key(&self, secret: &str) -> Result<Option<KeyRow>, StoreError> {
        // Hash first, then look the hash up. The lookup is an ordinary
        // B-tree search whose timing (it compares bytes and stops at the
        // first difference) depends on SHA-256 of the *presented* secret.
        // That leaks at most how long a prefix of the presented hash matches
        // some stored hash, which is useless to an attacker: steering guesses
        // towards a longer matching prefix means finding SHA-256 preimages,
        // and even a whole stored hash would not help, because the secret
        // behind it is 256 random bits. (Looking up by the plaintext, or
        // comparing plaintexts with `==`, would instead leak the secret
        // itself byte by byte.) The final equality check is done again in
        // constant time on the row found, so the decision never rests on an
        // early-exit comparison even if the lookup changes (say, to a lookup
        // by key id with the hash compared here).
        let presented = hash_secret(secret);
        let found = self
            .conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS}, hash FROM api_keys WHERE hash = ?1"
            ))?
            .query_row([presented.as_slice()], |row| {
                Ok((key_from_row(row)?, row.get::<_, Vec<u8>>(5)?))
            })
            .optional()?;
        Ok(found.and_then(|(key, stored)| {
            (hashes_match(&stored, &presented) && key.revoked_at.is_none()).then_some(key)
        }))
    }

    /// The key with this id, revoked or not.
    pub fn get_key(&self, id: &str) -> Result<Option<KeyRow>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM api_keys WHERE id = ?1"))?
            .query_row([id], key_from_row)
            .optional()?)
    }

    /// Every key, revoked ones included, oldest first (not the warm pools'
    /// own, [`crate::POOL_KEY_ID`]).
    pub fn list_keys(&self) -> Result<Vec<KeyRow>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM api_keys WHERE id != '{}' ORDER BY created_at, id",
                crate::POOL_KEY_ID
            ))?
            .query_map([], key_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Revokes a key from now on. Revoking a revoked key is a no-op that
    /// keeps the first revocation time; an unknown id is
    /// [`StoreError::NotFound`].
    pub fn revoke_key(&self, id: &str) -> Result<(), StoreError> {
        let changed = self
            .conn
            .prepare_cached(
                "UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?2) WHERE id = ?1",
            )?
            .execute(params![id, now_millis()])?;
        if changed == 0 {
            return Err(StoreError::NotFound {
                kind: Entity::ApiKey,
                id: id.to_owned(),
            });
        }
        Ok(())
    }

    /// How many keys exist, revoked ones included, the warm pools' own not
    /// (so "no keys yet", the
    /// daemon's cue to create the first admin key, is `0`).
    pub fn count_keys(&self) -> Result<u64, StoreError> {
        Ok(self
            .conn
            .prepare_cached("SELECT count(*) FROM api_keys WHERE id != ?1")?
            .query_row([crate::POOL_KEY_ID], |row| row.get(0))?)
    }
}
