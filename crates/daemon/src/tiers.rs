//! The tier registry: the backends this daemon runs sandboxes on, built
//! from their probes at start (as cloud-hypervisor builds its hypervisor
//! from what the host offers), and what routes every call about a sandbox
//! to its tier's backend. Nothing else in the daemon knows which tiers
//! exist or what is inside one.

use crate::DaemonError;
use airlock_backend::{Backend, Resources, Unavailable};
use airlock_policy::Tier;
use serde::Serialize;
use std::sync::Arc;

/// The tiers of this daemon: the available ones by their backends, and
/// the others with why they are not.
pub struct Tiers {
    available: Vec<Arc<dyn Backend>>,
    unavailable: Vec<(Tier, Unavailable)>,
}

/// A tier as `GET /v1/tiers` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TierStatus {
    pub tier: Tier,
    pub available: bool,
    /// Why it is not available, in a sentence that says what would fix it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Tiers {
    /// Probes each of `candidates`: those that can run here serve their
    /// tier (the first of a tier wins), the others are kept with their
    /// reason.
    pub fn probe(candidates: Vec<Arc<dyn Backend>>) -> Tiers {
        let mut tiers = Tiers {
            available: Vec::new(),
            unavailable: Vec::new(),
        };
        for backend in candidates {
            let tier = backend.tier();
            if tiers.available.iter().any(|b| b.tier() == tier) {
                continue;
            }
            match backend.probe() {
                Ok(()) => {
                    tiers.unavailable.retain(|(t, _)| *t != tier);
                    tiers.available.push(backend);
                }
                Err(reason) => {
                    if !tiers.unavailable.iter().any(|(t, _)| *t == tier) {
                        tiers.unavailable.push((tier, reason));
                    }
                }
            }
        }
        tiers
    }

    /// The backend of `tier`, or why a sandbox cannot run there (a 400:
    /// the client chose the tier).
    pub fn get(&self, tier: Tier) -> Result<&Arc<dyn Backend>, DaemonError> {
        if let Some(backend) = self.available.iter().find(|b| b.tier() == tier) {
            return Ok(backend);
        }
        Err(DaemonError::BadInput(
            match self.unavailable.iter().find(|(t, _)| *t == tier) {
                Some((_, reason)) => reason.to_string(),
                None => format!("the {} tier is not served by this daemon", tier.as_str()),
            },
        ))
    }

    /// The backend that recorded `resources`.
    pub fn of(&self, resources: &Resources) -> Result<&Arc<dyn Backend>, DaemonError> {
        self.get(resources.tier())
    }

    /// Every available backend.
    pub fn all(&self) -> &[Arc<dyn Backend>] {
        &self.available
    }

    /// Every tier this daemon knows of, available or not.
    pub fn statuses(&self) -> Vec<TierStatus> {
        let mut statuses: Vec<TierStatus> = self
            .available
            .iter()
            .map(|b| TierStatus {
                tier: b.tier(),
                available: true,
                reason: None,
            })
            .chain(self.unavailable.iter().map(|(tier, reason)| TierStatus {
                tier: *tier,
                available: false,
                reason: Some(reason.to_string()),
            }))
            .collect();
        statuses.sort_by_key(|s| s.tier.as_str());
        statuses
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use airlock_backend::{
        AdoptError, CreateError, DeadlineError, DestroyError, Instance, Reconciled, Usage,
    };
    use airlock_policy::SandboxSpec;
    use std::collections::HashSet;

    /// A tier that is available or not, and runs nothing.
    struct Probed(Result<(), &'static str>);

    #[async_trait::async_trait]
    impl Backend for Probed {
        fn tier(&self) -> Tier {
            Tier::Process
        }
        fn probe(&self) -> Result<(), Unavailable> {
            self.0.map_err(|reason| Unavailable {
                tier: "process",
                reason: reason.to_owned(),
            })
        }
        fn reserve_id(&self, _: &SandboxSpec) -> String {
            "sbx-0000000000000000".into()
        }
        fn unreserve(&self, _: &str) {}
        async fn create(&self, _: &str, _: &SandboxSpec) -> Result<Instance, CreateError> {
            Err(CreateError::Failed("runs nothing".into()))
        }
        async fn adopt(&self, _: &str, _: &Resources) -> Result<Instance, AdoptError> {
            Err(AdoptError::WrongTier)
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

    #[test]
    fn an_unavailable_tier_is_refused_with_its_probes_sentence() {
        let tiers = Tiers::probe(vec![Arc::new(Probed(Err(
            "it needs root; run the daemon as root",
        )))]);
        match tiers.get(Tier::Process) {
            Err(DaemonError::BadInput(m)) => assert_eq!(
                m,
                "the process tier is not available here: it needs root; run the daemon as root"
            ),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("an unavailable tier was served"),
        }
        assert!(tiers.all().is_empty());
        assert_eq!(
            tiers.statuses(),
            [TierStatus {
                tier: Tier::Process,
                available: false,
                reason: Some(
                    "the process tier is not available here: it needs root; run the daemon as root"
                        .into()
                ),
            }]
        );
    }

    #[test]
    fn the_first_available_backend_of_a_tier_serves_it() {
        let tiers = Tiers::probe(vec![
            Arc::new(Probed(Err("not this one"))),
            Arc::new(Probed(Ok(()))),
        ]);
        assert!(tiers.get(Tier::Process).is_ok());
        assert_eq!(tiers.all().len(), 1);
        assert_eq!(
            tiers.statuses(),
            [TierStatus {
                tier: Tier::Process,
                available: true,
                reason: None,
            }]
        );
    }
}
