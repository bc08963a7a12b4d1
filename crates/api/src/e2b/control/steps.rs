//! The e2b Template SDK's build body (`POST /v2/templates/{id}/builds/{buildID}`)
//! as an airlock [`BuildSpec`].
//!
//! | e2b step | args | airlock step |
//! |---|---|---|
//! | `RUN` | `[cmd]`, `[cmd, user]` | `Run { Shell(cmd), user }` |
//! | `COPY` | `[src, dest, owner?, mode?]` + `filesHash` | `Copy` of that upload's context; owner `""` is the current user, `u` is `u:u`; mode octal |
//! | `ENV` | `[k1, v1, k2, v2, …]` | `Env` |
//! | `WORKDIR` | `[path]` | `Workdir` |
//! | `USER` | `[name]` (a second arg is ignored) | `User` |
//!
//! Before the SDK's steps comes `USER user`: an e2b build starts as
//! `user`, and the last user and working directory are the sandbox's. `fromImage` of e2b's own base images
//! (`e2bdev/base`, `e2bdev/code-interpreter…`) and `fromTemplate` of its
//! base names build on airlock's `base` template; another image is pulled
//! from the registries the operator configured. `force` anywhere, or the
//! top-level one, runs every step without the cache.

use airlock_build::spec::{resolve_path, Base, BuildSpec, Command, SpecError, StartConfig, Step};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The build body as the SDKs send it (unknown fields are ignored: the JS
/// SDK sends `resolveSymlinks` and `gzip` on its steps).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildBody {
    pub from_image: Option<String>,
    pub from_template: Option<String>,
    pub from_image_registry: Option<serde_json::Value>,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub steps: Vec<StepBody>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
}

/// One step as the SDKs send it.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepBody {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub force: bool,
    pub files_hash: Option<String>,
}

/// A build body made an airlock build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    pub spec: BuildSpec,
    /// Run every step, cached or not.
    pub no_cache: bool,
    /// The upload (`filesHash`) each COPY takes its files from, by index
    /// into `spec.steps`.
    pub copies: BTreeMap<usize, String>,
    /// For each step of `spec.steps`, the SDK's step number (from 1) it
    /// came from; `None` for the steps added before the SDK's.
    pub origin: Vec<Option<usize>>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
}

