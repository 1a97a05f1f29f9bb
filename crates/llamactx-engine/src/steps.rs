//! One sequence's generation rules, which the engine's scheduler follows (on the engine's
//! context, and on a caller's for `generate`, `stream` and `generate_batch`): token bytes become text without cutting a UTF-8 character, stop strings
//! end the text (and are held back while they may be starting), and `max_tokens`, the
//! sequence's context size and end-of-generation tokens end the sequence.

use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::token::LlamaToken;

use crate::errors::Result;

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens`, or the sequence's context is full.
    Length,
}

impl Finish {
    pub fn name(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

/// Token bytes to text: complete UTF-8 characters only, invalid bytes as U+FFFD (as Python's
/// `errors="replace"` decoder does), stop strings cut out.
pub struct TextStream {
    /// The start of a character whose remaining bytes have not come yet.
    partial: Vec<u8>,
    stops: Vec<String>,
    /// Decoded text that may be the start of a stop string.
    held: String,
}

impl TextStream {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            partial: Vec::new(),
            stops: stops.into_iter().filter(|stop| !stop.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// The text safe to emit after `bytes`, and whether a stop string was reached (the text
    /// then ends before it).
    pub fn push(&mut self, bytes: &[u8]) -> (String, bool) {
        let text = self.decode(bytes, false);
        self.hold_back(&text)
    }

    /// The text still held back, at the end of the sequence.
    pub fn finish(&mut self) -> String {
        let text = self.decode(&[], true);
        let (mut out, stopped) = self.hold_back(&text);
        if !stopped {
            out.push_str(&std::mem::take(&mut self.held));
        }
        out
    }

    fn decode(&mut self, bytes: &[u8], last: bool) -> String {
        let mut buffer = std::mem::take(&mut self.partial);
        buffer.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest = buffer.as_slice();
        while !rest.is_empty() {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    out.push_str(text);
                    rest = &[];
                }
                Err(err) => {
                    let (valid, after) = rest.split_at(err.valid_up_to());
                    out.push_str(&String::from_utf8_lossy(valid));
                    match err.error_len() {
                        Some(invalid) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = after.get(invalid..).unwrap_or_default();
                        }
                        None if last => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &[];
                        }
                        None => {
                            self.partial = after.to_vec();
                            rest = &[];
                        }
                    }
                }
            }
        }
        out
    }

    fn hold_back(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if let Some(at) = self.stops.iter().filter_map(|stop| self.held.find(stop.as_str())).min() {
            let out = self.held[..at].to_owned();
            self.held.clear();
            return (out, true);
        }
        let keep = self
            .stops
            .iter()
            .map(|stop| overlap(&self.held, stop))
            .max()
            .unwrap_or(0);
        let out = self.held[..self.held.len() - keep].to_owned();
        self.held.replace_range(..self.held.len() - keep, "");
        (out, false)
    }
}

/// Bytes in the longest end of `text` (whole characters) that is a proper start of `stop`.
fn overlap(text: &str, stop: &str) -> usize {
    let longest = text.len().min(stop.len().saturating_sub(1));
    (1..=longest)
        .rev()
        .find(|&n| {
            let start = text.len() - n;
            text.is_char_boundary(start) && stop.as_bytes().starts_with(&text.as_bytes()[start..])
        })
        .unwrap_or(0)
}

/// The rules one generating sequence follows, token by token.
pub struct Steps {
    text: TextStream,
    max_tokens: usize,
    generated: usize,
    /// Tokens the sequence may hold, prompt and completion, as OpenAI and llama-server count a
    /// context: the token that makes `n_ctx` is the last (it is never decoded).
    n_ctx: usize,
}

impl Steps {
    pub fn new(stops: Vec<String>, max_tokens: usize, n_ctx: usize) -> Self {
        Self {
            text: TextStream::new(stops),
            max_tokens,
            generated: 0,
            n_ctx,
        }
    }

    /// Takes a sampled token (its bytes, whether it ends generation) of a sequence that holds
    /// `kv_len` tokens: the text to emit, and why the sequence ends if it does. A token that
    /// does not end it must be decoded next, at position `kv_len`.
    pub fn take(&mut self, bytes: &[u8], end_of_generation: bool, kv_len: usize) -> (String, Option<Finish>) {
        self.generated += 1;
        if end_of_generation {
            return (self.text.finish(), Some(Finish::Stop));
        }
        let (mut piece, stopped) = self.text.push(bytes);
        if stopped {
            return (piece, Some(Finish::Stop));
        }
        if self.generated >= self.max_tokens || kv_len + 1 >= self.n_ctx {
            piece.push_str(&self.text.finish());
            return (piece, Some(Finish::Length));
        }
        (piece, None)
    }
}

/// The bytes `token` adds to generated text (special tokens render as nothing).
pub fn token_bytes(model: &LlamaModel, token: LlamaToken) -> Result<Vec<u8>> {
    crate::model::piece(model, token.0, false)
}

#[cfg(test)]
mod tests {
    use super::{Finish, Steps, TextStream};

    #[test]
    fn prompt_and_completion_hold_at_most_n_ctx_tokens() {
        let mut steps = Steps::new(vec![], 100, 8);
        assert!(steps.take(b"a", false, 6).1.is_none()); // the 7th token: decoded next
        assert!(matches!(steps.take(b"b", false, 7).1, Some(Finish::Length))); // the 8th: the last
    }

    #[test]
    fn characters_split_across_tokens_come_out_whole() {
        let mut text = TextStream::new(vec![]);
        let euro = "€".as_bytes();
        assert_eq!(text.push(&euro[..1]), (String::new(), false));
        assert_eq!(text.push(&euro[1..]), ("€".to_owned(), false));
        assert_eq!(text.push(b"\xffa"), ("\u{fffd}a".to_owned(), false));
        assert_eq!(text.push(&euro[..2]), (String::new(), false));
        assert_eq!(text.finish(), "\u{fffd}");
    }

    #[test]
    fn stop_strings_are_held_back_then_cut() {
        let mut text = TextStream::new(vec!["END".to_owned(), String::new()]);
        assert_eq!(text.push(b"abc E"), ("abc ".to_owned(), false));
        assert_eq!(text.push(b"N"), (String::new(), false));
        assert_eq!(text.push(b"x"), ("ENx".to_owned(), false));
        assert_eq!(text.push(b"yEND more"), ("y".to_owned(), true));
        let mut held = TextStream::new(vec!["é!".to_owned()]);
        assert_eq!(held.push("aé".as_bytes()), ("a".to_owned(), false));
        assert_eq!(held.finish(), "é");
    }
}
