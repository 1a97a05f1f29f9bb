//! A prompt with images, as the engine reads it: one token list in which each image takes its
//! positions with placeholder tokens, and the images' embeddings, encoded at submit (in the
//! submitting thread: the engine keeps stepping meanwhile).
//!
//! The placeholders are negative ids (no vocabulary has them) derived from the image's id, the
//! hash of its pixels: the prefix cache, which compares tokens, so recognises the same image,
//! and never takes one image for another.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::token::LlamaToken;

use super::scheduler::MediaSpan;
use crate::errors::{Error, Result};
use crate::media::{SharedChunks, SharedMtmd};
use crate::prompt_checks::{self, PromptShape};

/// An image's chunks and where they go among the prompt's text tokens.
pub struct MediaInput {
    pub at: usize,
    pub chunks: Arc<SharedChunks>,
    pub made_by: u64,
}

/// What the length checks see of a prompt of `tokens` text tokens and `media`: its cells, each
/// image's counted from its chunks (all its embeddings: on an M-RoPE model, more than its
/// positions).
pub fn shape(tokens: usize, media: &[MediaInput], drafts: bool) -> PromptShape {
    PromptShape {
        cells: tokens + media.iter().map(|input| input.chunks.cells()).sum::<usize>(),
        images: !media.is_empty(),
        drafts,
    }
}

/// The assembled prompt: its tokens (placeholders included), the text tokens among them (to
/// check against the vocabulary) and its images.
pub struct MediaPrompt {
    pub tokens: Vec<LlamaToken>,
    pub text: Vec<i32>,
    pub media: Vec<MediaSpan>,
}

/// Splices each of `media` (in increasing `at`) into the text `tokens`: an image's text chunks
/// (a model's image delimiters) as tokens, its media chunks encoded by `mtmd` (or kept from an
/// earlier encode) behind placeholders. `ValueError` for chunks of another projector, positions
/// out of order or past the text, and a prompt that ends with an image (its last token must
/// have logits).
pub fn assemble(mtmd: &SharedMtmd, model: &LlamaModel, tokens: &[i32], media: &[MediaInput]) -> Result<MediaPrompt> {
    let mut assembled = MediaPrompt {
        tokens: Vec::with_capacity(tokens.len()),
        text: Vec::with_capacity(tokens.len()),
        media: Vec::with_capacity(media.len()),
    };
    let mut taken = 0;
    for input in media {
        if input.made_by != mtmd.id() {
            return Err(Error::value(
                "an image was tokenized by another MtmdContext than the engine's",
            ));
        }
        if input.at < taken || input.at > tokens.len() {
            return Err(Error::value(format!(
                "images must go at increasing positions within the {} text tokens, got {}",
                tokens.len(),
                input.at
            )));
        }
        assembled.push_text(&tokens[taken..input.at]);
        taken = input.at;
        for index in 0..input.chunks.0.len() {
            let chunk = input
                .chunks
                .0
                .get(index)
                .ok_or_else(|| Error::value(format!("chunk {index} is missing")))?;
            if let Some(text) = chunk.text_tokens() {
                assembled.push_text(text);
                continue;
            }
            let width = usize::try_from(chunk.n_pos()).map_err(|_| Error::value("an image has no positions"))?;
            let id = chunk.id().unwrap_or_default().to_owned();
            let embeddings = {
                let mut guard = mtmd.lock()?;
                let open = guard.as_mut().ok_or_else(|| Error::closed("MtmdContext"))?;
                open.encoded(model, &input.chunks.0, index)?
            };
            assembled.media.push(MediaSpan {
                at: assembled.tokens.len(),
                width,
                cells: chunk.n_tokens(),
                chunks: Arc::clone(&input.chunks),
                index,
                embeddings,
            });
            assembled.tokens.extend(placeholders(&id, width));
        }
    }
    assembled.push_text(&tokens[taken..]);
    if let Some(last) = assembled.media.last() {
        prompt_checks::ends_with_text(assembled.tokens.len().saturating_sub(last.at + last.width))?;
    }
    Ok(assembled)
}

/// `ValueError` unless `projector` was loaded for `model`.
pub fn check_projector(projector: &SharedMtmd, model: &Arc<LlamaModel>) -> Result<()> {
    if !projector.is_for(model) {
        return Err(Error::value("the MtmdContext was loaded for another model"));
    }
    Ok(())
}

/// The prompt of `tokens` with `media` spliced in by `projector` (their media encoded now, in
/// this thread); `ValueError` for media without a projector.
pub fn with_media(
    projector: Option<&SharedMtmd>,
    model: &LlamaModel,
    tokens: Vec<i32>,
    media: &[MediaInput],
) -> Result<MediaPrompt> {
    if media.is_empty() {
        return Ok(MediaPrompt::text_only(tokens));
    }
    let Some(mtmd) = projector else {
        return Err(Error::value(
            "no projector (mtmd) was given to read the prompt's images with",
        ));
    };
    assemble(mtmd, model, &tokens, media)
}

impl MediaPrompt {
    /// A prompt of text only.
    pub fn text_only(tokens: Vec<i32>) -> Self {
        Self {
            tokens: tokens.iter().map(|&token| LlamaToken::new(token)).collect(),
            text: tokens,
            media: Vec::new(),
        }
    }

    fn push_text(&mut self, tokens: &[i32]) {
        self.text.extend_from_slice(tokens);
        self.tokens.extend(tokens.iter().map(|&token| LlamaToken::new(token)));
    }
}

/// `width` placeholder tokens for the media named `id`: negative, and the same for the same id.
fn placeholders(id: &str, width: usize) -> impl Iterator<Item = LlamaToken> + '_ {
    (0..width).map(move |offset| {
        let mut hasher = DefaultHasher::new();
        (id, offset).hash(&mut hasher);
        // 30 bits of the hash, made negative.
        let bits = i32::try_from(hasher.finish() & 0x3fff_ffff).unwrap_or(0);
        LlamaToken::new(-1 - bits)
    })
}

#[cfg(test)]
mod tests {
    use super::placeholders;

    #[test]
    fn placeholders_are_negative_and_name_their_media() {
        let first: Vec<i32> = placeholders("abc", 16).map(|token| token.0).collect();
        assert!(first.iter().all(|&token| token < 0));
        assert_eq!(first, placeholders("abc", 16).map(|token| token.0).collect::<Vec<_>>());
        assert_ne!(first, placeholders("abd", 16).map(|token| token.0).collect::<Vec<_>>());
    }
}
