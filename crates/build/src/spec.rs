//! A build as data, whatever wrote it: the Dockerfile parser
//! ([`crate::dockerfile`]) makes one, and so will the e2b Template SDK's
//! steps (JSON). [`BuildSpec::validate`] is the one check of a spec from
//! anywhere: every list and string is bounded, and a spec the parser
//! returns always passes it.
//!
//! A spec says what the Dockerfile (or the SDK) itself sets. What the base
//! gives (its environment, working directory, user, entrypoint and
//! command) is the executor's to look up; [`RunConfig`] is the
//! configuration in effect at a step, the base's changed by the steps
//! before it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The most steps a build may have (RUN, COPY, ENV, WORKDIR, USER).
pub const MAX_STEPS: usize = 256;
/// The longest RUN command, CMD or ENTRYPOINT, in bytes (the sum of its
/// arguments in exec form).
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// The most arguments of a command in exec form.
pub const MAX_ARGS: usize = 4096;
/// The longest path, source, destination or image reference, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// The longest variable name, user or `--chown` owner, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// The longest variable value, in bytes.
pub const MAX_VALUE_BYTES: usize = 32 * 1024;
/// The most variables of one step or of the start configuration.
pub const MAX_VARS: usize = 1024;
/// The most sources of one COPY.
pub const MAX_SOURCES: usize = 1024;
/// The most bytes of all the strings of a spec together.
pub const MAX_TOTAL_BYTES: usize = 4 * 1024 * 1024;
/// The longest template name (as the daemon's template names are).
pub const MAX_TEMPLATE_NAME: usize = 128;

/// One build: a base, the steps on top of it, and how its sandboxes start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildSpec {
    pub from: Base,
    #[serde(default)]
    pub steps: Vec<Step>,
    #[serde(default)]
    pub start: StartConfig,
}

/// What a build starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Base {
    /// A template of the daemon's, by name (`NAME` or `NAME@sha256:<hex>`).
    Template { name: String },
    /// An image of a registry, pulled as `airlock template pull` does.
    Image { reference: String },
    /// Nothing: an empty root filesystem.
    // A struct variant, so that fields beside its tag are refused.
    Scratch {},
}

/// One step of a build. RUN and COPY change files (a layer each); ENV,
/// WORKDIR and USER change the configuration in effect for the steps after
/// them (WORKDIR also makes its directory, as Docker does). Every step has
/// a cache key ([`crate::cache`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// A command run in a sandbox of the build so far, in the working
    /// directory and as the user in effect (or `user`, e2b's
    /// `run_cmd(user=)`), with the environment in effect.
    Run {
        command: Command,
        /// The user of this command only.
        #[serde(default)]
        user: Option<String>,
        /// Variables of this command only: the Dockerfile's ARG values in
        /// effect. The executor sets each one the environment in effect
        /// has no value for (an ENV of the same name wins, as in Docker).
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
    /// Files of the build context copied in (Dockerfile `COPY`, and `ADD`
    /// of local files). `sources` are relative to the context (globs `*`,
    /// `?` and `[...]` in their last component); a directory's contents
    /// are copied, not the directory itself. `dest` is absolute, or
    /// relative to the working directory in effect; it is a directory when
    /// it ends with `/` (or is `.`), when the sources are more than one,
    /// or when it is one already.
    Copy {
        sources: Vec<String>,
        dest: String,
        /// `user[:group]` owning what is copied (names or numbers); root
        /// when `None`.
        #[serde(default)]
        chown: Option<String>,
        /// The permission bits of everything copied (at most `0o7777`);
        /// the context's own when `None`.
        #[serde(default)]
        chmod: Option<u32>,
    },
    /// Variables set for every later step and in the image's
    /// configuration, in order (a later one of the same name wins).
    Env { vars: Vec<(String, String)> },
    /// The working directory of later steps and of the image: absolute,
    /// or relative to the one in effect.
    Workdir { path: String },
    /// The user (`name`, `uid`, `name:group`, `uid:gid`) of later steps
    /// and of the image.
    User { user: String },
}

/// A command: a string for `/bin/sh -c`, or an argument vector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    Shell(String),
    Exec(Vec<String>),
}

