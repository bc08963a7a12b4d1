//! What decides where a request goes and what of it goes in: the ports
//! dialect's `PORT-ID.DOMAIN` hosts and `/v1/sandboxes/ID/ports/PORT/`
//! paths, the path that goes in, the headers taken off; and the e2b
//! upload's `X-Metadata-*` headers; the AIO upload's multipart form.
//! Hostile bytes never panic, a target
//! is always a real port of a sandbox-shaped id under the domain, and no
//! daemon credential survives the header rewrite.
#![no_main]

use airlock_api::aio::fuzzing::form_parts;
use airlock_api::e2b::sandbox::fuzzing::metadata;
use airlock_api::ports::{by_host, by_path, fuzz_inward_headers, fuzz_inward_uri};
use http::{HeaderMap, HeaderName, HeaderValue, Uri};
use libfuzzer_sys::fuzz_target;

const DOMAIN: &str = "sbx.example.test";

fn headers_of(text: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in text.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(&line[colon + 1..]),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    headers
}

fuzz_target!(|input: &[u8]| {
    let headers = headers_of(input);
    if let Some(target) = by_host(&headers, Some(DOMAIN)) {
        assert!(target.port != 0);
        assert!(!target.id.is_empty() && !target.id.contains(['.', '/', ':']));
        let host = headers
            .get("host")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        assert!(host.contains(DOMAIN), "{host}");
        assert!(target.prefix.is_none());
    }
    let path = String::from_utf8_lossy(input);
    if let Some(target) = by_path(&path) {
        assert!(target.port != 0);
        let prefix = target.prefix.as_deref().unwrap_or_default();
        assert!(path.starts_with(prefix));
        assert!(!target.id.contains(['.', '/']));
    }
    if let Ok(uri) = path.parse::<Uri>() {
        let prefix = by_path(uri.path()).and_then(|t| t.prefix);
        let inward = fuzz_inward_uri(&uri, prefix.as_deref());
        // Origin form (`*`, OPTIONS' asterisk form, stays as it is): no
        // authority goes in.
        assert!(inward.authority().is_none(), "{inward}");
        assert!(inward.path().starts_with('/') || inward == "*", "{inward}");
    }
    let mut rewritten = headers.clone();
    fuzz_inward_headers(&mut rewritten, input.first().is_some_and(|b| b & 1 == 1));
    for name in ["e2b-traffic-access-token", "e2b-sandbox-id", "e2b-sandbox-port"] {
        assert!(!rewritten.contains_key(name));
    }
    for name in ["x-api-key", "x-access-token", "authorization"] {
        for value in rewritten.get_all(name) {
            let text = value.to_str().unwrap_or_default().trim();
            let bare = text
                .strip_prefix("Bearer ")
                .or_else(|| text.strip_prefix("bearer "))
                .unwrap_or(text)
                .trim();
            assert!(
                !["e2b_", "al_", "at_", "tt_"].iter().any(|p| bare.starts_with(p)),
                "{name}: {text}"
            );
        }
    }
    if let Ok(found) = metadata(&headers) {
        let total: usize = found.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(total <= 4096);
        assert!(found.values().all(|v| v.bytes().all(|b| (0x20..=0x7e).contains(&b))));
    }
    // The AIO upload's form, whole in memory: every part's bytes lie
    // inside the body.
    if let Ok(parts) = form_parts(input, "b0undary") {
        let total: usize = parts.iter().map(|(_, _, data)| data.len()).sum();
        assert!(total <= input.len());
    }
});
