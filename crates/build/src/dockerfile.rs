//! A Dockerfile read into a [`BuildSpec`], by hand, as Docker's builder
//! reads one (a single stage):
//!
//! - **Lines**: `#` comments; parser directives `# syntax=` (ignored, with
//!   a warning) and `# escape=` (`\` or `` ` ``) before anything else; a
//!   line ending with the escape character continues on the next, where
//!   comment lines and empty lines are skipped; instructions in any case;
//!   errors and warnings name the line an instruction starts on.
//! - **FROM**, exactly once (a second FROM, `FROM … AS name` and
//!   `COPY --from` are multi-stage builds and refused): `scratch` is
//!   [`Base::Scratch`]; a name of letters, digits and `._-` (with an
//!   optional `@sha256:` pin) is a template of the daemon's
//!   ([`Base::Template`]); anything with a `/` or a `:` tag
//!   (`python:3.12`, `docker.io/library/ubuntu`, `localhost:5000/x`) is an
//!   image ([`Base::Image`]).
//! - **ARG** `name[=default] …`, before FROM (only FROM sees those, unless
//!   an ARG after FROM names them again, Docker's rule) and after it; a
//!   build argument overrides a default. The ARGs in effect become a RUN's
//!   [`Step::Run::env`]. Docker's platform arguments (`TARGETARCH`, …) are
//!   there as Docker has them (this machine's platform), and its proxy
//!   arguments (`HTTP_PROXY`, …) reach RUN when given, without an ARG.
//! - **Substitution** (`$VAR`, `${VAR}`, `${VAR:-x}`, `${VAR:+x}`, …, see
//!   [`words`]) in FROM, ARG, ENV, COPY/ADD, WORKDIR and USER, from the ENV
//!   variables (the base's and the Dockerfile's) and then the ARGs in
//!   effect. RUN, CMD and ENTRYPOINT are not substituted: their shell does
//!   it.
//! - **RUN**, **CMD**, **ENTRYPOINT**: exec form (a JSON array of strings)
//!   or shell form (`/bin/sh -c`; anything that is not such an array).
//!   ENTRYPOINT without a CMD in the Dockerfile clears the base's CMD.
//! - **ENV** `k=v k2="v 2"` (every value substituted with the variables as
//!   they were before the instruction) and the legacy `ENV k v w`.
//! - **WORKDIR**, resolved against the one in effect; **USER**.
//! - **COPY** / **ADD** `[--chown=u:g] [--chmod=0755] src… dest` (or the
//!   JSON form): sources relative to the context, a destination resolved
//!   against the working directory, more than one source only into a
//!   destination ending with `/`. ADD of local files is COPY; ADD of a URL,
//!   or of a file named as a tar archive (which Docker would extract), is
//!   refused.
//! - **Refused**, naming the line: ONBUILD, VOLUME, SHELL, heredocs
//!   (`RUN <<EOF`), flags airlock does not implement (`RUN --mount`,
//!   `FROM --platform`, `COPY --link`, …) and unknown instructions.
//! - **Ignored with a warning** ([`Warning::Ignored`]): EXPOSE, LABEL,
//!   MAINTAINER, STOPSIGNAL (metadata that changes nothing airlock runs)
//!   and HEALTHCHECK (airlock does not probe sandboxes).
//!
//! Everything is bounded: the text ([`MAX_DOCKERFILE_BYTES`]), the steps
//! ([`MAX_STEPS`]), every value after substitution, and the spec as
//! [`BuildSpec::validate`] checks it, which a parsed spec always passes.

pub mod words;

use crate::spec::{
    self, is_owner, is_variable_name, resolve_path, source_problem, Base, BuildSpec, Command,
    RunConfig, SpecError, StartConfig, Step, Where, MAX_STEPS, MAX_TOTAL_BYTES, MAX_VARS,
};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
pub use words::SubstError;

/// The largest Dockerfile read.
pub const MAX_DOCKERFILE_BYTES: usize = 1024 * 1024;

/// Build arguments Docker passes to RUN without an ARG naming them.
pub const PROXY_ARGS: [&str; 10] = [
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "FTP_PROXY",
    "ftp_proxy",
    "NO_PROXY",
    "no_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// A parsed Dockerfile: the build, and what was ignored or unused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub spec: BuildSpec,
    pub warnings: Vec<Warning>,
}

