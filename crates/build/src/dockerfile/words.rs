//! Words and variables as Docker's builder reads them: splitting an
//! argument into words, and one word's substitution and quote removal.
//!
//! In a word, outside quotes the escape character makes the next
//! character literal; `'…'` is literal; in `"…"` the escape character
//! makes `"`, `$` and itself literal and is kept before anything else.
//! `$NAME` and `${NAME}` are the variable's value (empty when unset),
//! `${NAME:-word}` / `${NAME-word}` the word when unset or empty / unset,
//! `${NAME:+word}` / `${NAME+word}` the word when set and non-empty /
//! set, `${NAME:?word}` / `${NAME?word}` an error saying the word when
//! unset or empty / unset. A `$` before anything else is itself.

use crate::spec::MAX_VALUE_BYTES;

/// How deep `${…}` may nest inside the word of another.
pub const MAX_NESTING: usize = 16;

/// Why a word's substitution failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubstError {
    #[error("a {0} quote is not closed")]
    Unclosed(&'static str),
    #[error("`${{` is not closed by `}}`")]
    UnclosedBrace,
    #[error("`${{}}` names no variable")]
    NoName,
    #[error(
        "`${{{name}{modifier}…}}` is not a substitution airlock supports (:-, -, :+, +, :? and ?)"
    )]
    Modifier { name: String, modifier: char },
    #[error("{name} is required: {message}")]
    Required { name: String, message: String },
    #[error("a value is longer than {MAX_VALUE_BYTES} bytes after substitution")]
    TooLong,
    #[error("`${{…}}` is nested more than {MAX_NESTING} deep")]
    TooDeep,
}

