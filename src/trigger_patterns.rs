//! Checks for the trigger patterns of lazy grammars, which llama.cpp compiles with `std::regex`
//! outside any try block: an invalid pattern would end the process, and libstdc++'s regex
//! compiler recurses once per nesting level, so a deep or long pattern overflows the stack.

use std::ffi::c_char;

use crate::errors::{Error, Result};

/// The longest pattern accepted, in bytes.
const MAX_PATTERN_BYTES: usize = 1024;
/// The deepest nesting of groups accepted.
const MAX_NESTING: usize = 32;

extern "C" {
    fn llamactx_regex_is_valid(pattern: *const c_char, length: usize) -> i32;
}

/// How deep `pattern`'s groups nest (escaped characters and character classes do not count).
fn nesting(pattern: &str) -> usize {
    let (mut depth, mut deepest, mut in_class, mut escaped) = (0_usize, 0, false, false);
    for c in pattern.chars() {
        match (escaped, in_class, c) {
            (true, _, _) => escaped = false,
            (false, _, '\\') => escaped = true,
            (false, false, '[') => in_class = true,
            (false, true, ']') => in_class = false,
            (false, false, '(') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (false, false, ')') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// `ValueError` for a pattern llama.cpp could not compile safely.
pub fn check(pattern: &str) -> Result<()> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(Error::value(format!(
            "a trigger pattern may hold at most {MAX_PATTERN_BYTES} bytes, got {}",
            pattern.len()
        )));
    }
    if nesting(pattern) > MAX_NESTING {
        return Err(Error::value(format!(
            "a trigger pattern may nest groups at most {MAX_NESTING} deep"
        )));
    }
    // SAFETY: the pointer and length describe `pattern`'s bytes, which outlive the call; the
    // function only reads them and catches every exception.
    if unsafe { llamactx_regex_is_valid(pattern.as_ptr().cast(), pattern.len()) } == 0 {
        return Err(Error::value(format!(
            "{pattern:?} is not a regular expression std::regex accepts (ECMAScript syntax)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_patterns_and_refuses_broken_deep_or_long_ones() {
        assert!(check(r"^\s*<tool_call>[\s\S]*").is_ok());
        assert!(check("([").is_err());
        assert!(check(&"(".repeat(40)).is_err());
        assert!(check(&format!("{}a{}", "(".repeat(33), ")".repeat(33))).is_err());
        assert!(check(&"a".repeat(2000)).is_err());
        assert_eq!(nesting(r"(a\(b)[(]((c))"), 2);
    }
}
