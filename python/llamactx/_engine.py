"""``Engine``: many requests served at once by one context (continuous batching), from threads
and from asyncio. Scheduling, decoding and sampling run on the engine's own native thread;
this module only turns prompts into tokens and waits for pieces."""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from llamactx import _prompt_cache as prompt_cache
from llamactx._constraints import JsonSchema, constraint
from llamactx._llamactx import (
    Completion,
    EngineStats,
    LlamaLoraAdapter,
    LlamaModel,
    LlamaSampler,
    MtmdContext,
    SamplingParams,
    _EngineCore,
    _RequestCore,
    _Waker,
)
from llamactx._media import MediaBudget, MediaPrompt
from llamactx._reasoning import Reasoning
from llamactx._render import ChatRenderer, Message, PreparedChat
from llamactx._schema_check import OutputCheck
from llamactx._speculative import Speculative
from llamactx._tools import ChatInputError, Tool, ToolChoice, reply_message

__all__ = ["Delta", "Engine", "Request"]

#: A piece of generated text and, per token sampled for it, ``(token, logprob)`` of that token
#: then of the most likely others.
Delta = tuple[str, list[list[tuple[int, float]]]]


class _LoopWaker:
    """Wakes one asyncio loop when a request it awaits has news: the engine writes to a pipe
    (without the GIL) that the loop reads. It holds no reference to its loop, and forgets each
    wait when it ends: a closed loop is then freed, its entry in ``_wakers`` goes, and the pipe
    closes with this object."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._native = _Waker()
        self._waiting: dict[asyncio.Future[None], tuple[_RequestCore, bool]] = {}
        loop.add_reader(self._native.fileno(), self._wake)

    def watch(self, core: _RequestCore, *, pieces: bool) -> None:
        core.watch(self._native, pieces)

    async def wait(self, core: _RequestCore, end_only: bool) -> None:
        """Returns once ``core`` has news (the end only, with ``end_only``)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[future] = (core, end_only)
        try:
            await future
        finally:
            del self._waiting[future]

    def _wake(self) -> None:
        self._native.drain()
        for future, (core, end_only) in self._waiting.items():
            if not future.done() and core.ready(end_only):
                future.set_result(None)


_wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker] = weakref.WeakKeyDictionary()


def _waker_for(core: _RequestCore, *, pieces: bool) -> _LoopWaker:
    loop = asyncio.get_running_loop()
    waker = _wakers.get(loop)
    if waker is None:
        waker = _wakers[loop] = _LoopWaker(loop)
    waker.watch(core, pieces=pieces)
    return waker


