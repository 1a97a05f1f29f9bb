//! GBNF, llama.cpp's grammar format, translated into llguidance's Lark.
//!
//! llama.cpp's grammar engine keeps one stack per way the text so far can be parsed, so an
//! ambiguous grammar such as `e ::= "a" e "b" | "a" e "c" | "z"` multiplies its work with every
//! character: one request could stall a step for minutes. llguidance's Earley parser bounds
//! the work of each step (and refuses a step past its limits), so every GBNF grammar given as
//! text (`generate(grammar=...)`, the engine, the server) is compiled by llguidance instead.
//!
//! The parse mirrors llama.cpp's (`llama-grammar.cpp`): the same syntax, escapes, whitespace
//! rules, nesting limit and repetition counts, so a grammar means the same in both. llama.cpp's
//! further bound on repetitions of repetitions (it expands them into rules) is not needed:
//! llguidance does not expand them, and such grammars compile in milliseconds. To keep
//! the language exactly, every character is its own lexeme: llguidance's lexer then never has
//! to choose between two splits of the text that GBNF's character-level matching both allows.

use std::collections::HashMap;
use std::fmt::Write as _;

pub mod left_linear;

/// Deepest nesting of parentheses llama.cpp parses (`GRAMMAR_RECURSIVE_LIMIT`).
const MAX_NESTING: usize = 256;
/// llama.cpp's `MAX_REPETITION_THRESHOLD`: a larger minimum is refused, a larger maximum means
/// no maximum.
const MAX_REPETITIONS: u64 = 2000;

/// The Lark grammar accepting what the GBNF `source` does from its rule `root`, or why `source`
/// is not GBNF that llama.cpp would parse.
pub fn to_lark(source: &str, root: &str) -> Result<String, String> {
    let mut parser = Parser {
        src: source,
        pos: 0,
        rules: Vec::new(),
        defined: HashMap::new(),
    };
    parser.skip_space(true);
    while parser.pos < source.len() {
        parser.rule()?;
    }
    for name in &parser.rules {
        if !parser.defined.contains_key(name) {
            return Err(format!("undefined rule identifier '{name}'"));
        }
    }
    if !parser.defined.contains_key(root) {
        return Err(format!("the grammar has no rule '{root}' to start from"));
    }
    let mut lark = format!("start: {}\n", lark_name(root));
    for (name, body) in left_linear::rules(&parser.defined, root) {
        let _ = writeln!(lark, "{name}: {body}");
    }
    Ok(lark)
}

/// One alternative of a rule.
struct Alt<'a> {
    /// Its items, in Lark.
    items: Vec<String>,
    /// Every rule it references, at any depth.
    refs: Vec<&'a str>,
    /// The rule its last item is, when that item is a bare reference.
    tail: Option<&'a str>,
}

/// A sequence of Lark items, after `first` when given.
fn sequence_lark(first: Option<&str>, items: &[String]) -> String {
    let items: Vec<&str> = first
        .into_iter()
        .chain(items.iter().map(String::as_str).filter(|item| !item.is_empty()))
        .collect();
    if items.is_empty() {
        "\"\"".to_owned()
    } else {
        items.join(" ")
    }
}

