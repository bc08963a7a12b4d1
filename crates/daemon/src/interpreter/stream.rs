//! Splitting a kernel's output stream into the user's text and the
//! kernel's own messages.
//!
//! A kernel writes its messages as `"\x1eairlock-<nonce> " + JSON + "\n"`
//! on the same pipe as the user's output (see `python.py`), so the two keep
//! their order. The nonce is drawn per kernel, so output that happens to
//! contain the record separator is still text.

use serde::Deserialize;
use serde_json::{Map, Value};

/// A message a kernel writes about the execution it runs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KernelMessage {
    /// A value to show: the cell's own (`main`) or one passed to `display`.
    Result {
        main: bool,
        /// MIME-ish format name (`text`, `html`, `png`…) to its content.
        data: Map<String, Value>,
    },
    /// The cell raised.
    Error {
        name: String,
        value: String,
        traceback: String,
    },
    /// The kernel's execution counter after this execution.
    Count { n: u64 },
    /// Nothing more of this execution follows on this stream.
    End,
}

/// A piece of one stream, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// The user's output: a whole line with its `\n`, or a part of one
    /// that was written without one.
    Text(String),
    /// A kernel message.
    Message(KernelMessage),
}

/// The longest message line a kernel may write (a result with an image).
const MAX_MESSAGE: usize = 64 << 20;

/// The parser of one stream of one kernel.
#[derive(Debug)]
pub struct StreamParser {
    mark: Vec<u8>,
    pending: Vec<u8>,
}

impl StreamParser {
    /// A parser for a kernel started with `nonce`.
    pub fn new(nonce: &str) -> StreamParser {
        StreamParser {
            mark: format!("\x1eairlock-{nonce} ").into_bytes(),
            pending: Vec::new(),
        }
    }

    /// Takes the next chunk of the stream and returns what it completes.
    /// Text is held back only while it could be the start of a message or
    /// ends inside a UTF-8 sequence.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Piece> {
        self.pending.extend_from_slice(chunk);
        let mut pieces = Vec::new();
        loop {
            match find(&self.pending, &self.mark) {
                Some(at) => {
                    let text: Vec<u8> = self.pending.drain(..at).collect();
                    push_text(&mut pieces, &String::from_utf8_lossy(&text));
                    let body_start = self.mark.len();
                    let Some(newline) = self.pending[body_start..].iter().position(|&b| b == b'\n')
                    else {
                        if self.pending.len() > MAX_MESSAGE {
                            // Not a message after all: let it through as text.
                            let text: Vec<u8> = std::mem::take(&mut self.pending);
                            push_text(&mut pieces, &String::from_utf8_lossy(&text));
                        }
                        break;
                    };
                    let line: Vec<u8> = self.pending.drain(..body_start + newline + 1).collect();
                    let body = &line[body_start..line.len() - 1];
                    match serde_json::from_slice::<KernelMessage>(body) {
                        Ok(message) => pieces.push(Piece::Message(message)),
                        Err(_) => push_text(&mut pieces, &String::from_utf8_lossy(&line)),
                    }
                }
                None => {
                    let keep = held_back(&self.pending, &self.mark);
                    let ready = self.pending.len() - keep;
                    let text: Vec<u8> = self.pending.drain(..ready).collect();
                    push_text(&mut pieces, &String::from_utf8_lossy(&text));
                    break;
                }
            }
        }
        pieces
    }
}

/// How many bytes at the end of `pending` must wait for more: a prefix of
/// the mark, or an unfinished UTF-8 sequence.
fn held_back(pending: &[u8], mark: &[u8]) -> usize {
    let prefix = (1..mark.len().min(pending.len() + 1))
        .rev()
        .find(|&n| pending.ends_with(&mark[..n]))
        .unwrap_or(0);
    let text = &pending[..pending.len() - prefix];
    let unfinished = match std::str::from_utf8(text) {
        Ok(_) => 0,
        Err(e) if e.error_len().is_none() => text.len() - e.valid_up_to(),
        Err(_) => {
            // Invalid somewhere; only an unfinished tail is worth waiting for.
            let tail_start = text.len().saturating_sub(3);
            (tail_start..text.len())
                .find(|&i| {
                    matches!(std::str::from_utf8(&text[i..]), Err(e) if e.valid_up_to() == 0 && e.error_len().is_none())
                })
                .map_or(0, |i| text.len() - i)
        }
    };
    prefix + unfinished
}

/// Splits `text` into lines, each keeping its `\n`.
fn push_text(pieces: &mut Vec<Piece>, text: &str) {
    for line in text.split_inclusive('\n') {
        pieces.push(Piece::Text(line.to_owned()));
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Piece {
        Piece::Text(s.to_owned())
    }

    #[test]
    fn lines_and_messages_keep_their_order() {
        let mut parser = StreamParser::new("n1");
        let pieces = parser.push(
            b"a\nb\nc\x1eairlock-n1 {\"type\":\"count\",\"n\":3}\n\x1eairlock-n1 {\"type\":\"end\"}\n",
        );
        assert_eq!(
            pieces,
            vec![
                text("a\n"),
                text("b\n"),
                text("c"),
                Piece::Message(KernelMessage::Count { n: 3 }),
                Piece::Message(KernelMessage::End),
            ]
        );
    }

    #[test]
    fn a_message_split_across_chunks_waits_for_its_end() {
        let mut parser = StreamParser::new("n1");
        let whole = b"out\x1eairlock-n1 {\"type\":\"end\"}\nmore";
        let mut pieces = Vec::new();
        for byte in whole.iter() {
            pieces.extend(parser.push(&[*byte]));
        }
        let joined: String = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Text(t) => Some(t.as_str()),
                Piece::Message(_) => None,
            })
            .collect();
        assert_eq!(joined, "outmore");
        assert!(pieces.contains(&Piece::Message(KernelMessage::End)));
    }

    #[test]
    fn another_nonce_or_a_bad_body_is_text() {
        let mut parser = StreamParser::new("right");
        let pieces = parser.push(b"\x1eairlock-wrong {\"type\":\"end\"}\n");
        assert_eq!(pieces, vec![text("\x1eairlock-wrong {\"type\":\"end\"}\n")]);
        let pieces = parser.push(b"\x1eairlock-right {nope}\n");
        assert_eq!(pieces, vec![text("\x1eairlock-right {nope}\n")]);
    }

    #[test]
    fn multibyte_characters_split_across_chunks_survive() {
        let mut parser = StreamParser::new("n");
        let snowman = "☃\n".as_bytes();
        let mut pieces = parser.push(&snowman[..1]);
        assert!(pieces.is_empty());
        pieces.extend(parser.push(&snowman[1..]));
        assert_eq!(pieces, vec![text("☃\n")]);
    }

    #[test]
    fn results_and_errors_parse() {
        let mut parser = StreamParser::new("n");
        let pieces = parser.push(
            b"\x1eairlock-n {\"type\":\"result\",\"main\":true,\"data\":{\"text\":\"42\"}}\n\
              \x1eairlock-n {\"type\":\"error\",\"name\":\"E\",\"value\":\"v\",\"traceback\":\"t\"}\n",
        );
        let mut data = Map::new();
        data.insert("text".into(), Value::from("42"));
        assert_eq!(
            pieces,
            vec![
                Piece::Message(KernelMessage::Result { main: true, data }),
                Piece::Message(KernelMessage::Error {
                    name: "E".into(),
                    value: "v".into(),
                    traceback: "t".into()
                }),
            ]
        );
    }
}
