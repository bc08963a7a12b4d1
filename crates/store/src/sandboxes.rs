//! The `sandboxes` table.

use std::collections::BTreeMap;

use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, ErrorCode, OptionalExtension, Row};

use crate::secret::{hash_secret, hashes_match, hex, unhex};
use crate::{
    check_limit, json_column, now_millis, Entity, ListQuery, NewSandbox, Page, SandboxRow, State,
    Store, StoreError,
};

/// The columns of a [`SandboxRow`], in the order [`sandbox_from_row`] reads.
const COLUMNS: &str = "id, state, state_reason, tier, template, spec_json, metadata_json, \
     owner_key_id, created_at, updated_at, expires_at, resources_json";

fn sandbox_from_row(row: &Row<'_>) -> rusqlite::Result<SandboxRow> {
    let metadata: BTreeMap<String, String> = json_column(row, 6)?;
    Ok(SandboxRow {
        id: row.get(0)?,
        state: row.get(1)?,
        state_reason: row.get(2)?,
        tier: row.get(3)?,
        template: row.get(4)?,
        spec_json: row.get(5)?,
        metadata,
        owner_key_id: row.get(7)?,
        created_at: row.get(8)?,
        updated_at: row.get(9)?,
        expires_at: row.get(10)?,
        resources_json: row.get(11)?,
    })
}

/// Fails unless `text` is JSON (and, with `object`, a JSON object).
fn check_json(field: &'static str, text: &str, object: bool) -> Result<(), StoreError> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) if !object || v.is_object() => Ok(()),
        _ => Err(StoreError::InvalidJson {
            field,
            expected: if object { "a JSON object" } else { "JSON" },
        }),
    }
}

/// Encodes the position after `row` in the (created_at, id) order.
///
/// The cursor is not authenticated and need not be: a forged one only moves
/// the start of the page, and every filter of the query still applies.
fn encode_cursor(created_at: i64, id: &str) -> String {
    let mut bytes = created_at.to_be_bytes().to_vec();
    bytes.extend_from_slice(id.as_bytes());
    hex(&bytes)
}

fn decode_cursor(cursor: &str) -> Result<(i64, String), StoreError> {
    let bytes = unhex(cursor).ok_or(StoreError::InvalidCursor)?;
    if bytes.len() <= 8 {
        return Err(StoreError::InvalidCursor);
    }
    let (time, id) = bytes.split_at(8);
    let time: [u8; 8] = time.try_into().map_err(|_| StoreError::InvalidCursor)?;
    let id = String::from_utf8(id.to_vec()).map_err(|_| StoreError::InvalidCursor)?;
    Ok((i64::from_be_bytes(time), id))
}

/// Whether `err` is a constraint failure with this extended code.
fn is_constraint(err: &rusqlite::Error, extended: std::os::raw::c_int) -> bool {
    matches!(err, rusqlite::Error::SqliteFailure(e, _)
        if e.code == ErrorCode::ConstraintViolation && e.extended_code == extended)
}