/// Why a build body is not one airlock builds (each a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepsError {
    #[error("exactly one of fromImage and fromTemplate must be set")]
    Base,
    #[error("fromImageRegistry is not supported: this daemon pulls with the credentials its operator configured")]
    Registry,
    #[error("template {0:?} not found")]
    UnknownTemplate(String),
    #[error("step {step}: the step type {kind:?} is not supported (RUN, COPY, ENV, WORKDIR and USER are)")]
    Unsupported { step: usize, kind: String },
    #[error("step {step}: {kind} takes {expected} arguments, not {got}")]
    Arguments {
        step: usize,
        kind: &'static str,
        expected: &'static str,
        got: usize,
    },
    #[error("step {step}: COPY needs filesHash, 64 lowercase hex digits")]
    FilesHash { step: usize },
    #[error("step {step}: the mode {mode:?} is not octal permission bits (such as 0755)")]
    Mode { step: usize, mode: String },
    #[error("step {step}: the source {path:?} is not a path inside the build's files")]
    Source { step: usize, path: String },
    #[error("the {0} is empty or longer than 64 KiB")]
    Command(&'static str),
    #[error("{0}")]
    Spec(#[from] SpecError),
}

/// Whether `hash` is a files hash: 64 lowercase hex digits.
pub fn is_files_hash(hash: &str) -> bool {
    hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether an image reference is one of e2b's base images, which are
/// airlock's `base` template here.
pub fn is_e2b_base_image(reference: &str) -> bool {
    let reference = reference
        .strip_prefix("docker.io/")
        .or_else(|| reference.strip_prefix("index.docker.io/"))
        .unwrap_or(reference);
    let repository = reference.split(['@', ':']).next().unwrap_or(reference);
    repository == "e2bdev/base" || repository.starts_with("e2bdev/code-interpreter")
}

/// The part of a COPY source before its first glob character, as a
/// directory of the uploaded archive (whose members are what the glob
/// matched): `src/**/*.py` is `src`, `*.txt` is `.`.
fn static_prefix(source: &str) -> String {
    let source = source.trim_start_matches("./");
    match source.find(['*', '?', '[', '{']) {
        None => source.trim_end_matches('/').to_owned(),
        Some(at) => match source[..at].rfind('/') {
            Some(slash) if slash > 0 => source[..slash].to_owned(),
            _ => ".".to_owned(),
        },
    }
}

/// The owner of a COPY: `""` is the current user (`user:user`), a name
/// alone is `name:name`.
fn owner_of(owner: &str, current: &str) -> String {
    let owner = if owner.is_empty() { current } else { owner };
    if owner.contains(':') {
        owner.to_owned()
    } else {
        format!("{owner}:{owner}")
    }
}

/// The user every e2b build starts as.
pub const E2B_USER: &str = "user";

const MAX_START_BYTES: usize = 64 * 1024;

/// Converts a build body. `resolve` names the airlock template an e2b
/// `fromTemplate` (a name, `name:tag` or template id) is, `None` if none.
pub fn convert(
    body: &BuildBody,
    resolve: &dyn Fn(&str) -> Option<String>,
) -> Result<Converted, StepsError> {
    if body
        .from_image_registry
        .as_ref()
        .is_some_and(|v| !v.is_null())
    {
        return Err(StepsError::Registry);
    }
    fn nonempty(s: &Option<String>) -> Option<&str> {
        s.as_deref().filter(|s| !s.is_empty())
    }
    let from = match (nonempty(&body.from_image), nonempty(&body.from_template)) {
        (Some(image), None) if is_e2b_base_image(image) => Base::Template {
            name: airlock_daemon::templates::BASE.to_owned(),
        },
        (Some(image), None) => Base::Image {
            reference: image.to_owned(),
        },
        (None, Some(template)) => match super::wire::template_choice(template) {
            super::wire::TemplateChoice::Registered(name) if name == "base" => {
                Base::Template { name }
            }
            _ => Base::Template {
                name: resolve(template)
                    .ok_or_else(|| StepsError::UnknownTemplate(template.to_owned()))?,
            },
        },
        _ => return Err(StepsError::Base),
    };
    let mut steps = Vec::with_capacity(body.steps.len());
    let mut copies = BTreeMap::new();
    let mut user = E2B_USER.to_owned();
    let mut no_cache = body.force;
    for (index, step) in body.steps.iter().enumerate() {
        let number = index + 1;
        no_cache |= step.force;
        let args = &step.args;
        let count = |kind: &'static str, expected: &'static str, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(StepsError::Arguments {
                    step: number,
                    kind,
                    expected,
                    got: args.len(),
                })
            }
        };
        let converted = match step.kind.as_str() {
            "RUN" => {
                count("RUN", "1 or 2", matches!(args.len(), 1 | 2))?;
                Step::Run {
                    command: Command::Shell(args[0].clone()),
                    user: args.get(1).filter(|u| !u.is_empty()).cloned(),
                    env: BTreeMap::new(),
                }
            }
            "COPY" => {
                count("COPY", "2 to 4", (2..=4).contains(&args.len()))?;
                let hash = step
                    .files_hash
                    .as_deref()
                    .filter(|h| is_files_hash(h))
                    .ok_or(StepsError::FilesHash { step: number })?;
                let source = static_prefix(&args[0]);
                if source.is_empty()
                    || source.starts_with('/')
                    || source.split('/').any(|c| c == "..")
                {
                    return Err(StepsError::Source {
                        step: number,
                        path: args[0].chars().take(64).collect(),
                    });
                }
                let owner = args.get(2).map_or("", String::as_str);
                let chmod = match args.get(3).map(String::as_str) {
                    None | Some("") => None,
                    Some(mode) => Some(
                        u32::from_str_radix(mode, 8)
                            .ok()
                            .filter(|m| *m <= 0o7777 && !mode.starts_with(['+', '-']))
                            .ok_or_else(|| StepsError::Mode {
                                step: number,
                                mode: mode.chars().take(16).collect(),
                            })?,
                    ),
                };
                copies.insert(index, hash.to_owned());
                Step::Copy {
                    sources: vec![source],
                    dest: args[1].clone(),
                    chown: Some(owner_of(owner, &user)),
                    chmod,
                }
            }
            "ENV" => {
                count(
                    "ENV",
                    "an even number of",
                    !args.is_empty() && args.len() % 2 == 0,
                )?;
                Step::Env {
                    vars: args
                        .chunks_exact(2)
                        .map(|pair| (pair[0].clone(), pair[1].clone()))
                        .collect(),
                }
            }
            "WORKDIR" => {
                count("WORKDIR", "1", args.len() == 1)?;
                Step::Workdir {
                    path: args[0].clone(),
                }
            }
            "USER" => {
                count("USER", "1 or 2", matches!(args.len(), 1 | 2))?;
                args[0].clone_into(&mut user);
                Step::User {
                    user: args[0].clone(),
                }
            }
            other => {
                return Err(StepsError::Unsupported {
                    step: number,
                    kind: other.chars().take(32).collect(),
                })
            }
        };
        steps.push(converted);
    }
    let start_cmd = checked_command("start command", &body.start_cmd)?;
    let ready_cmd = checked_command("ready command", &body.ready_cmd)?;
    // Checked before the e2b prologue goes in front, so that a step's
    // number in an error is the SDK's.
    BuildSpec {
        from: from.clone(),
        steps: steps.clone(),
        start: StartConfig::default(),
    }
    .validate()?;
    // e2b's builds run as `user` in its home.
    let prologue = [
        Step::User {
            user: E2B_USER.to_owned(),
        },
        Step::Workdir {
            path: "/home/user".to_owned(),
        },
    ];
    let added = prologue.len();
    let mut start = StartConfig::default();
    let mut workdir = "/".to_owned();
    for step in prologue.iter().chain(&steps) {
        match step {
            Step::Env { vars } => {
                for (name, value) in vars {
                    match start.env.iter_mut().find(|(n, _)| n == name) {
                        Some((_, v)) => value.clone_into(v),
                        None => start.env.push((name.clone(), value.clone())),
                    }
                }
            }
            Step::Workdir { path } => {
                workdir = resolve_path(&workdir, path);
                start.workdir = Some(workdir.clone());
            }
            Step::User { user } => start.user = Some(user.clone()),
            Step::Run { .. } | Step::Copy { .. } => {}
        }
    }
    let origin = (0..added)
        .map(|_| None)
        .chain((1..=steps.len()).map(Some))
        .collect();
    let copies = copies.into_iter().map(|(i, h)| (i + added, h)).collect();
    let spec = BuildSpec {
        from,
        steps: prologue.into_iter().chain(steps).collect(),
        start,
    };
    spec.validate()?;
    Ok(Converted {
        spec,
        no_cache,
        copies,
        origin,
        start_cmd,
        ready_cmd,
    })
}

