"""The ``llamactx`` command line: ``generate`` (stream text), ``chat`` (answer one message, or
converse), ``embed``, ``rerank``, ``serve`` (an OpenAI-compatible server), ``rpc-server`` (lend this
machine's devices to another's model), ``bench`` and ``info``.
``generate`` and ``chat`` sample as llama.cpp does by default, with a fixed seed."""

from __future__ import annotations

import argparse
import base64
import ipaddress
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from llamactx._chat import ChatSession
from llamactx._cpu import cpu_variant
from llamactx._embedding import embed, embedding_context
from llamactx._enums import LlamaPoolingType
from llamactx._generation import stream
from llamactx._limits import INT32_MAX, RANDOM_SEED
from llamactx._llamactx import (
    LlamaContext,
    LlamaCppError,
    LlamaModel,
    LlamaSampler,
    MtmdContext,
    SamplingParams,
    _gpu_devices,
    serve_rpc,
)
from llamactx._media import MAX_PIXELS_CEILING, MEDIA_URL_MAX_BYTES, MEDIA_URL_TIMEOUT, MediaBudget
from llamactx._models import default_model_path
from llamactx._prompt_cache import DEFAULT_MAX_BYTES as DEFAULT_PROMPT_CACHE_BYTES
from llamactx._reasoning import REASONING_FORMATS, Reasoning, thinking_kwargs
from llamactx._rerank import ranking, rerank
from llamactx._sampling import SAMPLING_DEFAULTS
from llamactx._speculative import MAX_DRAFT, MAX_NGRAM, DraftModel, NgramDraft, Speculative
from llamactx.bench import speeds

__all__ = ["main"]

Number = TypeVar("Number", int, float)

# llama.cpp's sampling defaults (SamplingParams' own), so that the command line samples as
# llama-cli does; except the seed, which llama.cpp picks at random and we fix so that a run can
# be repeated.
DEFAULT_TEMP = SAMPLING_DEFAULTS["temperature"]
DEFAULT_TOP_K = SAMPLING_DEFAULTS["top_k"]
DEFAULT_TOP_P = SAMPLING_DEFAULTS["top_p"]
DEFAULT_MIN_P = SAMPLING_DEFAULTS["min_p"]
DEFAULT_SEED = 0
#: llama-server's ``--pooling`` names.
POOLING_TYPES = {
    "none": LlamaPoolingType.NONE,
    "mean": LlamaPoolingType.MEAN,
    "cls": LlamaPoolingType.CLS,
    "last": LlamaPoolingType.LAST,
    "rank": LlamaPoolingType.RANK,
}
USABLE_CPUS = len(os.sched_getaffinity(0))  # contexts refuse more threads: ggml's spin


def _in_range(convert: Callable[[str], Number], low: Number, high: Number) -> Callable[[str], Number]:
    """An argparse type: ``convert(text)`` between ``low`` and ``high``, else a usage error
    (exit status 2) instead of a traceback from deep inside the run."""

    def parse(text: str) -> Number:
        value = convert(text)  # a ValueError here makes argparse say "invalid int value"
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is not in [{low}, {high}]")
        return value

    parse.__name__ = convert.__name__
    return parse


COUNT = _in_range(int, 1, INT32_MAX)
#: A count of compute threads: at most the CPUs this process may use.
THREADS = _in_range(int, 1, USABLE_CPUS)
NON_NEGATIVE = _in_range(int, 0, INT32_MAX)
COUNT_BYTES = _in_range(int, 1, 2**63 - 1)
PROBABILITY = _in_range(float, 0.0, 1.0)