/// Alternatives in Lark, one after another.
fn alternatives(alts: &[Alt<'_>]) -> String {
    alts.iter()
        .map(|alt| sequence_lark(None, &alt.items))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// A GBNF rule name (`[a-zA-Z0-9-]+`) as a Lark rule name, one to one: `g_` first, an
/// uppercase letter as `_` and its lowercase, `-` as `__`.
fn lark_name(name: &str) -> String {
    let mut out = String::from("g_");
    for c in name.chars() {
        match c {
            'A'..='Z' => {
                out.push('_');
                out.push(c.to_ascii_lowercase());
            }
            '-' => out.push_str("__"),
            _ => out.push(c),
        }
    }
    out
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    /// Every rule name referenced (for the undefined-rule check).
    rules: Vec<&'a str>,
    /// Each defined rule's alternatives (a rule defined twice keeps its last definition, as in
    /// llama.cpp).
    defined: HashMap<&'a str, Vec<Alt<'a>>>,
}

fn is_word_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.src.as_bytes().get(self.pos).copied()
    }

    fn peek_at(&self, offset: usize) -> Option<u8> {
        self.src.as_bytes().get(self.pos + offset).copied()
    }

    fn error(&self, what: &str) -> String {
        let rest: String = self.src[self.pos..].chars().take(40).collect();
        format!("{what} at {rest:?}")
    }

    /// Spaces, tabs and `#` comments; newlines too where `newline_ok`.
    fn skip_space(&mut self, newline_ok: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newline_ok => self.pos += 1,
                b'#' => {
                    while !matches!(self.peek(), None | Some(b'\r' | b'\n')) {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Result<&'a str, String> {
        let start = self.pos;
        while self.peek().is_some_and(is_word_char) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error("expecting name"));
        }
        Ok(&self.src[start..self.pos])
    }

    fn int(&mut self) -> Result<u64, String> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error("expecting an int"));
        }
        self.src[start..self.pos]
            .parse()
            .map_err(|_| self.error("integer out of range"))
    }

    fn rule(&mut self) -> Result<(), String> {
        let name = self.name()?;
        self.skip_space(false);
        if !self.src[self.pos..].starts_with("::=") {
            return Err(self.error("expecting ::="));
        }
        self.pos += 3;
        self.skip_space(true);
        let body = self.alternates(false, 0)?;
        match self.peek() {
            Some(b'\r') => self.pos += if self.peek_at(1) == Some(b'\n') { 2 } else { 1 },
            Some(b'\n') => self.pos += 1,
            Some(_) => return Err(self.error("expecting newline or end")),
            None => {}
        }
        self.skip_space(true);
        self.defined.insert(name, body);
        Ok(())
    }

    fn alternates(&mut self, nested: bool, depth: usize) -> Result<Vec<Alt<'a>>, String> {
        let mut alts = vec![self.sequence(nested, depth)?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.skip_space(true);
            alts.push(self.sequence(nested, depth)?);
        }
        Ok(alts)
    }

    /// One alternative: its items, each in Lark, with repetitions applied to the last one.
    fn sequence(&mut self, nested: bool, depth: usize) -> Result<Alt<'a>, String> {
        let referenced_before = self.rules.len();
        let mut items: Vec<String> = Vec::new();
        let mut tail = None;
        // Whether the last item can take a repetition (llama.cpp: a symbol was just pushed).
        let mut repeatable = false;
        while let Some(c) = self.peek() {
            // Every item but a rule's name ends a tail (a repetition too: it wraps the name).
            let ended = tail.take();
            match c {
                b'"' => {
                    self.pos += 1;
                    let mut chars = Vec::new();
                    while self.peek() != Some(b'"') {
                        if self.peek().is_none() {
                            return Err("unexpected end of input".to_owned());
                        }
                        let c = self.char()?;
                        if c == '\0' {
                            return Err(self.error("a NUL character (llama.cpp never generates one)"));
                        }
                        chars.push(literal(c));
                    }
                    self.pos += 1;
                    repeatable = !chars.is_empty();
                    items.push(match chars.len() {
                        0 => String::new(),
                        1 => chars.remove(0),
                        _ => format!("({})", chars.join(" ")),
                    });
                }
                b'[' => {
                    items.push(self.class()?);
                    repeatable = true;
                }
                b'<' | b'!' => {
                    items.push(self.token()?);
                    repeatable = true;
                }
                b'(' => {
                    if depth >= MAX_NESTING {
                        return Err(format!("grammar recursion depth limit exceeded (max {MAX_NESTING})"));
                    }
                    self.pos += 1;
                    self.skip_space(true);
                    let inner = self.alternates(true, depth + 1)?;
                    if self.peek() != Some(b')') {
                        return Err(self.error("expecting ')'"));
                    }
                    self.pos += 1;
                    items.push(format!("({})", alternatives(&inner)));
                    repeatable = true;
                }
                b'.' => {
                    self.pos += 1;
                    items.push("/[^\\x{0}]/".to_owned());
                    repeatable = true;
                }
                b'*' | b'+' | b'?' | b'{' => {
                    let (min, max) = self.repetition()?;
                    let last = items.last_mut().filter(|_| repeatable);
                    let Some(last) = last else {
                        return Err(self.error("expecting preceding item to */+/?/{"));
                    };
                    *last = match max {
                        Some(max) => format!("({last}){{{min},{max}}}"),
                        None => format!("({last}){{{min},}}"),
                    };
                }
                c if is_word_char(c) => {
                    let name = self.name()?;
                    self.rules.push(name);
                    items.push(lark_name(name));
                    tail = Some(name);
                    repeatable = true;
                }
                _ => {
                    tail = ended;
                    break;
                }
            }
            self.skip_space(nested);
        }
        Ok(Alt {
            items,
            refs: self.rules[referenced_before..].to_vec(),
            tail,
        })
    }

    /// `*`, `+`, `?` or `{m}`, `{m,}`, `{m,n}`, as (minimum, maximum).
    fn repetition(&mut self) -> Result<(u64, Option<u64>), String> {
        let c = self.peek();
        self.pos += 1;
        let bounds = match c {
            Some(b'*') => (0, None),
            Some(b'+') => (1, None),
            Some(b'?') => (0, Some(1)),
            _ => {
                self.skip_space(false);
                let min = self.int()?;
                self.skip_space(false);
                let max = match self.peek() {
                    Some(b'}') => Some(min),
                    Some(b',') => {
                        self.pos += 1;
                        self.skip_space(false);
                        let max = if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                            Some(self.int()?)
                        } else {
                            None
                        };
                        self.skip_space(false);
                        if self.peek() != Some(b'}') {
                            return Err(self.error("expecting '}'"));
                        }
                        max
                    }
                    _ => return Err(self.error("expecting ','")),
                };
                self.pos += 1;
                if min > MAX_REPETITIONS {
                    return Err(
                        "number of repetitions exceeds sane defaults, please reduce the number of repetitions"
                            .to_owned(),
                    );
                }
                if max.is_some_and(|max| max < min) {
                    return Err(format!("a repetition {{{min},..}} whose maximum is below its minimum"));
                }
                (min, max.filter(|&max| max <= MAX_REPETITIONS))
            }
        };
        Ok(bounds)
    }

    /// `[...]` or `[^...]` as a one-character regex. Never NUL: llama.cpp refuses every token
    /// that starts with one, and matches no character after one.
    fn class(&mut self) -> Result<String, String> {
        self.pos += 1;
        let negated = self.peek() == Some(b'^');
        if negated {
            self.pos += 1;
        }
        let mut members = String::new();
        let mut empty = true;
        while self.peek() != Some(b']') {
            if self.peek().is_none() {
                return Err("unexpected end of input".to_owned());
            }
            let low = u32::from(self.char()?);
            let mut high = low;
            if self.peek() == Some(b'-') && !matches!(self.peek_at(1), Some(b']')) {
                if self.peek_at(1).is_none() {
                    return Err("unexpected end of input".to_owned());
                }
                self.pos += 1;
                high = u32::from(self.char()?);
                if high < low {
                    return Err(format!("the range \\x{{{low:x}}}-\\x{{{high:x}}} is empty"));
                }
            }
            let low = if negated { low } else { low.max(1) };
            if low <= high {
                let _ = write!(members, "\\x{{{low:x}}}-\\x{{{high:x}}}");
                empty = false;
            }
        }
        self.pos += 1;
        if negated {
            Ok(format!("/[^{members}\\x{{0}}]/"))
        } else if empty {
            Err(self.error("a character class that matches nothing (llama.cpp never generates NUL)"))
        } else {
            Ok(format!("/[{members}]/"))
        }
    }

    /// `<[id]>` or `<text>`: a token, as llguidance writes it; `!<...>` is not supported.
    fn token(&mut self) -> Result<String, String> {
        if self.peek() == Some(b'!') {
            return Err(self.error("negated tokens (!<...>) are not supported"));
        }
        let end = self.src[self.pos..]
            .find('>')
            .ok_or_else(|| self.error("expecting '>'"))?;
        let token = &self.src[self.pos..=self.pos + end];
        let inner = &token[1..token.len() - 1];
        let valid = match inner.strip_prefix('[').and_then(|id| id.strip_suffix(']')) {
            Some(id) => !id.is_empty() && id.bytes().all(|c| c.is_ascii_digit()),
            None => !inner.is_empty() && !inner.contains(['<', '\n', '"']),
        };
        if !valid {
            return Err(self.error("expecting a token <[id]> or <text>"));
        }
        self.pos += end + 1;
        Ok(token.to_owned())
    }

    /// One character of a literal or class: an escape, or a UTF-8 character.
    fn char(&mut self) -> Result<char, String> {
        if self.peek() == Some(b'\\') {
            let escape = self.peek_at(1);
            let hex_digits = match escape {
                Some(b'x') => 2,
                Some(b'u') => 4,
                Some(b'U') => 8,
                Some(c @ (b't' | b'r' | b'n' | b'\\' | b'"' | b'[' | b']' | b'-')) => {
                    self.pos += 2;
                    return Ok(match c {
                        b't' => '\t',
                        b'r' => '\r',
                        b'n' => '\n',
                        _ => char::from(c),
                    });
                }
                _ => return Err(self.error("unknown escape")),
            };
            let digits = self
                .src
                .get(self.pos + 2..self.pos + 2 + hex_digits)
                .filter(|digits| digits.bytes().all(|c| c.is_ascii_hexdigit()));
            let Some(digits) = digits else {
                return Err(self.error(&format!("expecting {hex_digits} hex chars")));
            };
            let value = u32::from_str_radix(digits, 16).map_err(|_| self.error("bad hex escape"))?;
            self.pos += 2 + hex_digits;
            return char::from_u32(value).ok_or_else(|| format!("\\x{value:x} is not a Unicode character"));
        }
        let c = self.src[self.pos..].chars().next().ok_or("unexpected end of input")?;
        self.pos += c.len_utf8();
        Ok(c)
    }
}

