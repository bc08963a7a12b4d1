//! Create is atomic with respect to the store: when the write after the
//! backend started a sandbox fails, the sandbox is destroyed, recorded dead,
//! and its admission permit comes back, so the next create under a cap of
//! one live sandbox succeeds. The same holds for a create whose requester
//! goes away while the backend is still starting the sandbox.
//!
//! The store failure is real: the test backend's `create` takes an
//! exclusive lock on the daemon's SQLite file through a second connection
//! (as another writer would), so the daemon's next write waits out its busy
//! timeout and fails. Its `destroy` lets go of the lock.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_backend::{
    AdoptError, Backend, CreateError, DestroyError, Ending, Instance, Reconciled, Resources,
    Unavailable, Usage,
};
use airlock_core::AdmissionLimits;
use airlock_daemon::sandboxes::NewSandboxRequest;
use airlock_daemon::{Config, Daemon, DaemonError};
use airlock_policy::{SandboxSpec, Tier};
use airlock_protocol::{read_frame, write_frame, AgentClient, Event, Frame, Request, Versions};
use airlock_store::Store;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// An agent that only greets.
async fn greeting_agent(mut stream: tokio::net::UnixStream) {
    while let Ok(frame) = read_frame::<_, Request>(&mut stream).await {
        let Request::Hello { version, oldest } = frame.msg else {
            continue;
        };
        let version = Versions::OURS
            .highest_common(Versions::offered(version, oldest))
            .unwrap();
        let hello = Event::Hello {
            version,
            agent_version: "fake".into(),
        };
        if write_frame(&mut stream, &Frame::new(frame.id, hello))
            .await
            .is_err()
        {
            break;
        }
    }
}

/// A tier whose sandboxes are greeting agents; the first `lock_creates`
/// creates lock the store file until the sandbox is destroyed.
struct LockingTier {
    db: PathBuf,
    lock_creates: usize,
    creates: AtomicUsize,
    destroyed: Mutex<Vec<String>>,
    /// The connection holding the lock, while it is held.
    holder: Mutex<Option<rusqlite::Connection>>,
    ends: Mutex<Vec<(String, watch::Sender<Option<Ending>>)>>,
    /// When set, a create starts its sandbox (it counts as running from
    /// then on, as a launched supervisor does) and waits for a permit here
    /// before it answers.
    gate: Option<Arc<tokio::sync::Semaphore>>,
    /// Sandboxes started and not destroyed.
    running: Mutex<HashSet<String>>,
    /// Deadlines handed to sandboxes.
    deadlines: Mutex<Vec<(String, i64)>>,
}

impl LockingTier {
    fn new(db: PathBuf, lock_creates: usize, gate: Option<Arc<tokio::sync::Semaphore>>) -> Self {
        LockingTier {
            db,
            lock_creates,
            creates: AtomicUsize::new(0),
            destroyed: Mutex::default(),
            holder: Mutex::default(),
            ends: Mutex::default(),
            gate,
            running: Mutex::default(),
            deadlines: Mutex::default(),
        }
    }
}

