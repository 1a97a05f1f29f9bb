"""Lazy grammars: waiting for the trigger, where the grammar starts, copies and resets."""

import numpy as np
import pytest

import llamactx
from llamactx import LlamaContext, LlamaModel, LlamaSampler


def pieces(model: LlamaModel, tokens: list[int]) -> list[str]:
    return [model.token_to_str(token, True) for token in tokens]


def kept(sampler: LlamaSampler, ctx: LlamaContext) -> list[int]:
    """The tokens the sampler leaves possible among every token of the last output row."""
    candidates = ctx.candidates_ith(-1)
    sampler.apply(candidates)
    return [int(token) for token in candidates.ids[np.isfinite(candidates.logits)]]


def allowed(sampler: LlamaSampler, ctx: LlamaContext) -> set[str]:
    """The pieces of `kept`, decoded with replacement characters."""
    return {ctx.model.token_to_bytes(token, True).decode(errors="replace") for token in kept(sampler, ctx)}


def accept_text(sampler: LlamaSampler, model: LlamaModel, text: str) -> None:
    for token in model.str_to_token(text, False):
        sampler.accept(token)


def test_nothing_is_masked_until_the_pattern_appears(model: LlamaModel, paris_ctx: LlamaContext) -> None:
    lazy = LlamaSampler.grammar_lazy_patterns(model, 'root ::= "answer: " ("yes" | "no")', "root", ["answer:"], [])
    everything = len(kept(LlamaSampler.greedy(), paris_ctx))
    accept_text(lazy, model, "Let me think. The")
    assert len(kept(lazy, paris_ctx)) == everything
    accept_text(lazy, model, " answer:")
    assert allowed(lazy, paris_ctx) == {" ", " y", " ye", " yes", " n", " no"}


def test_the_grammar_starts_at_the_first_group_even_inside_a_token(model: LlamaModel, paris_ctx: LlamaContext) -> None:
    """The trigger " tool" is one token; the group starts two bytes into it."""
    assert pieces(model, model.str_to_token("call the tool", False))[-1] == " tool"
    lazy = LlamaSampler.grammar_lazy_patterns(model, 'root ::= "ool(" [a-z]+ ")"', "root", [r"t(ool)"], [])
    accept_text(lazy, model, "call the tool")
    after_tool = allowed(lazy, paris_ctx)
    assert "(" in after_tool
    assert all(piece.startswith("(") for piece in after_tool)
    accept_text(lazy, model, "(x")
    assert ")" in allowed(lazy, paris_ctx)
    assert "(" not in allowed(lazy, paris_ctx)


def test_a_trigger_token_starts_the_grammar_with_itself(model: LlamaModel, paris_ctx: LlamaContext) -> None:
    (start,) = model.str_to_token("<|im_start|>", False)
    lazy = LlamaSampler.grammar_lazy_patterns(model, 'root ::= "<|im_start|>" "x"', "root", [], [start])
    accept_text(lazy, model, "anything at all")
    lazy.accept(start)
    assert allowed(lazy, paris_ctx) == {"x"}


def test_text_the_grammar_refuses_after_the_trigger_is_an_error(model: LlamaModel) -> None:
    lazy = LlamaSampler.grammar_lazy_patterns(model, 'root ::= "answer: yes"', "root", ["answer:"], [])
    accept_text(lazy, model, "The answer:")
    with pytest.raises(llamactx.SchemaError, match="doesn't satisfy the grammar"):
        accept_text(lazy, model, " no")
    with pytest.raises(ValueError, match="reset"):
        lazy.accept(model.str_to_token(" yes", False)[0])
    lazy.reset()
    accept_text(lazy, model, "The answer: yes")


def test_end_of_generation_waits_or_is_refused_by_an_unfinished_grammar(model: LlamaModel) -> None:
    eos = model.token_eos()
    lazy = LlamaSampler.grammar_lazy_patterns(model, 'root ::= "answer: yes"', "root", ["answer:"], [])
    lazy.accept(eos)
    accept_text(lazy, model, "answer:")
    with pytest.raises(llamactx.ShimError, match="end-of-generation"):
        lazy.accept(eos)


def test_reset_waits_again_and_chains_copy_the_waiting_text(model: LlamaModel, paris_ctx: LlamaContext) -> None:
    lazy = LlamaSampler.grammar_lazy_patterns(model, 'root ::= "answer: " ("yes" | "no")', "root", ["answer:"], [])
    everything = len(kept(LlamaSampler.greedy(), paris_ctx))
    accept_text(lazy, model, "The answer")
    chain = LlamaSampler.chain([lazy])
    accept_text(chain, model, ":")
    assert " " in allowed(chain, paris_ctx)
    assert len(kept(lazy, paris_ctx)) == everything
    chain.reset()
    assert len(kept(chain, paris_ctx)) == everything


def test_anchors_refer_to_all_the_text_not_the_search_window(model: LlamaModel, paris_ctx: LlamaContext) -> None:
    lazy = LlamaSampler.grammar_lazy_patterns(model, 'root ::= "answer: yes"', "root", [r"^\s*answer:"], [])
    everything = len(kept(LlamaSampler.greedy(), paris_ctx))
    accept_text(lazy, model, "Sure. answer:")
    assert len(kept(lazy, paris_ctx)) == everything


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=(a))\1", "(" * 40 + "a" + ")" * 40, "a" * 2000, "(["])
def test_patterns_that_cannot_run_in_bounded_work_are_refused(model: LlamaModel, pattern: str) -> None:
    with pytest.raises(ValueError, match="trigger pattern"):
        LlamaSampler.grammar_lazy_patterns(model, 'root ::= "x"', "root", [pattern], [])


def test_a_look_around_trigger_waits_past_text_it_rules_out(model: LlamaModel, paris_ctx: LlamaContext) -> None:
    """Look-around (which Functionary's ``>>>(?!all)`` needs) runs in the bounded backtracking
    engine: "no tool" is ruled out by the look-behind, a later "tool" triggers."""
    lazy = LlamaSampler.grammar_lazy_patterns(model, 'root ::= "tool(" [a-z]+ ")"', "root", ["(?<!no )tool"], [])
    everything = len(kept(LlamaSampler.greedy(), paris_ctx))
    accept_text(lazy, model, "There is no tool")
    assert len(kept(lazy, paris_ctx)) == everything
    accept_text(lazy, model, " but a tool")
    after_tool = allowed(lazy, paris_ctx)
    assert "(" in after_tool
    assert all(piece.startswith("(") for piece in after_tool)
