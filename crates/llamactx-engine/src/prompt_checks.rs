//! The checks a generation request passes before anything is decoded, for the engine and for
//! `generate`/`stream`/`chat`/`ChatSession` alike: each rule and its message are written once.

use crate::errors::{Error, Result};

/// What the checks see of a request's prompt.
#[derive(Debug, Clone, Copy)]
pub struct PromptShape {
    /// The KV cells it takes: its tokens, and its media's embeddings (at least as many as the
    /// positions it takes).
    pub cells: usize,
    pub images: bool,
    /// Whether tokens will be drafted for it (speculative decoding).
    pub drafts: bool,
}

/// `max_tokens` as a count: `ValueError` for a negative one.
pub fn max_tokens(max_tokens: i64) -> Result<usize> {
    usize::try_from(max_tokens).map_err(|_| Error::value(format!("max_tokens must be >= 0, got {max_tokens}")))
}

/// `ValueError` for a prompt that can never generate in a sequence of `n_ctx_seq` cells:
/// without tokens, leaving no room for one more, or with images and drafts (drafting reads
/// token runs only).
pub fn prompt(shape: PromptShape, n_ctx_seq: usize) -> Result<()> {
    if shape.cells == 0 {
        return Err(Error::value("the prompt has no tokens"));
    }
    if shape.images && shape.drafts {
        return Err(Error::value("speculative decoding does not take prompts with images"));
    }
    if shape.cells >= n_ctx_seq {
        let images = if shape.images { ", its images' included" } else { "" };
        return Err(Error::value(format!(
            "the prompt has {} tokens{images}; a sequence holds {n_ctx_seq} (n_ctx / n_seq_max), and the prompt \
             must leave room for a token",
            shape.cells
        )));
    }
    Ok(())
}

/// `ValueError` for a prompt with media whose last medium is not followed by text (its last
/// token's logits are where generation starts: a medium's embeddings have none).
pub fn ends_with_text(tokens_after_last_medium: usize) -> Result<()> {
    if tokens_after_last_medium == 0 {
        return Err(Error::value("a prompt must end with text after its last image"));
    }
    Ok(())
}
