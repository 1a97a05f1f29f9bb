"""llama.cpp's own HTTP server, prebuilt: the serving benchmark's peer, run in-process through the
`xllamacpp` wheel with ITS interpreter, so that no llama.cpp build is needed.

    .venv-peers/bin/python benches/peer_xllamacpp_server.py --model M --port N --threads T --parallel P --ctx C

Settings are llama-server's for `-m M --port N -t T -tb T -np P -c C` (C split across the P slots, continuous
batching, n_batch 2048 / n_ubatch 512, prompt cache and slot reuse left at their defaults); `--embeddings` adds
`--embeddings --pooling mean` (llama-server then serves embeddings only, pooled as `llamactx serve --embeddings`
pools them), `--reranking` its `--reranking` (`/v1/rerank` only).
Prints `listening http://127.0.0.1:N` once `GET /health` answers 200, then serves until SIGTERM,
SIGINT or the end of stdin (so it stops when its parent dies: give it a pipe, not /dev/null), shuts the server
down and exits 0. llama.cpp logs to stderr.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import xllamacpp

HOST = "127.0.0.1"
HEALTH_TIMEOUT_S = 60.0
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--parallel", type=int, required=True)
    parser.add_argument("--ctx", type=int, required=True, help="total context, split across the parallel slots")
    parser.add_argument("--embeddings", action="store_true", help="serve embeddings (only), mean-pooled")
    parser.add_argument("--reranking", action="store_true", help="serve /v1/rerank (llama-server's --reranking)")
    parser.add_argument(
        "--chat-template-file", metavar="FILE", help="llama-server's --chat-template-file: this Jinja template"
    )
    parser.add_argument(
        "--spec-ngram",
        nargs=2,
        type=int,
        metavar=("N", "M"),
        help="speculative decoding by n-gram lookup: llama-server's --spec-type ngram-simple "
        "--spec-ngram-size-n N --spec-ngram-size-m M",
    )
    parser.add_argument(
        "--draft-model",
        metavar="FILE",
        help="speculative decoding with a draft model: llama-server's --model-draft FILE (its default sizes)",
    )
    return parser.parse_args()


def server_params(args: argparse.Namespace) -> xllamacpp.CommonParams:
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = [HOST]
    params.port = args.port
    params.n_ctx = args.ctx
    params.n_parallel = args.parallel
    params.cont_batching = True
    params.n_batch = 2048
    params.n_ubatch = 512
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    if args.chat_template_file:
        with open(args.chat_template_file, encoding="utf-8") as template:
            params.chat_template = template.read()
    if args.spec_ngram:
        params.speculative.types = [xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]
        params.speculative.ngram_simple.size_n, params.speculative.ngram_simple.size_m = args.spec_ngram
    if args.draft_model:
        params.speculative.types = [xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
        params.speculative.draft.mparams.path = args.draft_model
    if args.embeddings:
        params.embedding = True
        params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    if args.reranking:
        params.embedding = True
        params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_RANK
    return params


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(url: str) -> bool:
    """True once `url` answers `GET /health` with 200; False if a stop signal comes first."""
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while not healthy(url):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}/health did not answer 200 within {HEALTH_TIMEOUT_S:.0f}s")
        if signal.sigtimedwait(STOP_SIGNALS, 0.05) is not None:
            return False
    return True


def watch_stdin() -> None:
    """Turn the end of stdin (or an unreadable stdin) into a SIGTERM for this process."""
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    args = parse_args()
    # Blocked before any thread starts, so every thread (llama.cpp's included) inherits the mask and the stop signals
    # stay pending until the main thread takes them with sigwait: no handler runs at an arbitrary point.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    threading.Thread(target=watch_stdin, daemon=True).start()

    # Returns once the model is loaded and the HTTP listener is up; the server runs on its own C++ threads.
    server = xllamacpp.Server(server_params(args))
    url = f"http://{HOST}:{args.port}"
    if wait_healthy(url):
        print(f"listening {url}", flush=True)
        signal.sigwait(STOP_SIGNALS)
    # The last reference going stops the server: its destructor ends the slot loop and the HTTP threads, and joins.
    del server
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
