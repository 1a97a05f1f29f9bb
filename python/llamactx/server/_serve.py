"""``llamactx serve``: the app on uvicorn, on a socket bound before the engine starts (so that
``--port 0`` can report the port the system picked)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from types import FrameType

import uvicorn

from llamactx._engine import Engine
from llamactx._llamactx import (
    ChatTemplateError,
    LlamaContext,
    LlamaLoraAdapterInitError,
    LlamaLoraAdapterSetError,
    LlamaModel,
    MtmdContext,
    MtmdError,
)
from llamactx._media import MediaBudget
from llamactx._reasoning import Reasoning, thinking_kwargs
from llamactx._speculative import Speculative
from llamactx.server._app import create_app
from llamactx.server._media_urls import MediaUrlPolicy
from llamactx.server._slots import SlotFiles

__all__ = ["serve"]

#: Seconds open streams get to finish after Ctrl-C or SIGTERM before they are cancelled.
GRACEFUL_SECONDS = 5
#: Seconds the rest of a shutdown then gets (the engine's step, the worker threads): a longer
#: one is not waited for, and the process exits without it.
CLOSE_SECONDS = 10


def _bound(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def _exit_unless(done: threading.Event, seconds: float) -> None:
    """Ends the process (status 0) unless ``done`` is set within ``seconds``: a shutdown must
    not wait for a step that does not end (llama.cpp's own grammar engine, which a template's
    tool-call grammar still reaches, can make one last minutes) or for a worker thread still
    rendering a template. The engine's thread owns what it uses, and nothing is left to hand
    to anyone."""

    def watchdog() -> None:
        if not done.wait(seconds):
            print(
                f"llamactx serve: still shutting down after {seconds:g} s (a step or a template render "
                "does not end); exiting without it",
                file=sys.stderr,
                flush=True,
            )
            os._exit(0)

    threading.Thread(target=watchdog, name="llamactx-shutdown-watchdog", daemon=True).start()


def serve(
    model: LlamaModel,
    arguments: argparse.Namespace,
    embeddings: LlamaContext | None,
    speculative: Speculative | None = None,
    reasoning: Reasoning = Reasoning(),
    adapter: tuple[str, float] | None = None,
) -> int:
    """Serves until Ctrl-C or SIGTERM; the engine is closed on the way out, within
    ``CLOSE_SECONDS`` of the open streams' end; ``adapter`` is a LoRA adapter's file and scale,
    applied to every request. Status 2 for options the engine refuses."""
    done = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        _exit_unless(done, CLOSE_SECONDS)
        raise SystemExit(0)

    # uvicorn shuts down on SIGTERM, then raises it again for the handler it found: this one
    # makes that a normal exit (status 0) that closes the engine, instead of death by signal.
    signal.signal(signal.SIGTERM, stop)
    logging.getLogger("llamactx.server").setLevel(logging.INFO)  # a line per request
    try:
        sock = _bound(arguments.host, arguments.port)
    except OSError as error:
        print(f"llamactx serve: cannot listen on {arguments.host}:{arguments.port}: {error}", file=sys.stderr)
        return 1
    options = {"n_threads": arguments.threads, "n_threads_batch": arguments.threads} if arguments.threads else {}
    options["flash_attn_type"] = arguments.flash_attn
    given = {
        "cache_type_k": arguments.cache_type_k,
        "cache_type_v": arguments.cache_type_v,
        "n_batch": arguments.batch_size,
        "n_ubatch": arguments.ubatch_size,
        "n_threads_batch": arguments.threads_batch,
    }
    options.update({name: value for name, value in given.items() if value is not None})
    with sock:
        try:
            mtmd = MtmdContext(model, arguments.mmproj, n_threads=arguments.threads) if arguments.mmproj else None
            lora = None if adapter is None else model.lora_adapter_init(adapter[0])
            engine = Engine(
                model,
                max_waiting=arguments.max_waiting,
                prefix_cache=not arguments.no_prefix_cache,
                chat_template=arguments.chat_template,
                speculative=speculative,
                mtmd=mtmd,
                lora_adapter=lora,
                lora_scale=1.0 if adapter is None else adapter[1],
                n_ctx=arguments.ctx,
                n_seq_max=arguments.parallel,
                **options,
            )
        # e.g. a draft model of another vocabulary, no projector, an adapter llama.cpp refuses
        except (ValueError, MtmdError, OSError, LlamaLoraAdapterInitError, LlamaLoraAdapterSetError) as error:
            print(f"llamactx serve: {error}", file=sys.stderr)
            return 2
        try:
            engine.prepare_chat([("user", "Hello")])  # a --chat-template that cannot render fails here, not per request
        except ChatTemplateError as error:
            engine.close()
            print(f"llamactx serve: the chat template: {error}", file=sys.stderr)
            return 2
        cache = arguments.prompt_cache_dir
        if cache is not None:
            restored = engine.load_prompt_cache(cache, max_bytes=arguments.prompt_cache_bytes)
            print(f"llamactx serve: {restored} cached prompts restored from {cache}", file=sys.stderr, flush=True)
        try:
            _serve_until_stopped(engine, sock, arguments, embeddings, reasoning)
        finally:
            _exit_unless(done, CLOSE_SECONDS)
            if cache is not None:
                saved = engine.save_prompt_cache(cache, max_bytes=arguments.prompt_cache_bytes)
                print(f"llamactx serve: {saved} cached prompts saved to {cache}", file=sys.stderr, flush=True)
            engine.close()
            done.set()
    return 0


def _slot_files(arguments: argparse.Namespace) -> SlotFiles | None:
    """Where ``--slot-save-path`` keeps slot files; None without it."""
    if arguments.slot_save_path is None:
        return None
    return SlotFiles(Path(arguments.slot_save_path), arguments.prompt_cache_bytes)


def _media_url_policy(arguments: argparse.Namespace) -> MediaUrlPolicy | None:
    """What ``--allow-media-urls`` and the ``--media-url-*`` options allow; None without it."""
    if not arguments.allow_media_urls:
        return None
    return MediaUrlPolicy(
        max_bytes=arguments.media_url_max_bytes,
        timeout=arguments.media_url_timeout,
        allowed_networks=tuple(arguments.media_url_allow_network),
    )


def _serve_until_stopped(
    engine: Engine,
    sock: socket.socket,
    arguments: argparse.Namespace,
    embeddings: LlamaContext | None,
    reasoning: Reasoning,
) -> None:
    app = create_app(
        engine,
        model_id=arguments.model_id,
        model_aliases=arguments.model_alias,
        strict_model=arguments.strict_model,
        api_key=arguments.api_key,
        embeddings=embeddings,
        media_urls=_media_url_policy(arguments),
        media_budget=MediaBudget(arguments.max_media_parts, arguments.max_media_pixels, arguments.max_audio_seconds),
        chat_template_kwargs=thinking_kwargs(
            arguments.chat_template_kwargs, arguments.reasoning, arguments.reasoning_effort
        ),
        reasoning=reasoning,
        slot_files=_slot_files(arguments),
    )
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"llamactx serve: listening on http://{shown}:{port}", file=sys.stderr, flush=True)
    config = uvicorn.Config(
        app,
        log_level="info" if arguments.verbose else "warning",
        timeout_graceful_shutdown=GRACEFUL_SECONDS,
        server_header=False,
    )
    uvicorn.Server(config).run(sockets=[sock])
