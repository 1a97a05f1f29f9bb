//! The checks of `prompt_checks` as Python calls them.

use pyo3::prelude::*;

use super::{ends_with_text, prompt, PromptShape};
use crate::errors::python::to_py;

/// Python's `MediaPrompt` checks its text after the last medium here (`ends_with_text`).
#[pyfunction]
#[pyo3(name = "_check_media_ending")]
pub fn check_media_ending(tokens_after_last_medium: usize) -> PyResult<()> {
    ends_with_text(tokens_after_last_medium).map_err(to_py)
}

/// Python's one-sequence paths check a request here: `ValueError` for a prompt of `cells`
/// that a sequence of `n_ctx_seq` cells can never generate after (`prompt`), or a negative
/// `max_tokens`; returns `max_tokens` as a count.
#[pyfunction]
#[pyo3(name = "_check_prompt", signature = (cells, n_ctx_seq, *, max_tokens=0, images=false, drafts=false))]
pub fn check_prompt(cells: usize, n_ctx_seq: usize, max_tokens: i64, images: bool, drafts: bool) -> PyResult<usize> {
    let max_tokens = super::max_tokens(max_tokens).map_err(to_py)?;
    prompt(PromptShape { cells, images, drafts }, n_ctx_seq).map_err(to_py)?;
    Ok(max_tokens)
}
