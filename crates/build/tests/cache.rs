//! Cache keys: a changed input changes the key of its step and of every
//! later one and of none before; the same Dockerfile and context give the
//! same keys.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_build::cache::{base_key, keys, step_key, StepInputs, SCRATCH_DIGEST};
use airlock_build::context::{Context, ContextError, Limits};
use airlock_build::dockerfile::parse;
use airlock_build::{BuildSpec, RunConfig, Step};
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

const DOCKERFILE: &str = "FROM py
ARG MODE=release
RUN apt-get update
COPY requirements.txt /app/
RUN pip install -r /app/requirements.txt
COPY src/ /app/src/
ENV APP=/app
RUN python3 -m compileall /app
";

fn context() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("requirements.txt"), "flask\n").unwrap();
    fs::create_dir(dir.path().join("src")).unwrap();
    fs::write(dir.path().join("src/app.py"), "print(1)\n").unwrap();
    fs::write(dir.path().join("README.md"), "not copied\n").unwrap();
    dir
}

fn spec(text: &str, build_args: &[(&str, &str)]) -> BuildSpec {
    let args = build_args
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    parse(text, &args).unwrap().spec
}

fn keys_of(spec: &BuildSpec, base_digest: &str, root: &Path) -> Vec<String> {
    let context = Context::open(root, Limits::default()).unwrap();
    keys(
        &base_key(base_digest),
        &RunConfig::default(),
        spec,
        |_, sources| -> Result<_, ContextError> { context.hash_sources(sources) },
    )
    .unwrap()
}

/// The first index at which two key lists differ, checking that every
/// key from there on differs.
fn first_change(before: &[String], after: &[String]) -> Option<usize> {
    assert_eq!(before.len(), after.len());
    let first = before.iter().zip(after).position(|(a, b)| a != b)?;
    for (i, (a, b)) in before.iter().zip(after).enumerate().skip(first) {
        assert_ne!(a, b, "key {i} did not change after key {first} did");
    }
    Some(first)
}

#[test]
fn unchanged_inputs_give_identical_keys() {
    let dir = context();
    let spec = spec(DOCKERFILE, &[]);
    let once = keys_of(&spec, "sha256:base", dir.path());
    assert_eq!(once.len(), 6);
    assert_eq!(keys_of(&spec, "sha256:base", dir.path()), once);
    // A copy of the context elsewhere, made at another time, is the same.
    let other = context();
    assert_eq!(keys_of(&spec, "sha256:base", other.path()), once);
    let mut unique = once.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), once.len(), "every step has a key of its own");
    for key in &once {
        assert!(key.starts_with("sha256:") && key.len() == 71, "{key}");
    }
}

#[test]
fn a_changed_copy_source_changes_its_step_and_the_later_ones() {
    let dir = context();
    let spec = spec(DOCKERFILE, &[]);
    let before = keys_of(&spec, "sha256:base", dir.path());
    // Steps: 0 RUN update, 1 COPY requirements, 2 RUN pip, 3 COPY src,
    // 4 ENV, 5 RUN compileall.
    fs::write(dir.path().join("requirements.txt"), "flask\nrequests\n").unwrap();
    let after = keys_of(&spec, "sha256:base", dir.path());
    assert_eq!(first_change(&before, &after), Some(1));

    fs::write(dir.path().join("src/new.py"), "").unwrap();
    let again = keys_of(&spec, "sha256:base", dir.path());
    assert_eq!(first_change(&after, &again), Some(3));

    // A file no COPY names changes nothing.
    fs::write(dir.path().join("README.md"), "changed").unwrap();
    assert_eq!(keys_of(&spec, "sha256:base", dir.path()), again);
}

#[test]
fn every_input_is_in_the_key() {
    let dir = context();
    let root = dir.path();
    let base = keys_of(&spec(DOCKERFILE, &[]), "sha256:base", root);
    // Another base changes everything.
    assert_eq!(
        first_change(
            &base,
            &keys_of(&spec(DOCKERFILE, &[]), "sha256:other", root)
        ),
        Some(0)
    );
    assert_ne!(base_key(SCRATCH_DIGEST), base_key("sha256:base"));
    // A build argument reaches every RUN after its ARG.
    let with_arg = keys_of(&spec(DOCKERFILE, &[("MODE", "debug")]), "sha256:base", root);
    assert_eq!(first_change(&base, &with_arg), Some(0));
    // An edited command, an ENV, a destination.
    for (from, to, step) in [
        ("RUN pip install", "RUN pip3 install", 2),
        ("ENV APP=/app", "ENV APP=/srv", 4),
        ("COPY src/ /app/src/", "COPY src/ /app/code/", 3),
        ("RUN python3 -m", "RUN [\"python3\", \"-m\"] #", 5),
    ] {
        let edited = DOCKERFILE.replace(from, to);
        let changed = keys_of(&spec(&edited, &[]), "sha256:base", root);
        assert_eq!(first_change(&base, &changed), Some(step), "{to}");
    }
}

#[test]
fn step_keys_cover_the_config_in_effect_and_the_sources() {
    let run = Step::Run {
        command: airlock_build::Command::Shell("make".into()),
        user: None,
        env: BTreeMap::new(),
    };
    let config = RunConfig::default();
    let key = |config: &RunConfig, user: Option<&str>| {
        let step = match &run {
            Step::Run { command, env, .. } => Step::Run {
                command: command.clone(),
                user: user.map(str::to_owned),
                env: env.clone(),
            },
            _ => unreachable!(),
        };
        step_key(
            "sha256:parent",
            &step,
            &StepInputs {
                config,
                sources: None,
            },
        )
    };
    let plain = key(&config, None);
    assert_eq!(plain, key(&config, None));
    assert_ne!(plain, key(&config, Some("1000")));
    let mut other = config.clone();
    other.workdir = "/src".into();
    assert_ne!(plain, key(&other, None));
    let mut other = config.clone();
    other.user = "app".into();
    assert_ne!(plain, key(&other, None));
    let mut other = config.clone();
    other.set("CC", "clang");
    assert_ne!(plain, key(&other, None));
    assert_ne!(
        plain,
        step_key(
            "sha256:other-parent",
            &run,
            &StepInputs {
                config: &config,
                sources: None
            }
        )
    );
}