/// What the image configuration records of the build itself, its final
/// values after all steps. `None` (and an empty `env`) leave the base's
/// value; `Some(vec![])` clears it (Docker clears an inherited CMD when
/// the Dockerfile sets ENTRYPOINT but no CMD).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StartConfig {
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Option<Vec<String>>,
    /// Variables set over the base's, each name once, in the order first
    /// set.
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub user: Option<String>,
}

/// Where in a spec a check failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Where {
    From,
    /// Steps counted from 1.
    Step(usize),
    Start,
}

impl fmt::Display for Where {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Where::From => f.write_str("the base"),
            Where::Step(n) => write!(f, "step {n}"),
            Where::Start => f.write_str("the start configuration"),
        }
    }
}

/// Why a spec is not one airlock builds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("the build has {steps} steps; at most {MAX_STEPS} are allowed")]
    TooManySteps { steps: usize },
    #[error("the build's strings come to more than {MAX_TOTAL_BYTES} bytes")]
    TooLarge,
    #[error("{at}: {what} is longer than {max} bytes")]
    TooLong {
        at: Where,
        what: &'static str,
        max: usize,
    },
    #[error("{at}: {what} has more than {max} entries")]
    TooMany {
        at: Where,
        what: &'static str,
        max: usize,
    },
    #[error("{at}: {what} is empty")]
    Empty { at: Where, what: &'static str },
    #[error("{at}: {what} contains a NUL byte")]
    Nul { at: Where, what: &'static str },
    #[error("{at}: {name:?} cannot name a variable (it must be non-empty, without `=`)")]
    VariableName { at: Where, name: String },
    #[error("{at}: {name:?} is not a template name (letters, digits and ._-, optionally @sha256:<digest>)")]
    TemplateName { at: Where, name: String },
    #[error("{at}: {reference:?} is not an image reference (no spaces or control characters)")]
    ImageReference { at: Where, reference: String },
    #[error("{at}: the source {path:?} {why}")]
    Source {
        at: Where,
        path: String,
        why: &'static str,
    },
    #[error("{at}: {owner:?} is not an owner (`user[:group]`, names or numbers)")]
    Owner { at: Where, owner: String },
    #[error("{at}: {user:?} is not a user (`user[:group]`, names or numbers, no spaces)")]
    User { at: Where, user: String },
    #[error("{at}: the mode {mode:#o} has bits beyond 0o7777")]
    Mode { at: Where, mode: u32 },
}

/// Adds up and checks the strings of a spec.
struct Checker {
    at: Where,
    total: usize,
}

impl Checker {
    fn text(&mut self, what: &'static str, s: &str, max: usize) -> Result<(), SpecError> {
        let at = self.at;
        if s.len() > max {
            return Err(SpecError::TooLong { at, what, max });
        }
        if s.contains('\0') {
            return Err(SpecError::Nul { at, what });
        }
        self.total += s.len();
        if self.total > MAX_TOTAL_BYTES {
            return Err(SpecError::TooLarge);
        }
        Ok(())
    }

    fn nonempty(&mut self, what: &'static str, s: &str, max: usize) -> Result<(), SpecError> {
        if s.is_empty() {
            return Err(SpecError::Empty { at: self.at, what });
        }
        self.text(what, s, max)
    }

    fn count(&self, what: &'static str, n: usize, max: usize) -> Result<(), SpecError> {
        if n > max {
            return Err(SpecError::TooMany {
                at: self.at,
                what,
                max,
            });
        }
        Ok(())
    }

    fn args(&mut self, what: &'static str, args: &[String]) -> Result<(), SpecError> {
        self.count(what, args.len(), MAX_ARGS)?;
        let mut bytes = 0usize;
        for arg in args {
            bytes += arg.len();
            if bytes > MAX_COMMAND_BYTES {
                return Err(SpecError::TooLong {
                    at: self.at,
                    what,
                    max: MAX_COMMAND_BYTES,
                });
            }
            self.text(what, arg, MAX_COMMAND_BYTES)?;
        }
        Ok(())
    }

    fn var(&mut self, name: &str, value: &str) -> Result<(), SpecError> {
        if !is_variable_name(name) {
            return Err(SpecError::VariableName {
                at: self.at,
                name: truncated(name),
            });
        }
        self.text("a variable name", name, MAX_NAME_BYTES)?;
        self.text("a variable value", value, MAX_VALUE_BYTES)
    }

    fn user(&mut self, user: &str) -> Result<(), SpecError> {
        self.nonempty("a user", user, MAX_NAME_BYTES)?;
        if !is_owner(user) {
            return Err(SpecError::User {
                at: self.at,
                user: user.to_owned(),
            });
        }
        Ok(())
    }

    fn command(&mut self, command: &Command) -> Result<(), SpecError> {
        match command {
            Command::Shell(line) => {
                if line.trim().is_empty() {
                    return Err(SpecError::Empty {
                        at: self.at,
                        what: "a command",
                    });
                }
                self.text("a command", line, MAX_COMMAND_BYTES)
            }
            Command::Exec(args) => {
                if args.is_empty() {
                    return Err(SpecError::Empty {
                        at: self.at,
                        what: "a command",
                    });
                }
                self.args("a command", args)
            }
        }
    }
}

/// A name shortened for an error message.
fn truncated(s: &str) -> String {
    s.chars().take(64).collect()
}

/// Whether `name` may name a variable: non-empty, no `=`, no NUL (Docker
/// allows any other name).
pub fn is_variable_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['=', '\0'])
}

