//! A reranker's prompt for one (query, document) pair, as llama-server builds it
//! (`format_prompt_rerank`): the model's `rerank` template with `{query}` and `{document}` filled
//! in, or, without one, `[BOS] query [EOS] [SEP] document [EOS]`, each special token where the
//! vocabulary says to add it. One difference, on purpose: the query and the document are text,
//! whatever they hold. llama-server parses special tokens in the whole filled template, so a
//! document holding `<|im_end|>` would end the template's turn early; here such an input is
//! tokenized on its own, as plain text, and the rest as llama-server does. A pair without
//! special-token text gets llama-server's tokens exactly (the filled template as one string).

use llama_cpp_4::model::{AddBos, LlamaModel, Special};
use llama_cpp_4::token::LlamaToken;
use llama_cpp_4::StringFromModelError;
use pyo3::prelude::*;

use crate::errors::python::to_py;
use crate::errors::Result;
use crate::gil::detached;
use crate::model::python::PyLlamaModel;
use crate::tokens::to_ids;

const QUERY: &str = "{query}";
const DOCUMENT: &str = "{document}";

/// The tokens of a reranker's prompt for `query` and `document` (see the module's docs).
#[pyfunction]
#[pyo3(name = "_rerank_prompt")]
pub fn rerank_prompt(
    py: Python<'_>,
    model: &Bound<'_, PyLlamaModel>,
    query: &str,
    document: &str,
) -> PyResult<Vec<i32>> {
    let model = model.get().tokenizer().map_err(to_py)?;
    detached(py, || {
        let tokens = match model.chat_template(Some("rerank")) {
            Ok(template) => templated(&model, template, query, document)?,
            Err(StringFromModelError::ReturnedError(_)) => plain(&model, query, document)?,
            Err(err) => return Err(err.into()),
        };
        Ok(to_ids(&tokens))
    })
}

fn tokenize(model: &LlamaModel, text: &str, special: Special) -> Result<Vec<LlamaToken>> {
    Ok(model.str_to_token_with_special(text, AddBos::Never, special)?)
}

/// `[BOS] query [EOS] [SEP] document [EOS]`; EOS is SEP for a vocabulary without one, and a
/// token the vocabulary lacks is left out (llama.cpp would decode its null id).
fn plain(model: &LlamaModel, query: &str, document: &str) -> Result<Vec<LlamaToken>> {
    let vocab = model.get_vocab();
    let null = LlamaToken::new(-1);
    let end = if vocab.eos() == null { vocab.sep() } else { vocab.eos() };
    let special = |token: LlamaToken, wanted: bool| (wanted && token != null).then_some(token);
    let mut tokens: Vec<LlamaToken> = special(vocab.bos(), vocab.get_add_bos()).into_iter().collect();
    tokens.extend(tokenize(model, query, Special::Plaintext)?);
    tokens.extend(special(end, vocab.get_add_eos()));
    tokens.extend(special(vocab.sep(), vocab.get_add_sep()));
    tokens.extend(tokenize(model, document, Special::Plaintext)?);
    tokens.extend(special(end, vocab.get_add_eos()));
    Ok(tokens)
}

/// A piece of the filled template: the template's own text, or an input.
enum Piece<'a> {
    Template(&'a str),
    Input(&'a str),
}

/// The template cut at its placeholders, each replaced by its input. Only the template's own
/// text is searched for placeholders (llama-server replaces `{document}` inside the query too).
fn pieces<'a>(template: &'a str, query: &'a str, document: &'a str) -> Vec<Piece<'a>> {
    let mut pieces = Vec::new();
    let mut rest = template;
    loop {
        let next = [(QUERY, query), (DOCUMENT, document)]
            .into_iter()
            .filter_map(|(placeholder, input)| rest.find(placeholder).map(|at| (at, placeholder, input)))
            .min_by_key(|&(at, _, _)| at);
        let Some((at, placeholder, input)) = next else {
            pieces.push(Piece::Template(rest));
            return pieces;
        };
        pieces.push(Piece::Template(&rest[..at]));
        pieces.push(Piece::Input(input));
        rest = &rest[at + placeholder.len()..];
    }
}

fn holds_special_text(model: &LlamaModel, text: &str) -> Result<bool> {
    Ok(tokenize(model, text, Special::Tokenize)? != tokenize(model, text, Special::Plaintext)?)
}

/// The filled template tokenized as one string, special tokens parsed, but for an input that
/// holds special-token text: that one is tokenized on its own, as plain text.
fn templated(model: &LlamaModel, template: &str, query: &str, document: &str) -> Result<Vec<LlamaToken>> {
    let mut tokens = Vec::new();
    let mut run = String::new();
    for piece in pieces(template, query, document) {
        match piece {
            Piece::Input(text) if holds_special_text(model, text)? => {
                tokens.extend(tokenize(model, &run, Special::Tokenize)?);
                run.clear();
                tokens.extend(tokenize(model, text, Special::Plaintext)?);
            }
            Piece::Template(text) | Piece::Input(text) => run.push_str(text),
        }
    }
    tokens.extend(tokenize(model, &run, Special::Tokenize)?);
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(pieces: &[Piece<'_>]) -> Vec<String> {
        pieces
            .iter()
            .map(|piece| match piece {
                Piece::Template(text) => format!("T:{text}"),
                Piece::Input(text) => format!("I:{text}"),
            })
            .collect()
    }

    #[test]
    fn placeholders_are_filled_in_order() {
        let filled = pieces("Q: {query} D: {document}!", "q", "d");
        assert_eq!(shown(&filled), ["T:Q: ", "I:q", "T: D: ", "I:d", "T:!"]);
    }

    #[test]
    fn an_input_is_never_read_as_a_placeholder() {
        let filled = pieces("{query}|{document}", "{document}", "{query}");
        assert_eq!(shown(&filled), ["T:", "I:{document}", "T:|", "I:{query}", "T:"]);
    }

    #[test]
    fn a_template_without_placeholders_is_one_piece() {
        assert_eq!(shown(&pieces("plain", "q", "d")), ["T:plain"]);
    }
}