/// The words of `text`, split at whitespace outside quotes; quotes and
/// escapes stay for [`expand`] (Docker's `parseWords`).
pub fn split_quoted(text: &str, escape: char) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if quote.is_none() && c.is_whitespace() {
            if in_word {
                words.push(std::mem::take(&mut word));
                in_word = false;
            }
            continue;
        }
        in_word = true;
        word.push(c);
        if c == escape && quote != Some('\'') {
            if let Some(next) = chars.next() {
                word.push(next);
            }
            continue;
        }
        match quote {
            None if c == '\'' || c == '"' => quote = Some(c),
            Some(q) if q == c => quote = None,
            _ => {}
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// `word` with its variables substituted (`lookup` gives a variable's
/// value, `None` when unset) and its quotes and escapes removed.
pub fn expand(
    word: &str,
    escape: char,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, SubstError> {
    let chars: Vec<char> = word.chars().collect();
    let mut lexer = Lexer {
        chars: &chars,
        at: 0,
        escape,
        lookup,
    };
    lexer.word(None, 0)
}

struct Lexer<'a> {
    chars: &'a [char],
    at: usize,
    escape: char,
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

fn push(out: &mut String, s: &str) -> Result<(), SubstError> {
    if out.len() + s.len() > MAX_VALUE_BYTES {
        return Err(SubstError::TooLong);
    }
    out.push_str(s);
    Ok(())
}

fn push_char(out: &mut String, c: char) -> Result<(), SubstError> {
    let mut buf = [0u8; 4];
    push(out, c.encode_utf8(&mut buf))
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

impl Lexer<'_> {
    fn next(&mut self) -> Option<char> {
        let c = self.chars.get(self.at).copied();
        if c.is_some() {
            self.at += 1;
        }
        c
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    /// Up to the end, or up to an unquoted, unescaped `stop` (consumed).
    fn word(&mut self, stop: Option<char>, depth: usize) -> Result<String, SubstError> {
        let mut out = String::new();
        loop {
            let Some(c) = self.next() else {
                if stop.is_some() {
                    return Err(SubstError::UnclosedBrace);
                }
                return Ok(out);
            };
            if Some(c) == stop {
                return Ok(out);
            }
            if c == self.escape {
                if let Some(next) = self.next() {
                    push_char(&mut out, next)?;
                }
            } else if c == '\'' {
                loop {
                    match self.next() {
                        None => return Err(SubstError::Unclosed("single")),
                        Some('\'') => break,
                        Some(c) => push_char(&mut out, c)?,
                    }
                }
            } else if c == '"' {
                self.double_quoted(&mut out, depth)?;
            } else if c == '$' {
                self.dollar(&mut out, depth)?;
            } else {
                push_char(&mut out, c)?;
            }
        }
    }

    fn double_quoted(&mut self, out: &mut String, depth: usize) -> Result<(), SubstError> {
        loop {
            match self.next() {
                None => return Err(SubstError::Unclosed("double")),
                Some('"') => return Ok(()),
                Some('$') => self.dollar(out, depth)?,
                Some(c) if c == self.escape => match self.peek() {
                    Some(next) if next == '"' || next == '$' || next == self.escape => {
                        self.at += 1;
                        push_char(out, next)?;
                    }
                    _ => push_char(out, c)?,
                },
                Some(c) => push_char(out, c)?,
            }
        }
    }

    fn name(&mut self) -> String {
        let mut name = String::new();
        while let Some(c) = self.peek().filter(|&c| is_name_char(c)) {
            name.push(c);
            self.at += 1;
        }
        name
    }

    /// After a `$`.
    fn dollar(&mut self, out: &mut String, depth: usize) -> Result<(), SubstError> {
        match self.peek() {
            Some('{') => {
                self.at += 1;
                if depth >= MAX_NESTING {
                    return Err(SubstError::TooDeep);
                }
                let name = self.name();
                let Some(after) = self.next() else {
                    return Err(SubstError::UnclosedBrace);
                };
                if name.is_empty() {
                    return Err(if after == '}' {
                        SubstError::NoName
                    } else {
                        SubstError::Modifier {
                            name,
                            modifier: after,
                        }
                    });
                }
                let value = (self.lookup)(&name);
                if after == '}' {
                    return push(out, value.as_deref().unwrap_or_default());
                }
                let (colon, modifier) = if after == ':' {
                    (true, self.next().ok_or(SubstError::UnclosedBrace)?)
                } else {
                    (false, after)
                };
                if !matches!(modifier, '-' | '+' | '?') {
                    return Err(SubstError::Modifier { name, modifier });
                }
                let word = self.word(Some('}'), depth + 1)?;
                // `:` counts an empty value as unset.
                let present = match &value {
                    Some(v) => !colon || !v.is_empty(),
                    None => false,
                };
                match modifier {
                    '-' if present => push(out, value.as_deref().unwrap_or_default()),
                    '-' => push(out, &word),
                    '+' if present => push(out, &word),
                    '+' => Ok(()),
                    _ if present => push(out, value.as_deref().unwrap_or_default()),
                    _ => Err(SubstError::Required {
                        name,
                        message: if word.is_empty() {
                            "it is not set".to_owned()
                        } else {
                            word
                        },
                    }),
                }
            }
            Some(c) if is_name_char(c) => {
                let name = self.name();
                push(out, (self.lookup)(&name).as_deref().unwrap_or_default())
            }
            _ => push(out, "$"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(name: &str) -> Option<String> {
        match name {
            "A" => Some("apple".into()),
            "E" => Some(String::new()),
            "SP" => Some("a b".into()),
            _ => None,
        }
    }

    fn x(word: &str) -> Result<String, SubstError> {
        expand(word, '\\', &vars)
    }

    #[test]
    fn substitutes_as_docker_does() {
        let cases = [
            ("$A", "apple"),
            ("${A}s", "apples"),
            ("$A-$U-", "apple--"),
            ("${U:-def}", "def"),
            ("${E:-def}", "def"),
            ("${E-def}", ""),
            ("${A:-def}", "apple"),
            ("${A:+alt}", "alt"),
            ("${E:+alt}", ""),
            ("${E+alt}", "alt"),
            ("${U+alt}", ""),
            ("${U:-${A:-x}y}", "appley"),
            ("'$A'", "$A"),
            ("\"$A b\"", "apple b"),
            ("\\$A", "$A"),
            ("\"\\$A \\\" \\x\"", "$A \" \\x"),
            ("a\\ b", "a b"),
            ("$", "$"),
            ("$/x", "$/x"),
            ("${A:-a}}", "apple}"),
            ("${U:-a\\}b}", "a}b"),
            ("${U:-'}'}", "}"),
            ("$SP", "a b"),
            ("trailing\\", "trailing"),
        ];
        for (word, want) in cases {
            assert_eq!(x(word).as_deref(), Ok(want), "{word}");
        }
    }

    #[test]
    fn backtick_escape() {
        assert_eq!(
            expand("C:\\dir` x`$A", '`', &vars).as_deref(),
            Ok("C:\\dir x$A")
        );
    }

    #[test]
    fn refuses_what_it_cannot() {
        assert_eq!(x("'abc"), Err(SubstError::Unclosed("single")));
        assert_eq!(x("\"abc"), Err(SubstError::Unclosed("double")));
        assert_eq!(x("${A"), Err(SubstError::UnclosedBrace));
        assert_eq!(x("${A:-x"), Err(SubstError::UnclosedBrace));
        assert_eq!(x("${}"), Err(SubstError::NoName));
        assert!(matches!(x("${A#x}"), Err(SubstError::Modifier { .. })));
        assert!(matches!(x("${A/x/y}"), Err(SubstError::Modifier { .. })));
        assert_eq!(
            x("${U:?set U}"),
            Err(SubstError::Required {
                name: "U".into(),
                message: "set U".into()
            })
        );
        assert_eq!(x("${E?x}").as_deref(), Ok(""));
        assert_eq!(x(&"${U:-".repeat(40)), Err(SubstError::TooDeep));
        let long = |_: &str| Some("x".repeat(MAX_VALUE_BYTES / 2 + 1));
        assert_eq!(expand("$A$A", '\\', &long), Err(SubstError::TooLong));
    }

    #[test]
    fn splits_words() {
        assert_eq!(
            split_quoted(r#" a=1  b="x y" c='p q'\ r d=\"e "#, '\\'),
            vec!["a=1", "b=\"x y\"", "c='p q'\\ r", "d=\\\"e"]
        );
        assert_eq!(split_quoted("", '\\'), Vec::<String>::new());
    }
}