/// Something the parser accepted but that has no effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// An instruction or directive that changes nothing airlock builds.
    Ignored {
        line: usize,
        what: &'static str,
        why: &'static str,
    },
    /// A build argument no ARG declares (and not one of [`PROXY_ARGS`]).
    UnusedBuildArg { name: String },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::Ignored { line, what, why } => {
                write!(f, "line {line}: {what} is ignored: {why}")
            }
            Warning::UnusedBuildArg { name } => {
                write!(f, "the build argument {name} is not declared by any ARG")
            }
        }
    }
}

/// Why a Dockerfile cannot be built; every one that comes from a line
/// names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DockerfileError {
    #[error("the Dockerfile is {bytes} bytes; at most {MAX_DOCKERFILE_BYTES} are read")]
    TooLarge { bytes: usize },
    #[error("the Dockerfile has no FROM")]
    NoFrom,
    #[error("line {line}: {instruction} comes before FROM, where only ARG may")]
    BeforeFrom {
        line: usize,
        instruction: &'static str,
    },
    #[error("line {line}: {what}: multi-stage builds are not supported")]
    MultiStage { line: usize, what: &'static str },
    #[error("line {line}: {instruction} is not supported: {why}")]
    Refused {
        line: usize,
        instruction: &'static str,
        why: &'static str,
    },
    #[error("line {line}: {instruction:?} is not a Dockerfile instruction")]
    Unknown { line: usize, instruction: String },
    #[error("line {line}: {instruction} needs {needs}")]
    Arguments {
        line: usize,
        instruction: &'static str,
        needs: &'static str,
    },
    #[error("line {line}: {instruction} {flag} is not supported")]
    Flag {
        line: usize,
        instruction: &'static str,
        flag: String,
    },
    #[error("line {line}: {flag} {value:?} is not {wants}")]
    FlagValue {
        line: usize,
        flag: &'static str,
        value: String,
        wants: &'static str,
    },
    #[error("line {line}: {source}")]
    Substitution { line: usize, source: SubstError },
    #[error("line {line}: the parser directive {name} is given twice")]
    DuplicateDirective { line: usize, name: &'static str },
    #[error("line {line}: the escape character must be \\ or `, not {value:?}")]
    Escape { line: usize, value: String },
    #[error("line {line}: ADD of the URL {url:?} is not supported: download it in a RUN step")]
    AddUrl { line: usize, url: String },
    #[error("line {line}: ADD would extract the archive {archive:?}, which airlock does not do: COPY it and unpack it in a RUN step")]
    AddArchive { line: usize, archive: String },
    #[error("line {line}: {instruction} with a heredoc (<<) is not supported: COPY the file, or write it with printf in RUN")]
    Heredoc {
        line: usize,
        instruction: &'static str,
    },
    #[error(
        "line {line}: {instruction} of more than one source needs a destination ending with /"
    )]
    CopyDestination {
        line: usize,
        instruction: &'static str,
    },
    #[error("line {line}: the build has more than {MAX_STEPS} steps")]
    TooManySteps { line: usize },
    #[error("line {line}: the ARGs in effect are more than {MAX_VARS}, or longer than {MAX_TOTAL_BYTES} bytes in all")]
    TooManyArgs { line: usize },
    #[error("line {line}: {source}")]
    Spec { line: usize, source: SpecError },
}

impl DockerfileError {
    /// The line the error is about, if it is about one.
    pub fn line(&self) -> Option<usize> {
        use DockerfileError::*;
        match self {
            TooLarge { .. } | NoFrom => None,
            BeforeFrom { line, .. }
            | MultiStage { line, .. }
            | Refused { line, .. }
            | Unknown { line, .. }
            | Arguments { line, .. }
            | Flag { line, .. }
            | FlagValue { line, .. }
            | Substitution { line, .. }
            | DuplicateDirective { line, .. }
            | Escape { line, .. }
            | AddUrl { line, .. }
            | AddArchive { line, .. }
            | Heredoc { line, .. }
            | CopyDestination { line, .. }
            | TooManySteps { line }
            | TooManyArgs { line }
            | Spec { line, .. } => Some(*line),
        }
    }
}

/// Parses `text` as a Dockerfile built over an empty base configuration
/// (no environment, working directory `/`, root). Use [`parse_over`] with
/// the base's configuration to build: `$PATH` in an ENV, a relative
/// WORKDIR and the ARGs a RUN gets depend on it. The base is in the result
/// (`spec.from`), and does not depend on the base's configuration.
pub fn parse(text: &str, build_args: &BTreeMap<String, String>) -> Result<Parsed, DockerfileError> {
    parse_over(text, build_args, &RunConfig::default())
}

