//! `MtmdInputChunks`: a prompt tokenized with its media, as mtmd returns it: runs of text tokens
//! and image or audio chunks, in order. Immutable once made.

use llama_cpp_4::mtmd::{MtmdInputChunk, MtmdInputChunks};

/// The crate's chunk list, shared read-only.
pub struct SharedChunks(pub MtmdInputChunks);

impl SharedChunks {
    /// Chunk `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<MtmdInputChunk<'_>> {
        self.0.get(index)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    /// The KV cells all chunks take: their text tokens and media embeddings (more than their
    /// positions where a model places several embeddings at a position, M-RoPE).
    pub fn cells(&self) -> usize {
        self.0.n_tokens()
    }
}

// SAFETY: `MtmdInputChunks` is `!Send`/`!Sync` only for its raw pointer. The list is never
// changed after `tokenize` filled it, and mtmd's chunk accessors only read it.
unsafe impl Send for SharedChunks {}
// SAFETY: as above: shared references only read.
unsafe impl Sync for SharedChunks {}
