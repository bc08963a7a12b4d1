//! `.dockerignore` and the globs of COPY sources: a small matcher of
//! Docker's pattern language over the bytes of a path.
//!
//! A pattern is matched against a whole path relative to the context
//! (components joined by `/`): `*` is any run of bytes but `/`, `?` one
//! byte but `/`, `[…]` one byte of a class (`[a-z]`, `[!…]` or `[^…]`
//! negated), `**` any number of whole components (zero included), `\` makes
//! the next byte literal.
//!
//! A `.dockerignore` is a list of such patterns, one a line: blank lines
//! and lines starting with `#` are skipped, whitespace around a pattern is
//! dropped, a leading `/` and `./` and a trailing `/` mean nothing, `!`
//! makes an exception. A path is excluded when the last pattern that
//! matches it, or any directory above it, is not an exception (Docker's
//! rule, so `!dir/keep` brings one file of an excluded `dir` back).

use std::fmt;

/// The most patterns of a `.dockerignore`.
pub const MAX_PATTERNS: usize = 10_000;
/// The longest pattern, in bytes.
pub const MAX_PATTERN_BYTES: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Byte(u8),
    /// `?`: a byte but `/`.
    One,
    /// `*`: bytes but `/`.
    Star,
    /// `**` at the end: anything.
    Rest,
    /// `**/` (or `**` before more): whole components, or none.
    Dirs,
    /// `[…]`: (negated, ranges).
    Class(bool, Vec<(u8, u8)>),
}

/// Why a pattern is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("a `[` is not closed by `]`")]
    UnclosedClass,
    #[error("the pattern is longer than {MAX_PATTERN_BYTES} bytes")]
    TooLong,
}

/// One compiled pattern.
#[derive(Clone, PartialEq, Eq)]
pub struct Pattern {
    source: String,
    tokens: Vec<Token>,
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pattern({:?})", self.source)
    }
}

impl Pattern {
    pub fn new(pattern: &str) -> Result<Pattern, PatternError> {
        if pattern.len() > MAX_PATTERN_BYTES {
            return Err(PatternError::TooLong);
        }
        let bytes = pattern.as_bytes();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            i += 1;
            match b {
                b'*' if bytes.get(i) == Some(&b'*') => {
                    i += 1;
                    if bytes.get(i) == Some(&b'/') {
                        i += 1;
                    }
                    tokens.push(if i >= bytes.len() {
                        Token::Rest
                    } else {
                        Token::Dirs
                    });
                }
                b'*' => tokens.push(Token::Star),
                b'?' => tokens.push(Token::One),
                b'\\' => {
                    if let Some(&next) = bytes.get(i) {
                        tokens.push(Token::Byte(next));
                        i += 1;
                    }
                }
                b'[' => {
                    let negated = matches!(bytes.get(i), Some(b'!' | b'^'));
                    if negated {
                        i += 1;
                    }
                    let mut ranges = Vec::new();
                    let mut first = true;
                    loop {
                        let Some(&c) = bytes.get(i) else {
                            return Err(PatternError::UnclosedClass);
                        };
                        i += 1;
                        if c == b']' && !first {
                            break;
                        }
                        first = false;
                        let c = if c == b'\\' {
                            let Some(&escaped) = bytes.get(i) else {
                                return Err(PatternError::UnclosedClass);
                            };
                            i += 1;
                            escaped
                        } else {
                            c
                        };
                        if bytes.get(i) == Some(&b'-')
                            && bytes.get(i + 1).is_some_and(|&e| e != b']')
                        {
                            let end = bytes[i + 1];
                            i += 2;
                            ranges.push((c, end));
                        } else {
                            ranges.push((c, c));
                        }
                    }
                    tokens.push(Token::Class(negated, ranges));
                }
                b => tokens.push(Token::Byte(b)),
            }
        }
        Ok(Pattern {
            source: pattern.to_owned(),
            tokens,
        })
    }

    /// Whether the pattern has a wildcard (is not a literal name).
    pub fn is_glob(&self) -> bool {
        self.tokens.iter().any(|t| !matches!(t, Token::Byte(_)))
    }

    /// The literal components before the first wildcard.
    fn literal_prefix(&self) -> Vec<Vec<u8>> {
        let mut parts = vec![Vec::new()];
        for token in &self.tokens {
            match token {
                Token::Byte(b'/') => parts.push(Vec::new()),
                Token::Byte(b) => {
                    if let Some(last) = parts.last_mut() {
                        last.push(*b);
                    }
                }
                _ => {
                    // The component the wildcard is in is not literal.
                    parts.pop();
                    return parts;
                }
            }
        }
        parts
    }

    /// Whether `path` matches the whole pattern: a table of which token
    /// suffixes match which path suffixes, filled from the end, one row
    /// per token (time tokens × bytes, no recursion).
    pub fn matches(&self, path: &[u8]) -> bool {
        let n = path.len();
        // next[j]: tokens[i + 1..] match path[j..].
        let mut next = vec![false; n + 1];
        next[n] = true;
        let mut row = vec![false; n + 1];
        for token in self.tokens.iter().rev() {
            // For `**/`: whether some `/` at k >= j has next[k + 1].
            let mut after_slash = false;
            for j in (0..=n).rev() {
                let byte = path.get(j).copied();
                let not_slash = byte.is_some_and(|c| c != b'/');
                row[j] = match token {
                    Token::Byte(b) => byte == Some(*b) && next[j + 1],
                    Token::One => not_slash && next[j + 1],
                    Token::Class(negated, ranges) => {
                        byte.is_some_and(|c| {
                            c != b'/'
                                && ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
                        }) && next[j + 1]
                    }
                    Token::Star => next[j] || (not_slash && row[j + 1]),
                    Token::Rest => true,
                    Token::Dirs => {
                        if byte == Some(b'/') && next[j + 1] {
                            after_slash = true;
                        }
                        next[j] || after_slash
                    }
                };
            }
            std::mem::swap(&mut row, &mut next);
        }
        next[0]
    }
}

