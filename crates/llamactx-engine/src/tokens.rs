//! Token ids, checked against the vocabulary before llama.cpp sees them (an out-of-range id
//! aborts inside llama.cpp); `python.rs` reads them from Python.

use llama_cpp_4::token::LlamaToken;

use crate::errors::{Error, Result};

/// Checks that every id lies in `[0, n_vocab)`.
pub fn check_vocab(ids: &[i32], n_vocab: i32) -> Result<()> {
    match ids.iter().find(|&&id| id < 0 || id >= n_vocab) {
        Some(id) => Err(Error::value(format!(
            "token id {id} is outside the vocabulary [0, {n_vocab})"
        ))),
        None => Ok(()),
    }
}

pub fn to_llama_tokens(ids: &[i32]) -> Vec<LlamaToken> {
    ids.iter().copied().map(LlamaToken::new).collect()
}

pub fn to_ids(tokens: &[LlamaToken]) -> Vec<i32> {
    tokens.iter().map(|token| token.0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_bounds() {
        assert!(check_vocab(&[0, 9], 10).is_ok());
        assert!(matches!(check_vocab(&[10], 10), Err(Error::Value(_))));
        assert!(matches!(check_vocab(&[-1], 10), Err(Error::Value(_))));
    }
}
