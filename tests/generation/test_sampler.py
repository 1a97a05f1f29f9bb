"""The LlamaSampler constructors, each checked for what it does to real logits."""

from __future__ import annotations

import pytest

import llamactx


def filtered(ctx: llamactx.LlamaContext, *samplers: llamactx.LlamaSampler) -> llamactx.LlamaTokenDataArray:
    candidates = ctx.candidates_ith(-1)
    for sampler in samplers:
        sampler.apply(candidates)
    return candidates


def test_dist_with_the_same_seed_repeats(paris_ctx: llamactx.LlamaContext) -> None:
    first = [
        llamactx.LlamaSampler.chain([llamactx.LlamaSampler.temp(5.0), llamactx.LlamaSampler.dist(s)]).sample(paris_ctx)
        for s in range(8)
    ]
    again = [
        llamactx.LlamaSampler.chain([llamactx.LlamaSampler.temp(5.0), llamactx.LlamaSampler.dist(s)]).sample(paris_ctx)
        for s in range(8)
    ]
    assert first == again
    assert len(set(first)) > 1  # hot temperature: different seeds differ


def test_truncating_samplers_keep_the_top_token(
    model: llamactx.LlamaModel, paris_ctx: llamactx.LlamaContext, paris: int
) -> None:
    assert len(filtered(paris_ctx, llamactx.LlamaSampler.top_k(3))) == 3
    for sampler in (
        llamactx.LlamaSampler.top_p(0.5, 1),
        llamactx.LlamaSampler.min_p(0.5, 1),
        llamactx.LlamaSampler.typical(0.5, 1),
    ):
        kept = filtered(paris_ctx, sampler)
        assert 1 <= len(kept) < model.n_vocab(), sampler.name()
        assert paris in kept.ids.tolist()


def test_logit_bias_can_ban_the_top_token(
    model: llamactx.LlamaModel, paris_ctx: llamactx.LlamaContext, paris: int
) -> None:
    banned = llamactx.LlamaSampler.chain(
        [llamactx.LlamaSampler.logit_bias(model.n_vocab(), [(paris, -1000.0)]), llamactx.LlamaSampler.greedy()]
    )
    assert banned.sample(paris_ctx) != paris
    with pytest.raises(ValueError, match="outside"):
        llamactx.LlamaSampler.logit_bias(model.n_vocab(), [(model.n_vocab(), 1.0)])


def test_penalties_lower_accepted_tokens(
    model: llamactx.LlamaModel, paris_ctx: llamactx.LlamaContext, paris: int
) -> None:
    chain = llamactx.LlamaSampler.chain(
        [llamactx.LlamaSampler.penalties(model.n_vocab(), 64, 1000.0, 0.0, 0.0), llamactx.LlamaSampler.greedy()]
    )
    assert chain.sample(paris_ctx) == paris  # and accepted: now penalised
    assert chain.sample(paris_ctx) != paris
    chain.reset()
    assert chain.sample(paris_ctx) == paris


def test_other_constructors_build_and_sample(model: llamactx.LlamaModel, paris_ctx: llamactx.LlamaContext) -> None:
    pickers = [
        llamactx.LlamaSampler.mirostat(model.n_vocab(), 0, 5.0, 0.1, 100),
        llamactx.LlamaSampler.mirostat_v2(0, 5.0, 0.1),
    ]
    for picker in pickers:
        assert 0 <= picker.sample(paris_ctx) < model.n_vocab()
    for stage in (
        llamactx.LlamaSampler.temp_ext(0.8, 0.1, 1.0),
        llamactx.LlamaSampler.xtc(0.5, 0.1, 1, 0),
        llamactx.LlamaSampler.adaptive_p(0.5, 0.9, 0),
        llamactx.LlamaSampler.top_n_sigma(1.0),
        llamactx.LlamaSampler.dry(model, 0.8, 1.75, 2, 64, ["\n"]),
    ):
        chain = llamactx.LlamaSampler.chain([stage, llamactx.LlamaSampler.dist(0)])
        assert 0 <= chain.sample(paris_ctx) < model.n_vocab()
    assert llamactx.LlamaSampler.infill(model).name() == "infill"


def test_grammar_constrains_the_next_token(model: llamactx.LlamaModel, paris_ctx: llamactx.LlamaContext) -> None:
    grammar = llamactx.LlamaSampler.grammar(model, 'root ::= " London" | " Rome"')
    chain = llamactx.LlamaSampler.chain([grammar, llamactx.LlamaSampler.greedy()])
    token = chain.sample(paris_ctx)  # sampling also accepts: the grammar is now complete
    assert model.token_to_str(token) in (" London", " Rome")
    with pytest.raises(llamactx.ShimError, match="grammar"):
        chain.accept(token)  # a second piece does not fit the finished grammar
    with pytest.raises(llamactx.SamplerInitError) as raised:
        llamactx.LlamaSampler.grammar(model, "root ::= (")
    assert raised.value.kind == "NullReturn"
    with pytest.raises(llamactx.SamplerInitError):
        llamactx.LlamaSampler.grammar(model, "root ::= \0")
    with pytest.raises(ValueError, match="vocabulary"):
        grammar.accept(model.n_vocab())


def test_lazy_grammar(model: llamactx.LlamaModel) -> None:
    lazy = llamactx.LlamaSampler.grammar_lazy_patterns(model, 'root ::= "yes"', "root", ["answer:"], [])
    assert lazy.name() == "grammar"


def test_grammar_sampler_refuses_another_models_context(model_path, paris_ctx: llamactx.LlamaContext) -> None:  # type: ignore[no-untyped-def]
    other = llamactx.LlamaModel.load_from_file(model_path)
    grammar = llamactx.LlamaSampler.grammar(other, 'root ::= "a"')
    with pytest.raises(ValueError, match="another model"):
        grammar.sample(paris_ctx)


def test_chain_keeps_copies(paris_ctx: llamactx.LlamaContext) -> None:
    greedy = llamactx.LlamaSampler.greedy()
    chain = llamactx.LlamaSampler.chain([llamactx.LlamaSampler.top_k(5), greedy], no_perf=True)
    assert chain.name() == "chain"
    assert chain.sample(paris_ctx) == greedy.sample(paris_ctx)
    assert "chain" in repr(chain)


@pytest.mark.parametrize("tiny", [1e-40, 1e-45, 5e-7])
def test_a_tiny_temperature_picks_as_greedy_does(
    model: llamactx.LlamaModel, paris_ctx: llamactx.LlamaContext, paris: int, tiny: float
) -> None:
    # Dividing the logits by 1e-40 overflowed them to infinity: NaN probabilities, and llama.cpp
    # picked the last candidate instead of " Paris".
    for seed in range(4):
        for temperature in (llamactx.LlamaSampler.temp(tiny), llamactx.LlamaSampler.temp_ext(tiny, 0.0, 1.0)):
            assert (
                llamactx.LlamaSampler.chain([temperature, llamactx.LlamaSampler.dist(seed)]).sample(paris_ctx) == paris
            )
    with model.new_context(n_ctx=256) as ctx:
        greedy = llamactx.generate(ctx, "The capital of France is", max_tokens=12)
        sampling = llamactx.SamplingParams(temperature=tiny, top_k=0, top_p=1.0, min_p=0.0, seed=7)
        assert (
            llamactx.generate(ctx, "The capital of France is", max_tokens=12, sampler=sampling.sampler(model)) == greedy
        )
