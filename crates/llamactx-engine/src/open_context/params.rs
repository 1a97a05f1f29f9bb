//! A context's options, checked and turned into crate params (read from Python's keyword
//! arguments in `context/params.rs`).

use std::num::NonZeroU32;

use llama_cpp_4::context::params::{LlamaAttentionType, LlamaContextParams, LlamaFlashAttnType, LlamaPoolingType};
use llama_cpp_4::quantize::GgmlType;

use crate::errors::{Error, Result};
use crate::threadpool::{available_cpus, check_threads};

/// llama.cpp's default `n_batch` and `n_ctx`, needed to check combinations [llama.cpp internal].
pub const DEFAULT_N_BATCH: u32 = 2048;

pub const DEFAULT_N_CTX: u32 = 512;

/// Declares `ContextOptions` from one list of `name: type`: the struct and its keyword names
/// (below), and the reading of `new_context`'s keyword arguments (`context/params.rs`). A new
/// llama.cpp parameter is one line here and one in `to_params` (plus the stub and the API
/// reference, which a test checks against it).
#[macro_export]
macro_rules! context_option_list {
    ($declare:ident) => {
        $declare! {
            n_ctx: u32,
            n_batch: u32,
            n_ubatch: u32,
            n_seq_max: u32,
            n_threads: i32,
            n_threads_batch: i32,
            embeddings: bool,
            pooling_type: i32,
            flash_attn_type: i32,
            attention_type: i32,
            cache_type_k: String,
            cache_type_v: String,
            offload_kqv: bool,
            kv_unified: bool,
            swa_full: bool,
            op_offload: bool,
            no_perf: bool,
            rope_freq_base: f32,
            rope_freq_scale: f32,
        }
    };
}

macro_rules! declare_context_options {
    ($($name:ident: $ty:ty),* $(,)?) => {
        /// The options of a context (`new_context`'s keywords); `None` keeps llama.cpp's default.
        #[derive(Debug, Default, Clone)]
        pub struct ContextOptions {
            $(pub $name: Option<$ty>,)*
        }

        impl ContextOptions {
            /// The keyword names, in the order the stub lists them.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];
        }
    };
}
context_option_list!(declare_context_options);

pub fn in_range(name: &str, value: i32, low: i32, high: i32) -> Result<i32> {
    if (low..=high).contains(&value) {
        Ok(value)
    } else {
        Err(Error::value(format!("{name} must be in {low}..={high}, got {value}")))
    }
}

/// A finite number of at least 0 (0 keeps the model's value).
pub fn not_negative(name: &str, value: f32) -> Result<f32> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(Error::value(format!(
            "{name} must be a finite number of at least 0, got {value}"
        )))
    }
}

pub fn positive(name: &str, value: u32) -> Result<u32> {
    if value == 0 {
        return Err(Error::value(format!("{name} must be at least 1")));
    }
    Ok(value)
}

/// llama.cpp's default thread count (4), capped at the CPUs this process may use (see
/// `check_threads`).
pub fn default_threads(llama_default: i32) -> i32 {
    llama_default.min(available_cpus()).max(1)
}

/// The ggml types llama.cpp accepts for its KV cache, by their lower-case ggml names, with the
/// bytes a block of 32 values takes in each [llama.cpp internal].
pub const CACHE_TYPES: &[(&str, GgmlType, u64)] = &[
    ("f32", GgmlType::F32, 128),
    ("f16", GgmlType::F16, 64),
    ("bf16", GgmlType::BF16, 64),
    ("q8_0", GgmlType::Q8_0, 34),
    ("q4_0", GgmlType::Q4_0, 18),
    ("q4_1", GgmlType::Q4_1, 20),
    ("q5_0", GgmlType::Q5_0, 22),
    ("q5_1", GgmlType::Q5_1, 24),
    ("iq4_nl", GgmlType::IQ4NL, 18),
];

/// llama.cpp's default KV cache type.
pub const DEFAULT_CACHE_TYPE: &str = "f16";

/// The bytes a block of 32 values takes in the cache type named `name` (llama.cpp's default
/// when `None`).
pub fn cache_block_bytes(name: Option<&str>) -> Result<u64> {
    Ok(cache_type(name.unwrap_or(DEFAULT_CACHE_TYPE))?.1)
}