/// One character as a Lark string literal (JSON's escapes, which llguidance reads).
fn literal(c: char) -> String {
    serde_json::to_string(&c.to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_characters_and_repetitions_translate() {
        let lark = to_lark(
            "root ::= \"ab\"* [a-z0-9] item{2,3} .\nitem ::= [^\\n\\]] | \"\"",
            "root",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: g_root\ng_item: /[^\\x{a}-\\x{a}\\x{5d}-\\x{5d}\\x{0}]/ | \"\"\ng_root: ((\"a\" \"b\")){0,} \
             /[\\x{61}-\\x{7a}\\x{30}-\\x{39}]/ (g_item){2,3} /[^\\x{0}]/\n"
        );
        // NUL is never generated, as in llama.cpp.
        assert!(to_lark("root ::= [\\x00-\\x1F]", "root")
            .unwrap()
            .contains("/[\\x{1}-\\x{1f}]/"));
    }

    #[test]
    fn names_map_one_to_one() {
        assert_eq!(lark_name("Ab-c"), "g__ab__c");
        assert_ne!(lark_name("a-B"), lark_name("a_b"));
    }

    #[test]
    fn newlines_end_rules_outside_parentheses_only() {
        assert!(to_lark("root ::= \"a\"\n  \"b\"", "root").is_err());
        assert!(to_lark("root ::= (\"a\"\n  \"b\") |\n \"c\"", "root").is_ok());
    }

    #[test]
    fn what_llama_cpp_refuses_is_refused() {
        for (grammar, message) in [
            ("root ::= x", "undefined rule identifier 'x'"),
            ("root ::= *", "expecting preceding item"),
            ("root ::= \"a\"{2001}", "exceeds sane defaults"),
            ("root ::= \"\\q\"", "unknown escape"),
            ("root ::= [z-a]", "is empty"),
            ("root ::= [\\x00]", "matches nothing"),
            ("root ::= \"\\x00\"", "NUL character"),
            ("root ::= \"a\"{3,1}", "maximum is below its minimum"),
            ("root ::= \"a", "unexpected end of input"),
            ("other ::= \"a\"", "no rule 'root'"),
            ("root ::= \"\\uD800\"", "not a Unicode character"),
        ] {
            let error = to_lark(grammar, "root").unwrap_err();
            assert!(error.contains(message), "{grammar:?}: {error}");
        }
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(300), ")".repeat(300));
        assert!(to_lark(&deep, "root").unwrap_err().contains("depth limit"));
    }
}