class Request:
    """One submitted request. Iterate it (``for`` or ``async for``) for the text as it is
    generated; ``result()`` or ``await request`` gives the ``Completion``. A failure inside the
    engine is raised by both. Ctrl-C while waiting raises ``KeyboardInterrupt`` and cancels the
    request; so does cancelling the asyncio task that awaits it. With a JSON Schema, a finished
    value that breaks it (a keyword llguidance cannot enforce while generating) raises
    ``SchemaError`` from both, after the last piece."""

    def __init__(self, core: _RequestCore, check: OutputCheck | None = None) -> None:
        self._core = core
        self._check = check
        self._reply: Callable[[str], dict[str, Any]] = partial(reply_message, schema=None)

    def __iter__(self) -> Iterator[str]:
        for text, _ in self.deltas():
            yield text

    def __aiter__(self) -> AsyncIterator[str]:
        return self._texts()

    async def _texts(self) -> AsyncIterator[str]:
        async for text, _ in self.adeltas():
            yield text

    def deltas(self) -> Iterator[Delta]:
        """The output as it is generated: ``(text, logprobs)`` pairs, where ``logprobs`` holds,
        per token sampled since the previous pair, what ``Completion.logprobs`` holds for it
        (empty unless ``logprobs`` was asked for)."""
        while (delta := self._core.next_piece()) is not None:
            yield delta
        self._check_end()

    async def adeltas(self) -> AsyncIterator[Delta]:
        """``deltas()`` for ``async for``."""
        waker = _waker_for(self._core, pieces=True)
        while True:
            kind, delta = self._core.poll()
            if kind == "end":
                if self._check is not None:  # off the event loop, as in ``_result``
                    await asyncio.to_thread(self._check_end)
                return
            if delta is not None:
                yield delta
                continue
            await self._wait(waker, end_only=False)

    async def _wait(self, waker: _LoopWaker, *, end_only: bool) -> None:
        try:
            await waker.wait(self._core, end_only)
        except asyncio.CancelledError:
            self._core.cancel()
            raise

    def result(self, timeout: float | None = None) -> Completion:
        """The ``Completion``, waiting up to ``timeout`` seconds (``TimeoutError`` after). In a
        forked child, waiting for a request that had not ended (by ``result``, ``await`` or
        iteration) raises ``ValueError``: its engine thread stayed in the parent."""
        return self._checked(self._core.result(timeout))

    def __await__(self) -> Generator[Any, None, Completion]:
        return self._result().__await__()

    async def _result(self) -> Completion:
        waker = _waker_for(self._core, pieces=False)
        while (completion := self._core.result_now()) is None:
            await self._wait(waker, end_only=True)
        if self._check is None:
            return completion
        # Off the event loop: the check's work is bounded (MAX_CHECK_STEPS), not small.
        return await asyncio.to_thread(self._checked, completion)

    def _check_end(self) -> None:
        """After the last piece (a failure was raised instead of the end): the check of the
        finished value."""
        if self._check is not None and (completion := self._core.result_now()) is not None:
            self._checked(completion)

    def _checked(self, completion: Completion) -> Completion:
        """``completion``, once a JSON Schema's check passed its complete value."""
        if self._check is not None and completion.finish_reason == "stop":
            self._check.validate(completion.text)
        return completion

    def message(self, timeout: float | None = None) -> dict[str, Any]:
        """OpenAI's assistant message for the result: ``content``, and for a chat submitted with
        ``tools``, the ``tool_calls`` it made (``content`` None then), each with a fresh ``id``
        and its ``arguments`` as JSON text; a thinking model's reasoning in ``reasoning_content``
        (``Reasoning``)."""
        return self._reply(self.result(timeout).text)

    async def amessage(self) -> dict[str, Any]:
        """``message()`` for ``await``."""
        return self._reply((await self).text)

    def cancel(self) -> None:
        """Stops the request at the engine's next step; it ends with ``finish_reason ==
        "cancelled"`` and the text generated so far."""
        self._core.cancel()

    @property
    def done(self) -> bool:
        """Whether the request is over (finished, cancelled or failed)."""
        return self._core.done

    def __repr__(self) -> str:
        return f"<Request {'done' if self.done else 'running'}>"


