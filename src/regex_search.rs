//! Regular expressions matched in time linear in the text: the check of a JSON Schema's
//! finished value (`python/llamactx/_schema_check.py`) matches `pattern` and
//! `patternProperties` with them, because schemas are untrusted and Python's backtracking `re`
//! can take exponential time on a pattern such as `^(a+)+$`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use regex::{Regex, RegexBuilder};

/// Bytes a compiled pattern and its lazy DFA may take: a hostile pattern is refused, not built.
const SIZE_LIMIT: usize = 1 << 22;

/// A pattern compiled by the `regex` crate: ECMA-262's syntax less look-around and
/// back-references (which llguidance refuses too).
#[pyclass(frozen, module = "llamactx", name = "_Regex")]
pub struct PyRegex {
    regex: Regex,
}

#[pymethods]
impl PyRegex {
    /// `ValueError` for a pattern the `regex` crate cannot compile within its size limit.
    #[new]
    fn new(pattern: &str) -> PyResult<Self> {
        RegexBuilder::new(pattern)
            .size_limit(SIZE_LIMIT)
            .dfa_size_limit(SIZE_LIMIT)
            .build()
            .map(|regex| Self { regex })
            .map_err(|err| PyValueError::new_err(format!("the pattern {pattern:?} cannot be compiled: {err}")))
    }

    /// Whether the pattern matches anywhere in `text` (JSON Schema's `pattern` is unanchored).
    fn search(&self, py: Python<'_>, text: &str) -> bool {
        py.detach(|| self.regex.is_match(text))
    }
}