fn checked_command(
    what: &'static str,
    command: &Option<String>,
) -> Result<Option<String>, StepsError> {
    match command.as_deref() {
        None | Some("") => Ok(None),
        Some(c) if c.len() > MAX_START_BYTES || c.contains('\0') || c.trim().is_empty() => {
            Err(StepsError::Command(what))
        }
        Some(c) => Ok(Some(c.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const HASH: &str = "ffb7bd0e00000000000000000000000000000000000000000000000000c0417f";

    fn body(value: serde_json::Value) -> BuildBody {
        serde_json::from_value(value).unwrap()
    }

    fn no_templates(_: &str) -> Option<String> {
        None
    }

    fn sdk_steps(converted: &Converted) -> &[Step] {
        &converted.spec.steps[2..]
    }

    #[test]
    fn the_observed_python_body_converts_step_by_step() {
        let b = body(json!({
            "fromImage": "e2bdev/base", "force": false,
            "steps": [
                {"type": "RUN", "args": ["echo hi"], "force": false},
                {"type": "RUN", "args": ["a && b", "root"], "force": false},
                {"type": "COPY", "args": ["app", "/app/", "user", "0755"], "filesHash": HASH, "force": false},
                {"type": "COPY", "args": ["hello.txt", "/home/user/hello.txt", "", ""], "filesHash": HASH, "force": false, "forceUpload": true},
                {"type": "ENV", "args": ["FOO", "bar", "X", "1"], "force": false},
                {"type": "WORKDIR", "args": ["/app"], "force": false},
                {"type": "USER", "args": ["root"], "force": false},
                {"type": "COPY", "args": ["src/**/*.py", "lib", "", ""], "filesHash": HASH, "resolveSymlinks": true, "gzip": false}
            ],
            "startCmd": "python -m http.server 8000",
            "readyCmd": "[ -n \"$(ss -Htuln sport = :8000)\" ]"
        }));
        let c = convert(&b, &no_templates).unwrap();
        assert_eq!(
            c.spec.from,
            Base::Template {
                name: "base".into()
            }
        );
        assert_eq!(
            &c.spec.steps[..2],
            &[
                Step::User {
                    user: "user".into()
                },
                Step::Workdir {
                    path: "/home/user".into()
                }
            ]
        );
        let steps = sdk_steps(&c);
        assert_eq!(
            steps[0],
            Step::Run {
                command: Command::Shell("echo hi".into()),
                user: None,
                env: BTreeMap::new()
            }
        );
        assert_eq!(
            steps[1],
            Step::Run {
                command: Command::Shell("a && b".into()),
                user: Some("root".into()),
                env: BTreeMap::new()
            }
        );
        assert_eq!(
            steps[2],
            Step::Copy {
                sources: vec!["app".into()],
                dest: "/app/".into(),
                chown: Some("user:user".into()),
                chmod: Some(0o755)
            }
        );
        assert_eq!(
            steps[3],
            Step::Copy {
                sources: vec!["hello.txt".into()],
                dest: "/home/user/hello.txt".into(),
                chown: Some("user:user".into()),
                chmod: None
            }
        );
        assert_eq!(
            steps[4],
            Step::Env {
                vars: vec![("FOO".into(), "bar".into()), ("X".into(), "1".into())]
            }
        );
        // After USER root, a COPY with no owner is root's; a glob copies
        // what it matched from the directory before it.
        assert_eq!(
            steps[7],
            Step::Copy {
                sources: vec!["src".into()],
                dest: "lib".into(),
                chown: Some("root:root".into()),
                chmod: None
            }
        );
        // Each COPY's upload, by its index in the spec (the prologue first).
        assert_eq!(c.copies.keys().copied().collect::<Vec<_>>(), vec![4, 5, 9]);
        assert_eq!(c.origin[..3], [None, None, Some(1)]);
        assert_eq!(c.origin.last(), Some(&Some(8)));
        assert_eq!(c.spec.start.user.as_deref(), Some("root"));
        assert_eq!(c.spec.start.workdir.as_deref(), Some("/app"));
        assert_eq!(
            c.spec.start.env,
            vec![("FOO".into(), "bar".into()), ("X".into(), "1".into())]
        );
        assert_eq!(c.start_cmd.as_deref(), Some("python -m http.server 8000"));
        assert!(c.ready_cmd.as_deref().unwrap().contains("sport = :8000"));
        assert!(!c.no_cache);
    }

    #[test]
    fn bases_map_to_templates_and_images() {
        let resolve = |name: &str| (name == "abc123" || name == "mine").then(|| "mine".to_owned());
        for (image, expected) in [
            (
                "e2bdev/base",
                Base::Template {
                    name: "base".into(),
                },
            ),
            (
                "docker.io/e2bdev/base:latest",
                Base::Template {
                    name: "base".into(),
                },
            ),
            (
                "e2bdev/code-interpreter:v1",
                Base::Template {
                    name: "base".into(),
                },
            ),
            (
                "python:3.12",
                Base::Image {
                    reference: "python:3.12".into(),
                },
            ),
            (
                "registry.local:5000/x/y",
                Base::Image {
                    reference: "registry.local:5000/x/y".into(),
                },
            ),
        ] {
            let c = convert(&body(json!({"fromImage": image})), &resolve).unwrap();
            assert_eq!(c.spec.from, expected, "{image}");
        }
        for (template, expected) in [
            ("base", "base"),
            ("code-interpreter-v1", "base"),
            ("abc123", "mine"),
        ] {
            let c = convert(&body(json!({"fromTemplate": template})), &resolve).unwrap();
            assert_eq!(
                c.spec.from,
                Base::Template {
                    name: expected.into()
                },
                "{template}"
            );
        }
        assert_eq!(
            convert(&body(json!({"fromTemplate": "nope"})), &resolve),
            Err(StepsError::UnknownTemplate("nope".into()))
        );
    }

    #[test]
    fn force_anywhere_skips_the_cache() {
        let top = convert(
            &body(json!({"fromImage": "e2bdev/base", "force": true})),
            &no_templates,
        )
        .unwrap();
        assert!(top.no_cache);
        let step = convert(
            &body(json!({"fromImage": "e2bdev/base", "steps": [{"type": "RUN", "args": ["x"], "force": true}]})),
            &no_templates,
        )
        .unwrap();
        assert!(step.no_cache);
    }

    #[test]
    fn bad_bodies_are_refused_naming_the_step() {
        let refused = |value: serde_json::Value| convert(&body(value), &no_templates).unwrap_err();
        assert_eq!(refused(json!({})), StepsError::Base);
        assert_eq!(
            refused(json!({"fromImage": "e2bdev/base", "fromTemplate": "base"})),
            StepsError::Base
        );
        assert_eq!(
            refused(
                json!({"fromImage": "x", "fromImageRegistry": {"type": "registry", "username": "u", "password": "p"}})
            ),
            StepsError::Registry
        );
        let unsupported = refused(json!({"fromImage": "e2bdev/base", "steps": [
            {"type": "RUN", "args": ["x"]}, {"type": "ARG", "args": ["A"]}]}));
        assert_eq!(
            unsupported,
            StepsError::Unsupported {
                step: 2,
                kind: "ARG".into()
            }
        );
        assert!(unsupported.to_string().contains("\"ARG\" is not supported"));
        for (step, expected) in [
            (
                json!({"type": "COPY", "args": ["a", "/b"]}),
                StepsError::FilesHash { step: 1 },
            ),
            (
                json!({"type": "COPY", "args": ["a", "/b"], "filesHash": "ABC"}),
                StepsError::FilesHash { step: 1 },
            ),
            (
                json!({"type": "COPY", "args": ["a", "/b", "", "rwx"], "filesHash": HASH}),
                StepsError::Mode {
                    step: 1,
                    mode: "rwx".into(),
                },
            ),
            (
                json!({"type": "COPY", "args": ["a", "/b", "", "17777"], "filesHash": HASH}),
                StepsError::Mode {
                    step: 1,
                    mode: "17777".into(),
                },
            ),
            (
                json!({"type": "COPY", "args": ["../etc", "/b"], "filesHash": HASH}),
                StepsError::Source {
                    step: 1,
                    path: "../etc".into(),
                },
            ),
            (
                json!({"type": "COPY", "args": ["/etc/passwd", "/b"], "filesHash": HASH}),
                StepsError::Source {
                    step: 1,
                    path: "/etc/passwd".into(),
                },
            ),
            (
                json!({"type": "ENV", "args": ["A"]}),
                StepsError::Arguments {
                    step: 1,
                    kind: "ENV",
                    expected: "an even number of",
                    got: 1,
                },
            ),
            (
                json!({"type": "RUN", "args": []}),
                StepsError::Arguments {
                    step: 1,
                    kind: "RUN",
                    expected: "1 or 2",
                    got: 0,
                },
            ),
        ] {
            let mut b = body(json!({"fromImage": "e2bdev/base"}));
            b.steps = vec![serde_json::from_value(step.clone()).unwrap()];
            assert_eq!(convert(&b, &no_templates).unwrap_err(), expected, "{step}");
        }
        // The spec's own checks number steps as the SDK does.
        let empty_run = refused(json!({"fromImage": "e2bdev/base", "steps": [
            {"type": "ENV", "args": ["A", "1"]}, {"type": "RUN", "args": ["   "]}]}));
        assert!(empty_run.to_string().starts_with("step 2:"), "{empty_run}");
        let bad_user = refused(json!({"fromImage": "e2bdev/base", "steps": [
            {"type": "USER", "args": ["a b"]}]}));
        assert!(bad_user.to_string().starts_with("step 1:"), "{bad_user}");
        assert_eq!(
            refused(json!({"fromImage": "e2bdev/base", "startCmd": "  "})),
            StepsError::Command("start command")
        );
    }

    #[test]
    fn static_prefixes_of_sources() {
        assert_eq!(static_prefix("app"), "app");
        assert_eq!(static_prefix("app/"), "app");
        assert_eq!(static_prefix("./app/x.txt"), "app/x.txt");
        assert_eq!(static_prefix("src/**/*.py"), "src");
        assert_eq!(static_prefix("*.txt"), ".");
        assert_eq!(static_prefix("a/b/c*"), "a/b");
    }

    #[test]
    fn files_hashes() {
        assert!(is_files_hash(HASH));
        assert!(!is_files_hash(&HASH.to_uppercase()));
        assert!(!is_files_hash(&HASH[1..]));
        assert!(!is_files_hash("../../../../etc/passwd"));
    }
}
