//! The front half of template builds (`airlock template build`, the e2b
//! Template SDK): everything that can be decided before a step runs.
//!
//! - [`spec`]: a build as data ([`spec::BuildSpec`]), bounded and checked,
//!   whatever wrote it.
//! - [`dockerfile`]: a Dockerfile parsed into a spec, with what it cannot
//!   build refused by line.
//! - [`cache`]: each step's cache key, a digest of everything that can
//!   change what the step makes.
//! - [`context`]: the build context's files a COPY names, selected without
//!   leaving the context directory, hashed for the key and packed as a tar
//!   stream for the sandbox that runs the build.
//!
//! Running the steps (a sandbox per RUN, a layer per RUN and COPY) is the
//! daemon's.
#![forbid(unsafe_code)]

pub mod cache;
pub mod context;
pub mod dockerfile;
pub mod spec;

pub use spec::{Base, BuildSpec, Command, RunConfig, StartConfig, Step, MAX_STEPS};
