//! A scripted model for the scheduler's unit tests: its next token is a function of the tokens
//! before it, its KV cache a list of tokens per sequence, and it refuses any decode a real
//! context would refuse or that would leave holes (a position other than the next one of its
//! sequence: drafted cells kept after a rejection), so a scheduling mistake fails the test.

use std::collections::{HashMap, HashSet};

use llama_cpp_4::token::LlamaToken;

use super::backend::{Backend, Entry, Sizes};
use super::prefix_cache::Adapter;
use super::scheduler::MediaSpan;
use crate::errors::{Error, Result};

/// The end-of-generation token of every script.
pub const END: i32 = 0;

/// What a script's decode reports when it fails on purpose.
pub const FAILURE: &str = "the scripted decode failed";

pub type Script = fn(&[LlamaToken]) -> LlamaToken;

pub struct Scripted {
    sizes: Sizes,
    script: Script,
    /// How far the script's token stands out of the others in the logits (all 0).
    pub peak: f32,
    cells: HashMap<i32, Vec<LlamaToken>>,
    /// The logits of each entry of the last decode (None without an output).
    rows: Vec<Option<Vec<f32>>>,
    /// Every decode asked for, in order, failed ones included.
    pub decodes: Vec<Vec<Entry>>,
    /// The decodes (by their index in `decodes`) that fail, changing nothing.
    pub failing: HashSet<usize>,
    /// The adapter's scale now, and the scale each decode in `decodes` ran under.
    pub adapter: Adapter,
    pub decode_adapters: Vec<Adapter>,
    /// Called with a decode's index after it succeeded: a test submits or cancels from here,
    /// as another thread would in the middle of a step.
    pub after_decode: Option<Box<dyn FnMut(usize) + Send>>,
}

impl Scripted {
    pub fn new(sizes: Sizes, script: Script) -> Self {
        Self {
            sizes,
            script,
            peak: 10.0,
            cells: HashMap::new(),
            rows: Vec::new(),
            decodes: Vec::new(),
            failing: HashSet::new(),
            adapter: None,
            decode_adapters: Vec::new(),
            after_decode: None,
        }
    }

    /// The tokens sequence `seq` holds in the KV cache.
    pub fn cells(&self, seq: i32) -> &[LlamaToken] {
        self.cells.get(&seq).map_or(&[], Vec::as_slice)
    }

    /// What a real context would refuse, and holes in a sequence.
    fn check(&self, entries: &[Entry]) -> Result<()> {
        if entries.is_empty() || entries.len() > self.sizes.n_batch {
            return Err(Error::value(format!("a decode of {} entries", entries.len())));
        }
        let mut next: HashMap<i32, usize> = HashMap::new();
        for entry in entries {
            let seq_max = i32::try_from(self.sizes.n_seq_max).unwrap_or(i32::MAX);
            if !(0..seq_max).contains(&entry.seq) || !(0..self.sizes.n_vocab).contains(&entry.token.0) {
                return Err(Error::value(format!("{entry:?} is outside the context")));
            }
            let position = next.entry(entry.seq).or_insert_with(|| self.cells(entry.seq).len());
            if entry.position != *position || *position >= self.sizes.n_ctx_seq {
                return Err(Error::value(format!(
                    "{entry:?} does not follow the {position} cells before it"
                )));
            }
            *position += 1;
        }
        Ok(())
    }

    /// Logits where the script's token stands out by `peak`.
    fn logits(&self, history: &[LlamaToken]) -> Vec<f32> {
        let mut logits = vec![0.0; usize::try_from(self.sizes.n_vocab).unwrap_or(0)];
        if let Some(logit) = usize::try_from((self.script)(history).0)
            .ok()
            .and_then(|token| logits.get_mut(token))
        {
            *logit = self.peak;
        }
        logits
    }
}

impl Backend for Scripted {
    fn sizes(&self) -> Sizes {
        self.sizes
    }

