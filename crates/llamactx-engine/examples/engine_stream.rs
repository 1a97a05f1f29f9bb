//! Streams concurrent requests through the llamactx engine from Rust, without Python:
//!
//! ```text
//! cargo run --release -p llamactx-engine --example engine_stream -- MODEL.gguf MAX_TOKENS PROMPT...
//! ```
//!
//! Each prompt is tokenized as plain text (with a BOS token where the model asks for one), all
//! are submitted at once to an engine of 4 sequences, greedy, and each request's text is read
//! on a thread of its own as it is generated. Prints a JSON line per piece, `{"request": i,
//! "piece": text}`, then one per request, `{"request": i, "prompt_tokens": [...], "text": ...,
//! "finish_reason": ...}`.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use llama_cpp_4::model::params::LlamaModelParams;
use llama_cpp_4::model::{AddBos, Special};
use llamactx_engine::engine::{Engine, EngineSettings};
use llamactx_engine::errors::Error;
use llamactx_engine::model::load_checked;
use llamactx_engine::open_context::ContextOptions;
use llamactx_engine::sampler::params::SamplingParams;
use serde_json::json;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("engine_stream: {message}");
            ExitCode::FAILURE
        }
    }
}

fn failed(err: Error) -> String {
    format!("{err:?}")
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(max_tokens)) = (args.next(), args.next()) else {
        return Err("usage: engine_stream MODEL.gguf MAX_TOKENS PROMPT...".to_owned());
    };
    let max_tokens: usize = max_tokens
        .parse()
        .map_err(|_| format!("MAX_TOKENS must be a count, got {max_tokens:?}"))?;
    let prompts: Vec<String> = args.collect();
    let (model, learned_positions) = load_checked(Path::new(&path), &LlamaModelParams::default()).map_err(failed)?;
    let options = ContextOptions {
        n_ctx: Some(2048),
        n_seq_max: Some(4),
        ..ContextOptions::default()
    };
    let engine = Engine::start(
        Arc::clone(&model),
        learned_positions,
        &options,
        EngineSettings::default(),
    )
    .map_err(failed)?;
    let add_bos = if model.add_bos_token() {
        AddBos::Always
    } else {
        AddBos::Never
    };
    let mut requests = Vec::new();
    for prompt in &prompts {
        let tokens: Vec<i32> = model
            .str_to_token_with_special(prompt, add_bos, Special::Plaintext)
            .map_err(|err| format!("{prompt:?} does not tokenize: {err}"))?
            .into_iter()
            .map(|token| token.0)
            .collect();
        let request = engine
            .submit_tokens(&tokens, max_tokens, Vec::new(), SamplingParams::greedy())
            .map_err(failed)?;
        requests.push((tokens, request));
    }
    std::thread::scope(|scope| {
        for (index, (_, request)) in requests.iter().enumerate() {
            scope.spawn(move || {
                while let Some(piece) = request.next_text() {
                    println!("{}", json!({"request": index, "piece": piece}));
                }
            });
        }
    });
    for (index, (tokens, request)) in requests.iter().enumerate() {
        let completion = request.ended().ok_or("a request's text ended before its outcome")??;
        println!(
            "{}",
            json!({
                "request": index,
                "prompt_tokens": tokens,
                "text": completion.text,
                "finish_reason": completion.finish_reason,
            })
        );
    }
    engine.stop().map_err(failed)
}