def _network(text: str) -> str:
    """An argparse type: a network in CIDR notation (``10.1.2.0/24``, ``fd00::/8``)."""
    try:
        return str(ipaddress.ip_network(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _model_file(text: str) -> Path:
    """An argparse type: an existing file (the default model when the option is absent)."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return path


def _model_path(arguments: argparse.Namespace) -> Path:
    chosen: Path | None = arguments.model
    return chosen or default_model_path()


def _endpoints(text: str) -> list[str]:
    """An argparse type: comma-separated ``host:port`` endpoints of RPC servers."""
    endpoints = [endpoint.strip() for endpoint in text.split(",") if endpoint.strip()]
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"{endpoint} is not host:port")
    return endpoints


def _load_model(
    arguments: argparse.Namespace, n_gpu_layers: int | None = None, main_gpu: int | None = None
) -> LlamaModel:
    """The chosen model, with its layers on the ``--rpc`` servers when there are some, and
    ``n_gpu_layers`` of them on GPU ``main_gpu`` (a GPU build's)."""
    rpc_servers: list[str] | None = arguments.rpc
    return LlamaModel.load_from_file(
        _model_path(arguments), n_gpu_layers=n_gpu_layers, main_gpu=main_gpu, rpc_servers=rpc_servers or None
    )


def _sampler(arguments: argparse.Namespace, model: LlamaModel) -> LlamaSampler:
    """``SamplingParams``' chain (llama.cpp's default one) with the command line's values;
    greedy on request."""
    temperature = 0.0 if arguments.greedy else arguments.temp
    seed = None if arguments.seed == RANDOM_SEED else arguments.seed
    sampling = SamplingParams(
        temperature=temperature, top_k=arguments.top_k, top_p=arguments.top_p, min_p=arguments.min_p, seed=seed
    )
    return sampling.sampler(model)


def _context(arguments: argparse.Namespace) -> LlamaContext:
    """A context on the chosen model for ``generate`` and ``chat``."""
    model = _load_model(arguments)
    threads = arguments.threads
    return model.new_context(
        n_ctx=arguments.n_ctx, n_threads=threads, n_threads_batch=threads, no_perf=not arguments.stats
    )


def _write(pieces: Iterable[str]) -> None:
    """Prints text as it is generated, then ends the line."""
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")


def _print_speed(ctx: LlamaContext) -> None:
    timings = ctx.timings()
    prompt_rate = 1000 * timings.n_p_eval / timings.t_p_eval_ms if timings.t_p_eval_ms else float("nan")
    rate = 1000 * timings.n_eval / timings.t_eval_ms if timings.t_eval_ms else float("nan")
    print(
        f"llamactx: prompt {timings.n_p_eval} tokens at {prompt_rate:.1f} tokens/s, "
        f"generation {timings.n_eval} tokens at {rate:.1f} tokens/s",
        file=sys.stderr,
    )


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
    ctx = _context(arguments)
    progress = _prompt_progress if sys.stderr.isatty() else None
    sampler = _sampler(arguments, ctx.model)
    _write(stream(ctx, arguments.prompt, max_tokens=arguments.max_tokens, sampler=sampler, progress=progress))
    if arguments.stats:
        _print_speed(ctx)
    return 0


def _chat(arguments: argparse.Namespace) -> int:
    if arguments.image and not arguments.mmproj:
        print("llamactx chat: --image needs --mmproj, the projector that reads images", file=sys.stderr)
        return 2
    reasoning = _reasoning(arguments, "chat")
    if reasoning is None:
        return 2
    ctx = _context(arguments)
    mtmd = MtmdContext(ctx.model, arguments.mmproj) if arguments.mmproj else None
    session = ChatSession(
        ctx,
        system=arguments.system,
        max_tokens=arguments.max_tokens,
        mtmd=mtmd,
        chat_template=arguments.chat_template,
        chat_template_kwargs=thinking_kwargs(
            arguments.chat_template_kwargs, arguments.reasoning, arguments.reasoning_effort
        ),
        reasoning=reasoning,
    )
    sampler = _sampler(arguments, ctx.model)
    try:
        images = [_image_part(Path(path)) for path in arguments.image or ()]
        if arguments.message is not None:
            _write(session.send(_with_images(images, arguments.message), sampler))
        else:
            print("llamactx chat: an empty line or Ctrl-D ends it.", file=sys.stderr)
            while (line := _read_line()).strip():
                _write(session.send(_with_images(images, line), sampler))
                images = []  # shown with the first message
    except (ValueError, OSError) as error:  # a bad image, or a conversation past the context
        print(f"llamactx chat: {error}", file=sys.stderr)
        return 2
    if arguments.stats:
        _print_speed(ctx)
    return 0


def _image_part(path: Path) -> dict[str, Any]:
    """An OpenAI image part holding the file at ``path``."""
    encoded = base64.b64encode(path.read_bytes()).decode("ascii")
    return {"type": "image_url", "image_url": {"url": f"data:image/{path.suffix[1:] or 'png'};base64,{encoded}"}}


def _with_images(images: list[dict[str, Any]], text: str) -> str | list[dict[str, Any]]:
    """The user's message: its text alone, or the images then the text as content parts."""
    return [*images, {"type": "text", "text": text}] if images else text


def _read_line() -> str:
    """The user's next line, or an empty one at the end of input."""
    try:
        return input("> ")
    except EOFError:
        return ""


#: ``serve --flash-attn``'s words, as llama.cpp's ``flash_attn_type``.
_FLASH_ATTN_TYPES = {"auto": -1, "on": 1, "off": 0}


def _flash_attn_type(word: str) -> int:
    if word not in _FLASH_ATTN_TYPES:
        raise argparse.ArgumentTypeError(f"{word!r} is not one of auto, on, off")
    return _FLASH_ATTN_TYPES[word]


def _serve(arguments: argparse.Namespace) -> int:
    try:
        from llamactx.server._serve import serve
    except ImportError as missing:
        print(f"llamactx serve needs the server extra ({missing}): pip install 'llamactx[server]'", file=sys.stderr)
        return 2
    if arguments.allow_media_urls and not arguments.mmproj:
        print("llamactx serve: --allow-media-urls needs --mmproj, the projector that reads images", file=sys.stderr)
        return 2
    gpu = {"n_gpu_layers": arguments.n_gpu_layers, "main_gpu": arguments.main_gpu}
    if any(value is not None for value in gpu.values()) and not arguments.rpc and not _gpu_devices():
        print("llamactx serve: this build has no GPU: -ngl and -mg change nothing", file=sys.stderr)
    reasoning = _reasoning(arguments, "serve")
    if reasoning is None:
        return 2
    try:
        adapter = _adapter(arguments)
    except ValueError as error:
        print(f"llamactx serve: {error}", file=sys.stderr)
        return 2
    model = _load_model(arguments, **gpu)
    try:
        speculative = _speculative(arguments)
    except ValueError as error:
        print(f"llamactx serve: {error}", file=sys.stderr)
        return 2
    pooling = LlamaPoolingType.RANK if arguments.reranking else POOLING_TYPES[arguments.pooling]
    wanted = arguments.embeddings or arguments.reranking
    embeddings = embedding_context(model, 8, 512, arguments.threads, pooling) if wanted else None
    return serve(model, arguments, embeddings, speculative, reasoning, adapter)


def _reasoning(arguments: argparse.Namespace, command: str) -> Reasoning | None:
    """The reasoning options as a ``Reasoning``; None (after saying why) for a budget below -1."""
    try:
        budget = None if arguments.reasoning_budget == -1 else arguments.reasoning_budget
        return Reasoning(arguments.reasoning_format, budget, arguments.reasoning_budget_message)
    except (ValueError, OverflowError) as error:
        print(f"llamactx {command}: --reasoning-budget takes -1 (unbounded) or more: {error}", file=sys.stderr)
        return None


def _adapter(arguments: argparse.Namespace) -> tuple[str, float] | None:
    """The LoRA adapter of ``--lora FILE`` (scale 1) or ``--lora-scaled FILE:SCALE``, as
    llama-server writes them (a comma between several): one at most, which is all a context of
    llama-cpp-4 takes; ``ValueError`` otherwise. ``--lora-init-without-apply`` starts it at 0."""
    given = [(path, 1.0) for paths in arguments.lora for path in paths.split(",")]
    for pairs in arguments.lora_scaled:
        for pair in pairs.split(","):
            path, _, scale = pair.rpartition(":")
            try:
                given.append((path, float(scale)))
            except ValueError:
                raise ValueError(f"--lora-scaled takes FILE:SCALE, got {pair!r}") from None
    if len(given) > 1:
        raise ValueError(f"llamactx serve applies one LoRA adapter (llama-cpp-4's context takes one), got {len(given)}")
    if not given:
        return None
    path, scale = given[0]
    return path, 0.0 if arguments.lora_init_without_apply else scale


def _speculative(arguments: argparse.Namespace) -> Speculative | None:
    """The server's speculative decoding, from ``--spec-ngram`` or ``--draft-model``."""
    if arguments.spec_ngram and arguments.draft_model:
        raise ValueError("--spec-ngram and --draft-model are two ways to draft: choose one")
    if arguments.spec_ngram:
        return NgramDraft(arguments.spec_ngram_size_n, arguments.spec_ngram_size_m)
    if arguments.draft_model:
        draft = LlamaModel.load_from_file(arguments.draft_model)
        return DraftModel(draft, arguments.draft_max, arguments.draft_p_min)
    return None


def _rerank(arguments: argparse.Namespace) -> int:
    documents = arguments.documents or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not documents:
        print("llamactx rerank: give the documents to rank, as arguments or lines of stdin", file=sys.stderr)
        return 2
    model = _load_model(arguments)
    n_seq = max(1, min(len(documents), 64))
    ctx = embedding_context(model, n_seq, arguments.n_ubatch, arguments.threads, LlamaPoolingType.RANK)
    scores = rerank(ctx, arguments.query, documents)
    results = [
        {"index": index, "relevance_score": float(scores[index]), "document": documents[index]}
        for index in ranking(scores.tolist(), arguments.top_n)
    ]
    print(json.dumps({"model": str(model.path), "results": results}))
    return 0


def _embed(arguments: argparse.Namespace) -> int:
    texts = arguments.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    model = _load_model(arguments)
    ctx = embedding_context(model, max(1, min(len(texts), 64)), arguments.n_ubatch, arguments.threads)
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
    model = _load_model(arguments)
    ctx = model.new_context(
        n_ctx=arguments.pp + arguments.tg,
        n_batch=arguments.pp,
        n_threads=arguments.threads,
        n_threads_batch=arguments.threads,
        flash_attn_type=arguments.flash_attn,
    )
    print(f"model: {model.desc()}  threads: {ctx.n_threads()}  flash_attn: {arguments.flash_attn}")
    for test, rate in speeds(ctx, pp=arguments.pp, tg=arguments.tg, repetitions=arguments.repetitions).items():
        print(f"{test:>8}: {rate:8.1f} tokens/s")
    return 0


def _info(arguments: argparse.Namespace) -> int:
    variant = cpu_variant()
    print(f"cpu build: {variant.name} ({variant.reason})")
    print(f"cpu features: {' '.join(variant.features)}")
    model = _load_model(arguments)
    print(f"path: {model.path}")
    print(f"description: {model.desc()}")
    print(f"parameters: {model.n_params()}  vocabulary: {model.n_vocab()}  embedding: {model.n_embd()}")
    for part in model.devices():
        where = f" at {part['endpoint']}" if part["endpoint"] else ""
        size = "" if part["weight_bytes"] is None else f": {part['weight_bytes'] / 2**20:.1f} MiB of weights"
        print(f"device: {part['name']} ({part['kind']}){where}{size}")
    for key, value in sorted(model.metadata().items()):
        print(f"{key}: {value if len(value) < 200 else value[:200] + '...'}")
    return 0


def _rpc_server(arguments: argparse.Namespace) -> int:
    host: str = arguments.host
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"llamactx rpc-server: listening on {host}: the RPC protocol has no authentication, anyone who reaches "
            "this port can run computations and read what clients send; use it on a trusted network only",
            file=sys.stderr,
        )

    def ready() -> None:
        print(f"llamactx rpc-server: listening on {host}:{arguments.port} (Ctrl-C stops it)", flush=True)

    try:
        serve_rpc(host, arguments.port, threads=arguments.threads, cache_dir=arguments.cache, on_ready=ready)
    except KeyboardInterrupt:
        print("llamactx rpc-server: stopped", file=sys.stderr)
    # llama.cpp's serving thread cannot be stopped, and the C++ destructors a normal exit runs
    # beside it crashed the process (SIGSEGV) when a client had just been served: end it here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _add_model_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "-m",
        "--model",
        type=_model_file,
        metavar="PATH",
        help="GGUF file (default: SmolLM2-135M-Instruct, fetched once)",
    )
    command.add_argument(
        "--rpc",
        type=_endpoints,
        metavar="HOST:PORT,...",
        help="put the layers on these `llamactx rpc-server`s (trusted networks only)",
    )


#: The longest ``--chat-template-file`` read: templates take a few KiB.
MAX_TEMPLATE_BYTES = 1 << 20


def _template_file(path: str) -> str:
    """An argparse type: the Jinja source in the file at ``path`` (UTF-8, at most
    ``MAX_TEMPLATE_BYTES``), else a usage error."""
    try:
        with open(path, "rb") as file:
            source = file.read(MAX_TEMPLATE_BYTES + 1)
        if len(source) > MAX_TEMPLATE_BYTES:
            raise argparse.ArgumentTypeError(f"{path} is over {MAX_TEMPLATE_BYTES} bytes: not a chat template")
        return source.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise argparse.ArgumentTypeError(f"cannot read the chat template {path}: {error}") from None


def _json_object(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object, else a usage error."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, got {type(value).__name__}")
    return value


def _add_chat_template_options(command: argparse.ArgumentParser) -> None:
    """llama-server's ``--chat-template``, ``--chat-template-file`` and ``--chat-template-kwargs``."""
    command.add_argument(
        "--chat-template-kwargs",
        type=_json_object,
        metavar="JSON",
        help="variables of the chat template, as a JSON object (e.g. '{\"enable_thinking\": false}')",
    )
    choice = command.add_mutually_exclusive_group()
    choice.add_argument(
        "--chat-template",
        metavar="NAME|TEXT",
        help="render chats with this template instead of the model's: Jinja source, or the name of one of "
        "llama.cpp's built-in formats (e.g. chatml); a model without a template is rendered as chatml",
    )
    choice.add_argument(
        "--chat-template-file",
        dest="chat_template",
        metavar="FILE",
        type=_template_file,
        help="render chats with the Jinja template in FILE",
    )


def _add_reasoning_options(command: argparse.ArgumentParser, *, formats: bool = True) -> None:
    """llama-server's options for a thinking model's reasoning (``Reasoning``); ``formats``
    adds ``--reasoning-format``, for a command whose replies split the reasoning out (the chat
    command prints a reply as the model writes it, its reasoning in its tags)."""
    reasoning = command.add_argument_group("reasoning of thinking models (llama-server's names)")
    reasoning.add_argument(
        "-rea",
        "--reasoning",
        choices=("on", "off", "auto"),
        default="auto",
        help="whether replies think: the chat template's enable_thinking, true (on) or false (off), over "
        "--chat-template-kwargs' (default: auto, the template's own default)",
    )
    reasoning.add_argument(
        "--reasoning-effort",
        default="default",
        metavar="LEVEL",
        help="the chat template's reasoning_effort (e.g. low, medium, high), over --chat-template-kwargs' "
        "(default: default, the template's own)",
    )
    if formats:
        reasoning.add_argument(
            "--reasoning-format",
            choices=REASONING_FORMATS,
            default="auto",
            help="how a reply's reasoning comes back: none leaves it in the content; auto and deepseek put it "
            "in reasoning_content (streamed as its own deltas); deepseek-legacy splits it too, but streams it "
            "inline in the content (default: auto)",
        )
    else:
        command.set_defaults(reasoning_format="auto")
    reasoning.add_argument(
        "--reasoning-budget",
        type=int,
        default=-1,
        metavar="N",
        help="most tokens a reply may reason: then the reasoning is closed for it (-1: unbounded, the default; "
        "0: at once)",
    )
    reasoning.add_argument(
        "--reasoning-budget-message",
        default="",
        metavar="MESSAGE",
        help="text forced before the closing tag when the budget ends a reply's reasoning",
    )


def _add_adapter_options(command: argparse.ArgumentParser) -> None:
    """llama-server's LoRA options, for one adapter applied to every request."""
    adapters = command.add_argument_group("LoRA adapter (llama-server's names; one adapter)")
    adapters.add_argument(
        "--lora", action="append", default=[], metavar="FILE", help="apply this LoRA adapter (GGUF) at scale 1"
    )
    adapters.add_argument(
        "--lora-scaled",
        action="append",
        default=[],
        metavar="FILE:SCALE",
        help="apply this LoRA adapter at SCALE",
    )
    adapters.add_argument(
        "--lora-init-without-apply",
        action="store_true",
        help="load the adapter at scale 0: requests' lora or POST /lora-adapters give it a scale",
    )


def _add_gpu_options(command: argparse.ArgumentParser) -> None:
    """llama-server's GPU placement, for the model's load (``LlamaModel.load_from_file``):
    meaningful in a build with a GPU backend; another takes them and says they do nothing."""
    gpu = command.add_argument_group("GPU offload (llama-server's names; a CPU build reports that it ignores them)")
    gpu.add_argument(
        "-ngl",
        "--gpu-layers",
        "--n-gpu-layers",
        dest="n_gpu_layers",
        type=NON_NEGATIVE,
        metavar="N",
        help="layers of the model stored on the GPU, or on the --rpc servers (default: none, or all with --rpc)",
    )
    gpu.add_argument("-mg", "--main-gpu", type=NON_NEGATIVE, metavar="INDEX", help="the GPU that holds the model")


def _add_always_on_options(command: argparse.ArgumentParser) -> None:
    """llama-server's switches for what ``serve`` always does, taken so that its command lines
    run unchanged."""
    always = command.add_argument_group("always on here (llama-server's switches, taken and ignored)")
    for flags, what in (
        (("--jinja",), "chats are rendered by the model's Jinja template (llama.cpp's engine)"),
        (("--metrics",), "/metrics serves Prometheus metrics"),
        (("--slots",), "GET /slots lists the slots"),
        (("--cache-prompt",), "a prompt reuses the KV of an earlier one it starts with (see --no-cache-prompt)"),
        (("-cb", "--cont-batching"), "requests join and leave the batch between steps"),
    ):
        always.add_argument(*flags, action="store_true", help=what)


def _add_memory_options(command: argparse.ArgumentParser) -> None:
    """llama-server's options for the context's KV cache, batches and batch threads (the
    engine's context options: checked when it is made, status 2 for what it refuses)."""
    memory = command.add_argument_group("memory and batches (llama-server's names)")
    for flag, short, what in (("--cache-type-k", "-ctk", "K"), ("--cache-type-v", "-ctv", "V")):
        memory.add_argument(
            short,
            flag,
            metavar="TYPE",
            help=f"the KV cache's {what} type: f16 (default), f32, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl"
            + ("; a quantized V needs --flash-attn on or auto" if what == "V" else ""),
        )
    memory.add_argument("-b", "--batch-size", type=COUNT, metavar="N", help="most tokens a decode takes (n_batch)")
    memory.add_argument("-ub", "--ubatch-size", type=COUNT, metavar="N", help="most tokens a micro-batch computes")
    memory.add_argument(
        "-tb",
        "--threads-batch",
        type=THREADS,
        metavar="N",
        help="threads reading prompts (default: -t)",
    )


def _add_threads_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "-t", "--threads", type=THREADS, metavar="N", help="compute threads (default: up to 4, one per CPU)"
    )


