//! The `snapshots` and `snapshot_layers` tables: a tenant's frozen
//! sandbox filesystems, each a stack of layers like a template's, owned by
//! the key that took it.

use rusqlite::{params, OptionalExtension, Row};

use crate::{json_column, now_millis, Entity, Store, StoreError};

/// A snapshot: what a sandbox's filesystem was, as a stack of layers.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRow {
    /// `snap-` and 16 hex digits.
    pub id: String,
    /// Unique among its owner's snapshots.
    pub name: Option<String>,
    /// The key that took it; only it (and admins) see and use it.
    pub owner_key_id: String,
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    /// The template that sandbox was created from, as it was named.
    pub template: String,
    /// The tier that sandbox ran on.
    pub tier: String,
    /// How its sandboxes start (an image configuration, a JSON object).
    pub config: serde_json::Value,
    /// Its layers' `diff_id`s, bottom first.
    pub layers: Vec<String>,
    /// The sandbox's changes: entries and bytes of regular files unpacked.
    pub entries: u64,
    pub bytes: u64,
    /// The changes' uncompressed tar, and its zstd-compressed archive.
    pub tar_bytes: u64,
    pub archive_bytes: u64,
    /// `sha256:` and 64 hex digits of the archive, if it was written.
    pub archive_digest: Option<String>,
    pub zstd_level: i32,
    /// How long taking it took, in milliseconds.
    pub took_ms: u64,
    /// Unix milliseconds.
    pub created_at: i64,
}

/// A snapshot to record (`created_at` is now).
pub type NewSnapshot = SnapshotRow;

/// How much of its snapshots one key may keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotQuota {
    /// Snapshots (a name taken again replaces one, and takes none more).
    pub count: u64,
    /// Their changes' bytes and archives' bytes together.
    pub bytes: u64,
}

/// What a key's snapshots take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotUsage {
    pub count: u64,
    pub bytes: u64,
}

impl SnapshotUsage {
    /// What `quota` this usage plus one more snapshot of `bytes` would
    /// exceed, if any.
    pub fn exceeded_by(&self, bytes: u64, quota: &SnapshotQuota) -> Option<SnapshotQuotaExceeded> {
        if self.count.saturating_add(1) > quota.count {
            return Some(SnapshotQuotaExceeded::Count {
                held: self.count,
                limit: quota.count,
            });
        }
        if self.bytes.saturating_add(bytes) > quota.bytes {
            return Some(SnapshotQuotaExceeded::Bytes {
                held: self.bytes,
                adding: bytes,
                limit: quota.bytes,
            });
        }
        None
    }
}

/// Which part of a snapshot quota a new snapshot would exceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotQuotaExceeded {
    #[error("this API key holds {held} snapshots, its limit: delete one before taking another")]
    Count { held: u64, limit: u64 },
    #[error("this API key's snapshots hold {held} bytes and this one {adding} more, past its limit of {limit}: delete some before taking another")]
    Bytes { held: u64, adding: u64, limit: u64 },
}

/// Which snapshots a listing returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotFilter {
    /// Only this key's (`None`: everyone's, for admins).
    pub owner_key_id: Option<String>,
    /// Only those taken of this sandbox.
    pub sandbox_id: Option<String>,
    /// Only the one with this id or name.
    pub id_or_name: Option<String>,
}

const COLUMNS: &str = "id, name, owner_key_id, sandbox_id, template, tier, config_json, \
     entries, bytes, tar_bytes, archive_bytes, archive_digest, zstd_level, took_ms, created_at";

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn from_row(row: &Row<'_>) -> rusqlite::Result<SnapshotRow> {
    let count = |i: usize| -> rusqlite::Result<u64> { Ok(row.get::<_, i64>(i)?.max(0) as u64) };
    Ok(SnapshotRow {
        id: row.get(0)?,
        name: row.get(1)?,
        owner_key_id: row.get(2)?,
        sandbox_id: row.get(3)?,
        template: row.get(4)?,
        tier: row.get(5)?,
        config: json_column(row, 6)?,
        layers: Vec::new(),
        entries: count(7)?,
        bytes: count(8)?,
        tar_bytes: count(9)?,
        archive_bytes: count(10)?,
        archive_digest: row.get(11)?,
        zstd_level: row.get(12)?,
        took_ms: count(13)?,
        created_at: row.get(14)?,
    })
}

