//! The scheduler's media: an image's or audio clip's embeddings, encoded at submit, decoded
//! as a step entry of their own.

use super::{Phase, Running, Scheduler};
use crate::engine::backend::Backend;

impl<B: Backend> Scheduler<B> {
    /// Decodes the image each reading request is at, if any: each in a decode of its own (mtmd
    /// decodes one image per call), from the embeddings encoded at submit. A failure (which
    /// changed nothing) fails that request only. While a submitting thread holds the projector
    /// (encoding another request's image), the images wait for a later step if other requests
    /// have work in this one: their generation does not wait for the encode.
    pub fn read_media(&mut self) {
        if !self.backend.reads_media() {
            return;
        }
        let at_media = |running: &Running| {
            matches!(running.phase, Phase::Reading)
                && running.job.media_at(running.kv_len()).is_some()
                && self.in_turn(running)
        };
        if !self.running.iter().any(at_media) {
            return;
        }
        let others_busy = self
            .running
            .iter()
            .any(|running| running.phase.is_live() && !at_media(running));
        let mut failed = Vec::new();
        for index in 0..self.running.len() {
            let running = &self.running[index];
            if !matches!(running.phase, Phase::Reading) {
                continue;
            }
            let Some(span) = running.job.media_at(running.kv_len()) else {
                continue;
            };
            match self.backend.decode_media(span, running.seq, !others_busy) {
                Ok(false) => {}
                Ok(true) => {
                    let (at, width) = (span.at, span.width);
                    self.counters.prompt_tokens_computed += width as u64;
                    let running = &mut self.running[index];
                    let read = &running.job.prompt[at..at + width];
                    running.kv_tokens.extend_from_slice(read);
                }
                Err(err) => failed.push((index, err)),
            }
        }
        for (index, err) in failed {
            self.fail([index].into_iter(), err);
        }
    }
}
