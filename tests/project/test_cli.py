"""The command line and the streaming generator behind it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.decoding import decode_prompt
from support.prompts import CHATML_WITH_VARIABLES, DEMO_ANSWER, DEMO_QUESTION, HELPFUL, PARIS_PROMPT, PLAIN_CHATML

import llamactx

QUESTION = "What is the capital of France?"


def run_cli(*arguments: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "llamactx", *arguments]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=300, check=False)


def test_generate_command_streams_paris_when_greedy(model_path: Path) -> None:
    greedy = run_cli("generate", PARIS_PROMPT, "-m", str(model_path), "-n", "8", "--greedy")
    assert greedy.returncode == 0, greedy.stderr
    assert greedy.stdout.startswith(" Paris")
    assert run_cli("generate", PARIS_PROMPT, "-m", str(model_path), "-n", "8", "--temp", "0").stdout == greedy.stdout


def test_info_command_prints_metadata(model_path: Path) -> None:
    result = run_cli("info", "-m", str(model_path))
    assert result.returncode == 0, result.stderr
    assert "general.architecture: llama" in result.stdout
    variant = llamactx.cpu_variant()
    assert f"cpu build: {variant.name} ({variant.reason})\n" in result.stdout


def test_stream_joins_to_generate(ctx: llamactx.LlamaContext) -> None:
    pieces = list(llamactx.stream(ctx, PARIS_PROMPT, max_tokens=12))
    assert len(pieces) > 1
    assert "".join(pieces) == llamactx.generate(ctx, PARIS_PROMPT, max_tokens=12)
    assert pieces[0] == " Paris"


def test_stop_strings_end_generation_before_them(ctx: llamactx.LlamaContext) -> None:
    full = llamactx.generate(ctx, PARIS_PROMPT, max_tokens=20)
    assert "." in full
    stopped = llamactx.generate(ctx, PARIS_PROMPT, max_tokens=20, stop=["."])
    assert stopped == full[: full.index(".")]


#: Logits of two CPU builds differ by far less than this (test_cpu_builds.py: the same greedy
#: text): a greedy answer whose every token leads by more is the same on every build.
DEMO_MARGIN = 0.5


def test_the_demo_answers_its_question_and_every_token_leads_by_a_margin(model_path: Path) -> None:
    """``make demo`` (issue 49: asked without "in one sentence" and sampled, the default model
    answered "Allemagne (FRANCE) is the largest island..." on some CPUs)."""
    result = run_cli("chat", DEMO_QUESTION, "-m", str(model_path), "--max-tokens", "128", "--greedy")
    assert result.returncode == 0, result.stderr
    assert result.stdout == DEMO_ANSWER + "\n"
    model = llamactx.LlamaModel.load_from_file(model_path)
    with llamactx.Engine(model, n_ctx=512, n_seq_max=1) as engine:
        prompt = engine.chat_tokens([{"role": "user", "content": DEMO_QUESTION}])
    tokens: list[int] = []
    margins: list[float] = []
    with model.new_context(n_ctx=512) as ctx:
        decode_prompt(ctx, prompt)
        while True:
            runner_up, best = np.sort(ctx.get_logits_ith(-1))[-2:]
            margins.append(float(best - runner_up))
            token = int(np.argmax(ctx.get_logits_ith(-1)))
            if model.is_eog_token(token) or len(tokens) == 32:
                break
            tokens.append(token)
            step = llamactx.LlamaBatch(1)
            step.add(token, len(prompt) + len(tokens) - 1, [0], True)
            ctx.decode(step)
    assert model.detokenize(tokens) == DEMO_ANSWER
    assert min(margins) > DEMO_MARGIN, margins


def test_chat_command_keeps_the_conversation(model_path: Path) -> None:
    options = ["-m", str(model_path), "-n", "20", "--greedy", "--system", HELPFUL]
    result = run_cli("chat", *options, stdin=f"{QUESTION}\n\n")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_chat_answers_one_message_like_the_chat_function(model_path: Path, ctx: llamactx.LlamaContext) -> None:
    options = ["-m", str(model_path), "-n", "32", "--n-ctx", "512", "--greedy", "--system", HELPFUL]
    result = run_cli("chat", QUESTION, *options)
    assert result.returncode == 0, result.stderr
    expected = llamactx.chat(ctx, [("system", HELPFUL), ("user", QUESTION)], max_tokens=32)
    assert result.stdout == expected + "\n"
    assert "Paris" in result.stdout


def test_default_sampling_is_llama_cpps_chain(model_path: Path, ctx: llamactx.LlamaContext) -> None:
    result = run_cli("chat", QUESTION, "-m", str(model_path), "-n", "32", "--n-ctx", "512", "--stats")
    assert result.returncode == 0, result.stderr
    assert "tokens/s" in result.stderr
    sampler = llamactx.LlamaSampler.chain(
        [
            llamactx.LlamaSampler.top_k(40),
            llamactx.LlamaSampler.top_p(0.95),
            llamactx.LlamaSampler.min_p(0.05),
            llamactx.LlamaSampler.temp(0.8),
            llamactx.LlamaSampler.dist(0),
        ]
    )
    expected = llamactx.chat(ctx, [{"role": "user", "content": QUESTION}], max_tokens=32, sampler=sampler)
    assert result.stdout == expected + "\n"


def test_the_seed_decides_the_sampled_text(model_path: Path) -> None:
    hot = ("-m", str(model_path), "-n", "12", "--temp", "3", "--top-k", "0", "--top-p", "1", "--min-p", "0")
    first, again, other = (run_cli("generate", PARIS_PROMPT, *hot, "--seed", seed) for seed in ("7", "7", "8"))
    assert first.returncode == 0, first.stderr
    assert first.stdout == again.stdout
    assert first.stdout != other.stdout


def test_help_states_the_sampling_defaults() -> None:
    result = run_cli("chat", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for setting in ("top-k 40", "top-p 0.95", "min-p 0.05", "temperature 0.8", "--greedy", "--seed"):
        assert setting in text


@pytest.mark.parametrize(
    "bad",
    [
        ["--top-p", "1.5"],
        ["--min-p", "-0.1"],
        ["--temp", "-1"],
        ["--temp", "nan"],
        ["--seed", "-1"],
        ["--seed", str(2**32)],
        ["--top-k", "-5"],
        ["-n", "many"],
        ["--threads", "0"],
        ["--threads", str(len(os.sched_getaffinity(0)) + 1)],
        ["--n-ctx", "0"],
        ["--model", "/no/such/model.gguf"],
    ],
    ids=" ".join,
)
def test_a_bad_option_value_is_a_usage_error(bad: list[str]) -> None:
    result = run_cli("generate", PARIS_PROMPT, *bad)
    assert result.returncode == 2
    assert "usage:" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_an_unknown_flash_attention_word() -> None:
    result = run_cli("serve", "--flash-attn", "maybe")
    assert result.returncode == 2
    assert "'maybe' is not one of auto, on, off" in result.stderr
    assert "Traceback" not in result.stderr


def test_embed_command_writes_json_and_npy(model_path: Path, tmp_path: Path) -> None:
    import json

    import numpy as np

    result = run_cli("embed", "-m", str(model_path), "hello there", "good morning")
    assert result.returncode == 0, result.stderr
    vectors = np.array(json.loads(result.stdout)["embeddings"])
    assert vectors.shape == (2, 576)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    out = tmp_path / "vectors.npy"
    assert run_cli("embed", "-m", str(model_path), "-o", str(out), stdin="hello there\ngood morning\n").returncode == 0
    np.testing.assert_allclose(np.load(out), vectors, atol=1e-6)


def test_bench_command_reports_speeds(model_path: Path) -> None:
    result = run_cli("bench", "-m", str(model_path), "-p", "32", "-n", "8", "-r", "1")
    assert result.returncode == 0, result.stderr
    # The default is what the CPUs allow (it was 2, refused where one CPU is all there is).
    assert f"threads: {min(4, len(os.sched_getaffinity(0)))} " in result.stdout
    assert "pp32:" in result.stdout
    assert "tg8:" in result.stdout


def test_chat_takes_a_chat_template_from_the_command_line_or_a_file(
    model_path: Path, ctx: llamactx.LlamaContext, tmp_path: Path
) -> None:
    template = tmp_path / "chatml.jinja"
    template.write_text(PLAIN_CHATML)
    expected = llamactx.chat(ctx, [{"role": "user", "content": QUESTION}], max_tokens=16, chat_template=PLAIN_CHATML)
    options = ("-m", str(model_path), "-n", "16", "--greedy")
    for given in (["--chat-template-file", str(template)], ["--chat-template", PLAIN_CHATML]):
        result = run_cli("chat", QUESTION, *options, *given)
        assert result.returncode == 0, result.stderr
        assert result.stdout == expected + "\n"
    both = run_cli("chat", QUESTION, *options, "--chat-template", "chatml", "--chat-template-file", str(template))
    assert both.returncode == 2
    assert "not allowed with" in both.stderr
    missing = run_cli("chat", QUESTION, *options, "--chat-template-file", str(tmp_path / "none.jinja"))
    assert missing.returncode == 2
    assert "cannot read the chat template" in missing.stderr
    huge = tmp_path / "huge.jinja"
    huge.write_bytes(b"x" * (2**20 + 1))
    too_big = run_cli("chat", QUESTION, *options, "--chat-template-file", str(huge))
    assert too_big.returncode == 2
    assert "is over 1048576 bytes" in too_big.stderr


def test_chat_takes_the_chat_templates_variables(model_path: Path, ctx: llamactx.LlamaContext) -> None:
    kwargs = {"greeting": "Answer in French.", "enable_thinking": True}
    messages = [{"role": "user", "content": QUESTION}]
    template = CHATML_WITH_VARIABLES
    expected = llamactx.chat(ctx, messages, max_tokens=16, chat_template=template, chat_template_kwargs=kwargs)
    options = ("-m", str(model_path), "-n", "16", "--greedy", "--chat-template", template)
    result = run_cli("chat", QUESTION, *options, "--chat-template-kwargs", json.dumps(kwargs))
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected + "\n"
    for bad, why in (("{not json", "not JSON"), ("[1]", "a JSON object is needed")):
        refused = run_cli("chat", QUESTION, *options, "--chat-template-kwargs", bad)
        assert refused.returncode == 2
        assert why in refused.stderr