/// The cache type named `name` and the bytes a block of 32 of its values takes.
pub fn cache_type(name: &str) -> Result<(GgmlType, u64)> {
    let lower = name.to_ascii_lowercase();
    CACHE_TYPES
        .iter()
        .find(|(known, _, _)| *known == lower)
        .map(|&(_, ggml_type, block_bytes)| (ggml_type, block_bytes))
        .ok_or_else(|| {
            let names: Vec<&str> = CACHE_TYPES.iter().map(|(known, _, _)| *known).collect();
            Error::value(format!(
                "unknown KV cache type {name:?}; use one of {}",
                names.join(", ")
            ))
        })
}

impl ContextOptions {
    /// The `n_ctx` llama.cpp will use for these options: its default when unset, the model's
    /// training context for 0.
    pub fn effective_n_ctx(&self, n_ctx_train: u32) -> u32 {
        match self.n_ctx {
            None => DEFAULT_N_CTX,
            Some(0) => n_ctx_train,
            Some(n_ctx) => n_ctx,
        }
    }

    /// These options for a model with learned position embeddings, which has a row for each of
    /// `n_ctx_train` positions: llama.cpp asserts on a position past them (third red team: a
    /// draft model with a shorter context aborted the engine once a request passed it). An
    /// unset `n_ctx` is bounded to them, a larger one refused.
    pub fn within_positions(&self, n_ctx_train: u32) -> Result<Self> {
        let n_ctx = self.effective_n_ctx(n_ctx_train);
        if n_ctx <= n_ctx_train {
            return Ok(self.clone());
        }
        if self.n_ctx.is_none() {
            return Ok(Self {
                n_ctx: Some(n_ctx_train),
                ..self.clone()
            });
        }
        Err(Error::value(format!(
            "n_ctx={n_ctx} is past the {n_ctx_train} positions this model's learned position embeddings hold: \
             pass n_ctx={n_ctx_train} or less"
        )))
    }

    /// llama.cpp reserves an output row per sequence within `n_batch`, which it first caps at
    /// `n_ctx`, and asserts when they do not fit. An encoder-decoder model's relative position
    /// bias cannot be added to attention split into one KV stream per sequence: llama.cpp
    /// asserts while it reserves the graph.
    pub fn check_for_model(&self, n_ctx_train: u32, encoder_decoder: bool) -> Result<()> {
        let n_seq_max = self.n_seq_max.unwrap_or(1);
        if encoder_decoder && n_seq_max > 1 && !self.kv_unified.unwrap_or(false) {
            return Err(Error::value(format!(
                "an encoder-decoder model runs several sequences (n_seq_max={n_seq_max}) only in one KV \
                 stream: pass kv_unified=True"
            )));
        }
        let n_ctx = self.n_ctx.unwrap_or(n_ctx_train).max(1);
        let n_batch = self.n_batch.unwrap_or(DEFAULT_N_BATCH).min(n_ctx);
        if n_seq_max > n_batch {
            return Err(Error::value(format!(
                "n_seq_max ({n_seq_max}) must not exceed n_batch ({n_batch}, capped at n_ctx): llama.cpp \
                 reserves an output row per sequence in each batch"
            )));
        }
        Ok(())
    }