/// Whether `owner` is `user[:group]`: each a non-empty name or number of
/// printable characters other than `:` and spaces.
pub fn is_owner(owner: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p.len() <= MAX_NAME_BYTES
            && p.chars()
                .all(|c| !c.is_whitespace() && !c.is_control() && c != ':')
    };
    match owner.split_once(':') {
        Some((user, group)) => part(user) && part(group),
        None => part(owner),
    }
}

/// Whether `name` (with an optional `@sha256:<64 hex>` pin) names a
/// template: 1 to 128 of letters, digits and `._-`, not starting with `.`
/// or `-`, no `..`. (The daemon's template names may also hold `:`; in a
/// FROM a `:` is an image's tag, see [`crate::dockerfile`].)
pub fn is_template_reference(name: &str) -> bool {
    let (bare, pin) = match name.split_once('@') {
        Some((bare, pin)) => (bare, Some(pin)),
        None => (name, None),
    };
    let bare_ok = (1..=MAX_TEMPLATE_NAME).contains(&bare.len())
        && bare
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !bare.starts_with(['.', '-'])
        && !bare.contains("..");
    let pin_ok = pin.is_none_or(|pin| {
        pin.strip_prefix("sha256:").is_some_and(|hex| {
            hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
    });
    bare_ok && pin_ok
}

/// Why a COPY source is not one: `None` if it is one. Sources are relative
/// to the build context, without `..`.
pub fn source_problem(source: &str) -> Option<&'static str> {
    if source.is_empty() {
        Some("is empty")
    } else if source.starts_with('/') {
        Some("is absolute; sources are relative to the build context")
    } else if source.split('/').any(|c| c == "..") {
        Some("climbs out of the build context with `..`")
    } else {
        None
    }
}

impl BuildSpec {
    /// Checks every bound and rule of this module's documentation.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.steps.len() > MAX_STEPS {
            return Err(SpecError::TooManySteps {
                steps: self.steps.len(),
            });
        }
        let mut c = Checker {
            at: Where::From,
            total: 0,
        };
        match &self.from {
            Base::Template { name } => {
                if !is_template_reference(name) {
                    return Err(SpecError::TemplateName {
                        at: c.at,
                        name: truncated(name),
                    });
                }
                c.text("a template name", name, MAX_PATH_BYTES)?;
            }
            Base::Image { reference } => {
                c.nonempty("an image reference", reference, MAX_PATH_BYTES)?;
                if reference
                    .chars()
                    .any(|ch| ch.is_whitespace() || ch.is_control())
                {
                    return Err(SpecError::ImageReference {
                        at: c.at,
                        reference: truncated(reference),
                    });
                }
            }
            Base::Scratch {} => {}
        }
        for (index, step) in self.steps.iter().enumerate() {
            c.at = Where::Step(index + 1);
            check_step(&mut c, step)?;
        }
        c.at = Where::Start;
        let start = &self.start;
        if let Some(entrypoint) = &start.entrypoint {
            c.args("the entrypoint", entrypoint)?;
        }
        if let Some(cmd) = &start.cmd {
            c.args("the command", cmd)?;
        }
        c.count("the environment", start.env.len(), MAX_VARS)?;
        for (name, value) in &start.env {
            c.var(name, value)?;
        }
        if let Some(workdir) = &start.workdir {
            c.nonempty("the working directory", workdir, MAX_PATH_BYTES)?;
        }
        if let Some(user) = &start.user {
            c.user(user)?;
        }
        Ok(())
    }
}

