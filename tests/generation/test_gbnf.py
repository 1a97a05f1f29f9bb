"""GBNF grammars given as text compile with llguidance (translated to Lark), whose work per step
is bounded: the same tokens as llama.cpp's own grammar engine allow, without its exponential
stacks (issue 27, finding 3)."""

from __future__ import annotations

import math

import pytest
from support.decoding import decode_prompt

import llamactx
from llamactx import LlamaModel, LlamaSampler

JSON = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
"""
ARITHMETIC = r"""
root  ::= (expr "=" ws term "\n")+   # comments and nested groups
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
"""
#: Splits a GBNF character match allows that a greedy lexer would miss, and Unicode escapes.
AMBIGUOUS = r"""
root ::= ("ab" | "a") "bc" x{1,3} "." | [^a-z]{2} "\u00e9"?
x ::= "b" | "bb"
"""
#: Any text without "<t>", then "<t>" and a word: the right recursion of llama.cpp's tool-call
#: grammars ("until" rules), which an Earley parser pays for with every character unless it is
#: rewritten as left recursion (crates/llamactx-engine/src/sampler/guidance/gbnf/left_linear.rs).
UNTIL = r"""
root   ::= until "<t>" [a-z]+
until  ::= | [<] until1 | [^<] until
until1 ::= | [<] until1 | [t] until2 | [^<t] until
until2 ::= | [<] until1 | [^<>] until
"""
#: The red team's grammar: llama.cpp keeps 3**n stacks after n characters "a".
EXPONENTIAL = 'root ::= e\ne ::= "a" e "b" | "a" e "c" | "a" e "d" | "z"\n'


def kept(candidates: llamactx.LlamaTokenDataArray) -> set[int]:
    """The candidates a sampler left."""
    ids, logits = candidates.ids, candidates.logits
    return {int(token) for token, logit in zip(ids, logits, strict=True) if math.isfinite(logit)}


@pytest.fixture(scope="module")
def text_tokens(model: LlamaModel) -> set[int]:
    # Control tokens render as no text: llama.cpp's engine matches their names as text, llguidance
    # never offers them as text (the better choice), so the comparison leaves them out.
    return {token for token in range(model.n_vocab()) if model.token_to_bytes(token, special=False)}


@pytest.mark.parametrize(
    ("grammar", "prompt"),
    [(JSON, "A JSON object describing a cat:"), (ARITHMETIC, "x = 3 + 4\n"), (AMBIGUOUS, "Say abc:")],
)
def test_llguidance_allows_exactly_what_llama_cpp_allows(
    model: LlamaModel, ctx: llamactx.LlamaContext, text_tokens: set[int], grammar: str, prompt: str
) -> None:
    engine, translated = LlamaSampler.grammar(model, grammar), LlamaSampler.llguidance(model, "gbnf", grammar)
    tokens = model.str_to_token(prompt, True)
    decode_prompt(ctx, tokens)
    for step in range(24):
        by_engine, by_llguidance = ctx.candidates(), ctx.candidates()
        engine.apply(by_engine)
        translated.apply(by_llguidance)
        texts = text_tokens | {token for token in kept(by_engine) if model.is_eog_token(token)}
        assert kept(by_llguidance) <= texts, f"step {step}: llguidance offered a control token as text"
        assert kept(by_engine) & texts == kept(by_llguidance), f"step {step}"
        ids, logits = by_llguidance.ids, by_llguidance.logits
        best = int(ids[int(logits.argmax())])
        engine.accept(best)
        translated.accept(best)
        if model.is_eog_token(best):
            break
        batch = llamactx.LlamaBatch(1)
        batch.add(best, len(tokens), [0], True)
        ctx.decode(batch)
        tokens.append(best)
    assert step > 2


def test_long_text_under_right_recursion_is_allowed_as_llama_cpp_allows_it(
    model: LlamaModel, paris_ctx: llamactx.LlamaContext, text_tokens: set[int]
) -> None:
    engine, translated = LlamaSampler.grammar(model, UNTIL), LlamaSampler.llguidance(model, "gbnf", UNTIL)
    text = "Some <b>text</b>, a < t, <tt and <<t, " * 12 + "<t>done"
    forced = model.str_to_token(text, False)
    assert len(forced) > 150
    for step, token in enumerate(forced):
        by_engine, by_llguidance = paris_ctx.candidates(), paris_ctx.candidates()
        engine.apply(by_engine)
        translated.apply(by_llguidance)
        assert kept(by_engine) & text_tokens == kept(by_llguidance) & text_tokens, f"step {step}"
        assert token in kept(by_llguidance), f"step {step}"
        engine.accept(token)
        translated.accept(token)


@pytest.mark.timeout(120)
def test_an_exponential_grammar_generates_in_bounded_steps(ctx: llamactx.LlamaContext) -> None:
    # llama.cpp's own engine took 47 s for the 8th token of this (the red team's measurement).
    text = llamactx.generate(ctx, "Write a's:", max_tokens=32, grammar=EXPONENTIAL)
    assert set(text) == {"a"}
    assert len(text) >= 32


@pytest.mark.timeout(120)
def test_the_engine_compiles_gbnf_with_llguidance_too(model: LlamaModel) -> None:
    with llamactx.Engine(model, n_ctx=256, n_seq_max=2) as engine:
        completion = engine.submit("Write a's:", max_tokens=32, grammar=EXPONENTIAL).result()
    assert set(completion.text) == {"a"}


@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        ("root ::= x", "undefined rule identifier 'x'"),
        ('root ::= "a"\n  "b"', "expecting name"),
        ('item ::= "a"', "no rule 'root'"),
        ('root ::= "\\q"', "unknown escape"),
        ("root ::= !<[1]>", "negated tokens"),
        ("root ::= " + "(" * 300 + '"a"' + ")" * 300, "depth limit exceeded"),
    ],
)
def test_gbnf_llama_cpp_would_refuse_is_refused_by_name(ctx: llamactx.LlamaContext, grammar: str, message: str) -> None:
    with pytest.raises(llamactx.SamplerInitError, match="the GBNF grammar does not parse") as raised:
        llamactx.generate(ctx, "x", max_tokens=2, grammar=grammar)
    assert raised.value.kind == "InvalidGrammar"
    assert message in str(raised.value)