/// A fresh snapshot id: `snap-` and 16 hex digits.
pub fn new_snapshot_id() -> Result<String, StoreError> {
    crate::secret::random_id("snap-", 8)
}

impl Store {
    /// Records a snapshot. One of the same owner and name is replaced in
    /// place: it keeps its id (what clients hold), and takes the new
    /// layers and figures; the id of `new` is then unused. All or nothing.
    /// Returns what was recorded. With `quota`, refuses (changing nothing)
    /// a snapshot that would take its owner past it, counting what it
    /// replaces as gone.
    pub fn put_snapshot(
        &self,
        new: &NewSnapshot,
        quota: Option<&SnapshotQuota>,
    ) -> Result<SnapshotRow, StoreError> {
        if !new.config.is_object() {
            return Err(StoreError::InvalidJson {
                field: "config_json",
                expected: "a JSON object",
            });
        }
        let tx = self.conn.unchecked_transaction()?;
        let existing: Option<String> = match &new.name {
            Some(name) => self
                .conn
                .prepare_cached("SELECT id FROM snapshots WHERE owner_key_id = ?1 AND name = ?2")?
                .query_row(params![new.owner_key_id, name], |row| row.get(0))
                .optional()?,
            None => None,
        };
        if let Some(quota) = quota {
            let usage = self.snapshot_usage(&new.owner_key_id, new.name.as_deref())?;
            if let Some(exceeded) =
                usage.exceeded_by(new.bytes.saturating_add(new.archive_bytes), quota)
            {
                return Err(StoreError::SnapshotQuota(exceeded));
            }
        }
        let mut row = new.clone();
        row.created_at = now_millis();
        if let Some(id) = existing {
            row.id = id;
            self.conn
                .prepare_cached("DELETE FROM snapshots WHERE id = ?1")?
                .execute([&row.id])?;
        }
        self.conn
            .prepare_cached(&format!(
                "INSERT INTO snapshots ({COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
            ))?
            .execute(params![
                row.id,
                row.name,
                row.owner_key_id,
                row.sandbox_id,
                row.template,
                row.tier,
                row.config.to_string(),
                to_i64(row.entries),
                to_i64(row.bytes),
                to_i64(row.tar_bytes),
                to_i64(row.archive_bytes),
                row.archive_digest,
                row.zstd_level,
                to_i64(row.took_ms),
                row.created_at,
            ])?;
        self.insert_layer_stack(
            "INSERT INTO snapshot_layers (snapshot, position, diff_id) VALUES (?1, ?2, ?3)",
            &row.id,
            &row.layers,
        )?;
        tx.commit()?;
        Ok(row)
    }

