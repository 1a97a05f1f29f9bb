//! The embeddings a projector keeps of the media it encoded last, so that a conversation (or
//! several requests) about one image or clip encodes it once.
//!
//! mtmd names every chunk it makes of one bitmap with the bitmap's id: an audio clip becomes a
//! chunk per 30 s, a tiled image an overview and its tiles, all under one id. Kept by id alone,
//! every later chunk of a clip took the first chunk's embeddings (a 60 s clip: three chunks,
//! one encode, logits off by up to 7). A chunk is kept by its id and its part: how many media
//! chunks of the same id come before it in its list. The same bitmap always becomes the same
//! chunks, so a key names one chunk's content wherever it is met.

use std::collections::VecDeque;
use std::sync::Arc;

use llama_cpp_4::mtmd::MtmdInputChunks;

/// At most this many chunks' embeddings, and this many bytes of them, are kept; the oldest go
/// first.
const KEPT_ENCODINGS: usize = 16;
const KEPT_ENCODING_BYTES: usize = 256 << 20;

/// Which media chunk a kept encoding is of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaKey {
    /// The id mtmd copied from the chunk's bitmap (`MtmdBitmap.id`).
    id: String,
    /// Media chunks of the same id before this one in its list.
    part: usize,
}

impl MediaKey {
    /// The key of chunk `index` of `chunks`; None for a text chunk and for media without an id
    /// (never kept: nothing tells two of them apart).
    pub fn of(chunks: &MtmdInputChunks, index: usize) -> Option<Self> {
        let id = chunks.get(index)?.id().filter(|id| !id.is_empty())?.to_owned();
        let earlier = (0..index).map(|at| chunks.get(at).and_then(|chunk| chunk.id().map(str::to_owned)));
        Some(Self::after(id, earlier))
    }

    /// The key of media `id` that follows chunks of the ids `earlier` (None for text).
    fn after(id: String, earlier: impl Iterator<Item = Option<String>>) -> Self {
        let part = earlier.filter(|other| other.as_deref() == Some(id.as_str())).count();
        Self { id, part }
    }
}

/// The embeddings of the last media chunks encoded, oldest first.
#[derive(Default)]
pub struct KeptEncodings {
    kept: VecDeque<(MediaKey, Arc<Vec<f32>>)>,
}

impl KeptEncodings {
    /// The embeddings kept for `key`.
    pub fn get(&self, key: &MediaKey) -> Option<Arc<Vec<f32>>> {
        self.kept
            .iter()
            .find(|(kept, _)| kept == key)
            .map(|(_, embeddings)| Arc::clone(embeddings))
    }

    /// Keeps `embeddings` for `key`, dropping the oldest past the bounds.
    pub fn keep(&mut self, key: MediaKey, embeddings: Arc<Vec<f32>>) {
        self.kept.push_back((key, embeddings));
        let bytes =
            |kept: &VecDeque<(MediaKey, Arc<Vec<f32>>)>| kept.iter().map(|(_, values)| values.len() * 4).sum::<usize>();
        while self.kept.len() > KEPT_ENCODINGS || bytes(&self.kept) > KEPT_ENCODING_BYTES {
            self.kept.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, earlier: &[Option<&str>]) -> MediaKey {
        MediaKey::after(id.to_owned(), earlier.iter().map(|id| id.map(str::to_owned)))
    }

    #[test]
    fn chunks_of_one_bitmap_have_keys_of_their_own() {
        // A clip in three chunks between text, as mtmd tokenizes a 60 s clip.
        let first = key("clip", &[None]);
        let second = key("clip", &[None, Some("clip")]);
        let third = key("clip", &[None, Some("clip"), Some("clip"), None]);
        assert_ne!(first, second);
        assert_ne!(second, third);
        // Another bitmap between them does not move a chunk's part.
        assert_eq!(key("clip", &[Some("image"), Some("clip")]), second);
    }

    #[test]
    fn each_chunk_gets_its_own_embeddings_back() {
        let mut kept = KeptEncodings::default();
        let (first, second) = (key("clip", &[]), key("clip", &[Some("clip")]));
        kept.keep(first.clone(), Arc::new(vec![1.0]));
        assert_eq!(kept.get(&second), None);
        kept.keep(second.clone(), Arc::new(vec![2.0]));
        assert_eq!(kept.get(&first).as_deref(), Some(&vec![1.0]));
        assert_eq!(kept.get(&second).as_deref(), Some(&vec![2.0]));
    }

    #[test]
    fn the_oldest_go_first() {
        let mut kept = KeptEncodings::default();
        let keys: Vec<MediaKey> = (0..=KEPT_ENCODINGS).map(|n| key(&n.to_string(), &[])).collect();
        for key in &keys {
            kept.keep(key.clone(), Arc::new(vec![0.0]));
        }
        assert_eq!(kept.get(&keys[0]), None);
        assert!(kept.get(&keys[KEPT_ENCODINGS]).is_some());
        kept.keep(key("large", &[]), Arc::new(vec![0.0; KEPT_ENCODING_BYTES / 4]));
        assert_eq!(kept.get(&keys[KEPT_ENCODINGS]), None);
    }
}