def _add_generation_options(command: argparse.ArgumentParser, *, max_tokens: int, n_ctx: int) -> None:
    """The options ``generate`` and ``chat`` share: model, lengths, threads, sampling, --stats."""
    _add_model_option(command)
    command.add_argument(
        "-n",
        "--max-tokens",
        type=NON_NEGATIVE,
        default=max_tokens,
        metavar="N",
        help="most tokens to generate (default: %(default)s)",
    )
    command.add_argument(
        "--n-ctx", type=COUNT, default=n_ctx, metavar="N", help="context size in tokens (default: %(default)s)"
    )
    _add_threads_option(command)
    command.add_argument("--stats", action="store_true", help="print speed on stderr")
    sampling = command.add_argument_group(
        "sampling",
        f"llama.cpp's default chain: top-k {DEFAULT_TOP_K}, then top-p {DEFAULT_TOP_P}, then min-p "
        f"{DEFAULT_MIN_P}, then temperature {DEFAULT_TEMP}, then a random pick seeded with --seed "
        f"(default {DEFAULT_SEED}; a seed always gives the same text). --greedy, or --temp 0, takes the "
        "most likely token instead.",
    )
    sampling.add_argument("--greedy", action="store_true", help="always take the most likely token")
    sampling.add_argument(
        "--temp",
        type=_in_range(float, 0.0, math.inf),
        default=DEFAULT_TEMP,
        metavar="T",
        help="temperature; 0 is greedy",
    )
    sampling.add_argument(
        "--top-k",
        type=NON_NEGATIVE,
        default=DEFAULT_TOP_K,
        metavar="K",
        help="keep the K most likely; 0 keeps all",
    )
    sampling.add_argument(
        "--top-p",
        type=PROBABILITY,
        default=DEFAULT_TOP_P,
        metavar="P",
        help="keep the likeliest with P of the mass; 1 keeps all",
    )
    sampling.add_argument(
        "--min-p",
        type=PROBABILITY,
        default=DEFAULT_MIN_P,
        metavar="P",
        help="drop those under P x the likeliest; 0 keeps all",
    )
    sampling.add_argument(
        "--seed",
        type=_in_range(int, 0, RANDOM_SEED),
        default=DEFAULT_SEED,
        metavar="S",
        help=f"seed of the random pick; {RANDOM_SEED} picks one at random, as llama.cpp does",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llamactx", description="Run GGUF models with llama.cpp from Python.")
    parser.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log on stderr")
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="stream text that continues PROMPT")
    generate.add_argument("prompt", help="the text to continue")
    _add_generation_options(generate, max_tokens=128, n_ctx=2048)
    generate.set_defaults(run=_generate)

    chat = commands.add_parser("chat", help="answer MESSAGE, or chat, with the model's chat template")
    chat.add_argument("message", nargs="?", help="answer this message and exit (default: chat until an empty line)")
    chat.add_argument("--system", metavar="TEXT", help="a system message")
    chat.add_argument("--mmproj", metavar="FILE", help="the model's multimodal projector (GGUF), to read images")
    chat.add_argument(
        "--image",
        metavar="PATH",
        action="append",
        help="show this PNG, JPEG, GIF or BMP with the first message (repeatable)",
    )
    _add_chat_template_options(chat)
    _add_reasoning_options(chat, formats=False)
    _add_generation_options(chat, max_tokens=256, n_ctx=4096)
    chat.set_defaults(run=_chat)

    rerank_command = commands.add_parser(
        "rerank", help="rank documents (arguments, or lines of stdin) by relevance to a query, as JSON"
    )
    rerank_command.add_argument("query")
    rerank_command.add_argument("documents", nargs="*")
    _add_model_option(rerank_command)
    rerank_command.add_argument("--top-n", type=COUNT, help="keep the best N")
    rerank_command.add_argument("--n-ubatch", type=COUNT, default=512, help="most tokens per decode")
    _add_threads_option(rerank_command)
    rerank_command.set_defaults(run=_rerank)

    embed_command = commands.add_parser("embed", help="embed texts (arguments, or lines of stdin) as JSON or .npy")
    embed_command.add_argument("texts", nargs="*")
    _add_model_option(embed_command)
    embed_command.add_argument("-o", "--output", help="write here (.npy: a numpy array; else JSON)")
    embed_command.add_argument("--raw", action="store_true", help="do not normalise the vectors")
    embed_command.add_argument("--n-ubatch", type=COUNT, default=512, help="most tokens per decode")
    _add_threads_option(embed_command)
    embed_command.set_defaults(run=_embed)

    bench = commands.add_parser("bench", help="prompt (pp) and generation (tg) tokens/s, like llama-bench")
    _add_model_option(bench)
    bench.add_argument("-p", "--pp", type=COUNT, default=512)
    bench.add_argument("-n", "--tg", type=COUNT, default=128)
    bench.add_argument("-r", "--repetitions", type=COUNT, default=3)
    _add_threads_option(bench)
    bench.add_argument("--flash-attn", type=int, default=0, choices=(-1, 0, 1))
    bench.set_defaults(run=_bench)

    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server (needs llamactx[server])")
    _add_model_option(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, this machine only)")
    serve.add_argument("--port", type=_in_range(int, 0, 65535), default=8000, help="0 picks a free port")
    serve.add_argument("-np", "--parallel", type=COUNT, default=8, metavar="N", help="requests decoded at once")
    serve.add_argument(
        "-c",
        "--ctx-size",
        "--ctx",
        dest="ctx",
        type=COUNT,
        default=4096,
        metavar="N",
        help="context size in tokens, shared by the --parallel slots",
    )
    _add_threads_option(serve)
    serve.add_argument(
        "--api-key", default=os.environ.get("LLAMACTX_API_KEY"), help="require this key (default: $LLAMACTX_API_KEY)"
    )
    serve.add_argument(
        "--embedding", "--embeddings", dest="embeddings", action="store_true", help="serve /v1/embeddings"
    )
    serve.add_argument(
        "--pooling",
        choices=sorted(POOLING_TYPES),
        default="mean",
        help="how /v1/embeddings pools a text's token vectors (rank: a reranker's scores, for /v1/rerank)",
    )
    serve.add_argument(
        "--reranking",
        "--rerank",
        dest="reranking",
        action="store_true",
        help="serve /v1/rerank with a reranker model (--embeddings --pooling rank)",
    )
    _add_chat_template_options(serve)
    serve.add_argument("--max-waiting", type=NON_NEGATIVE, default=1024, metavar="N", help="queue length before 503")
    serve.add_argument(
        "--no-prefix-cache",
        "--no-cache-prompt",
        dest="no_prefix_cache",
        action="store_true",
        help="do not reuse the KV of earlier prompts",
    )
    serve.add_argument(
        "--prompt-cache-dir",
        metavar="DIR",
        help="keep the prefix cache here across restarts: restored at start, saved at shutdown",
    )
    serve.add_argument(
        "--prompt-cache-bytes",
        type=COUNT_BYTES,
        default=DEFAULT_PROMPT_CACHE_BYTES,
        metavar="N",
        help="most bytes --prompt-cache-dir keeps (oldest removed first); the largest slot file a restore reads",
    )
    serve.add_argument(
        "--slot-save-path",
        metavar="DIR",
        help="serve POST /slots/{id}?action=save|restore with files in this directory (llama-server's)",
    )
    serve.add_argument(
        "--spec-ngram",
        action="store_true",
        help="speculative decoding by n-gram lookup in each request's own text: the same output in fewer decodes",
    )
    for flag, default, meaning in (
        ("n", NgramDraft.size_ngram, "tokens that must repeat for a draft"),
        ("m", NgramDraft.size_mgram, "the most tokens a draft proposes"),
    ):
        serve.add_argument(
            f"--spec-ngram-simple-size-{flag}",
            f"--spec-ngram-size-{flag}",
            dest=f"spec_ngram_size_{flag}",
            type=_in_range(int, 1, MAX_NGRAM),
            default=default,
            metavar=flag.upper(),
            help=f"{meaning} (default: %(default)s)",
        )
    serve.add_argument(
        "-mm",
        "--mmproj",
        metavar="FILE",
        help="the model's multimodal projector (GGUF): chats may hold images as data: URLs",
    )
    serve.add_argument(
        "--max-media-parts",
        type=COUNT,
        default=MediaBudget.max_parts,
        metavar="N",
        help="the most images and audio clips one request may hold, together (default: %(default)s)",
    )
    serve.add_argument(
        "--max-media-pixels",
        type=_in_range(int, 1, MAX_PIXELS_CEILING),
        default=MediaBudget.max_pixels,
        metavar="PIXELS",
        help="the most pixels the images of one request may hold, together, each image counted as width x height "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--max-audio-seconds",
        type=_in_range(float, 0.001, 86400.0),
        default=MediaBudget.max_audio_seconds,
        metavar="SECONDS",
        help="the most seconds of audio one request's clips may hold, together (default: %(default)s)",
    )
    serve.add_argument(
        "--allow-media-urls",
        action="store_true",
        help="fetch chats' http(s):// image URLs (with --mmproj), from public addresses only",
    )
    serve.add_argument(
        "--media-url-max-bytes",
        type=COUNT,
        default=MEDIA_URL_MAX_BYTES,
        metavar="N",
        help="the most bytes the image URLs of one request may bring, together (default: %(default)s)",
    )
    serve.add_argument(
        "--media-url-timeout",
        type=_in_range(float, 0.001, 600.0),
        default=MEDIA_URL_TIMEOUT,
        metavar="SECONDS",
        help="the longest the image URLs of one request may take, together (default: %(default)s)",
    )
    serve.add_argument(
        "--media-url-allow-network",
        type=_network,
        action="append",
        default=[],
        metavar="CIDR",
        help="a network that is not public but may be fetched from, e.g. an intranet's (repeatable)",
    )
    serve.add_argument(
        "-md",
        "--model-draft",
        "--spec-draft-model",
        "--draft-model",
        dest="draft_model",
        metavar="FILE",
        help="speculative decoding with this smaller GGUF model of the same vocabulary: the same output in fewer "
        "decodes of the model",
    )
    serve.add_argument(
        "--spec-draft-n-max",
        "--draft",
        "--draft-n",
        "--draft-max",
        dest="draft_max",
        type=_in_range(int, 1, MAX_DRAFT),
        default=DraftModel.n_draft_max,
        metavar="N",
        help="the most tokens a draft model's draft proposes (default: %(default)s)",
    )
    serve.add_argument(
        "--spec-draft-p-min",
        "--draft-p-min",
        dest="draft_p_min",
        type=PROBABILITY,
        default=DraftModel.p_min,
        metavar="P",
        help="a draft stops before a token the draft model gives less probability (default: %(default)s)",
    )
    serve.add_argument("--model-id", help="the model's name in responses (default: the file name without .gguf)")
    serve.add_argument(
        "--model-alias",
        action="append",
        default=[],
        metavar="NAME",
        help="another name /v1/models lists for the model (repeatable)",
    )
    serve.add_argument(
        "--strict-model",
        action="store_true",
        help="refuse requests without model or naming another than the model id or an alias "
        "(default: any name, or none, is the served model)",
    )
    serve.add_argument(
        "-fa",
        "--flash-attn",
        type=_flash_attn_type,
        default="auto",
        metavar="{auto,on,off}",
        help="flash attention, as llama-server's -fa (default: %(default)s, llama.cpp's choice: on for a CPU, "
        "where off can generate faster at long contexts)",
    )
    _add_memory_options(serve)
    _add_reasoning_options(serve)
    _add_gpu_options(serve)
    _add_adapter_options(serve)
    _add_always_on_options(serve)
    serve.set_defaults(run=_serve)

    rpc_server = commands.add_parser(
        "rpc-server",
        help="serve this machine's devices to other machines' models (llama.cpp's RPC server; no authentication)",
    )
    rpc_server.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s, this machine only)"
    )
    rpc_server.add_argument("--port", type=_in_range(int, 1, 65535), default=50052, help="(default: %(default)s)")
    _add_threads_option(rpc_server)
    rpc_server.add_argument(
        "--cache", type=Path, metavar="DIR", help="keep uploaded tensors here, so that weights cross the network once"
    )
    rpc_server.set_defaults(run=_rpc_server)

    info = commands.add_parser("info", help="print which CPU build runs and why, and a model's metadata")
    _add_model_option(info)
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
    except LlamaCppError as error:
        print(f"llamactx: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): silence the flush at exit too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
