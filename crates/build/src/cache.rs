//! Cache keys: a step's key is a digest of everything that can change
//! what the step makes, so a build whose step has the key of a layer
//! already made reuses that layer instead of running the step again; and
//! because each key covers its parent's, a changed step changes the key of
//! every step after it and of none before.
//!
//! What goes in, through a versioned, length-prefixed encoding
//! ([`KEY_VERSION`]) into SHA-256 (`sha256:<hex>`):
//!
//! - [`base_key`]: the base's digest: the configuration digest of a
//!   template or a pulled image, or [`SCRATCH_DIGEST`]. A base that
//!   changes under the same name changes every key.
//! - [`step_key`]: the parent key (the base's for the first step), the
//!   whole step (every field: a RUN's command and its form, its user and
//!   its variables; a COPY's sources as written, destination, `--chown`
//!   and `--chmod`; an ENV's variables in order; a WORKDIR's path; a
//!   USER's user), the configuration in effect before it
//!   ([`RunConfig`]: the environment in order, the working directory,
//!   the user), and for a COPY the digest of its sources in the context
//!   ([`crate::context::SourcesDigest`], which covers their paths, types,
//!   modes, symlink targets and contents).
//!
//! Not in it: the time, the host, the build context's path, the owners
//! and times of its files, and anything a RUN reads from outside its
//! inputs (the network, for one: a RUN that downloads is not run again
//! while its key stands, as with Docker's cache). An executor that adds
//! an input of its own to a step (a network policy, a tier) must add it
//! to the key, and a change of what a key means bumps [`KEY_VERSION`].

use crate::context::SourcesDigest;
use crate::spec::{BuildSpec, Command, RunConfig, Step};
use sha2::{Digest, Sha256};

/// The version of the keys' encoding.
pub const KEY_VERSION: u64 = 1;
/// The digest [`base_key`] takes for `FROM scratch`.
pub const SCRATCH_DIGEST: &str = "scratch";

/// What a step's key covers besides the step and its parent.
#[derive(Debug, Clone, Copy)]
pub struct StepInputs<'a> {
    /// The configuration in effect before the step.
    pub config: &'a RunConfig,
    /// For a COPY, the digest of its sources ([`crate::context`]); `None`
    /// for other steps.
    pub sources: Option<&'a SourcesDigest>,
}

/// `sha256:` and the lower-case hex of `digest`.
pub(crate) fn hex_digest(digest: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(7 + digest.len() * 2);
    out.push_str("sha256:");
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
    }
    out
}

struct Encoder(Sha256);

impl Encoder {
    fn new(domain: &str) -> Encoder {
        let mut e = Encoder(Sha256::new());
        e.str(domain);
        e.u64(KEY_VERSION);
        e
    }

    fn u64(&mut self, n: u64) {
        self.0.update(n.to_le_bytes());
    }

    fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.0.update(s.as_bytes());
    }

    fn opt(&mut self, s: Option<&str>) {
        match s {
            None => self.u64(0),
            Some(s) => {
                self.u64(1);
                self.str(s);
            }
        }
    }

    fn list(&mut self, items: &[String]) {
        self.u64(items.len() as u64);
        for item in items {
            self.str(item);
        }
    }

    fn pairs<'a>(&mut self, count: usize, pairs: impl Iterator<Item = (&'a String, &'a String)>) {
        self.u64(count as u64);
        for (name, value) in pairs {
            self.str(name);
            self.str(value);
        }
    }

    fn finish(self) -> String {
        hex_digest(self.0.finalize().as_slice())
    }
}

/// The key a build starts from: its base's digest.
pub fn base_key(base_digest: &str) -> String {
    let mut e = Encoder::new("airlock-build base");
    e.str(base_digest);
    e.finish()
}

/// The key of `step` on top of `parent` (see the module documentation).
pub fn step_key(parent: &str, step: &Step, inputs: &StepInputs<'_>) -> String {
    let mut e = Encoder::new("airlock-build step");
    e.str(parent);
    match step {
        Step::Run { command, user, env } => {
            e.str("run");
            match command {
                Command::Shell(line) => {
                    e.str("shell");
                    e.str(line);
                }
                Command::Exec(args) => {
                    e.str("exec");
                    e.list(args);
                }
            }
            e.opt(user.as_deref());
            e.pairs(env.len(), env.iter());
        }
        Step::Copy {
            sources,
            dest,
            chown,
            chmod,
        } => {
            e.str("copy");
            e.list(sources);
            e.str(dest);
            e.opt(chown.as_deref());
            match chmod {
                None => e.u64(0),
                Some(mode) => {
                    e.u64(1);
                    e.u64(u64::from(*mode));
                }
            }
        }
        Step::Env { vars } => {
            e.str("env");
            e.pairs(vars.len(), vars.iter().map(|(n, v)| (n, v)));
        }
        Step::Workdir { path } => {
            e.str("workdir");
            e.str(path);
        }
        Step::User { user } => {
            e.str("user");
            e.str(user);
        }
    }
    let config = inputs.config;
    e.str("config");
    e.pairs(config.env.len(), config.env.iter().map(|(n, v)| (n, v)));
    e.str(&config.workdir);
    e.str(&config.user);
    e.opt(inputs.sources.map(|s| s.digest.as_str()));
    e.finish()
}

/// The keys of every step of `spec`, in order, from the base's key and
/// configuration; `sources` gives the digest of a COPY's sources (its
/// index and sources), [`crate::context::Context::hash_sources`] for one.
pub fn keys<E>(
    base_key: &str,
    base: &RunConfig,
    spec: &BuildSpec,
    mut sources: impl FnMut(usize, &[String]) -> Result<SourcesDigest, E>,
) -> Result<Vec<String>, E> {
    let mut config = base.clone();
    let mut parent = base_key.to_owned();
    let mut keys = Vec::with_capacity(spec.steps.len());
    for (index, step) in spec.steps.iter().enumerate() {
        let digest = match step {
            Step::Copy { sources: s, .. } => Some(sources(index, s)?),
            _ => None,
        };
        let key = step_key(
            &parent,
            step,
            &StepInputs {
                config: &config,
                sources: digest.as_ref(),
            },
        );
        config.apply(step);
        keys.push(key.clone());
        parent = key;
    }
    Ok(keys)
}