/// Parses `text` as a Dockerfile built over a base whose configuration is
/// `base` (its environment, working directory and user).
pub fn parse_over(
    text: &str,
    build_args: &BTreeMap<String, String>,
    base: &RunConfig,
) -> Result<Parsed, DockerfileError> {
    if text.len() > MAX_DOCKERFILE_BYTES {
        return Err(DockerfileError::TooLarge { bytes: text.len() });
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut warnings = Vec::new();
    let (escape, lines) = logical_lines(text, &mut warnings)?;
    let mut parser = Parser {
        escape,
        build_args,
        used: BTreeSet::new(),
        meta: BTreeMap::new(),
        from: None,
        args: BTreeMap::new(),
        config: base.clone(),
        env: base.env.iter().cloned().collect(),
        steps: Vec::new(),
        start: StartConfig::default(),
        cmd_set: false,
        total: 0,
        warnings,
    };
    let mut last = 0;
    for (line, text) in &lines {
        last = *line;
        parser.instruction(*line, text)?;
    }
    let Some(from) = parser.from.take() else {
        return Err(DockerfileError::NoFrom);
    };
    for name in build_args.keys() {
        if !parser.used.contains(name)
            && !PROXY_ARGS.contains(&name.as_str())
            && platform_arg(name).is_none()
        {
            parser
                .warnings
                .push(Warning::UnusedBuildArg { name: name.clone() });
        }
    }
    let spec = BuildSpec {
        from,
        steps: parser.steps,
        start: parser.start,
    };
    spec.validate()
        .map_err(|source| DockerfileError::Spec { line: last, source })?;
    Ok(Parsed {
        spec,
        warnings: parser.warnings,
    })
}

/// A `# name=value` parser directive.
fn directive(line: &str) -> Option<(String, &str)> {
    let rest = line.strip_prefix('#')?.trim_start_matches([' ', '\t']);
    let name_len = rest
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(rest.len());
    let name = &rest[..name_len];
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return None;
    }
    let value = rest[name_len..]
        .trim_start_matches([' ', '\t'])
        .strip_prefix('=')?
        .trim_matches([' ', '\t']);
    if value.is_empty() {
        return None;
    }
    Some((name.to_ascii_lowercase(), value))
}

/// The escape character and the instructions of `text`, each with the
/// line it starts on, continuations joined.
fn logical_lines(
    text: &str,
    warnings: &mut Vec<Warning>,
) -> Result<(char, Vec<(usize, String)>), DockerfileError> {
    let mut escape = '\\';
    let mut directives = true;
    let mut seen: BTreeSet<&'static str> = BTreeSet::new();
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (index, raw) in text.split('\n').enumerate() {
        let number = index + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let trimmed = line.trim_start();
        let body = match current.take() {
            None => {
                if directives {
                    if let Some((name, value)) = directive(trimmed) {
                        let name: &'static str = match name.as_str() {
                            "escape" => "escape",
                            "syntax" => "syntax",
                            "check" => "check",
                            // An unknown directive is a comment, and
                            // nothing after a comment is a directive.
                            _ => {
                                directives = false;
                                continue;
                            }
                        };
                        if !seen.insert(name) {
                            return Err(DockerfileError::DuplicateDirective { line: number, name });
                        }
                        match name {
                            "escape" => {
                                escape = match value {
                                    "\\" => '\\',
                                    "`" => '`',
                                    _ => {
                                        return Err(DockerfileError::Escape {
                                            line: number,
                                            value: value.chars().take(16).collect(),
                                        })
                                    }
                                }
                            }
                            "syntax" => warnings.push(Warning::Ignored {
                                line: number,
                                what: "the syntax directive",
                                why: "airlock has one Dockerfile parser of its own",
                            }),
                            _ => warnings.push(Warning::Ignored {
                                line: number,
                                what: "the check directive",
                                why: "airlock does not run Docker's build checks",
                            }),
                        }
                        continue;
                    }
                    directives = false;
                }
                if trimmed.is_empty() || trimmed.starts_with('#') {
                    continue;
                }
                (number, trimmed.to_owned())
            }
            Some((start, mut joined)) => {
                // Inside an instruction comments and empty lines are
                // skipped, and the line is kept as it is.
                if trimmed.starts_with('#') || trimmed.is_empty() {
                    current = Some((start, joined));
                    continue;
                }
                joined.push_str(line);
                (start, joined)
            }
        };
        let (start, mut joined) = body;
        let end = joined.trim_end_matches([' ', '\t']).len();
        if joined[..end].ends_with(escape) {
            joined.truncate(end - escape.len_utf8());
            current = Some((start, joined));
        } else {
            joined.truncate(joined.trim_end().len());
            out.push((start, joined));
        }
    }
    if let Some((start, joined)) = current {
        let joined = joined.trim_end().to_owned();
        if !joined.is_empty() {
            out.push((start, joined));
        }
    }
    Ok((escape, out))
}

