//! The `pools` table: the warm pools the operator asked for, which the
//! daemon keeps filled (their members are sandboxes owned by
//! [`POOL_KEY_ID`] until a create claims one).

use rusqlite::{params, OptionalExtension, Row};

use crate::{now_millis, Entity, Store, StoreError};

/// The key warm pool members belong to until claimed (see schema V7).
pub const POOL_KEY_ID: &str = "key-pool";

/// One warm pool, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRow {
    /// Unique; 1 to 64 characters.
    pub name: String,
    /// The template its members run, as a create names it.
    pub template: String,
    /// The tier they run on; `None`: the template's.
    pub tier: Option<String>,
    /// Whether members have an egress path (they serve creates with a
    /// network policy other than `none`).
    pub networked: bool,
    /// Members kept ready.
    pub min_ready: u32,
    /// Most members at once, ready and starting.
    pub max: u32,
    /// Most members starting at once.
    pub refill: u32,
    /// Unix milliseconds.
    pub updated_at: i64,
}

const COLUMNS: &str = "name, template, tier, networked, min_ready, max, refill, updated_at";

fn from_row(row: &Row<'_>) -> rusqlite::Result<PoolRow> {
    let count = |i: usize| -> rusqlite::Result<u32> {
        Ok(u32::try_from(row.get::<_, i64>(i)?.max(0)).unwrap_or(u32::MAX))
    };
    Ok(PoolRow {
        name: row.get(0)?,
        template: row.get(1)?,
        tier: row.get(2)?,
        networked: row.get::<_, i64>(3)? != 0,
        min_ready: count(4)?,
        max: count(5)?,
        refill: count(6)?,
        updated_at: row.get(7)?,
    })
}

impl Store {
    /// Records pool `pool.name`, replacing one of that name. Returns what
    /// was recorded.
    pub fn put_pool(&self, pool: &PoolRow) -> Result<PoolRow, StoreError> {
        let mut row = pool.clone();
        row.updated_at = now_millis();
        self.conn
            .prepare_cached(&format!(
                "INSERT OR REPLACE INTO pools ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            ))?
            .execute(params![
                row.name,
                row.template,
                row.tier,
                i64::from(row.networked),
                i64::from(row.min_ready),
                i64::from(row.max),
                i64::from(row.refill),
                row.updated_at,
            ])?;
        Ok(row)
    }

    /// Every pool, by name.
    pub fn pools(&self) -> Result<Vec<PoolRow>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM pools ORDER BY name"))?
            .query_map([], from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Pool `name`, if there is one.
    pub fn get_pool(&self, name: &str) -> Result<Option<PoolRow>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM pools WHERE name = ?1"))?
            .query_row([name], from_row)
            .optional()?)
    }

    /// Removes pool `name`; [`StoreError::NotFound`] if there is none.
    pub fn delete_pool(&self, name: &str) -> Result<(), StoreError> {
        let changed = self
            .conn
            .prepare_cached("DELETE FROM pools WHERE name = ?1")?
            .execute([name])?;
        if changed == 0 {
            return Err(StoreError::NotFound {
                kind: Entity::Pool,
                id: name.to_owned(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pool(name: &str, min_ready: u32) -> PoolRow {
        PoolRow {
            name: name.into(),
            template: "base".into(),
            tier: None,
            networked: true,
            min_ready,
            max: 8,
            refill: 2,
            updated_at: 0,
        }
    }

    #[test]
    fn pools_are_replaced_by_name_and_deleted_once() {
        let store = Store::open_in_memory().unwrap();
        store.put_pool(&pool("b", 1)).unwrap();
        store.put_pool(&pool("a", 1)).unwrap();
        let again = store.put_pool(&pool("a", 4)).unwrap();
        assert!(again.updated_at > 0);
        let all = store.pools().unwrap();
        assert_eq!(
            all.iter()
                .map(|p| (&p.name[..], p.min_ready))
                .collect::<Vec<_>>(),
            vec![("a", 4), ("b", 1)]
        );
        assert_eq!(store.get_pool("a").unwrap().unwrap(), again);
        store.delete_pool("a").unwrap();
        assert!(matches!(
            store.delete_pool("a"),
            Err(StoreError::NotFound {
                kind: Entity::Pool,
                ..
            })
        ));
        // More ready than the pool may hold is refused.
        let mut bad = pool("c", 9);
        bad.max = 2;
        assert!(store.put_pool(&bad).is_err());
    }

    #[test]
    fn the_pools_key_is_not_listed_counted_or_signed_in_as() {
        let store = Store::open_in_memory().unwrap();
        assert_eq!(store.count_keys().unwrap(), 0);
        assert!(store.list_keys().unwrap().is_empty());
        assert!(store.get_key(POOL_KEY_ID).unwrap().is_some());
    }
}
