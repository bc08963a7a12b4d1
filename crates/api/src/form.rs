//! `multipart/form-data`'s header values, as the dialects' uploads read
//! them (e2b's `/files`, AIO's `/v1/file/upload`).

/// The boundary of a `multipart/form-data` content type.
pub(crate) fn multipart_boundary(content_type: &str) -> Option<&str> {
    let mut parts = content_type.split(';');
    if !parts
        .next()?
        .trim()
        .eq_ignore_ascii_case("multipart/form-data")
    {
        return None;
    }
    parts.find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"'))
            .filter(|b| !b.is_empty() && b.len() <= 200)
    })
}

/// The parameter `key` of a Content-Disposition value (`form-data;
/// name="file"; filename="/home/user/a;b.txt"`): parameters are split at
/// semicolons outside quoted strings, and a quoted string's `\"` and `\\`
/// stand for `"` and `\` (RFC 9110, 5.6.4).
pub(crate) fn disposition_param(value: &str, key: &str) -> Option<String> {
    let mut rest = value;
    loop {
        let (param, after) = split_param(rest);
        if let Some((k, v)) = param.split_once('=') {
            if k.trim().eq_ignore_ascii_case(key) {
                return Some(unquote(v.trim()));
            }
        }
        rest = after?;
    }
}

/// The first `;`-separated parameter of `text` and what follows its `;`
/// (`None` after the last), a `;` inside a quoted string not counting.
fn split_param(text: &str) -> (&str, Option<&str>) {
    let mut quoted = false;
    let mut escaped = false;
    for (at, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ';' if !quoted => return (&text[..at], Some(&text[at + 1..])),
            _ => {}
        }
    }
    (text, None)
}

/// A parameter value without its quotes and escapes (a token as it is).
fn unquote(value: &str) -> String {
    let Some(inner) = value.strip_prefix('"') else {
        return value.to_owned();
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => break,
            '\\' => out.extend(chars.next()),
            _ => out.push(c),
        }
    }
    out
}
