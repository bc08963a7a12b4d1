//! Pure building blocks of the airlock control plane (the `core/` box of
//! DESIGN.md), kept free of I/O so the daemon can lean on them and tests can
//! pin them down exactly.
//!
//! - [`lifecycle`]: the sandbox state machine. A [`State`] moves only through
//!   [`next`], a pure function over a complete (state, [`Action`]) table;
//!   anything the table does not allow is an [`IllegalTransition`].
//! - [`admission`]: caps on live sandboxes (global and per API key), a limit on
//!   concurrent creations and a bounded FIFO queue in front of them. Callers
//!   past the queue or the caps are [`Rejected`] at once with a `Retry-After`
//!   hint, which the API turns into `429`.
//!
//! ```
//! use airlock_core::{next, Action, Admission, AdmissionLimits, DeadReason, State};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let admission = Admission::new(AdmissionLimits::default())?;
//! let permit = admission.admit("key-1").await?; // or 429 with `retry_after`
//! let mut state = State::Creating;
//! // ... create the sandbox ...
//! state = next(state, Action::Started)?;
//! let lease = permit.succeeded(); // held while the sandbox lives
//!
//! state = next(state, Action::Stop(DeadReason::Deleted))?;
//! // ... teardown ...
//! state = next(state, Action::Exited(DeadReason::Deleted))?;
//! drop(lease);
//! assert_eq!(state, State::Dead(DeadReason::Deleted));
//! assert_eq!(admission.snapshot().live_total, 0);
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

pub mod admission;
pub mod lifecycle;

pub use admission::{
    Admission, AdmissionLimits, AdmissionStats, CreatePermit, LimitsError, LiveCapScope, LiveLease,
    RejectReason, Rejected,
};
pub use lifecycle::{next, Action, DeadReason, IllegalTransition, ParseStateError, State};
