//! The `volumes` table: named volumes, directories of the disk store that
//! outlive sandboxes, each owned by the key that made it. Which sandboxes
//! mount a volume is read from their specs, so a volume in use cannot be
//! deleted.

use rusqlite::{params, ErrorCode, OptionalExtension, Row};

use crate::{now_millis, Entity, Store, StoreError};

/// One volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRow {
    /// `vol-` and 16 hex digits.
    pub id: String,
    /// Unique among its owner's volumes.
    pub name: String,
    /// The key that made it; only it (and admins) see and use it.
    pub owner_key_id: String,
    /// Most bytes it may hold.
    pub quota_bytes: u64,
    /// Unix milliseconds.
    pub created_at: i64,
}

const COLUMNS: &str = "id, name, owner_key_id, quota_bytes, created_at";

fn from_row(row: &Row<'_>) -> rusqlite::Result<VolumeRow> {
    Ok(VolumeRow {
        id: row.get(0)?,
        name: row.get(1)?,
        owner_key_id: row.get(2)?,
        quota_bytes: u64::try_from(row.get::<_, i64>(3)?).unwrap_or(0),
        created_at: row.get(4)?,
    })
}

/// A fresh volume id: `vol-` and 16 random hex digits.
pub fn new_volume_id() -> Result<String, StoreError> {
    crate::secret::random_id("vol-", 8)
}

impl Store {
    /// Records a volume (`created_at` is now), unless its owner has one of
    /// that name already ([`StoreError::AlreadyExists`], naming the name)
    /// or has `max_per_owner` of them ([`StoreError::VolumeQuota`]).
    pub fn insert_volume(
        &self,
        volume: &VolumeRow,
        max_per_owner: u64,
    ) -> Result<VolumeRow, StoreError> {
        let tx = self.conn.unchecked_transaction()?;
        let held: i64 = self
            .conn
            .prepare_cached("SELECT count(*) FROM volumes WHERE owner_key_id = ?1")?
            .query_row([&volume.owner_key_id], |row| row.get(0))?;
        if u64::try_from(held).unwrap_or(0) >= max_per_owner {
            return Err(StoreError::VolumeQuota(max_per_owner));
        }
        let mut row = volume.clone();
        row.created_at = now_millis();
        let inserted = self
            .conn
            .prepare_cached(&format!(
                "INSERT INTO volumes ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5)"
            ))?
            .execute(params![
                row.id,
                row.name,
                row.owner_key_id,
                i64::try_from(row.quota_bytes).unwrap_or(i64::MAX),
                row.created_at,
            ]);
        match inserted {
            Ok(_) => {
                tx.commit()?;
                Ok(row)
            }
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == ErrorCode::ConstraintViolation =>
            {
                Err(StoreError::AlreadyExists {
                    kind: Entity::Volume,
                    id: volume.name.clone(),
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Volume `id`, if there is one.
    pub fn get_volume(&self, id: &str) -> Result<Option<VolumeRow>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM volumes WHERE id = ?1"))?
            .query_row([id], from_row)
            .optional()?)
    }

    /// The volume `owner` named `name`, if there is one.
    pub fn volume_by_name(&self, owner: &str, name: &str) -> Result<Option<VolumeRow>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM volumes WHERE owner_key_id = ?1 AND name = ?2"
            ))?
            .query_row([owner, name], from_row)
            .optional()?)
    }

    /// The volumes of `owner` (every volume with `None`), oldest first.
    pub fn list_volumes(&self, owner: Option<&str>) -> Result<Vec<VolumeRow>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM volumes WHERE ?1 IS NULL OR owner_key_id = ?1 \
                 ORDER BY created_at, id"
            ))?
            .query_map([owner], from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// A sandbox that is not dead and mounts volume `id`, if one does,
    /// with its state; one that is not stopping first.
    pub fn volume_user(&self, id: &str) -> Result<Option<(String, crate::State)>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT s.id, s.state FROM sandboxes s, json_each(s.spec_json, '$.volumes') v \
                 WHERE s.state <> 'dead' AND json_extract(v.value, '$.volume') = ?1 \
                 ORDER BY s.state = 'stopping', s.created_at LIMIT 1",
            )?
            .query_row([id], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?)
    }

    /// Removes volume `id`'s record, unless a sandbox that is not dead
    /// mounts it ([`StoreError::InUse`]); [`StoreError::NotFound`] if there
    /// is none. The caller removes its files after.
    pub fn delete_volume(&self, id: &str) -> Result<(), StoreError> {
        let tx = self.conn.unchecked_transaction()?;
        if let Some((user, _)) = self.volume_user(id)? {
            return Err(StoreError::InUse {
                kind: Entity::Volume,
                id: id.to_owned(),
                user,
            });
        }
        let changed = self
            .conn
            .prepare_cached("DELETE FROM volumes WHERE id = ?1")?
            .execute([id])?;
        if changed == 0 {
            return Err(StoreError::NotFound {
                kind: Entity::Volume,
                id: id.to_owned(),
            });
        }
        tx.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::NewSandbox;

    fn volume(id: &str, name: &str, owner: &str) -> VolumeRow {
        VolumeRow {
            id: id.into(),
            name: name.into(),
            owner_key_id: owner.into(),
            quota_bytes: 1 << 20,
            created_at: 0,
        }
    }

    #[test]
    fn names_are_per_owner_counts_are_capped_and_a_mounted_volume_stays() {
        let store = Store::open_in_memory().unwrap();
        let (key, _) = store.create_key("a", false).unwrap();
        let (other, _) = store.create_key("b", false).unwrap();
        let made = store
            .insert_volume(&volume("vol-1", "data", &key.id), 2)
            .unwrap();
        assert!(made.created_at > 0);
        assert!(matches!(
            store.insert_volume(&volume("vol-2", "data", &key.id), 2),
            Err(StoreError::AlreadyExists { .. })
        ));
        store
            .insert_volume(&volume("vol-3", "data", &other.id), 2)
            .unwrap();
        store
            .insert_volume(&volume("vol-4", "more", &key.id), 2)
            .unwrap();
        assert!(matches!(
            store.insert_volume(&volume("vol-5", "third", &key.id), 2),
            Err(StoreError::VolumeQuota(2))
        ));
        assert_eq!(store.list_volumes(Some(&key.id)).unwrap().len(), 2);
        assert_eq!(store.list_volumes(None).unwrap().len(), 3);
        assert_eq!(
            store.volume_by_name(&other.id, "data").unwrap().unwrap().id,
            "vol-3"
        );

        let spec = serde_json::json!({"volumes": [
            {"volume": "vol-1", "source": "/d/volumes/vol-1", "target": "/data"}
        ]});
        store
            .insert_sandbox(&NewSandbox {
                id: "sbx-1".into(),
                tier: "process".into(),
                template: "base".into(),
                spec_json: spec.to_string(),
                metadata: Default::default(),
                owner_key_id: key.id.clone(),
                access_token_hash: [0; 32],
                created_at: 1,
                expires_at: i64::MAX,
                resources_json: None,
                layers: Vec::new(),
            })
            .unwrap();
        assert!(matches!(
            store.delete_volume("vol-1"),
            Err(StoreError::InUse { user, .. }) if user == "sbx-1"
        ));
        store.delete_volume("vol-4").unwrap();
        store
            .set_state("sbx-1", None, crate::State::Dead, Some("deleted"))
            .unwrap();
        store.delete_volume("vol-1").unwrap();
        assert!(store.get_volume("vol-1").unwrap().is_none());
        assert!(matches!(
            store.delete_volume("vol-1"),
            Err(StoreError::NotFound { .. })
        ));
    }
}