    /// What `owner`'s snapshots take, but for the one named `replacing`
    /// (which a snapshot of that name replaces).
    pub fn snapshot_usage(
        &self,
        owner: &str,
        replacing: Option<&str>,
    ) -> Result<SnapshotUsage, StoreError> {
        let (count, bytes): (i64, i64) = self
            .conn
            .prepare_cached(
                "SELECT COUNT(*), COALESCE(SUM(bytes + archive_bytes), 0) FROM snapshots \
                 WHERE owner_key_id = ?1 AND (?2 IS NULL OR name IS NULL OR name != ?2)",
            )?
            .query_row(params![owner, replacing], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })?;
        Ok(SnapshotUsage {
            count: count.max(0) as u64,
            bytes: bytes.max(0) as u64,
        })
    }

    fn snapshot_layers(&self, id: &str) -> Result<Vec<String>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT diff_id FROM snapshot_layers WHERE snapshot = ?1 ORDER BY position",
            )?
            .query_map([id], |row| row.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?)
    }

    /// The snapshots `filter` selects, oldest first.
    pub fn snapshots(&self, filter: &SnapshotFilter) -> Result<Vec<SnapshotRow>, StoreError> {
        let mut rows = self
            .conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM snapshots WHERE \
                 (?1 IS NULL OR owner_key_id = ?1) AND \
                 (?2 IS NULL OR sandbox_id = ?2) AND \
                 (?3 IS NULL OR id = ?3 OR name = ?3) \
                 ORDER BY created_at, id"
            ))?
            .query_map(
                params![filter.owner_key_id, filter.sandbox_id, filter.id_or_name],
                from_row,
            )?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        for row in &mut rows {
            row.layers = self.snapshot_layers(&row.id)?;
        }
        Ok(rows)
    }

    /// The snapshot `id`, whoever owns it.
    pub fn get_snapshot(&self, id: &str) -> Result<Option<SnapshotRow>, StoreError> {
        let row = self
            .conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM snapshots WHERE id = ?1"))?
            .query_row([id], from_row)
            .optional()?;
        let Some(mut row) = row else {
            return Ok(None);
        };
        row.layers = self.snapshot_layers(&row.id)?;
        Ok(Some(row))
    }

    /// Removes the snapshot `id` (its layers stay until the collector finds
    /// nothing references them).
    pub fn delete_snapshot(&self, id: &str) -> Result<(), StoreError> {
        let changed = self
            .conn
            .prepare_cached("DELETE FROM snapshots WHERE id = ?1")?
            .execute([id])?;
        if changed == 0 {
            return Err(StoreError::NotFound {
                kind: Entity::Snapshot,
                id: id.to_owned(),
            });
        }
        Ok(())
    }

    /// Every snapshot id recorded (the collector's list of what archives
    /// may stay).
    pub fn snapshot_ids(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .conn
            .prepare_cached("SELECT id FROM snapshots ORDER BY id")?
            .query_map([], |row| row.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn snapshot(id: &str, owner: &str, name: Option<&str>, layers: Vec<String>) -> NewSnapshot {
        SnapshotRow {
            id: id.into(),
            name: name.map(Into::into),
            owner_key_id: owner.into(),
            sandbox_id: "sbx-1".into(),
            template: "base".into(),
            tier: "process".into(),
            config: serde_json::json!({"env": ["A=1"]}),
            layers,
            entries: 3,
            bytes: 10,
            tar_bytes: 3072,
            archive_bytes: 120,
            archive_digest: Some(digest('d')),
            zstd_level: 3,
            took_ms: 5,
            created_at: 0,
        }
    }

    #[test]
    fn a_snapshot_holds_its_layers_until_it_is_deleted() {
        let store = Store::open_in_memory().unwrap();
        store.record_layer(&digest('a'), 1, 1).unwrap();
        store.record_layer(&digest('b'), 1, 1).unwrap();
        let put = store
            .put_snapshot(
                &snapshot("snap-1", "key-a", None, vec![digest('a'), digest('b')]),
                None,
            )
            .unwrap();
        assert!(put.created_at > 0);
        assert!(store.unreferenced_layers().unwrap().is_empty());
        assert!(!store.forget_layer(&digest('b')).unwrap());
        assert_eq!(store.layer_references(&digest('b')).unwrap(), 1);
        let got = store.get_snapshot("snap-1").unwrap().unwrap();
        assert_eq!(got.layers, vec![digest('a'), digest('b')]);
        assert_eq!(got, put);
        store.delete_snapshot("snap-1").unwrap();
        assert!(matches!(
            store.delete_snapshot("snap-1"),
            Err(StoreError::NotFound {
                kind: Entity::Snapshot,
                ..
            })
        ));
        assert_eq!(
            store.unreferenced_layers().unwrap(),
            vec![digest('a'), digest('b')]
        );
    }

    #[test]
    fn a_snapshot_of_unrecorded_layers_is_refused_whole() {
        let store = Store::open_in_memory().unwrap();
        assert!(matches!(
            store.put_snapshot(&snapshot("snap-1", "key-a", None, vec![digest('a')]), None),
            Err(StoreError::NotFound {
                kind: Entity::Layer,
                ..
            })
        ));
        assert!(store.get_snapshot("snap-1").unwrap().is_none());
    }

    #[test]
    fn a_name_is_per_owner_and_taking_it_again_keeps_the_id() {
        let store = Store::open_in_memory().unwrap();
        store.record_layer(&digest('a'), 1, 1).unwrap();
        store.record_layer(&digest('b'), 1, 1).unwrap();
        store
            .put_snapshot(
                &snapshot("snap-1", "key-a", Some("s"), vec![digest('a')]),
                None,
            )
            .unwrap();
        store
            .put_snapshot(
                &snapshot("snap-2", "key-b", Some("s"), vec![digest('a')]),
                None,
            )
            .unwrap();
        let again = store
            .put_snapshot(
                &snapshot("snap-3", "key-a", Some("s"), vec![digest('b')]),
                None,
            )
            .unwrap();
        assert_eq!(again.id, "snap-1");
        assert!(store.get_snapshot("snap-3").unwrap().is_none());
        let mine = store
            .snapshots(&SnapshotFilter {
                owner_key_id: Some("key-a".into()),
                ..SnapshotFilter::default()
            })
            .unwrap();
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].layers, vec![digest('b')]);
        let by_name = store
            .snapshots(&SnapshotFilter {
                owner_key_id: Some("key-b".into()),
                id_or_name: Some("s".into()),
                ..SnapshotFilter::default()
            })
            .unwrap();
        assert_eq!(by_name.len(), 1);
        assert_eq!(by_name[0].id, "snap-2");
        assert_eq!(
            store.snapshots(&SnapshotFilter::default()).unwrap().len(),
            2
        );
        assert_eq!(store.snapshot_ids().unwrap(), vec!["snap-1", "snap-2"]);
        let of_other = store
            .snapshots(&SnapshotFilter {
                sandbox_id: Some("sbx-2".into()),
                ..SnapshotFilter::default()
            })
            .unwrap();
        assert!(of_other.is_empty());
        assert!(new_snapshot_id().unwrap().starts_with("snap-"));
    }

    #[test]
    fn a_quota_counts_what_a_key_holds_and_a_retaken_name_replaces() {
        let store = Store::open_in_memory().unwrap();
        store.record_layer(&digest('a'), 1, 1).unwrap();
        let quota = SnapshotQuota {
            count: 2,
            bytes: 1000,
        };
        let put = |id: &str, owner: &str, name: Option<&str>| {
            store.put_snapshot(&snapshot(id, owner, name, vec![digest('a')]), Some(&quota))
        };
        put("snap-1", "key-a", Some("s")).unwrap();
        put("snap-2", "key-a", None).unwrap();
        // The third is refused, and changes nothing.
        assert!(matches!(
            put("snap-3", "key-a", None),
            Err(StoreError::SnapshotQuota(SnapshotQuotaExceeded::Count {
                held: 2,
                limit: 2
            }))
        ));
        assert!(store.get_snapshot("snap-3").unwrap().is_none());
        // A name taken again replaces its snapshot: none more is held.
        assert_eq!(put("snap-4", "key-a", Some("s")).unwrap().id, "snap-1");
        // Another key has a quota of its own.
        put("snap-5", "key-b", None).unwrap();
        assert_eq!(
            store.snapshot_usage("key-a", None).unwrap(),
            SnapshotUsage {
                count: 2,
                bytes: 260
            }
        );
        let tight = SnapshotQuota {
            count: 10,
            bytes: 300,
        };
        assert!(matches!(
            store.put_snapshot(
                &snapshot("snap-6", "key-a", None, vec![digest('a')]),
                Some(&tight)
            ),
            Err(StoreError::SnapshotQuota(SnapshotQuotaExceeded::Bytes {
                held: 260,
                adding: 130,
                limit: 300
            }))
        ));
    }
}
