//! The sessions of every sandbox, by sandbox id and session id: one table
//! type for the shell sessions (`/v1/shell/…`) and the bash sessions
//! (`/v1/bash/…`), so both are bounded, evicted and forgotten with their
//! sandbox the same way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// What the table needs to know of an entry to choose one to evict.
pub(super) trait Entry {
    /// Whether it may be ended for a new one (it runs nothing).
    fn idle(&self) -> bool;
    /// When it was last used.
    fn last_used(&self) -> SystemTime;
}

/// What [`Table::open`] does when the sandbox has its most entries and
/// none of them is idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WhenFull {
    /// Add the new one all the same.
    Admit,
    /// Add nothing ([`Opened::Full`]).
    Refuse,
}

/// What [`Table::open`] did.
pub(super) enum Opened<T> {
    /// The entry was there.
    Found(Arc<T>),
    /// The entry is new; `evicted` is the idle one ended to make room.
    Made {
        entry: Arc<T>,
        evicted: Option<Arc<T>>,
    },
    /// The sandbox has its most entries, all busy.
    Full,
}

type Key = (String, String);

/// Entries by sandbox id and session id.
pub(super) struct Table<T> {
    inner: Arc<Mutex<HashMap<Key, Arc<T>>>>,
}

impl<T> Clone for Table<T> {
    fn clone(&self) -> Self {
        Table {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table {
            inner: Arc::default(),
        }
    }
}

fn key(sandbox: &str, session: &str) -> Key {
    (sandbox.to_owned(), session.to_owned())
}

impl<T> Table<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<T>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Entry `session` of `sandbox`, if there is one.
    pub fn get(&self, sandbox: &str, session: &str) -> Option<Arc<T>> {
        self.lock().get(&key(sandbox, session)).cloned()
    }

    /// Takes entry `session` of `sandbox` out of the table.
    pub fn remove(&self, sandbox: &str, session: &str) -> Option<Arc<T>> {
        self.lock().remove(&key(sandbox, session))
    }

    /// The entries of `sandbox`.
    pub fn of(&self, sandbox: &str) -> Vec<Arc<T>> {
        self.lock()
            .iter()
            .filter(|((s, _), _)| s == sandbox)
            .map(|(_, entry)| Arc::clone(entry))
            .collect()
    }

    /// Forgets the entries of every sandbox `live` says is gone.
    pub fn prune(&self, live: impl Fn(&str) -> bool) {
        self.lock().retain(|(s, _), _| live(s));
    }
}

impl<T: Entry> Table<T> {
    /// Entry `session` of `sandbox`, made by `make` if it is new. A
    /// sandbox keeps at most `most` entries: past it the least recently
    /// used idle one is taken out (and returned, for its owner to end),
    /// and when none is idle `when_full` decides.
    pub fn open(
        &self,
        sandbox: &str,
        session: &str,
        most: usize,
        when_full: WhenFull,
        make: impl FnOnce() -> T,
    ) -> Opened<T> {
        let mut all = self.lock();
        if let Some(found) = all.get(&key(sandbox, session)) {
            return Opened::Found(Arc::clone(found));
        }
        let mine: Vec<&Key> = all.keys().filter(|(s, _)| s == sandbox).collect();
        let mut evicted = None;
        if mine.len() >= most {
            let oldest = mine
                .into_iter()
                .filter_map(|k| all.get(k).map(|entry| (k.clone(), entry)))
                .filter(|(_, entry)| entry.idle())
                .min_by_key(|(_, entry)| entry.last_used())
                .map(|(k, _)| k);
            match oldest {
                Some(k) => evicted = all.remove(&k),
                None if when_full == WhenFull::Refuse => return Opened::Full,
                None => {}
            }
        }
        let entry = Arc::new(make());
        all.insert(key(sandbox, session), Arc::clone(&entry));
        Opened::Made { entry, evicted }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    struct Probe {
        busy: AtomicBool,
        used: SystemTime,
    }

    impl Entry for Probe {
        fn idle(&self) -> bool {
            !self.busy.load(Ordering::Relaxed)
        }
        fn last_used(&self) -> SystemTime {
            self.used
        }
    }

    fn probe(age: u64) -> Probe {
        Probe {
            busy: AtomicBool::new(false),
            used: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 - age),
        }
    }

    #[test]
    fn the_least_recently_used_idle_entry_makes_room() {
        let table = Table::default();
        for (name, age) in [("a", 5), ("b", 9), ("c", 1)] {
            table.open("sbx-1", name, 3, WhenFull::Refuse, || probe(age));
        }
        table.open("sbx-2", "x", 3, WhenFull::Refuse, || probe(100));
        let made = table.open("sbx-1", "d", 3, WhenFull::Refuse, || probe(0));
        let Opened::Made { evicted, .. } = made else {
            panic!("d was not made");
        };
        assert!(evicted.is_some());
        assert!(table.get("sbx-1", "b").is_none(), "b was the oldest");
        assert_eq!(table.of("sbx-1").len(), 3);
        assert!(matches!(
            table.open("sbx-1", "a", 3, WhenFull::Refuse, || probe(0)),
            Opened::Found(_)
        ));
    }

    #[test]
    fn a_full_sandbox_of_busy_entries_refuses_or_admits() {
        let table = Table::default();
        for name in ["a", "b"] {
            if let Opened::Made { entry, .. } =
                table.open("sbx-1", name, 2, WhenFull::Refuse, || probe(1))
            {
                entry.busy.store(true, Ordering::Relaxed);
            }
        }
        assert!(matches!(
            table.open("sbx-1", "c", 2, WhenFull::Refuse, || probe(0)),
            Opened::Full
        ));
        assert!(matches!(
            table.open("sbx-1", "c", 2, WhenFull::Admit, || probe(0)),
            Opened::Made { evicted: None, .. }
        ));
        table.prune(|s| s != "sbx-1");
        assert!(table.of("sbx-1").is_empty());
    }
}