/// Checks one step as [`BuildSpec::validate`] does, adding its strings to
/// `total` (refused past [`MAX_TOTAL_BYTES`]).
pub(crate) fn check_step_at(step: &Step, at: Where, total: &mut usize) -> Result<(), SpecError> {
    let mut c = Checker { at, total: *total };
    check_step(&mut c, step)?;
    *total = c.total;
    Ok(())
}

/// Checks a CMD or ENTRYPOINT as [`BuildSpec::validate`] does.
pub(crate) fn check_start_args(what: &'static str, args: &[String]) -> Result<(), SpecError> {
    Checker {
        at: Where::Start,
        total: 0,
    }
    .args(what, args)
}

fn check_step(c: &mut Checker, step: &Step) -> Result<(), SpecError> {
    match step {
        Step::Run { command, user, env } => {
            c.command(command)?;
            if let Some(user) = user {
                c.user(user)?;
            }
            c.count("the variables", env.len(), MAX_VARS)?;
            for (name, value) in env {
                c.var(name, value)?;
            }
        }
        Step::Copy {
            sources,
            dest,
            chown,
            chmod,
        } => {
            if sources.is_empty() {
                return Err(SpecError::Empty {
                    at: c.at,
                    what: "the list of sources",
                });
            }
            c.count("the sources", sources.len(), MAX_SOURCES)?;
            for source in sources {
                c.text("a source", source, MAX_PATH_BYTES)?;
                if let Some(why) = source_problem(source) {
                    return Err(SpecError::Source {
                        at: c.at,
                        path: truncated(source),
                        why,
                    });
                }
            }
            c.nonempty("the destination", dest, MAX_PATH_BYTES)?;
            if let Some(owner) = chown {
                c.text("the owner", owner, MAX_NAME_BYTES)?;
                if !is_owner(owner) {
                    return Err(SpecError::Owner {
                        at: c.at,
                        owner: truncated(owner),
                    });
                }
            }
            if let Some(mode) = *chmod {
                if mode > 0o7777 {
                    return Err(SpecError::Mode { at: c.at, mode });
                }
            }
        }
        Step::Env { vars } => {
            if vars.is_empty() {
                return Err(SpecError::Empty {
                    at: c.at,
                    what: "the list of variables",
                });
            }
            c.count("the variables", vars.len(), MAX_VARS)?;
            for (name, value) in vars {
                c.var(name, value)?;
            }
        }
        Step::Workdir { path } => c.nonempty("the working directory", path, MAX_PATH_BYTES)?,
        Step::User { user } => c.user(user)?,
    }
    Ok(())
}

/// The configuration in effect at a step: the base's, changed by the ENV,
/// WORKDIR and USER steps before it. Keys cover it
/// ([`crate::cache::StepInputs`]); the executor runs a RUN with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunConfig {
    /// In order, each name once.
    pub env: Vec<(String, String)>,
    /// Absolute.
    pub workdir: String,
    /// Empty for the default user (root).
    pub user: String,
}

impl Default for RunConfig {
    fn default() -> RunConfig {
        RunConfig {
            env: Vec::new(),
            workdir: "/".to_owned(),
            user: String::new(),
        }
    }
}

