//! Running the model (decode, encode) and the switches that change how it runs.

use llama_cpp_4::context::params::LlamaPoolingType;
use llama_cpp_4::context::LlamaContext;
use llama_cpp_4::llama_batch::LlamaBatch;

use super::OpenContext;
use crate::backend::explained;
use crate::batch::BatchState;
use crate::cpu_budget::CpuShare;
use crate::errors::{Error, Result};
use crate::interrupt::SigintWatch;
use crate::shared_pool::SharedPools;
use crate::threadpool::FORKED;

impl OpenContext {
    /// Switches embeddings on or off, refusing what llama.cpp cannot pool: its graph for MEAN and
    /// RANK pooling splits `min(n_ctx, n_ubatch)` rows evenly across the sequences and asserts
    /// when they do not divide (upstream llama.cpp issue 27175).
    pub fn enable_embeddings(&mut self, embeddings: bool) -> Result<()> {
        if embeddings {
            let (pooling, n_ctx) = self.with(|context| (context.pooling_type(), context.n_ctx()));
            let rows = n_ctx.min(self.n_ubatch);
            let splits = matches!(pooling, LlamaPoolingType::Mean | LlamaPoolingType::Rank);
            if splits && self.n_seq_max > 1 && !rows.is_multiple_of(self.n_seq_max) {
                return Err(Error::value(format!(
                    "with embeddings and {pooling:?} pooling, llama.cpp needs min(n_ctx, n_ubatch) = {rows} to be a \
                     multiple of n_seq_max ({}): choose n_ubatch accordingly",
                    self.n_seq_max
                )));
            }
        }
        self.with_mut(|context| context.set_embeddings(embeddings));
        self.embeddings = embeddings;
        Ok(())
    }

    /// The shared pools to compute on when the user attached none. Refuses a user's pool
    /// started before this process was forked: its threads are not here.
    pub fn shared_pools(&self) -> Result<Option<SharedPools>> {
        if self.pools.iter().any(|lease| !lease.usable()) {
            return Err(Error::value(format!("{FORKED}, or call detach_threadpool()")));
        }
        if !self.pools.is_empty() {
            return Ok(None);
        }
        Ok(self.with(|context| SharedPools::take(context.n_threads(), context.n_threads_batch())))
    }

    /// The CPUs a computation of `n_tokens` needs, waited for (see `cpu_budget`): llama.cpp
    /// computes a single token with `n_threads`, other micro-batches with `n_threads_batch`.
    pub fn claim_cpus(&self, n_tokens: usize) -> Result<CpuShare> {
        let (single, batch) = self.with(|context| (context.n_threads(), context.n_threads_batch()));
        let threads = if n_tokens == 1 { single } else { single.max(batch) };
        CpuShare::claim(threads, || self.abort_flags.poll())
            .ok_or_else(|| self.abort_flags.explain(Error::Aborted { interrupted: false }))
    }

    /// The most tokens one call may submit: llama.cpp asserts when a decode exceeds `n_batch`,
    /// or, for a graph that must see the whole batch at once (encoders, embeddings,
    /// non-causal attention), one micro-batch.
    pub fn batch_limit(&self, encoding: bool) -> (u32, &'static str) {
        if encoding || self.embeddings || !self.causal_attn || !self.has_memory {
            (self.n_ubatch, "n_ubatch")
        } else {
            (self.n_batch, "n_batch")
        }
    }

    /// Runs `decode` or `encode` on a checked batch and records which rows have outputs. All
    /// or nothing: a failed or aborted decode leaves the KV cache as it found it.
    pub fn compute<E>(
        &mut self,
        state: &mut BatchState,
        encoding: bool,
        run: impl for<'a> FnOnce(&mut LlamaContext<'a>, &mut LlamaBatch) -> std::result::Result<(), E>,
    ) -> Result<()>
    where
        Error: From<E>,
    {
        self.check_rpc()?;
        let (limit, limit_name) = self.batch_limit(encoding);
        state.check_for(self.n_vocab, self.n_seq_max, limit, limit_name)?;
        self.check_positions(state)?;
        let checkpoint = self.checkpoint(state, !encoding)?;
        let outcome = self.run_guarded(state.tokens.len(), |context| run(context, &mut state.batch));
        match outcome {
            Ok(()) => {
                self.output_rows.clone_from(&state.output_rows);
                self.output_seqs = state.seq_ids();
                Ok(())
            }
            Err(err) => {
                // A failed decode leaves llama.cpp's outputs in no state worth reading.
                self.output_rows.clear();
                self.output_seqs.clear();
                self.roll_back(&checkpoint);
                Err(err)
            }
        }
    }

    /// Refuses a batch that places a token past what the model's learned position embeddings
    /// hold (`position_limit`; positions are never negative, `BatchState` refuses those).
    pub fn check_positions(&self, state: &BatchState) -> Result<()> {
        let Some(limit) = self.position_limit else {
            return Ok(());
        };
        match state.spans.iter().find(|(_, span)| span.last >= limit) {
            Some((seq, span)) => Err(Error::value(format!(
                "sequence {seq} reaches position {}: this model's learned position embeddings hold positions \
                 0 to {}",
                span.last,
                limit - 1
            ))),
            None => Ok(()),
        }
    }

    /// Runs one computation of `n_tokens` tokens on the native context: interruptible (abort
    /// flags, Ctrl-C), on the CPUs it claims and the shared thread pools, its error explained
    /// by what llama.cpp logged, and an RPC server's failure noticed.
    pub fn run_guarded<E>(
        &mut self,
        n_tokens: usize,
        run: impl for<'a> FnOnce(&mut LlamaContext<'a>) -> std::result::Result<(), E>,
    ) -> Result<()>
    where
        Error: From<E>,
    {
        let watch = SigintWatch::start();
        self.abort_flags.arm(watch.is_some());
        let cpus = self.claim_cpus(n_tokens)?;
        let shared = self.shared_pools()?;
        let outcome = explained(|| {
            self.with_mut(|context| match &shared {
                Some(pools) => pools.run_on(context, run),
                None => run(context),
            })
        });
        drop(shared);
        drop(cpus);
        drop(watch);
        outcome
            .and_then(|()| self.check_rpc())
            .map_err(|err| self.abort_flags.explain(err))
    }

    /// `LlamaContext.decode` for Rust callers (the engine), on a batch they own.
    pub fn decode(&mut self, state: &mut BatchState) -> Result<()> {
        if self.awaits_encoder {
            return Err(Error::value(
                "this encoder-decoder model decodes from its encoder's output: call encode first",
            ));
        }
        self.compute(state, false, |context, batch| context.decode(batch))
    }
}
