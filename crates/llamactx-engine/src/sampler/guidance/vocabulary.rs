//! The model's vocabulary as llguidance sees it: every token's bytes (special tokens marked with
//! llguidance's 0xFF prefix), built once per model and shared by every constraint on it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, Weak};

use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::token::LlamaToken;
use llguidance::ParserFactory;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::errors::{Error, Result};

/// A model's vocabulary, indexed for llguidance.
pub struct Indexed {
    /// Compiles constraints against the vocabulary.
    pub factory: ParserFactory,
    /// The token ids llguidance's end of sequence stands for: the model's EOT (else EOS)
    /// first, then every other end-of-generation token.
    pub ends: Arc<[TokenId]>,
}

/// The vocabularies indexed so far, by model. A `Weak` keeps its model's allocation (not the
/// model), so a live model's address never matches a dead model's entry.
static INDEXED: Mutex<Vec<(Weak<LlamaModel>, Arc<Indexed>)>> = Mutex::new(Vec::new());

/// `model`'s vocabulary for llguidance; the first call for a model builds it (a pass over
/// every token).
pub fn indexed(model: &Arc<LlamaModel>) -> Result<Arc<Indexed>> {
    let mut indexed = INDEXED.lock().map_err(|_| Error::Poisoned("llguidance vocabularies"))?;
    indexed.retain(|(owner, _)| owner.strong_count() > 0);
    if let Some((_, found)) = indexed.iter().find(|(owner, _)| owner.as_ptr() == Arc::as_ptr(model)) {
        return Ok(Arc::clone(found));
    }
    let ends: Arc<[TokenId]> = end_tokens(model)?.into();
    let built = Arc::new(Indexed {
        factory: build(model, ends[0])?,
        ends,
    });
    indexed.push((Arc::downgrade(model), Arc::clone(&built)));
    Ok(built)
}

/// `Indexed::ends` of `model`; `ValueError` for a model with neither EOT nor EOS.
fn end_tokens(model: &LlamaModel) -> Result<Vec<TokenId>> {
    let eot = model.token_eot();
    let first = if eot.0 >= 0 { eot } else { model.token_eos() };
    let first = TokenId::try_from(first.0).map_err(|_| {
        Error::value("the model has no end-of-generation token (EOT or EOS) for a constraint to end on")
    })?;
    let others = (0..model.n_vocab())
        .filter(|&id| model.is_eog_token(LlamaToken::new(id)))
        .filter_map(|id| TokenId::try_from(id).ok())
        .filter(|&id| id != first);
    Ok(std::iter::once(first).chain(others).collect())
}

fn build(model: &Arc<LlamaModel>, end: TokenId) -> Result<ParserFactory> {
    let words = (0..model.n_vocab())
        .map(|id| token_bytes(model, id))
        .collect::<Result<Vec<_>>>()?;
    let vocab_size = u32::try_from(words.len()).map_err(|_| Error::value("the vocabulary is too large"))?;
    let info = TokRxInfo::new(vocab_size, end);
    // toktrie asserts on what it cannot index (e.g. more than 2^24 trie nodes): a refusal here.
    let trie = catch_unwind(AssertUnwindSafe(|| TokTrie::from(&info, &words)))
        .map_err(|_| Error::value("llguidance cannot index this model's vocabulary"))?;
    let vocabulary: TokEnv = Arc::new(TokenBytes { trie });
    let mut factory = ParserFactory::new_simple(&vocabulary)
        .map_err(|err| Error::value(format!("llguidance cannot index this model's vocabulary: {err}")))?;
    factory.quiet();
    Ok(factory)
}

/// What a constraint matches for token `id`: its text, or for a token that renders only as
/// special (control tokens such as `<|im_end|>`) that text after llguidance's marker byte, so
/// a grammar can name it but never produces it from plain text.
fn token_bytes(model: &LlamaModel, id: i32) -> Result<Vec<u8>> {
    let plain = crate::model::piece(model, id, false)?;
    if !plain.is_empty() {
        return Ok(plain);
    }
    let special = crate::model::piece(model, id, true)?;
    if special.is_empty() {
        return Ok(special);
    }
    Ok([&[TokTrie::SPECIAL_TOKEN_MARKER][..], &special].concat())
}

struct TokenBytes {
    trie: TokTrie,
}

impl TokenizerEnv for TokenBytes {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Only forced-token prediction uses this (we do not), so the trie's greedy split serves
    /// and llama.cpp's tokenizer is never called from llguidance.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}