#[async_trait::async_trait]
impl Backend for LockingTier {
    fn tier(&self) -> Tier {
        Tier::Process
    }
    fn probe(&self) -> Result<(), Unavailable> {
        Ok(())
    }
    fn reserve_id(&self, _: &SandboxSpec) -> String {
        format!("sbx-{:016x}", self.creates.load(Ordering::SeqCst) + 1)
    }
    fn unreserve(&self, _: &str) {}
    async fn create(&self, id: &str, _: &SandboxSpec) -> Result<Instance, CreateError> {
        let n = self.creates.fetch_add(1, Ordering::SeqCst);
        if n < self.lock_creates {
            let conn = rusqlite::Connection::open(&self.db).unwrap();
            conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
            *self.holder.lock().unwrap() = Some(conn);
        }
        self.running.lock().unwrap().insert(id.to_owned());
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        let (host, agent) = tokio::net::UnixStream::pair().unwrap();
        tokio::spawn(greeting_agent(agent));
        let agent = AgentClient::connect(host, 1).await.unwrap();
        let (tell, mut ended) = watch::channel(None);
        self.ends.lock().unwrap().push((id.to_owned(), tell));
        Ok(Instance {
            agent,
            resources: Resources::Process(airlock_backend::Supervised {
                supervisor_pid: None,
                socket: format!("/nonexistent/{id}.sock"),
            }),
            ended: Box::pin(async move {
                let ending = ended.wait_for(Option::is_some).await.ok().and_then(|e| *e);
                ending.unwrap_or(Ending::Unknown)
            }),
            egress: None,
            ports: None,
        })
    }
    async fn adopt(&self, _: &str, _: &Resources) -> Result<Instance, AdoptError> {
        Err(AdoptError::Gone { ending: None })
    }
    async fn destroy(&self, id: &str, _: Option<&Resources>) -> Result<(), DestroyError> {
        self.destroyed.lock().unwrap().push(id.to_owned());
        self.running.lock().unwrap().remove(id);
        if let Some(conn) = self.holder.lock().unwrap().take() {
            conn.execute_batch("ROLLBACK").unwrap();
        }
        for (of, tell) in self.ends.lock().unwrap().iter() {
            if of == id {
                let _ = tell.send(Some(Ending::Stopped));
            }
        }
        Ok(())
    }
    fn set_deadline(
        &self,
        id: &str,
        _: &Resources,
        at_ms: i64,
    ) -> Result<(), airlock_backend::DeadlineError> {
        self.deadlines.lock().unwrap().push((id.to_owned(), at_ms));
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

fn request() -> NewSandboxRequest {
    NewSandboxRequest {
        spec: SandboxSpec::default(),
        template_name: "host".into(),
        metadata: Default::default(),
        layers: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_after_the_backend_started_a_sandbox_destroys_it_and_frees_its_slot() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let store = Store::open(&db).unwrap();
    let (key, _) = store.create_key("admin", true).unwrap();
    let store = Arc::new(Mutex::new(store));
    let tier = Arc::new(LockingTier::new(db, 1, None));
    let mut config = Config::new(dir.path().to_owned());
    config.admission = AdmissionLimits {
        max_live_total: 1,
        ..AdmissionLimits::default()
    };
    let daemon = Daemon::new(config, Arc::clone(&store), tier.clone()).unwrap();

    let failed = daemon.create(&key, request(), "req-1").await;
    // A locked database is the store being unavailable (503).
    let Err(DaemonError::Unavailable(_)) = failed else {
        panic!(
            "the create whose store write failed answered {:?}",
            failed.map(|c| c.row.id)
        );
    };
    let first = "sbx-0000000000000001";
    assert_eq!(
        *tier.destroyed.lock().unwrap(),
        [first],
        "the sandbox the backend started was not destroyed"
    );
    assert!(daemon.running_ids().is_empty(), "a sandbox is left live");
    let rows = store.lock().unwrap().live_sandboxes().unwrap();
    assert!(
        rows.is_empty(),
        "rows left in a live state: {:?}",
        rows.iter()
            .map(|r| (&r.id, r.state.as_str()))
            .collect::<Vec<_>>()
    );
    let row = store.lock().unwrap().get_sandbox(first).unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.state_reason.as_deref()),
        ("dead", Some("create_failed"))
    );

    // The permit came back: a cap of one live sandbox admits the next.
    let created = daemon
        .create(&key, request(), "req-2")
        .await
        .unwrap_or_else(|e| panic!("the next create under max_live 1: {e}"));
    assert_eq!(created.row.state.as_str(), "running");
    assert_eq!(daemon.running_ids(), std::slice::from_ref(&created.row.id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_requester_goes_away_mid_launch_is_torn_down_and_frees_its_slot() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let store = Store::open(&db).unwrap();
    let (key, _) = store.create_key("admin", true).unwrap();
    let store = Arc::new(Mutex::new(store));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let tier = Arc::new(LockingTier::new(db, 0, Some(Arc::clone(&gate))));
    let mut config = Config::new(dir.path().to_owned());
    config.admission = AdmissionLimits {
        max_live_total: 1,
        ..AdmissionLimits::default()
    };
    let daemon = Daemon::new(config, Arc::clone(&store), tier.clone()).unwrap();

    // The requester goes away (its future is dropped, as a handler's is
    // when its client disconnects) while the backend is starting the sandbox.
    let requester = tokio::spawn({
        let daemon = daemon.clone();
        let key = key.clone();
        async move {
            daemon
                .create(&key, request(), "req-1")
                .await
                .map(|c| c.row.id)
        }
    });
    let first = "sbx-0000000000000001";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !tier.running.lock().unwrap().contains(first) {
        assert!(
            std::time::Instant::now() < deadline,
            "the create never reached the backend"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    requester.abort();
    assert!(requester.await.unwrap_err().is_cancelled());
    // The backend finishes starting it; nobody is waiting for it.
    gate.add_permits(1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !tier.running.lock().unwrap().is_empty() || !daemon.running_ids().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned sandbox still runs: backend {:?}, daemon {:?}",
            tier.running.lock().unwrap(),
            daemon.running_ids()
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !store.lock().unwrap().live_sandboxes().unwrap().is_empty() {
        assert!(std::time::Instant::now() < deadline, "its row stays live");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }

    // The permit came back: a cap of one live sandbox admits the next.
    gate.add_permits(1);
    let created = daemon
        .create(&key, request(), "req-2")
        .await
        .unwrap_or_else(|e| panic!("the next create under max_live 1: {e}"));
    assert_eq!(created.row.state.as_str(), "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_set_while_the_sandbox_starts_reaches_the_backend() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let store = Store::open(&db).unwrap();
    let (key, _) = store.create_key("admin", true).unwrap();
    let store = Arc::new(Mutex::new(store));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let tier = Arc::new(LockingTier::new(db, 0, Some(Arc::clone(&gate))));
    let daemon = Daemon::new(Config::new(dir.path().to_owned()), store, tier.clone()).unwrap();

    let creating = tokio::spawn({
        let daemon = daemon.clone();
        let key = key.clone();
        async move { daemon.create(&key, request(), "req-1").await.map(|c| c.row) }
    });
    let id = "sbx-0000000000000001";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !tier.running.lock().unwrap().contains(id) {
        assert!(
            std::time::Instant::now() < deadline,
            "the create never reached the backend"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let extended = daemon
        .set_timeout(&key, id, std::time::Duration::from_secs(3_000))
        .unwrap();
    gate.add_permits(1);
    let row = creating.await.unwrap().unwrap();
    assert_eq!(row.expires_at, extended.expires_at);
    assert_eq!(
        *tier.deadlines.lock().unwrap(),
        [(id.to_owned(), extended.expires_at)],
        "the backend did not learn the timeout set while it started the sandbox"
    );
}
