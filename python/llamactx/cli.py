"""The ``llamactx`` command line: ``llamactx generate "PROMPT"`` streams generated text."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from llamactx._llamactx import LlamaModel, LlamaSampler
from llamactx.generate import stream
from llamactx.models import default_model_path

__all__ = ["main"]


def _model_path(arguments: argparse.Namespace) -> Path:
    return Path(arguments.model) if arguments.model else default_model_path()


def _sampler(arguments: argparse.Namespace) -> LlamaSampler:
    if arguments.temp <= 0:
        return LlamaSampler.greedy()
    stages = [LlamaSampler.top_k(arguments.top_k), LlamaSampler.top_p(arguments.top_p, 1)]
    stages += [LlamaSampler.temp(arguments.temp), LlamaSampler.dist(arguments.seed)]
    return LlamaSampler.chain(stages)


def _generate(arguments: argparse.Namespace) -> int:
    model = LlamaModel.load_from_file(_model_path(arguments))
    threads = arguments.threads
    ctx = model.new_context(
        n_ctx=arguments.n_ctx, n_threads=threads, n_threads_batch=threads, no_perf=not arguments.stats
    )
    for piece in stream(ctx, arguments.prompt, max_tokens=arguments.max_tokens, sampler=_sampler(arguments)):
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
