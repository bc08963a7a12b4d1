//! The `build_steps` table: the build cache, each step's key and the layer
//! it made (see `airlock_build::cache` for what a key covers).

use rusqlite::{params, OptionalExtension};

use crate::{now_millis, Store, StoreError};

/// What the cache holds for a step's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CachedStep {
    /// The step made this layer (by `diff_id`).
    Layer(String),
    /// The step changed no file.
    Empty,
}

impl Store {
    /// The cached result of the step with `key`, marking it used now;
    /// `None` when the cache has none.
    pub fn cached_step(&self, key: &str) -> Result<Option<CachedStep>, StoreError> {
        let found: Option<Option<String>> = self
            .conn
            .prepare_cached("SELECT diff_id FROM build_steps WHERE key = ?1")?
            .query_row([key], |row| row.get(0))
            .optional()?;
        if found.is_some() {
            self.conn
                .prepare_cached("UPDATE build_steps SET used_at = ?2 WHERE key = ?1")?
                .execute(params![key, now_millis()])?;
        }
        Ok(found.map(|diff_id| diff_id.map_or(CachedStep::Empty, CachedStep::Layer)))
    }

    /// Caches what the step with `key` made (its layer must be recorded),
    /// replacing what the cache held for it.
    pub fn cache_step(&self, key: &str, step: &CachedStep) -> Result<(), StoreError> {
        let diff_id = match step {
            CachedStep::Layer(diff_id) => Some(diff_id.as_str()),
            CachedStep::Empty => None,
        };
        let now = now_millis();
        self.conn
            .prepare_cached(
                "INSERT INTO build_steps (key, diff_id, created_at, used_at) VALUES (?1, ?2, ?3, ?3) \
                 ON CONFLICT (key) DO UPDATE SET diff_id = excluded.diff_id, used_at = excluded.used_at",
            )?
            .execute(params![key, diff_id, now])?;
        Ok(())
    }

    /// Forgets the cached steps last used before `before` (unix
    /// milliseconds; `i64::MAX` forgets them all), so the collector can
    /// take their layers. Returns how many went.
    pub fn evict_build_steps(&self, before: i64) -> Result<usize, StoreError> {
        Ok(self
            .conn
            .prepare_cached("DELETE FROM build_steps WHERE used_at < ?1")?
            .execute([before])?)
    }

    /// How many steps the cache holds.
    pub fn build_steps(&self) -> Result<u64, StoreError> {
        let count: i64 = self
            .conn
            .prepare_cached("SELECT count(*) FROM build_steps")?
            .query_row([], |row| row.get(0))?;
        Ok(count.max(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    #[test]
    fn a_cached_layer_is_referenced_until_evicted() {
        let store = Store::open_in_memory().unwrap();
        let layer = digest('a');
        store.record_layer(&layer, 10, 1).unwrap();
        assert_eq!(store.cached_step(&digest('1')).unwrap(), None);
        store
            .cache_step(&digest('1'), &CachedStep::Layer(layer.clone()))
            .unwrap();
        store.cache_step(&digest('2'), &CachedStep::Empty).unwrap();
        assert_eq!(
            store.cached_step(&digest('1')).unwrap(),
            Some(CachedStep::Layer(layer.clone()))
        );
        assert_eq!(
            store.cached_step(&digest('2')).unwrap(),
            Some(CachedStep::Empty)
        );
        assert!(store.unreferenced_layers().unwrap().is_empty());
        assert!(!store.forget_layer(&layer).unwrap());
        assert_eq!(store.build_steps().unwrap(), 2);
        assert_eq!(store.evict_build_steps(0).unwrap(), 0);
        assert_eq!(store.evict_build_steps(i64::MAX).unwrap(), 2);
        assert_eq!(store.unreferenced_layers().unwrap(), vec![layer.clone()]);
        assert!(store.forget_layer(&layer).unwrap());
    }

    #[test]
    fn a_step_cannot_cache_an_unrecorded_layer() {
        let store = Store::open_in_memory().unwrap();
        assert!(store
            .cache_step(&digest('1'), &CachedStep::Layer(digest('b')))
            .is_err());
        assert!(store.cache_step("not a key", &CachedStep::Empty).is_err());
    }
}