/// A `.dockerignore`, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ignore {
    patterns: Vec<(bool, Pattern)>,
}

/// Why a `.dockerignore` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IgnoreError {
    #[error(".dockerignore has more than {MAX_PATTERNS} patterns")]
    TooMany,
    #[error(".dockerignore line {line}: {source}")]
    Pattern { line: usize, source: PatternError },
}

/// A pattern's text as Docker cleans it: no `.` or empty components, `..`
/// applied, no leading `/`.
fn clean(pattern: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in pattern.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    parts.join("/")
}

impl Ignore {
    pub fn parse(text: &str) -> Result<Ignore, IgnoreError> {
        let mut patterns = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (negated, rest) = match line.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, line),
            };
            let cleaned = clean(rest);
            if cleaned.is_empty() {
                continue;
            }
            if patterns.len() >= MAX_PATTERNS {
                return Err(IgnoreError::TooMany);
            }
            let pattern = Pattern::new(&cleaned).map_err(|source| IgnoreError::Pattern {
                line: index + 1,
                source,
            })?;
            patterns.push((negated, pattern));
        }
        Ok(Ignore { patterns })
    }

    /// Whether `path` (relative to the context, `/`-separated) is
    /// excluded.
    pub fn is_excluded(&self, path: &[u8]) -> bool {
        if path.is_empty() {
            return false;
        }
        let mut excluded = false;
        for (negated, pattern) in &self.patterns {
            // An exception only matters to what is excluded, an exclusion
            // to what is not.
            if *negated != excluded {
                continue;
            }
            let hit = pattern.matches(path)
                || path
                    .iter()
                    .enumerate()
                    .filter(|&(_, &b)| b == b'/')
                    .any(|(at, _)| pattern.matches(&path[..at]));
            if hit {
                excluded = !negated;
            }
        }
        excluded
    }

    /// Whether an exception could bring back something beneath the
    /// excluded directory `dir`, so it must be walked.
    pub fn may_include_beneath(&self, dir: &[u8]) -> bool {
        let dir_parts: Vec<&[u8]> = dir.split(|&b| b == b'/').collect();
        self.patterns.iter().any(|(negated, pattern)| {
            if !negated {
                return false;
            }
            let prefix = pattern.literal_prefix();
            // The pattern's literal start and the directory agree as far
            // as both go.
            prefix
                .iter()
                .zip(&dir_parts)
                .all(|(p, d)| p.as_slice() == *d)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, path: &str) -> bool {
        Pattern::new(pattern).unwrap().matches(path.as_bytes())
    }

    #[test]
    fn globs() {
        assert!(m("*.py", "a.py"));
        assert!(m("*.py", ".py"));
        assert!(!m("*.py", "d/a.py"));
        assert!(m("d/*.py", "d/a.py"));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "a/c"));
        assert!(m("**/*.go", "x.go"));
        assert!(m("**/*.go", "a/b/x.go"));
        assert!(!m("**/*.go", "a/b/x.gox"));
        assert!(m("a/**", "a/b/c"));
        assert!(m("a/**/z", "a/z"));
        assert!(m("a/**/z", "a/b/c/z"));
        assert!(!m("a/**/z", "a/bz"));
        assert!(m("**", "anything/at/all"));
        assert!(m("[a-c]x", "bx"));
        assert!(!m("[!a-c]x", "bx"));
        assert!(m("[^a-c]x", "dx"));
        assert!(m("[]]", "]"));
        assert!(m("\\*", "*"));
        assert!(!m("\\*", "a"));
        assert!(m("lit", "lit"));
        assert!(!m("lit", "lit2"));
        assert_eq!(Pattern::new("[ab"), Err(PatternError::UnclosedClass));
        // Many stars do not take exponential time.
        let pattern = "*a".repeat(30);
        assert!(!m(&pattern, &"a".repeat(29)));
    }

    #[test]
    fn dockerignore_rules() {
        let ignore = Ignore::parse(
            "# comment\n\n  node_modules  \n/build/\n*.log\n!keep.log\n**/secret*\ndocs\n!docs/README.md\n./tmp/./x\n",
        )
        .unwrap();
        let ex = |p: &str| ignore.is_excluded(p.as_bytes());
        assert!(ex("node_modules"));
        assert!(ex("node_modules/a/b.js"));
        assert!(!ex("src/node_modules"));
        assert!(ex("build"));
        assert!(ex("build/out.o"));
        assert!(ex("a.log"));
        assert!(!ex("keep.log"));
        assert!(!ex("sub/a.log"));
        assert!(ex("secret.txt"));
        assert!(ex("deep/er/secret.key"));
        assert!(ex("docs/guide.md"));
        assert!(!ex("docs/README.md"));
        assert!(ex("tmp/x"));
        assert!(!ex("tmp/y"));
        assert!(!ex("src/main.rs"));
        assert!(!ex(""));
        assert!(ignore.may_include_beneath(b"docs"));
        assert!(!ignore.may_include_beneath(b"node_modules"));
        // The last pattern that matches decides.
        let ignore = Ignore::parse("*.md\n!README.md\nREADME.md\n").unwrap();
        assert!(ignore.is_excluded(b"README.md"));
        let ignore = Ignore::parse("!x\n").unwrap();
        assert!(!ignore.is_excluded(b"x"));
        assert_eq!(
            Ignore::parse("ok\n[bad\n"),
            Err(IgnoreError::Pattern {
                line: 2,
                source: PatternError::UnclosedClass
            })
        );
    }
}