    fn decode(&mut self, entries: &[Entry]) -> Result<()> {
        let index = self.decodes.len();
        self.decodes.push(entries.to_vec());
        self.decode_adapters.push(self.adapter);
        if self.failing.contains(&index) {
            return Err(Error::Runtime(FAILURE.to_owned()));
        }
        self.check(entries)?;
        self.rows.clear();
        for entry in entries {
            let cells = self.cells.entry(entry.seq).or_default();
            cells.push(entry.token);
            let history = cells.clone();
            self.rows.push(entry.output.then(|| self.logits(&history)));
        }
        if let Some(after_decode) = &mut self.after_decode {
            after_decode(index);
        }
        Ok(())
    }

    fn finish_compute(&mut self) {}

    fn read_logits<T: Send>(&self, row: usize, read: impl FnOnce(&[f32]) -> T) -> Result<T> {
        match self.rows.get(row) {
            Some(Some(logits)) => Ok(read(logits)),
            _ => Err(Error::index(format!("row {row} has no logits"))),
        }
    }

    fn last_row(&self) -> Result<usize> {
        self.rows
            .iter()
            .rposition(Option::is_some)
            .ok_or_else(|| Error::index("the last decode has no output row"))
    }

    fn clear_cells(&mut self, seq: i32, from: usize, to: Option<usize>) -> Result<bool> {
        let cells = self.cells.entry(seq).or_default();
        let to = to.unwrap_or(cells.len()).min(cells.len());
        if from < to {
            cells.drain(from..to);
        }
        Ok(true)
    }

    fn copy_cells(&mut self, source: i32, dest: i32, to: Option<usize>) -> Result<()> {
        if !self.cells(dest).is_empty() {
            return Err(Error::value(format!("sequence {dest} is not empty")));
        }
        let copied = self.cells(source);
        let copied = copied[..to.unwrap_or(copied.len()).min(copied.len())].to_vec();
        self.cells.insert(dest, copied);
        Ok(())
    }

    /// The cells' tokens and the tokens named, as words: a restore checks they agree.
    fn save_seq(&mut self, seq: i32, tokens: &[LlamaToken]) -> Result<Vec<u8>> {
        let words = |tokens: &[LlamaToken]| {
            tokens
                .iter()
                .flat_map(|token| token.0.to_le_bytes())
                .collect::<Vec<u8>>()
        };
        let count = u32::try_from(tokens.len()).map_err(|_| Error::value("too many tokens"))?;
        Ok([count.to_le_bytes().to_vec(), words(tokens), words(self.cells(seq))].concat())
    }

    fn restore_seq(&mut self, seq: i32, file: &[u8]) -> Result<Vec<LlamaToken>> {
        self.cells.remove(&seq);
        let words: Vec<i32> = file
            .chunks_exact(4)
            .map(|word| i32::from_le_bytes([word[0], word[1], word[2], word[3]]))
            .collect();
        let count = words
            .first()
            .and_then(|&count| usize::try_from(count).ok())
            .unwrap_or(usize::MAX);
        let (named, cells) = words
            .get(1..)
            .unwrap_or_default()
            .split_at(count.min(words.len().saturating_sub(1)));
        if !file.len().is_multiple_of(4) || named != cells {
            return Err(Error::value("not a state this scripted model saved"));
        }
        let tokens: Vec<LlamaToken> = named.iter().copied().map(LlamaToken::new).collect();
        self.cells.insert(seq, tokens.clone());
        Ok(tokens)
    }

    fn adapter(&self) -> Adapter {
        self.adapter
    }

    fn set_adapter_scale(&mut self, scale: f32) -> Result<()> {
        if self.adapter.is_none() {
            return Err(Error::value("the scripted model has no adapter"));
        }
        self.adapter = Some(scale.to_bits());
        Ok(())
    }

    fn is_end_of_generation(&self, token: LlamaToken) -> bool {
        token.0 == END
    }

    fn token_bytes(&self, token: LlamaToken) -> Result<Vec<u8>> {
        Ok(format!(" {}", token.0).into_bytes())
    }

    fn reads_media(&self) -> bool {
        false
    }

    fn decode_media(&mut self, _span: &MediaSpan, _seq: i32, _wait: bool) -> Result<bool> {
        Err(Error::value("the scripted model reads no media"))
    }
}