/// What a source of ADD names, by its name: Docker would extract these.
fn looks_like_archive(source: &str) -> bool {
    let lower = source.to_ascii_lowercase();
    [
        ".tar",
        ".tar.gz",
        ".tgz",
        ".tar.bz2",
        ".tbz2",
        ".tbz",
        ".tar.xz",
        ".txz",
        ".tar.zst",
        ".tzst",
        ".tar.lzma",
        ".tlz",
    ]
    .iter()
    .any(|suffix| lower.ends_with(suffix))
}

fn is_url(source: &str) -> bool {
    source.contains("://") || source.starts_with("git@")
}

/// Whether `text` has a heredoc (`<<WORD`, `<<-WORD`, `<<"WORD"`) outside
/// quotes.
fn has_heredoc(text: &str, escape: char) -> bool {
    let chars: Vec<char> = text.chars().collect();
    let mut quote: Option<char> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == escape => i += 1,
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '<' && chars.get(i + 1) == Some(&'<') => {
                let mut j = i + 2;
                if chars.get(j) == Some(&'-') {
                    j += 1;
                }
                if matches!(chars.get(j), Some('"' | '\'')) {
                    j += 1;
                }
                if chars
                    .get(j)
                    .is_some_and(|c| c.is_ascii_alphabetic() || *c == '_')
                {
                    return true;
                }
                i = j;
                continue;
            }
            None => {}
        }
        i += 1;
    }
    false
}

/// A JSON array of strings, when `rest` is one.
fn json_array(rest: &str) -> Option<Vec<String>> {
    if !rest.starts_with('[') {
        return None;
    }
    serde_json::from_str(rest).ok()
}

/// The `--name[=value]` flags at the start of `rest`, and what follows.
fn take_flags(mut rest: &str) -> (Vec<(String, Option<String>)>, &str) {
    let mut flags = Vec::new();
    while let Some(after) = rest.strip_prefix("--") {
        let end = after.find(char::is_whitespace).unwrap_or(after.len());
        let token = &after[..end];
        let (name, value) = match token.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (token, None),
        };
        flags.push((name.to_ascii_lowercase(), value));
        rest = after[end..].trim_start();
    }
    (flags, rest)
}

/// The platform arguments Docker sets by itself, for this machine.
fn platform_arg(name: &str) -> Option<String> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    match name {
        "TARGETPLATFORM" | "BUILDPLATFORM" => Some(format!("linux/{arch}")),
        "TARGETOS" | "BUILDOS" => Some("linux".to_owned()),
        "TARGETARCH" | "BUILDARCH" => Some(arch.to_owned()),
        _ => None,
    }
}

/// The base a FROM names (see the module documentation).
fn base_of(image: &str) -> Base {
    if image == "scratch" {
        return Base::Scratch {};
    }
    let bare = image.split('@').next().unwrap_or(image);
    if !bare.contains(['/', ':']) {
        Base::Template {
            name: image.to_owned(),
        }
    } else {
        Base::Image {
            reference: image.to_owned(),
        }
    }
}

/// The octal mode of `--chmod`.
fn octal_mode(value: &str) -> Option<u32> {
    if value.is_empty() || value.len() > 5 || !value.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return None;
    }
    u32::from_str_radix(value, 8).ok().filter(|&m| m <= 0o7777)
}

struct Parser<'a> {
    escape: char,
    build_args: &'a BTreeMap<String, String>,
    /// Build arguments some ARG declared.
    used: BTreeSet<String>,
    /// ARGs before FROM.
    meta: BTreeMap<String, Option<String>>,
    from: Option<Base>,
    /// ARGs after FROM, with their values (`None`: declared, unset).
    args: BTreeMap<String, Option<String>>,
    /// The configuration in effect: the base's, changed by the steps.
    config: RunConfig,
    /// Its environment by name, for lookups.
    env: BTreeMap<String, String>,
    steps: Vec<Step>,
    start: StartConfig,
    cmd_set: bool,
    /// The bytes of the steps' strings so far.
    total: usize,
    warnings: Vec<Warning>,
}