impl RunConfig {
    /// The configuration of a base: `KEY=VALUE` entries (one without `=`
    /// is a name with an empty value), its working directory (`/` when
    /// none) and user.
    pub fn of_base(env: &[String], workdir: Option<&str>, user: Option<&str>) -> RunConfig {
        let mut config = RunConfig::default();
        for entry in env {
            let (name, value) = entry.split_once('=').unwrap_or((entry, ""));
            config.set(name, value);
        }
        if let Some(workdir) = workdir.filter(|w| !w.is_empty()) {
            config.workdir = resolve_path("/", workdir);
        }
        config.user = user.unwrap_or_default().to_owned();
        config
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Sets `name` where it is, or at the end.
    pub fn set(&mut self, name: &str, value: &str) {
        match self.env.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => value.clone_into(v),
            None => self.env.push((name.to_owned(), value.to_owned())),
        }
    }

    /// The configuration after `step`.
    pub fn apply(&mut self, step: &Step) {
        match step {
            Step::Env { vars } => {
                for (name, value) in vars {
                    self.set(name, value);
                }
            }
            Step::Workdir { path } => self.workdir = resolve_path(&self.workdir, path),
            Step::User { user } => user.clone_into(&mut self.user),
            Step::Run { .. } | Step::Copy { .. } => {}
        }
    }

    /// `path` resolved against the working directory: absolute and clean,
    /// ending with `/` when `path` names a directory by its form (ends with
    /// `/`, `/.` or is `.`), as a COPY destination does.
    pub fn resolve_dest(&self, path: &str) -> String {
        let dir_form = path.ends_with('/') || path == "." || path.ends_with("/.");
        let mut resolved = resolve_path(&self.workdir, path);
        if dir_form && !resolved.ends_with('/') {
            resolved.push('/');
        }
        resolved
    }
}