impl Store {
    /// Records a new sandbox in [`State::Creating`].
    ///
    /// Fails with [`StoreError::AlreadyExists`] if the id is taken and with
    /// [`StoreError::UnknownOwner`] if the owner key is not in the store.
    pub fn insert_sandbox(&self, new: &NewSandbox) -> Result<(), StoreError> {
        check_json("spec_json", &new.spec_json, true)?;
        if let Some(resources) = &new.resources_json {
            check_json("resources_json", resources, false)?;
        }
        let metadata = serde_json::Value::Object(
            new.metadata
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect(),
        )
        .to_string();
        let tx = self.conn.unchecked_transaction()?;
        let inserted = self
            .conn
            .prepare_cached(
                "INSERT INTO sandboxes (id, state, tier, template, spec_json, metadata_json, \
                 owner_key_id, access_token_hash, created_at, updated_at, expires_at, \
                 resources_json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10, ?11)",
            )?
            .execute(params![
                new.id,
                State::Creating,
                new.tier,
                new.template,
                new.spec_json,
                metadata,
                new.owner_key_id,
                new.access_token_hash.as_slice(),
                new.created_at,
                new.expires_at,
                new.resources_json,
            ]);
        match inserted {
            Ok(_) => {
                self.insert_sandbox_layers(&new.id, &new.layers)?;
                tx.commit()?;
                Ok(())
            }
            Err(e) if is_constraint(&e, rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY) => {
                Err(StoreError::AlreadyExists {
                    kind: Entity::Sandbox,
                    id: new.id.clone(),
                })
            }
            Err(e) if is_constraint(&e, rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY) => {
                Err(StoreError::UnknownOwner(new.owner_key_id.clone()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The sandbox with this id, if recorded.
    pub fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRow>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM sandboxes WHERE id = ?1"))?
            .query_row([id], sandbox_from_row)
            .optional()?)
    }

    /// Moves a sandbox to `to`, recording `reason` (`None` clears it).
    ///
    /// With `from`, this is a compare-and-set: nothing changes and the result
    /// is `false` unless the sandbox is currently in `from`. Without it the
    /// change is unconditional. Which transitions are legal is the caller's
    /// rule; use `from` to make a transition race-free (for example, so a
    /// reaper that saw `running` cannot overwrite a concurrent `dead`).
    /// Fails with [`StoreError::NotFound`] if there is no such sandbox.
    pub fn set_state(
        &self,
        id: &str,
        from: Option<State>,
        to: State,
        reason: Option<&str>,
    ) -> Result<bool, StoreError> {
        let changed = self
            .conn
            .prepare_cached(
                "UPDATE sandboxes SET state = ?2, state_reason = ?3, updated_at = ?4 \
                 WHERE id = ?1 AND (?5 IS NULL OR state = ?5)",
            )?
            .execute(params![id, to, reason, now_millis(), from])?;
        if changed > 0 {
            return Ok(true);
        }
        if self.sandbox_exists(id)? {
            Ok(false)
        } else {
            Err(not_found(id))
        }
    }

    /// Sets when the sandbox expires (unix milliseconds).
    pub fn set_expiry(&self, id: &str, expires_at: i64) -> Result<(), StoreError> {
        self.update_one(
            id,
            "UPDATE sandboxes SET expires_at = ?2, updated_at = ?3 WHERE id = ?1",
            Value::Integer(expires_at),
        )
    }

    /// Replaces the spec a sandbox is recorded with (a live change, such as
    /// a new network policy, that a re-adopting daemon must see).
    pub fn set_spec(&self, id: &str, spec_json: &str) -> Result<(), StoreError> {
        check_json("spec_json", spec_json, true)?;
        self.update_one(
            id,
            "UPDATE sandboxes SET spec_json = ?2, updated_at = ?3 WHERE id = ?1",
            Value::Text(spec_json.to_owned()),
        )
    }

    /// Hands warm pool member `id` (being created, owned by
    /// [`crate::POOL_KEY_ID`]) to the create that claimed it: its owner,
    /// template name, spec, metadata, access token and times become the
    /// claim's. `NotFound` unless it is such a member.
    pub fn claim_sandbox(&self, claim: &NewSandbox) -> Result<(), StoreError> {
        check_json("spec_json", &claim.spec_json, true)?;
        let metadata =
            serde_json::to_string(&claim.metadata).map_err(|_| StoreError::InvalidJson {
                field: "metadata_json",
                expected: "a JSON object",
            })?;
        let changed = self
            .conn
            .prepare_cached(
                "UPDATE sandboxes SET owner_key_id = ?2, template = ?3, spec_json = ?4, \
                 metadata_json = ?5, access_token_hash = ?6, created_at = ?7, updated_at = ?7, \
                 expires_at = ?8 \
                 WHERE id = ?1 AND owner_key_id = ?9 AND state = 'creating'",
            )?
            .execute(params![
                claim.id,
                claim.owner_key_id,
                claim.template,
                claim.spec_json,
                metadata,
                claim.access_token_hash.as_slice(),
                claim.created_at,
                claim.expires_at,
                crate::POOL_KEY_ID,
            ])
            .map_err(|e| match e {
                rusqlite::Error::SqliteFailure(f, _)
                    if f.code == rusqlite::ErrorCode::ConstraintViolation =>
                {
                    StoreError::UnknownOwner(claim.owner_key_id.clone())
                }
                other => other.into(),
            })?;
        if changed == 0 {
            return Err(StoreError::NotFound {
                kind: Entity::Sandbox,
                id: claim.id.clone(),
            });
        }
        Ok(())
    }

    /// Records (or with `None` clears) what teardown must release, as JSON.
    /// Call this before creating the resources it names.
    pub fn set_resources(&self, id: &str, json: Option<&str>) -> Result<(), StoreError> {
        if let Some(json) = json {
            check_json("resources_json", json, false)?;
        }
        self.update_one(
            id,
            "UPDATE sandboxes SET resources_json = ?2, updated_at = ?3 WHERE id = ?1",
            json.map_or(Value::Null, |j| Value::Text(j.to_owned())),
        )
    }

    /// Runs an `UPDATE` of one row taking (id, value, now); `NotFound` if no
    /// row has the id.
    fn update_one(&self, id: &str, sql: &str, value: Value) -> Result<(), StoreError> {
        let changed = self
            .conn
            .prepare_cached(sql)?
            .execute(params![id, value, now_millis()])?;
        if changed == 0 {
            return Err(not_found(id));
        }
        Ok(())
    }

    /// Records a sandbox running or paused (`from`) as paused keeping only
    /// its files, in one transaction: it runs on `spec_json` now (its
    /// template with its frozen changes on top), references `layers` too,
    /// and holds nothing on the host (its resources are cleared, so a
    /// restarted daemon leaves it paused rather than adopting it). `false`
    /// when it was no longer in `from`; nothing changed then.
    pub fn pause_files_only(
        &self,
        id: &str,
        from: State,
        spec_json: &str,
        layers: &[String],
    ) -> Result<bool, StoreError> {
        check_json("spec_json", spec_json, true)?;
        let tx = self.conn.unchecked_transaction()?;
        let changed = self
            .conn
            .prepare_cached(
                "UPDATE sandboxes SET state = ?2, state_reason = NULL, spec_json = ?3, \
                 resources_json = NULL, updated_at = ?4 WHERE id = ?1 AND state = ?5",
            )?
            .execute(params![id, State::Paused, spec_json, now_millis(), from])?;
        if changed == 0 {
            return if self.sandbox_exists(id)? {
                Ok(false)
            } else {
                Err(not_found(id))
            };
        }
        self.insert_sandbox_layers(id, layers)?;
        tx.commit()?;
        Ok(true)
    }

    /// How many sandboxes of `owner_key_id` are paused keeping only their
    /// files.
    pub fn count_files_only_paused(&self, owner_key_id: &str) -> Result<u64, StoreError> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT COUNT(*) FROM sandboxes WHERE owner_key_id = ?1 AND state = 'paused' \
                 AND resources_json IS NULL",
            )?
            .query_row([owner_key_id], |row| row.get(0))?)
    }