impl Parser<'_> {
    fn expand(&self, line: usize, word: &str) -> Result<String, DockerfileError> {
        let lookup = |name: &str| {
            if self.from.is_none() {
                return match self.meta.get(name) {
                    Some(value) => value.clone(),
                    None => self
                        .build_args
                        .get(name)
                        .cloned()
                        .filter(|_| platform_arg(name).is_some())
                        .or_else(|| platform_arg(name)),
                };
            }
            self.env
                .get(name)
                .cloned()
                .or_else(|| self.args.get(name).cloned().flatten())
        };
        words::expand(word, self.escape, &lookup)
            .map_err(|source| DockerfileError::Substitution { line, source })
    }

    fn push(&mut self, line: usize, step: Step) -> Result<(), DockerfileError> {
        if self.steps.len() >= MAX_STEPS {
            return Err(DockerfileError::TooManySteps { line });
        }
        spec::check_step_at(&step, Where::Step(self.steps.len() + 1), &mut self.total)
            .map_err(|source| DockerfileError::Spec { line, source })?;
        self.config.apply(&step);
        if let Step::Env { vars } = &step {
            self.env.extend(vars.iter().cloned());
        }
        self.steps.push(step);
        Ok(())
    }

    fn instruction(&mut self, line: usize, text: &str) -> Result<(), DockerfileError> {
        let word_end = text.find(char::is_whitespace).unwrap_or(text.len());
        let word = text[..word_end].to_ascii_uppercase();
        let rest = text[word_end..].trim();
        let instruction: &'static str = match word.as_str() {
            "ARG" => return self.arg(line, rest),
            "FROM" => return self.from(line, rest),
            "RUN" => "RUN",
            "CMD" => "CMD",
            "ENTRYPOINT" => "ENTRYPOINT",
            "COPY" => "COPY",
            "ADD" => "ADD",
            "ENV" => "ENV",
            "WORKDIR" => "WORKDIR",
            "USER" => "USER",
            "EXPOSE" => "EXPOSE",
            "LABEL" => "LABEL",
            "MAINTAINER" => "MAINTAINER",
            "STOPSIGNAL" => "STOPSIGNAL",
            "HEALTHCHECK" => "HEALTHCHECK",
            "ONBUILD" => "ONBUILD",
            "VOLUME" => "VOLUME",
            "SHELL" => "SHELL",
            _ => {
                return Err(DockerfileError::Unknown {
                    line,
                    instruction: text[..word_end].chars().take(32).collect(),
                })
            }
        };
        if self.from.is_none() {
            return Err(DockerfileError::BeforeFrom { line, instruction });
        }
        let ignored = |why| Warning::Ignored {
            line,
            what: instruction,
            why,
        };
        match instruction {
            "RUN" => self.run(line, rest),
            "CMD" | "ENTRYPOINT" => self.start_command(line, instruction, rest),
            "COPY" | "ADD" => self.copy(line, instruction, rest),
            "ENV" => self.env(line, rest),
            "WORKDIR" => {
                if rest.is_empty() {
                    return Err(DockerfileError::Arguments {
                        line,
                        instruction,
                        needs: "a path",
                    });
                }
                let path = self.expand(line, rest)?;
                if path.is_empty() {
                    return Err(DockerfileError::Arguments {
                        line,
                        instruction,
                        needs: "a path (it is empty after substitution)",
                    });
                }
                let path = resolve_path(&self.config.workdir, &path);
                self.start.workdir = Some(path.clone());
                self.push(line, Step::Workdir { path })
            }
            "USER" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                let [word] = words[..] else {
                    return Err(DockerfileError::Arguments {
                        line,
                        instruction,
                        needs: "exactly one user",
                    });
                };
                let user = self.expand(line, word)?;
                if !is_owner(&user) {
                    return Err(DockerfileError::Spec {
                        line,
                        source: SpecError::User {
                            at: Where::Step(self.steps.len() + 1),
                            user: user.chars().take(64).collect(),
                        },
                    });
                }
                self.start.user = Some(user.clone());
                self.push(line, Step::User { user })
            }
            "EXPOSE" => {
                self.warnings
                    .push(ignored("a sandbox's ports are reachable without it"));
                Ok(())
            }
            "LABEL" | "MAINTAINER" => {
                self.warnings
                    .push(ignored("templates do not keep image labels"));
                Ok(())
            }
            "STOPSIGNAL" => {
                self.warnings
                    .push(ignored("airlock stops a sandbox's processes with SIGKILL"));
                Ok(())
            }
            "HEALTHCHECK" => {
                self.warnings
                    .push(ignored("airlock does not probe a sandbox's health"));
                Ok(())
            }
            "ONBUILD" => Err(DockerfileError::Refused {
                line,
                instruction,
                why: "a template keeps no triggers for builds from it",
            }),
            "VOLUME" => Err(DockerfileError::Refused {
                line,
                instruction,
                why: "a template has no volumes; mount directories when a sandbox is created",
            }),
            _ => Err(DockerfileError::Refused {
                line,
                instruction,
                why:
                    "shell forms always run /bin/sh -c; use the exec (JSON) form for another shell",
            }),
        }
    }

    fn arg(&mut self, line: usize, rest: &str) -> Result<(), DockerfileError> {
        let words = words::split_quoted(rest, self.escape);
        if words.is_empty() {
            return Err(DockerfileError::Arguments {
                line,
                instruction: "ARG",
                needs: "a name",
            });
        }
        for word in words {
            let (name, default) = match word.split_once('=') {
                Some((name, default)) => (name, Some(self.expand(line, default)?)),
                None => (word.as_str(), None),
            };
            if !is_variable_name(name) || name.chars().any(char::is_whitespace) {
                return Err(DockerfileError::Arguments {
                    line,
                    instruction: "ARG",
                    needs: "names without spaces, quotes or `=` before any `=default`",
                });
            }
            let given = self.build_args.get(name).cloned();
            if given.is_some() {
                self.used.insert(name.to_owned());
            }
            let value = match (given, default) {
                (Some(given), _) => Some(given),
                (None, Some(default)) => Some(default),
                (None, None) if self.from.is_some() => self
                    .meta
                    .get(name)
                    .cloned()
                    .flatten()
                    .or_else(|| platform_arg(name)),
                (None, None) => platform_arg(name),
            };
            let table = if self.from.is_none() {
                &mut self.meta
            } else {
                &mut self.args
            };
            table.insert(name.to_owned(), value);
            let bytes: usize = table
                .iter()
                .map(|(n, v)| n.len() + v.as_ref().map_or(0, String::len))
                .sum();
            if table.len() > MAX_VARS || bytes > MAX_TOTAL_BYTES {
                return Err(DockerfileError::TooManyArgs { line });
            }
        }
        Ok(())
    }

    fn from(&mut self, line: usize, rest: &str) -> Result<(), DockerfileError> {
        if self.from.is_some() {
            return Err(DockerfileError::MultiStage {
                line,
                what: "a second FROM starts another stage",
            });
        }
        let (flags, rest) = take_flags(rest);
        if let Some((flag, _)) = flags.first() {
            return Err(DockerfileError::Flag {
                line,
                instruction: "FROM",
                flag: format!("--{flag}"),
            });
        }
        let words: Vec<&str> = rest.split_whitespace().collect();
        let image = match words[..] {
            [image] => image,
            [_, r#as, _] if r#as.eq_ignore_ascii_case("AS") => {
                return Err(DockerfileError::MultiStage {
                    line,
                    what: "FROM … AS names a build stage",
                })
            }
            _ => {
                return Err(DockerfileError::Arguments {
                    line,
                    instruction: "FROM",
                    needs: "one image or template name",
                })
            }
        };
        let image = self.expand(line, image)?;
        if image.is_empty() {
            return Err(DockerfileError::Arguments {
                line,
                instruction: "FROM",
                needs: "a name (it is empty after substitution)",
            });
        }
        let base = base_of(&image);
        let probe = BuildSpec {
            from: base.clone(),
            steps: Vec::new(),
            start: StartConfig::default(),
        };
        probe
            .validate()
            .map_err(|source| DockerfileError::Spec { line, source })?;
        self.from = Some(base);
        for name in PROXY_ARGS {
            if let Some(value) = self.build_args.get(name) {
                self.args.insert(name.to_owned(), Some(value.clone()));
            }
        }
        Ok(())
    }

    fn refuse_flags(
        line: usize,
        instruction: &'static str,
        flags: &[(String, Option<String>)],
    ) -> Result<(), DockerfileError> {
        match flags.first() {
            Some((flag, _)) => Err(DockerfileError::Flag {
                line,
                instruction,
                flag: format!("--{}", flag.chars().take(32).collect::<String>()),
            }),
            None => Ok(()),
        }
    }

    fn run(&mut self, line: usize, rest: &str) -> Result<(), DockerfileError> {
        let (flags, rest) = take_flags(rest);
        Self::refuse_flags(line, "RUN", &flags)?;
        if rest.is_empty() {
            return Err(DockerfileError::Arguments {
                line,
                instruction: "RUN",
                needs: "a command",
            });
        }
        let command = match json_array(rest) {
            Some(args) => Command::Exec(args),
            None => {
                if has_heredoc(rest, self.escape) {
                    return Err(DockerfileError::Heredoc {
                        line,
                        instruction: "RUN",
                    });
                }
                Command::Shell(rest.to_owned())
            }
        };
        let env = self
            .args
            .iter()
            .filter(|(name, _)| !self.env.contains_key(*name))
            .filter_map(|(name, value)| Some((name.clone(), value.clone()?)))
            .collect();
        self.push(
            line,
            Step::Run {
                command,
                user: None,
                env,
            },
        )
    }

    fn start_command(
        &mut self,
        line: usize,
        instruction: &'static str,
        rest: &str,
    ) -> Result<(), DockerfileError> {
        if rest.is_empty() {
            return Err(DockerfileError::Arguments {
                line,
                instruction,
                needs: "a command",
            });
        }
        let args = json_array(rest)
            .unwrap_or_else(|| vec!["/bin/sh".to_owned(), "-c".to_owned(), rest.to_owned()]);
        let what = if instruction == "CMD" {
            "the command"
        } else {
            "the entrypoint"
        };
        spec::check_start_args(what, &args)
            .map_err(|source| DockerfileError::Spec { line, source })?;
        if instruction == "CMD" {
            self.cmd_set = true;
            self.start.cmd = Some(args);
        } else {
            self.start.entrypoint = Some(args);
            if !self.cmd_set {
                self.start.cmd = Some(Vec::new());
            }
        }
        Ok(())
    }

    fn copy(
        &mut self,
        line: usize,
        instruction: &'static str,
        rest: &str,
    ) -> Result<(), DockerfileError> {
        let (flags, rest) = take_flags(rest);
        let mut chown = None;
        let mut chmod = None;
        for (flag, value) in &flags {
            match (flag.as_str(), value) {
                ("from", _) => {
                    return Err(DockerfileError::MultiStage {
                        line,
                        what: "--from copies from another stage or image",
                    })
                }
                ("chown", Some(value)) => {
                    let owner = self.expand(line, value)?;
                    if !is_owner(&owner) {
                        return Err(DockerfileError::FlagValue {
                            line,
                            flag: "--chown",
                            value: owner.chars().take(64).collect(),
                            wants: "user[:group] (names or numbers)",
                        });
                    }
                    chown = Some(owner);
                }
                ("chmod", Some(value)) => {
                    let mode = self.expand(line, value)?;
                    chmod = Some(octal_mode(&mode).ok_or_else(|| DockerfileError::FlagValue {
                        line,
                        flag: "--chmod",
                        value: mode.chars().take(64).collect(),
                        wants: "an octal mode of at most 7777",
                    })?);
                }
                _ => {
                    return Self::refuse_flags(line, instruction, &[(flag.clone(), None)]);
                }
            }
        }
        if json_array(rest).is_none() && has_heredoc(rest, self.escape) {
            return Err(DockerfileError::Heredoc { line, instruction });
        }
        let raw: Vec<String> = json_array(rest)
            .unwrap_or_else(|| rest.split_whitespace().map(str::to_owned).collect());
        if raw.len() < 2 {
            return Err(DockerfileError::Arguments {
                line,
                instruction,
                needs: "a source and a destination",
            });
        }
        let mut args = Vec::with_capacity(raw.len());
        for word in &raw {
            args.push(self.expand(line, word)?);
        }
        let dest = args.pop().unwrap_or_default();
        let sources = args;
        for source in &sources {
            if instruction == "ADD" && is_url(source) {
                return Err(DockerfileError::AddUrl {
                    line,
                    url: source.chars().take(256).collect(),
                });
            }
            if instruction == "ADD" && looks_like_archive(source) {
                return Err(DockerfileError::AddArchive {
                    line,
                    archive: source.chars().take(256).collect(),
                });
            }
            if let Some(why) = source_problem(source) {
                return Err(DockerfileError::Spec {
                    line,
                    source: SpecError::Source {
                        at: Where::Step(self.steps.len() + 1),
                        path: source.chars().take(64).collect(),
                        why,
                    },
                });
            }
        }
        if dest.is_empty() {
            return Err(DockerfileError::Arguments {
                line,
                instruction,
                needs: "a destination (it is empty after substitution)",
            });
        }
        if sources.len() > 1 && !dest.ends_with('/') {
            return Err(DockerfileError::CopyDestination { line, instruction });
        }
        let dest = self.config.resolve_dest(&dest);
        self.push(
            line,
            Step::Copy {
                sources,
                dest,
                chown,
                chmod,
            },
        )
    }

    fn env(&mut self, line: usize, rest: &str) -> Result<(), DockerfileError> {
        let words = words::split_quoted(rest, self.escape);
        let Some(first) = words.first() else {
            return Err(DockerfileError::Arguments {
                line,
                instruction: "ENV",
                needs: "NAME=VALUE pairs",
            });
        };
        let mut vars = Vec::new();
        if first.contains('=') {
            for word in &words {
                let Some((name, value)) = word.split_once('=') else {
                    return Err(DockerfileError::Arguments {
                        line,
                        instruction: "ENV",
                        needs: "NAME=VALUE pairs (a word has no `=`)",
                    });
                };
                vars.push((self.expand(line, name)?, self.expand(line, value)?));
            }
        } else {
            let value = rest[rest.find(char::is_whitespace).unwrap_or(rest.len())..].trim();
            if value.is_empty() {
                return Err(DockerfileError::Arguments {
                    line,
                    instruction: "ENV",
                    needs: "a value after the name",
                });
            }
            vars.push((self.expand(line, first)?, self.expand(line, value)?));
        }
        if vars.iter().any(|(name, _)| !is_variable_name(name)) {
            return Err(DockerfileError::Arguments {
                line,
                instruction: "ENV",
                needs: "non-empty names",
            });
        }
        for (name, value) in &vars {
            match self.start.env.iter_mut().find(|(n, _)| n == name) {
                Some((_, v)) => value.clone_into(v),
                None => self.start.env.push((name.clone(), value.clone())),
            }
        }
        if self.start.env.len() > MAX_VARS {
            return Err(DockerfileError::Spec {
                line,
                source: SpecError::TooMany {
                    at: Where::Start,
                    what: "the environment",
                    max: MAX_VARS,
                },
            });
        }
        self.push(line, Step::Env { vars })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives() {
        assert_eq!(directive("# escape=`"), Some(("escape".into(), "`")));
        assert_eq!(
            directive("#Syntax = docker/dockerfile:1 "),
            Some(("syntax".into(), "docker/dockerfile:1"))
        );
        assert_eq!(directive("# a comment"), None);
        assert_eq!(directive("# x="), None);
    }

    #[test]
    fn heredocs() {
        assert!(has_heredoc("cat <<EOF", '\\'));
        assert!(has_heredoc("cat <<-'EOF'", '\\'));
        assert!(has_heredoc("<<\"X\" sh", '\\'));
        assert!(!has_heredoc("echo $((1<<2))", '\\'));
        assert!(!has_heredoc("echo '<<EOF'", '\\'));
        assert!(!has_heredoc("echo \\<<EOF", '\\'));
    }

    #[test]
    fn bases() {
        assert_eq!(base_of("scratch"), Base::Scratch {});
        assert_eq!(base_of("py"), Base::Template { name: "py".into() });
        assert_eq!(
            base_of("py3.12"),
            Base::Template {
                name: "py3.12".into()
            }
        );
        for image in [
            "python:3.12",
            "library/ubuntu",
            "docker.io/library/ubuntu",
            "localhost:5000/x",
            "localhost/x",
        ] {
            assert_eq!(
                base_of(image),
                Base::Image {
                    reference: image.into()
                },
                "{image}"
            );
        }
    }

    #[test]
    fn modes() {
        assert_eq!(octal_mode("0755"), Some(0o755));
        assert_eq!(octal_mode("4755"), Some(0o4755));
        assert_eq!(octal_mode("755"), Some(0o755));
        assert_eq!(octal_mode("u+x"), None);
        assert_eq!(octal_mode("17777"), None);
        assert_eq!(octal_mode(""), None);
    }
}
