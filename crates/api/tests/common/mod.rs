//! A backend that runs nothing, and a daemon over it, for the API's tests
//! (they exercise routing and input checks, never a sandbox).
#![allow(clippy::unwrap_used, dead_code)]

use airlock_backend::{
    AdoptError, Backend, CreateError, DeadlineError, DestroyError, Instance, Reconciled, Resources,
    Unavailable, Usage,
};
use airlock_daemon::{Config, Daemon};
use airlock_policy::{SandboxSpec, Tier};
use airlock_store::Store;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A tier that counts the creates that reach it, records the spec each was
/// given, and runs nothing.
#[derive(Default)]
pub struct CountingTier {
    pub creates: AtomicUsize,
    /// The spec of every create that reached the tier, in order.
    pub specs: Mutex<Vec<SandboxSpec>>,
    ids: AtomicUsize,
}

impl CountingTier {
    /// The spec of the last create that reached the tier.
    pub fn last_spec(&self) -> Option<SandboxSpec> {
        self.specs.lock().unwrap().last().cloned()
    }
}

#[async_trait::async_trait]
impl Backend for CountingTier {
    fn tier(&self) -> Tier {
        Tier::Process
    }
    fn probe(&self) -> Result<(), Unavailable> {
        Ok(())
    }
    fn reserve_id(&self, _: &SandboxSpec) -> String {
        format!("sbx-{:016x}", self.ids.fetch_add(1, Ordering::SeqCst))
    }
    fn unreserve(&self, _: &str) {}
    async fn create(&self, _: &str, spec: &SandboxSpec) -> Result<Instance, CreateError> {
        self.specs.lock().unwrap().push(spec.clone());
        self.creates.fetch_add(1, Ordering::SeqCst);
        Err(CreateError::BadInput("this test tier runs nothing".into()))
    }
    async fn adopt(&self, _: &str, _: &Resources) -> Result<Instance, AdoptError> {
        Err(AdoptError::Gone { ending: None })
    }
    fn set_deadline(&self, _: &str, _: &Resources, _: i64) -> Result<(), DeadlineError> {
        Ok(())
    }
    async fn destroy(&self, _: &str, _: Option<&Resources>) -> Result<(), DestroyError> {
        Ok(())
    }
    async fn usage(&self, _: &str) -> Option<Usage> {
        None
    }
    async fn reconcile(&self, _: &HashSet<String>) -> Reconciled {
        Reconciled::default()
    }
    async fn leaked(&self, _: &HashSet<String>) -> usize {
        0
    }
}

/// A daemon with its data in `dir` over `tier`, and its admin key.
pub fn daemon(dir: &std::path::Path, tier: Arc<CountingTier>) -> (Daemon, String) {
    let store = Store::open_in_memory().unwrap();
    let (_, key) = store.create_key("admin", true).unwrap();
    let daemon = Daemon::new(
        Config::new(dir.to_owned()),
        Arc::new(Mutex::new(store)),
        tier,
    )
    .unwrap();
    (daemon, key)
}
