"""The ``llamactx`` command line: ``generate`` (stream text), ``chat``, ``embed``, ``bench`` and
``info``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from llamactx._chat import ChatSession
from llamactx._embedding import embed
from llamactx._enums import LlamaPoolingType
from llamactx._generation import stream
from llamactx._llamactx import LlamaModel, LlamaSampler
from llamactx._models import default_model_path
from llamactx.bench import speeds

__all__ = ["main"]


def _model_path(arguments: argparse.Namespace) -> Path:
    return Path(arguments.model) if arguments.model else default_model_path()


def _sampler(arguments: argparse.Namespace) -> LlamaSampler:
    if arguments.temp <= 0:
        return LlamaSampler.greedy()
    stages = [LlamaSampler.top_k(arguments.top_k), LlamaSampler.top_p(arguments.top_p, 1)]
    stages += [LlamaSampler.temp(arguments.temp), LlamaSampler.dist(arguments.seed)]
    return LlamaSampler.chain(stages)


def _prompt_progress(done: int, total: int) -> None:
    """A one-line progress bar on stderr for long prompts (over 512 tokens)."""
    if total <= 512:
        return
    width = 30
    filled = width * done // total
    end = "\n" if done == total else ""
    print(
        f"\rprompt [{'#' * filled}{'.' * (width - filled)}] {done}/{total} tokens", end=end, file=sys.stderr, flush=True
    )


def _generate(arguments: argparse.Namespace) -> int:
    model = LlamaModel.load_from_file(_model_path(arguments))
    threads = arguments.threads
    ctx = model.new_context(
        n_ctx=arguments.n_ctx, n_threads=threads, n_threads_batch=threads, no_perf=not arguments.stats
    )
    progress = _prompt_progress if sys.stderr.isatty() else None
    pieces = stream(
        ctx, arguments.prompt, max_tokens=arguments.max_tokens, sampler=_sampler(arguments), progress=progress
    )
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    if arguments.stats:
        timings = ctx.timings()
        prompt_rate = 1000 * timings.n_p_eval / timings.t_p_eval_ms if timings.t_p_eval_ms else float("nan")
        rate = 1000 * timings.n_eval / timings.t_eval_ms if timings.t_eval_ms else float("nan")
        print(
            f"llamactx: prompt {timings.n_p_eval} tokens at {prompt_rate:.1f} tokens/s, "
            f"generation {timings.n_eval} tokens at {rate:.1f} tokens/s",
            file=sys.stderr,
        )
    return 0


def _chat(arguments: argparse.Namespace) -> int:
    model = LlamaModel.load_from_file(_model_path(arguments))
    ctx = model.new_context(n_ctx=arguments.n_ctx, n_threads=arguments.threads, n_threads_batch=arguments.threads)
    session = ChatSession(ctx, system=arguments.system, max_tokens=arguments.max_tokens)
    print("llamactx chat: an empty line or Ctrl-D ends it.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        for piece in session.send(line, _sampler(arguments)):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
    return 0


def _embed(arguments: argparse.Namespace) -> int:
    texts = arguments.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    model = LlamaModel.load_from_file(_model_path(arguments))
    n_seq = max(1, min(len(texts), 64))
    n_ubatch = arguments.n_ubatch - arguments.n_ubatch % n_seq or n_seq
    ctx = model.new_context(
        n_ctx=max(arguments.n_ubatch, 256) * n_seq,
        n_batch=n_ubatch,
        n_ubatch=n_ubatch,
        n_seq_max=n_seq,
        embeddings=True,
        pooling_type=LlamaPoolingType.MEAN,
        n_threads=arguments.threads,
        n_threads_batch=arguments.threads,
    )
    vectors = embed(ctx, texts, normalize=not arguments.raw)
    if arguments.output and arguments.output.endswith(".npy"):
        import numpy as np

        np.save(arguments.output, vectors)
    else:
        payload = json.dumps({"model": str(model.path), "embeddings": vectors.tolist()})
        if arguments.output:
            Path(arguments.output).write_text(payload)
        else:
            print(payload)
    return 0


def _bench(arguments: argparse.Namespace) -> int:
    model = LlamaModel.load_from_file(_model_path(arguments))
    threads = arguments.threads or 2
    ctx = model.new_context(
        n_ctx=arguments.pp + arguments.tg,
        n_batch=arguments.pp,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn_type=arguments.flash_attn,
    )
    print(f"model: {model.desc()}  threads: {threads}  flash_attn: {arguments.flash_attn}")
    for test, rate in speeds(ctx, pp=arguments.pp, tg=arguments.tg, repetitions=arguments.repetitions).items():
        print(f"{test:>8}: {rate:8.1f} tokens/s")
    return 0


def _info(arguments: argparse.Namespace) -> int:
    model = LlamaModel.load_from_file(_model_path(arguments), vocab_only=False)
    print(f"path: {model.path}")
    print(f"description: {model.desc()}")
    print(f"parameters: {model.n_params()}  vocabulary: {model.n_vocab()}  embedding: {model.n_embd()}")
    for key, value in sorted(model.metadata().items()):
        print(f"{key}: {value if len(value) < 200 else value[:200] + '...'}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llamactx", description="Run GGUF models with llama.cpp from Python.")
    parser.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log on stderr")
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="stream text that continues PROMPT")
    generate.add_argument("prompt")
    generate.add_argument("-m", "--model", help="GGUF file (default: SmolLM2-135M-Instruct, fetched once)")
    generate.add_argument("-n", "--max-tokens", type=int, default=128)
    generate.add_argument("--temp", type=float, default=0.0, help="0 (the default) is greedy")
    generate.add_argument("--top-k", type=int, default=40)
    generate.add_argument("--top-p", type=float, default=0.95)
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--n-ctx", type=int, default=2048)
    generate.add_argument("-t", "--threads", type=int, default=None)
    generate.add_argument("--stats", action="store_true", help="print speed on stderr")
    generate.set_defaults(run=_generate)

    chat = commands.add_parser("chat", help="chat with the model, using its chat template")
    chat.add_argument("-m", "--model", help="GGUF file (default: the default model)")
    chat.add_argument("--system", help="a system message")
    chat.add_argument("-n", "--max-tokens", type=int, default=256)
    chat.add_argument("--temp", type=float, default=0.0, help="0 (the default) is greedy")
    chat.add_argument("--top-k", type=int, default=40)
    chat.add_argument("--top-p", type=float, default=0.95)
    chat.add_argument("--seed", type=int, default=0)
    chat.add_argument("--n-ctx", type=int, default=4096)
    chat.add_argument("-t", "--threads", type=int, default=None)
    chat.set_defaults(run=_chat)

    embed_command = commands.add_parser("embed", help="embed texts (arguments, or lines of stdin) as JSON or .npy")
    embed_command.add_argument("texts", nargs="*")
    embed_command.add_argument("-m", "--model", help="GGUF file (default: the default model)")
    embed_command.add_argument("-o", "--output", help="write here (.npy: a numpy array; else JSON)")
    embed_command.add_argument("--raw", action="store_true", help="do not normalise the vectors")
    embed_command.add_argument("--n-ubatch", type=int, default=512, help="most tokens per decode")
    embed_command.add_argument("-t", "--threads", type=int, default=None)
    embed_command.set_defaults(run=_embed)

    bench = commands.add_parser("bench", help="prompt (pp) and generation (tg) tokens/s, like llama-bench")
    bench.add_argument("-m", "--model", help="GGUF file (default: the default model)")
    bench.add_argument("-p", "--pp", type=int, default=512)
    bench.add_argument("-n", "--tg", type=int, default=128)
    bench.add_argument("-r", "--repetitions", type=int, default=3)
    bench.add_argument("-t", "--threads", type=int, default=None)
    bench.add_argument("--flash-attn", type=int, default=0, choices=(-1, 0, 1))
    bench.set_defaults(run=_bench)

    info = commands.add_parser("info", help="print a model's metadata")
    info.add_argument("-m", "--model", help="GGUF file (default: the default model)")
    info.set_defaults(run=_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``llamactx`` command and of ``python -m llamactx``."""
    arguments = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if arguments.verbose else logging.WARNING, format="%(message)s")
    try:
        return int(arguments.run(arguments))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): silence the flush at exit too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