class Engine:
    """Serves many requests at once with one context of ``model``: each step decodes chunks of
    new prompts, then the next token of every running request in one batch, so requests join
    and leave between steps (continuous batching). ``submit`` may be called from any thread.

    ``options`` are ``new_context``'s keywords; ``n_seq_max`` is how many requests run at once
    (each gets ``n_ctx / n_seq_max`` cells). At most ``max_waiting`` requests wait for a slot;
    beyond, ``submit`` raises ``EngineBusy``. With ``prefix_cache``, a finished request's tokens
    stay in its slot, and a request whose prompt starts the same way (a shared system prompt, a
    chat's next turn) reads only the rest; a running request's cells are copied when it shares
    more. Without it, a request's output equals ``generate`` on a context of the same options,
    token for token (reused cells were computed in other chunks, which can change a near-tie).
    With ``speculative`` (an ``NgramDraft`` or a ``DraftModel``), requests draft tokens (from
    their own text, or with a draft model) and verify them in one decode: the same output
    (but at near-ties: see ``NgramDraft``) in fewer decodes (``Completion.drafted_tokens`` and
    ``accepted_tokens`` say how many).
    With ``mtmd`` (an ``MtmdContext`` loaded for ``model``), chats may hold images: each is
    tokenized when the chat is prepared (which gives the prompt's whole length) and encoded at
    submit, in the submitting thread, while the engine keeps stepping; its
    embeddings are decoded in a step entry of their own, and the prefix cache recognises the
    same image in a later request (a conversation's next turn reads only what follows).
    With ``lora_adapter`` (a ``LlamaLoraAdapter`` loaded for ``model``), every request is
    generated with it applied at ``lora_scale`` (llama-server's ``--lora``/``--lora-scaled``), as
    ``LlamaContext.lora_adapter_set`` applies it; ``ValueError`` for an adapter of another model or
    a scale that is not finite, ``LlamaLoraAdapterSetError`` when llama.cpp refuses it.
    ``close()`` (or leaving a ``with`` block, or the interpreter's exit) ends every request
    still waiting or running as "cancelled".
    """

    def __init__(
        self,
        model: LlamaModel,
        *,
        max_waiting: int = 1024,
        prefix_cache: bool = True,
        chat_template: str | None = None,
        speculative: Speculative | None = None,
        mtmd: MtmdContext | None = None,
        lora_adapter: LlamaLoraAdapter | None = None,
        lora_scale: float = 1.0,
        **options: Any,
    ) -> None:
        if max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {max_waiting}")
        options.setdefault("n_ctx", 4096)
        options.setdefault("n_seq_max", 8)
        self.model = model
        #: The adapter every request is generated with (``GET /lora-adapters``).
        self.lora_adapter = lora_adapter
        # The scale the engine started with: that of the cells its prompt cache keeps.
        self._base_lora_scale = lora_scale
        lora = None if lora_adapter is None else (lora_adapter, lora_scale)
        self._core = _EngineCore(
            model, max_waiting, prefix_cache, speculative=speculative, mtmd=mtmd, lora=lora, **options
        )
        self._renderer = ChatRenderer(model, chat_template)
        self.mtmd = mtmd
        self._kv_options = {name: options[name] for name in prompt_cache.KV_OPTIONS if name in options}
        # Python joins non-daemon threads before it runs `atexit` handlers: a thread waiting
        # on a request would keep the interpreter from exiting. This hook runs before that.
        _close_at_exit(self._core)

    def submit(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 128,
        stop: str | Sequence[str] = (),
        sampling: SamplingParams | None = None,
        logprobs: int = 0,
        json_schema: JsonSchema | None = None,
        grammar: str | LlamaSampler | None = None,
        lora_scale: float | None = None,
    ) -> Request:
        """Queues a request to generate up to ``max_tokens`` tokens after ``prompt`` (text, or
        token ids) and returns at once. Greedy when ``sampling`` is None; ``logprobs`` (0..20)
        asks for the log-probabilities of each generated token and of that many alternatives.
        ``json_schema`` (a dict, JSON text, or a pydantic model / dataclass / TypedDict class) or
        ``grammar`` (GBNF, rule ``root``; llguidance's Lark when it starts with ``%llguidance``;
        or a ``LlamaSampler`` of this model, e.g. a lazy grammar, whose state is copied)
        constrains the output; it ends with "stop" only where the constraint is complete.
        ``ValueError`` for a prompt that cannot fit a sequence, ``SchemaError`` for a schema
        llguidance cannot compile, ``SamplerInitError`` for GBNF llama.cpp cannot parse,
        ``EngineBusy`` when ``max_waiting`` requests wait. ``lora_scale`` generates this request
        with the engine's LoRA adapter at that scale instead of ``lora_scale``'s (llama-server's
        per-request ``lora``): requests of different scales are decoded in turns, each decode
        under one scale, and reuse only cached cells computed under their own (``ValueError`` on
        an engine without an adapter, or for a scale that is not finite)."""
        return self._submit(
            self.tokens(prompt), max_tokens, stop, sampling, logprobs, json_schema, grammar, lora_scale=lora_scale
        )

    def _submit(
        self,
        tokens: list[int],
        max_tokens: int,
        stop: str | Sequence[str],
        sampling: SamplingParams | None,
        logprobs: int,
        json_schema: JsonSchema | None,
        grammar: str | LlamaSampler | None,
        media: MediaPrompt | None = None,
        lora_scale: float | None = None,
    ) -> Request:
        stops = [stop] if isinstance(stop, str) else list(stop)
        spec, check = constraint(json_schema, grammar)
        images = [] if media is None else media.spans()
        core = self._core.submit(tokens, max_tokens, stops, sampling, logprobs, spec, images, lora_scale)
        return Request(core, check)

    def submit_chat(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int = 256,
        stop: str | Sequence[str] = (),
        sampling: SamplingParams | None = None,
        logprobs: int = 0,
        json_schema: JsonSchema | None = None,
        grammar: str | None = None,
        tools: Sequence[Tool] = (),
        tool_choice: ToolChoice = "auto",
        parallel_tool_calls: bool = True,
        media_budget: MediaBudget = MediaBudget(),
        chat_template_kwargs: Mapping[str, Any] | None = None,
        reasoning: Reasoning = Reasoning(),
        lora_scale: float | None = None,
    ) -> Request:
        """``submit`` for the assistant's reply to ``messages`` (``{"role", "content"}`` dicts or
        pairs, OpenAI's assistant ``tool_calls`` and ``tool`` results included), formatted with
        the model's chat template. The messages' images and audio are read under
        ``media_budget`` (``ChatInputError``, a ``ValueError``, past it). ``chat_template_kwargs``
        are further variables of the template (llama-server's, e.g. ``{"enable_thinking": False}``).
        ``reasoning`` (``Reasoning``) says how a thinking model's reasoning is handled:
        ``request.message()`` has it in ``reasoning_content`` (llama.cpp's parser for the
        template splits it out), and its budget bounds it.

        ``tools`` (OpenAI's function tools) with ``tool_choice`` ("auto", "required", "none" or
        ``{"type": "function", "function": {"name": ...}}``) let the reply call them:
        ``request.message()`` gives the OpenAI message with its ``tool_calls``, whose arguments
        match the tools' parameter schemas. Message text is tokenized as plain text: only the
        template's own text becomes control tokens. ``TypeError`` for messages, ``tools`` or
        ``tool_choice`` of the wrong type; ``ValueError`` for tools with ``json_schema`` or
        ``grammar``, a malformed message or tool, or an unknown ``tool_choice``."""
        chat = self.prepare_chat(
            messages,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls,
            media_budget=media_budget,
            chat_template_kwargs=chat_template_kwargs,
            reasoning=reasoning,
        )
        return self.submit_prepared(
            chat,
            max_tokens=max_tokens,
            stop=stop,
            sampling=sampling,
            logprobs=logprobs,
            json_schema=json_schema,
            grammar=grammar,
            lora_scale=lora_scale,
        )

    def prepare_chat(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Tool] = (),
        tool_choice: ToolChoice = "auto",
        parallel_tool_calls: bool = True,
        media_budget: MediaBudget = MediaBudget(),
        chat_template_kwargs: Mapping[str, Any] | None = None,
        reasoning: Reasoning = Reasoning(),
    ) -> PreparedChat:
        """What ``submit_chat`` submits, without submitting it: the prompt's tokens in the chat
        template (its images and audio read under ``media_budget`` and tokenized, so that
        ``n_tokens`` is the whole prompt's length), the constraint ``tools`` put on the reply,
        the template's extra stop strings, the reasoning's budget, and the parser of the reply into
        OpenAI's message.
        Submit it (once or many times, e.g. for several choices) with ``submit_prepared``.
        Errors as ``submit_chat``'s."""
        return self._renderer.prepare(
            messages, tools, tool_choice, parallel_tool_calls, self.mtmd, media_budget, chat_template_kwargs, reasoning
        )

    def submit_prepared(
        self,
        chat: PreparedChat,
        *,
        max_tokens: int = 256,
        stop: str | Sequence[str] = (),
        sampling: SamplingParams | None = None,
        logprobs: int = 0,
        json_schema: JsonSchema | None = None,
        grammar: str | LlamaSampler | None = None,
        lora_scale: float | None = None,
    ) -> Request:
        """``submit`` for a chat from ``prepare_chat``: its tokens, its stop strings after
        ``stop``, its tools' constraint (``ValueError`` when ``json_schema`` or ``grammar`` is
        given as well: the tools constrain the reply themselves), and ``request.message()``
        parsing the reply with the chat's parser. Each call starts from a copy of the chat's
        constraint. The chat's reasoning budget bounds a reply without ``json_schema`` or
        ``grammar`` (those constrain the reply from its first token: it does not reason)."""
        if chat.with_tools and (json_schema is not None or grammar is not None):
            raise ChatInputError(
                "tools", "tools constrain the reply themselves: give json_schema or grammar without tools"
            )
        stops = [stop] if isinstance(stop, str) else list(stop)
        constraint = grammar if chat.sampler is None else chat.sampler
        if chat.reasoning_budget is not None and json_schema is None and grammar is None:
            stages = [chat.reasoning_budget] if chat.sampler is None else [chat.sampler, chat.reasoning_budget]
            constraint = LlamaSampler.chain(stages)
        request = self._submit(
            chat.tokens,
            max_tokens,
            [*stops, *chat.stops],
            sampling,
            logprobs,
            json_schema,
            constraint,
            chat.media,
            lora_scale,
        )
        request._reply = chat.reply
        return request

    def tokens(self, prompt: str | Sequence[int]) -> list[int]:
        """The token ids ``submit`` decodes for ``prompt`` (text gets the model's BOS token)."""
        if isinstance(prompt, str):
            return self.model.str_to_token(prompt, self.model.add_bos_token())
        return [int(token) for token in prompt]

    def chat_tokens(self, messages: Sequence[Message]) -> list[int]:
        """The token ids ``submit_chat`` decodes (without tools): ``messages`` in the model's
        chat template (or ``chat_template``), ready for the assistant's reply."""
        return self.prepare_chat(messages).tokens

    @property
    def n_ctx_seq(self) -> int:
        """KV cells of one sequence (``n_ctx / n_seq_max``): a prompt must be shorter, and a
        request ends with "length" when its sequence is full."""
        return self._core.n_ctx_seq

    def stats(self) -> EngineStats:
        """The engine's counts now (``EngineStats``): running and waiting requests, KV cells
        used by running requests, kept for reuse and in total, prefix-cache hits, tokens
        generated and prompt tokens computed, speculative tokens drafted and accepted, and
        generated tokens per second of engine work."""
        return self._core.stats()

    def save_slots(self, seq: int | None = None) -> list[bytes]:
        """The cached KV cells of slot ``seq`` (a sequence; ``None``: of every free slot that
        holds some), each as llama.cpp's sequence state file, naming the tokens the prefix cache
        keeps for it (what llama-server's ``/slots/{id}?action=save`` writes). A slot a request
        holds is saved once the request ends. ``IndexError`` for a slot the engine does not have."""
        return [bytes(file) for file in self._core.save_slots(seq)]

    def restore_slot(self, file: bytes, seq: int | None = None) -> tuple[int, int]:
        """Restores a sequence state file (``save_slots``', or llama.cpp's
        ``llama_state_seq_save_file``'s) into slot ``seq`` once no request holds it, or into the
        free slot whose cache is worth least (``None``), for the prefix cache to reuse: a request
        whose prompt starts with its tokens reads only the rest. Returns the slot and its token
        count. ``StateError`` for a file the context refuses (another model's cells, a corrupt
        state; the slot is then empty), ``ValueError`` without a prefix cache."""
        return self._core.restore_slot(file, seq)

    def slots(self) -> list[tuple[int, bool, int]]:
        """Every slot (sequence) as ``(slot, busy, n_tokens)``: whether a request holds it, and
        the tokens its KV cells hold (the request's so far, or those cached for reuse), read by
        the engine thread between two steps."""
        return self._core.slots()

    def erase_slot(self, seq: int) -> int:
        """Empties slot ``seq`` (once no request holds it); returns the tokens it held."""
        return self._core.erase_slot(seq)

    def save_prompt_cache(
        self, directory: str | os.PathLike[str], *, max_bytes: int = prompt_cache.DEFAULT_MAX_BYTES
    ) -> int:
        """Writes every cached slot (``save_slots``) to ``directory`` (made if missing), one
        file each, checked on load by a hash and by this engine's identity: its model file,
        adapter and KV settings. The directory keeps at most ``max_bytes`` of them, the oldest
        removed first. Returns the files written."""
        return prompt_cache.save(self.save_slots(), Path(directory), self._identity(), max_bytes)

    def load_prompt_cache(
        self, directory: str | os.PathLike[str], *, max_bytes: int = prompt_cache.DEFAULT_MAX_BYTES
    ) -> int:
        """Restores ``save_prompt_cache``'s newest files (as many as the engine has slots, at
        most ``max_bytes`` in all) into the prefix cache, so that a prompt they start reads only
        what follows. A file another model, adapter or KV setting made, or whose bytes changed,
        is refused (logged on the ``llamactx`` logger), as is a state the context refuses.
        Returns the files restored."""
        n_slots = self.stats().n_seq_max
        return prompt_cache.load(self.restore_slot, Path(directory), self._identity(), max_bytes, n_slots)

    @property
    def lora_scale(self) -> float:
        """The scale of ``lora_adapter`` for requests that name none (``lora_adapter``'s, until
        set: llama-server's ``POST /lora-adapters``); ``ValueError`` on setting it without an
        adapter or to a scale that is not finite. Requests submitted from then on use it."""
        scale = self._core.lora_scale
        return self._base_lora_scale if scale is None else scale

    @lora_scale.setter
    def lora_scale(self, scale: float) -> None:
        self._core.set_lora_scale(scale)

    def _identity(self) -> str:
        adapter = None if self.lora_adapter is None else (self.lora_adapter.path, self._base_lora_scale)
        return prompt_cache.identity(self.model.path, adapter, self._kv_options)

    def close(self) -> None:
        """Ends every waiting or running request as "cancelled" and stops the engine thread."""
        self._core.close()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._core.closed

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        stats = self.stats()
        state = "closed" if self.closed else f"running={stats.running} waiting={stats.waiting}"
        return f"<Engine {state}>"


_open_engines: weakref.WeakSet[_EngineCore] = weakref.WeakSet()
_exit_hook_registered = False


def _close_open_engines() -> None:
    for core in list(_open_engines):
        core.close()


def _close_at_exit(core: _EngineCore) -> None:
    global _exit_hook_registered
    if not _exit_hook_registered:
        register = getattr(threading, "_register_atexit", None)
        if register is None:  # pragma: no cover - CPython has had the hook since 3.9
            import atexit

            register = atexit.register
        register(_close_open_engines)
        _exit_hook_registered = True
    _open_engines.add(core)