/// `path` made absolute against `base` (itself absolute) and cleaned
/// lexically: no `.`, no empty components, `..` removes the component
/// before it and stops at `/`.
pub fn resolve_path(base: &str, path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    let joined: Vec<&str> = if path.starts_with('/') {
        path.split('/').collect()
    } else {
        base.split('/').chain(path.split('/')).collect()
    };
    for part in joined {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    let mut out = String::with_capacity(path.len() + base.len() + 1);
    for part in parts {
        out.push('/');
        out.push_str(part);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(steps: Vec<Step>) -> BuildSpec {
        BuildSpec {
            from: Base::Scratch {},
            steps,
            start: StartConfig::default(),
        }
    }

    #[test]
    fn resolves_paths() {
        assert_eq!(resolve_path("/", "a/b"), "/a/b");
        assert_eq!(resolve_path("/x/y", "../z/./w/"), "/x/z/w");
        assert_eq!(resolve_path("/x", "/../../etc"), "/etc");
        assert_eq!(resolve_path("/x", ".."), "/");
        let config = RunConfig {
            workdir: "/app".into(),
            ..RunConfig::default()
        };
        assert_eq!(config.resolve_dest("."), "/app/");
        assert_eq!(config.resolve_dest("lib/"), "/app/lib/");
        assert_eq!(config.resolve_dest("x.py"), "/app/x.py");
        assert_eq!(config.resolve_dest("/"), "/");
    }

    #[test]
    fn run_config_applies_steps() {
        let mut config = RunConfig::of_base(&["PATH=/bin".into(), "X".into()], None, None);
        assert_eq!(config.workdir, "/");
        config.apply(&Step::Env {
            vars: vec![
                ("PATH".into(), "/opt:/bin".into()),
                ("Y".into(), "1".into()),
            ],
        });
        config.apply(&Step::Workdir { path: "app".into() });
        config.apply(&Step::Workdir { path: "src".into() });
        config.apply(&Step::User {
            user: "1000:1000".into(),
        });
        assert_eq!(
            config.env,
            vec![
                ("PATH".to_owned(), "/opt:/bin".to_owned()),
                ("X".to_owned(), String::new()),
                ("Y".to_owned(), "1".to_owned())
            ]
        );
        assert_eq!(config.workdir, "/app/src");
        assert_eq!(config.user, "1000:1000");
    }

    #[test]
    fn template_references() {
        assert!(is_template_reference("py"));
        assert!(is_template_reference("my-base.v2"));
        assert!(is_template_reference(&format!(
            "py@sha256:{}",
            "a".repeat(64)
        )));
        assert!(!is_template_reference("py@sha256:abc"));
        assert!(!is_template_reference("py:3"));
        assert!(!is_template_reference("org/py"));
        assert!(!is_template_reference(".hidden"));
        assert!(!is_template_reference(""));
    }

    #[test]
    fn validate_bounds_and_rules() {
        let run = |s: &str| Step::Run {
            command: Command::Shell(s.into()),
            user: None,
            env: BTreeMap::new(),
        };
        assert_eq!(spec(vec![run("true")]).validate(), Ok(()));
        assert_eq!(
            spec(vec![run("true"); MAX_STEPS + 1]).validate(),
            Err(SpecError::TooManySteps {
                steps: MAX_STEPS + 1
            })
        );
        assert!(matches!(
            spec(vec![run(&"x".repeat(MAX_COMMAND_BYTES + 1))]).validate(),
            Err(SpecError::TooLong {
                at: Where::Step(1),
                ..
            })
        ));
        assert!(matches!(
            spec(vec![run("  ")]).validate(),
            Err(SpecError::Empty { .. })
        ));
        assert!(matches!(
            spec(vec![run("a\0b")]).validate(),
            Err(SpecError::Nul { .. })
        ));
        let big = "x".repeat(MAX_COMMAND_BYTES);
        assert_eq!(
            spec(vec![run(&big); 100]).validate(),
            Err(SpecError::TooLarge)
        );
        let copy = |source: &str, chmod| Step::Copy {
            sources: vec![source.into()],
            dest: "/x".into(),
            chown: Some("1000:g".into()),
            chmod,
        };
        assert_eq!(spec(vec![copy("a/*.py", Some(0o755))]).validate(), Ok(()));
        for bad in ["/etc/passwd", "a/../../b", ""] {
            assert!(
                matches!(
                    spec(vec![copy(bad, None)]).validate(),
                    Err(SpecError::Source { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            spec(vec![copy("a", Some(0o17777))]).validate(),
            Err(SpecError::Mode { .. })
        ));
        let env = Step::Env {
            vars: vec![("A=B".into(), "c".into())],
        };
        assert!(matches!(
            spec(vec![env]).validate(),
            Err(SpecError::VariableName { .. })
        ));
        let user = Step::User { user: "a b".into() };
        assert!(matches!(
            spec(vec![user]).validate(),
            Err(SpecError::User { .. })
        ));
        let mut s = spec(vec![]);
        s.from = Base::Template { name: "a/b".into() };
        assert!(matches!(s.validate(), Err(SpecError::TemplateName { .. })));
        s.from = Base::Image {
            reference: "a b".into(),
        };
        assert!(matches!(
            s.validate(),
            Err(SpecError::ImageReference { .. })
        ));
    }

    #[test]
    fn json_fails_closed() {
        let good = r#"{"from":{"type":"image","reference":"python:3.12"},
            "steps":[{"type":"run","command":{"shell":"pip install x"}},
                     {"type":"copy","sources":["."],"dest":"/app/","chmod":493},
                     {"type":"env","vars":[["A","1"]]},
                     {"type":"workdir","path":"/app"},{"type":"user","user":"1000"}],
            "start":{"cmd":["python3"]}}"#;
        let spec: BuildSpec = serde_json::from_str(good).unwrap();
        assert_eq!(spec.steps.len(), 5);
        assert_eq!(spec.validate(), Ok(()));
        let back: BuildSpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
        assert_eq!(back, spec);
        for bad in [
            r#"{"from":{"type":"scratch"},"extra":1}"#,
            r#"{"from":{"type":"scratch","name":"x"}}"#,
            r#"{"from":{"type":"template","name":"x","tag":"y"}}"#,
            r#"{"from":{"type":"scratch"},"steps":[{"type":"run","command":{"shell":"x"},"network":true}]}"#,
            r#"{"from":{"type":"scratch"},"steps":[{"type":"volume","path":"/x"}]}"#,
            r#"{"from":{"type":"scratch"},"start":{"healthcheck":[]}}"#,
            r#"{"steps":[]}"#,
        ] {
            assert!(serde_json::from_str::<BuildSpec>(bad).is_err(), "{bad}");
        }
    }
}
