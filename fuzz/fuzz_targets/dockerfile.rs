//! The Dockerfile parser: any text either parses into a spec that passes
//! its own validation (steps within MAX_STEPS, every bound held), the same
//! twice, and survives a JSON round trip, with cache keys that are the
//! same when computed twice and distinct per step; or it is refused with
//! an error that names a line of the text.
#![no_main]

use airlock_build::cache::{base_key, keys};
use airlock_build::context::SourcesDigest;
use airlock_build::dockerfile::{parse, parse_over};
use airlock_build::spec::{BuildSpec, RunConfig, MAX_STEPS};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::convert::Infallible;

/// A stand-in for the context: a digest of the sources' names.
fn sources(index: usize, sources: &[String]) -> Result<SourcesDigest, Infallible> {
    Ok(SourcesDigest {
        digest: format!("sha256:{index}:{}", sources.join("\0")),
        entries: sources.len(),
        bytes: 0,
        skipped: 0,
    })
}

fn check(text: &str, spec: &BuildSpec, base: &RunConfig) {
    assert!(spec.steps.len() <= MAX_STEPS, "{} steps", spec.steps.len());
    if let Err(e) = spec.validate() {
        panic!("a parsed spec does not validate: {e}");
    }
    let json = serde_json::to_string(spec).expect("a spec serializes");
    let back: BuildSpec = serde_json::from_str(&json).expect("a spec reads back");
    assert_eq!(&back, spec, "the JSON round trip changed {text:?}");
    let start = base_key("sha256:base");
    let once = keys(&start, base, spec, sources).unwrap_or_else(|e| match e {});
    let twice = keys(&start, base, spec, sources).unwrap_or_else(|e| match e {});
    assert_eq!(once, twice, "keys differ between two computations");
    assert_eq!(once.len(), spec.steps.len());
    let mut unique = once.clone();
    unique.push(start);
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), spec.steps.len() + 1, "two steps share a key");
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args: BTreeMap<String, String> = [("A", "1"), ("HTTP_PROXY", "http://p:3128"), ("V", "$A")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lines = text.split('\n').count();
    match parse(text, &args) {
        Ok(parsed) => {
            check(text, &parsed.spec, &RunConfig::default());
            assert_eq!(parse(text, &args), Ok(parsed.clone()), "not deterministic");
            let base = RunConfig::of_base(
                &["PATH=/usr/bin:/bin".to_owned(), "HOME=/root".to_owned()],
                Some("/home/user"),
                Some("1000"),
            );
            match parse_over(text, &args, &base) {
                Ok(over) => {
                    assert_eq!(over.spec.from, parsed.spec.from, "the base changed the FROM");
                    check(text, &over.spec, &base);
                }
                // The base's variables can make a value longer than a bound.
                Err(e) => assert!(e.line().is_some_and(|l| (1..=lines).contains(&l)), "{e}"),
            }
        }
        Err(e) => {
            let message = e.to_string();
            assert!(!message.is_empty());
            if let Some(line) = e.line() {
                assert!((1..=lines).contains(&line), "line {line} of {lines}: {message}");
                assert!(message.starts_with(&format!("line {line}: ")), "{message}");
            }
        }
    }
});