    fn sandbox_exists(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn
            .prepare_cached("SELECT 1 FROM sandboxes WHERE id = ?1")?
            .exists([id])?)
    }

    /// One page of sandboxes matching `query`, oldest first.
    ///
    /// Pagination is keyset on (created_at, id), so rows created or deleted
    /// between pages neither repeat nor shift others out of the listing.
    pub fn list_sandboxes(&self, query: &ListQuery) -> Result<Page<SandboxRow>, StoreError> {
        let limit = check_limit(query.limit, ListQuery::DEFAULT_LIMIT)?;
        let after = query.cursor.as_deref().map(decode_cursor).transpose()?;
        if query.states.as_ref().is_some_and(|s| s.is_empty()) {
            return Ok(Page {
                items: Vec::new(),
                next_cursor: None,
            });
        }

        let mut sql = format!("SELECT {COLUMNS} FROM sandboxes WHERE 1");
        let mut args: Vec<Value> = Vec::new();
        if let Some(states) = &query.states {
            let marks = vec!["?"; states.len()].join(", ");
            sql.push_str(&format!(" AND state IN ({marks})"));
            args.extend(states.iter().map(|s| Value::Text(s.as_str().to_owned())));
        }
        if let Some(owner) = &query.owner_key_id {
            sql.push_str(" AND owner_key_id = ?");
            args.push(Value::Text(owner.clone()));
        }
        if let Some(owner) = &query.except_owner_key_id {
            sql.push_str(" AND owner_key_id != ?");
            args.push(Value::Text(owner.clone()));
        }
        // json_each rather than json_extract: keys are matched as data, so a
        // key with dots, quotes or brackets cannot be read as a JSON path.
        for (key, value) in &query.metadata {
            sql.push_str(
                " AND EXISTS (SELECT 1 FROM json_each(sandboxes.metadata_json) AS m \
                 WHERE m.key = ? AND m.type = 'text' AND m.value = ?)",
            );
            args.push(Value::Text(key.clone()));
            args.push(Value::Text(value.clone()));
        }
        if let Some((created_at, id)) = after {
            sql.push_str(" AND (created_at, id) > (?, ?)");
            args.push(Value::Integer(created_at));
            args.push(Value::Text(id));
        }
        // One row more than asked tells whether there is a next page.
        sql.push_str(" ORDER BY created_at, id LIMIT ?");
        args.push(Value::Integer(i64::from(limit) + 1));

        let mut items = self
            .conn
            .prepare(&sql)?
            .query_map(params_from_iter(args), sandbox_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let next_cursor = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(|r| encode_cursor(r.created_at, &r.id))
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }

    /// Ids of sandboxes that are not dead and whose expiry is at or before
    /// `now` (unix milliseconds), soonest-expired first.
    pub fn expired(&self, now: i64) -> Result<Vec<String>, StoreError> {
        // `state <> 'dead'` matches the partial index's condition exactly, so
        // SQLite can use sandboxes_by_expiry.
        Ok(self
            .conn
            .prepare_cached(
                "SELECT id FROM sandboxes WHERE state <> 'dead' AND expires_at <= ?1 \
                 ORDER BY expires_at, id",
            )?
            .query_map([now], |row| row.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?)
    }

    /// Every sandbox that is not dead, oldest first: what the daemon must
    /// adopt or reap when it starts.
    pub fn live_sandboxes(&self) -> Result<Vec<SandboxRow>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM sandboxes WHERE state <> 'dead' ORDER BY created_at, id"
            ))?
            .query_map([], sandbox_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Removes a sandbox's row. Its events stay.
    pub fn delete_sandbox(&self, id: &str) -> Result<(), StoreError> {
        let changed = self
            .conn
            .prepare_cached("DELETE FROM sandboxes WHERE id = ?1")?
            .execute([id])?;
        if changed == 0 {
            return Err(not_found(id));
        }
        Ok(())
    }

    /// The live (not dead) sandbox whose access token is `token`, found by
    /// the token's SHA-256. For clients that name a sandbox only by its
    /// token (some e2b SDK versions after `connect`).
    pub fn live_sandbox_with_token(&self, token: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT id FROM sandboxes WHERE access_token_hash = ?1 AND state <> 'dead' LIMIT 1",
            )?
            .query_row([hash_secret(token).as_slice()], |row| row.get(0))
            .optional()?)
    }

    /// Whether `token` is the access token of sandbox `id`, compared in
    /// constant time on its SHA-256. Says nothing about the sandbox's state.
    pub fn verify_access_token(&self, id: &str, token: &str) -> Result<bool, StoreError> {
        let stored: Option<Vec<u8>> = self
            .conn
            .prepare_cached("SELECT access_token_hash FROM sandboxes WHERE id = ?1")?
            .query_row([id], |row| row.get(0))
            .optional()?;
        match stored {
            Some(stored) => Ok(hashes_match(&stored, &hash_secret(token))),
            None => Err(not_found(id)),
        }
    }
}

fn not_found(id: &str) -> StoreError {
    StoreError::NotFound {
        kind: Entity::Sandbox,
        id: id.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips() {
        for (t, id) in [
            (0, "sbx-0"),
            (-5, "x"),
            (i64::MAX, "sbx-ü"),
            (1_700_000_000_000, "a"),
        ] {
            assert_eq!(
                decode_cursor(&encode_cursor(t, id)).unwrap(),
                (t, id.to_owned())
            );
        }
    }

    #[test]
    fn malformed_cursors_are_refused() {
        let good = encode_cursor(5, "sbx-1");
        let bad = [
            String::new(),
            "zz".to_owned(),
            "abc".to_owned(),
            // Time only, no id.
            hex(&5i64.to_be_bytes()),
            // Not UTF-8 after the time.
            format!("{}ff", hex(&5i64.to_be_bytes())),
            good[..good.len() - 1].to_owned(),
            format!("{good}!"),
            "🙂".repeat(20),
        ];
        for cursor in bad {
            assert!(
                matches!(decode_cursor(&cursor), Err(StoreError::InvalidCursor)),
                "{cursor:?}"
            );
        }
    }
}