    /// The crate's params for these options, except `embeddings`, which the context switches
    /// on once it has checked that llama.cpp can pool them (see `OpenContext::check_pooling`).
    pub fn to_params(&self) -> Result<LlamaContextParams> {
        let mut params = LlamaContextParams::default();
        if let Some(n_ctx) = self.n_ctx {
            params = params.with_n_ctx(NonZeroU32::new(n_ctx));
        }
        if let Some(n_batch) = self.n_batch {
            params = params.with_n_batch(positive("n_batch", n_batch)?);
        }
        if let Some(n_ubatch) = self.n_ubatch {
            params = params.with_n_ubatch(positive("n_ubatch", n_ubatch)?);
        }
        if let Some(n_seq_max) = self.n_seq_max {
            params = params.with_n_seq_max(positive("n_seq_max", n_seq_max)?);
        }
        let n_threads = match self.n_threads {
            Some(n) => check_threads("n_threads", n)?,
            None => default_threads(params.n_threads()),
        };
        let n_threads_batch = match self.n_threads_batch {
            Some(n) => check_threads("n_threads_batch", n)?,
            None => default_threads(params.n_threads_batch()),
        };
        params = params.with_n_threads(n_threads).with_n_threads_batch(n_threads_batch);
        if let Some(pooling) = self.pooling_type {
            params = params.with_pooling_type(LlamaPoolingType::from(in_range("pooling_type", pooling, -1, 4)?));
        }
        if let Some(flash) = self.flash_attn_type {
            params = params.with_flash_attn_type(LlamaFlashAttnType::from(in_range("flash_attn_type", flash, -1, 1)?));
        }
        if let Some(attention) = self.attention_type {
            params =
                params.with_attention_type(LlamaAttentionType::from(in_range("attention_type", attention, -1, 1)?));
        }
        if let Some(name) = &self.cache_type_k {
            params = params.with_cache_type_k(cache_type(name)?.0);
        }
        if let Some(name) = &self.cache_type_v {
            let (ggml_type, _) = cache_type(name)?;
            // llama.cpp refuses this only after logging it, as a null context.
            let quantized = !matches!(ggml_type, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
            if quantized && self.flash_attn_type == Some(0) {
                return Err(Error::value(format!(
                    "a quantized V cache (cache_type_v={name:?}) needs flash attention: flash_attn_type=1, or -1 \
                     (auto) where the backend has it"
                )));
            }
            params = params.with_cache_type_v(ggml_type);
        }
        if let Some(offload) = self.offload_kqv {
            params = params.with_offload_kqv(offload);
        }
        if let Some(unified) = self.kv_unified {
            params = params.with_kv_unified(unified);
        }
        if let Some(swa_full) = self.swa_full {
            params = params.with_swa_full(swa_full);
        }
        if let Some(op_offload) = self.op_offload {
            params = params.with_op_offload(op_offload);
        }
        if let Some(no_perf) = self.no_perf {
            params = params.with_no_perf(no_perf);
        }
        if let Some(base) = self.rope_freq_base {
            params = params.with_rope_freq_base(not_negative("rope_freq_base", base)?);
        }
        if let Some(scale) = self.rope_freq_scale {
            params = params.with_rope_freq_scale(not_negative("rope_freq_scale", scale)?);
        }
        Ok(params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub fn refuses_more_sequences_than_batch_rows() {
        let options = ContextOptions {
            n_ctx: Some(4),
            n_seq_max: Some(8),
            ..ContextOptions::default()
        };
        assert!(matches!(options.check_for_model(8192, false), Err(Error::Value(_))));
        let default_ctx = ContextOptions {
            n_seq_max: Some(8),
            ..ContextOptions::default()
        };
        assert!(default_ctx.check_for_model(8192, false).is_ok());
        assert!(default_ctx.check_for_model(4, false).is_err());
    }

    #[test]
    pub fn takes_n_ctx_as_llama_cpp_does() {
        let unset = ContextOptions::default();
        assert_eq!(unset.effective_n_ctx(8192), DEFAULT_N_CTX);
        let zero = ContextOptions {
            n_ctx: Some(0),
            ..ContextOptions::default()
        };
        assert_eq!(zero.effective_n_ctx(8192), 8192);
        let given = ContextOptions {
            n_ctx: Some(300),
            ..ContextOptions::default()
        };
        assert_eq!(given.effective_n_ctx(8192), 300);
    }

    #[test]
    pub fn bounds_contexts_to_learned_positions() {
        let unset = ContextOptions::default();
        assert_eq!(unset.within_positions(128).map(|o| o.n_ctx).ok(), Some(Some(128)));
        assert_eq!(unset.within_positions(2048).map(|o| o.n_ctx).ok(), Some(None));
        let whole = ContextOptions {
            n_ctx: Some(0),
            ..ContextOptions::default()
        };
        assert_eq!(whole.within_positions(128).map(|o| o.n_ctx).ok(), Some(Some(0)));
        let past = ContextOptions {
            n_ctx: Some(129),
            ..ContextOptions::default()
        };
        assert!(matches!(past.within_positions(128), Err(Error::Value(_))));
    }

    #[test]
    pub fn runs_several_sequences_of_an_encoder_decoder_only_in_one_stream() {
        let streams = ContextOptions {
            n_seq_max: Some(2),
            ..ContextOptions::default()
        };
        assert!(matches!(streams.check_for_model(512, true), Err(Error::Value(_))));
        assert!(streams.check_for_model(512, false).is_ok());
        let unified = ContextOptions {
            kv_unified: Some(true),
            ..streams
        };
        assert!(unified.check_for_model(512, true).is_ok());
    }

    #[test]
    pub fn refuses_out_of_range_enums_and_zero_sizes() {
        let bad_pool = ContextOptions {
            pooling_type: Some(9),
            ..ContextOptions::default()
        };
        assert!(bad_pool.to_params().is_err());
        let zero_batch = ContextOptions {
            n_batch: Some(0),
            ..ContextOptions::default()
        };
        assert!(zero_batch.to_params().is_err());
        assert!(cache_type("Q8_0").is_ok());
        assert!(cache_type("q3_k").is_err());
    }
}
