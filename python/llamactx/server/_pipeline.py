"""What every API the server speaks shares, from a request's body to its reply: the body read and
checked, a chat's media fetched and its template rendered, the choices submitted to the engine
(all or none), and their completions awaited (a client that leaves cancels them), streamed, or
counted and logged. Each protocol (``_openai``, ``_anthropic``, ``_responses``) is a request
model and a renderer of replies on this one pipeline."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from starlette.requests import Request as HttpRequest

from llamactx._constraints import constraint_stage
from llamactx._engine import Engine, Request
from llamactx._limits import INT32_MAX, RANDOM_SEED
from llamactx._llamactx import (
    Completion,
    LlamaContext,
    SamplerInitError,
    SamplingParams,
    SchemaError,
    _check_prompt,
)
from llamactx._media import MediaBudget
from llamactx._reasoning import Reasoning
from llamactx._render import Message, PreparedChat
from llamactx._sampling import SAMPLING_DEFAULTS
from llamactx._tools import Tool, ToolChoice
from llamactx.server._errors import ApiError, ContextLengthExceeded, openai_error, shutting_down
from llamactx.server._generations import Generation, unless_disconnected
from llamactx.server._media_urls import MediaUrls, refuse_media_urls
from llamactx.server._metrics import ServerMetrics
from llamactx.server._openai_protocol import PENALTY_WINDOW_MAX, Body, LoraScale, SamplingBody, parsed
from llamactx.server._slots import SlotFiles

__all__ = ["UNLIMITED", "Identified", "Pipeline"]

logger = logging.getLogger("llamactx.server")

#: A request with no ``max_tokens`` may fill its sequence (it then ends with "length").
UNLIMITED = INT32_MAX


Prompt = TypeVar("Prompt", list[int], PreparedChat)


class Identified(Protocol):
    """A response as its log line names it."""

    @property
    def id(self) -> str: ...


def seed_of(seed: int | None, choice: int) -> int | None:
    """The seed of choice ``choice`` of a request seeded ``seed`` (None: a random draw)."""
    if seed is None or (seed := (seed + choice) % 2**32) == RANDOM_SEED:
        return None
    return seed


class Pipeline:
    """The engine and the options every API's handlers share, and the steps of a request."""

    def __init__(
        self,
        engine: Engine,
        model_id: str,
        model_aliases: Sequence[str],
        strict_model: bool,
        api_key: str | None,
        embeddings: LlamaContext | None,
        max_body_bytes: int,
        media_urls: MediaUrls | None = None,
        media_budget: MediaBudget = MediaBudget(),
        chat_template_kwargs: Mapping[str, Any] | None = None,
        reasoning: Reasoning = Reasoning(),
        slot_files: SlotFiles | None = None,
    ) -> None:
        self.engine = engine
        self.model = engine.model
        self.n_vocab = engine.model.n_vocab()
        self.model_id = model_id
        # The names /v1/models lists, in order, each once.
        self.model_names = tuple(dict.fromkeys([model_id, *model_aliases]))
        self.strict_model = strict_model
        self.api_key = api_key
        self.embeddings = embeddings
        self.embeddings_lock = threading.Lock()  # embed() uses the whole context
        self.max_body_bytes = max_body_bytes
        self.media_urls = media_urls
        self.media_budget = media_budget
        # Every chat's template variables, which a request's own override.
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        # Every chat's reasoning, whose format a chat request may change.
        self.reasoning = reasoning
        # Where /slots/{id}?action=save|restore keep their files, if anywhere.
        self.slot_files = slot_files
        self.metrics = ServerMetrics(engine)

    def check_fits(self, n_tokens: int) -> None:
        """The engine's check of a prompt of ``n_tokens`` (images included), made here, before
        the engine encodes any image: a 400 naming ``prompt`` for an empty one, and
        ``ContextLengthExceeded`` (OpenAI's error code) for one that cannot fit a sequence."""
        try:
            _check_prompt(n_tokens, self.engine.n_ctx_seq)
        except ValueError as error:
            if n_tokens == 0:
                raise ApiError(400, str(error), param="prompt") from None
            raise ContextLengthExceeded(n_tokens, self.engine.n_ctx_seq) from None

    async def media_fetched(
        self, messages: list[dict[str, Any]], messages_param: str = "messages"
    ) -> list[dict[str, Any]]:
        """``messages``, their ``http(s)://`` image URLs fetched into ``data:`` URLs where the
        server was made to (``MediaUrlPolicy``), else refused with a 400 that says how to allow
        them (on a server that reads images at all; another refuses every image). The messages
        are ``messages_param`` of the body, which a 400 names."""
        try:
            if self.media_urls is not None:
                await self.media_urls.inline(messages)
            elif self.engine.mtmd is not None:
                refuse_media_urls(messages)
        except ApiError as failure:
            failure.param = messages_param
            raise
        return messages

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        tool_choice: ToolChoice,
        parallel_tool_calls: bool,
        messages_param: str = "messages",
        template_kwargs: dict[str, Any] | None = None,
        reasoning_budget: int | None = None,
        reasoning_format: str | None = None,
    ) -> PreparedChat:
        """The chat rendered once for all its choices (``Engine.prepare_chat``, which checks the
        messages and tools, and reads the media under the server's ``MediaBudget``: its errors
        name their parameter, or are the messages' or, for a tool-call constraint that cannot
        be compiled, the tools'), checked to fit a sequence, media included. The messages are
        ``messages_param`` of the body (the Responses API's ``input``); ``template_kwargs`` is
        chat's ``chat_template_kwargs`` (its errors name it), over the server's;
        ``reasoning_budget`` and ``reasoning_format`` replace the server's (``Reasoning``)."""
        reasoning = self.reasoning
        try:
            if reasoning_format is not None:
                reasoning = replace(reasoning, format=reasoning_format)
        except ValueError as error:
            raise ApiError(400, str(error), param="reasoning_format") from None
        if reasoning_budget is not None:
            reasoning = replace(reasoning, budget=reasoning_budget)  # the body's model checked it
        template_kwargs = {**self.chat_template_kwargs, **(template_kwargs or {})} or None
        try:
            chat = self.engine.prepare_chat(
                messages,
                tools=tools,
                tool_choice=tool_choice,
                parallel_tool_calls=parallel_tool_calls,
                media_budget=self.media_budget,
                chat_template_kwargs=template_kwargs,
                reasoning=reasoning,
            )
        except Exception as error:
            param = "tools" if isinstance(error, (SchemaError, SamplerInitError)) else messages_param
            failure = openai_error(error, "the chat cannot be rendered", param)
            if isinstance(failure, ApiError) and failure.param == "messages":
                failure.param = messages_param  # as the engine names them
            raise failure from None
        self.check_fits(chat.n_tokens)
        return chat

    def submit(
        self,
        body: SamplingBody,
        prompts: Sequence[Prompt],
        submit: Callable[..., Request],
        *,
        max_tokens: int,
        logprobs: int,
        constraint_param: str,
    ) -> list[Generation]:
        """Submits ``body.n`` choices of each prompt with ``submit`` (``Engine.submit`` or
        ``submit_prepared``): all, or none (a refusal cancels those already queued). The body's
        constraint is compiled once, and each choice takes a copy. The prompts fit (``check_fits``)
        and the numbers are in range (the body's model): what the engine can refuse is the
        constraint (named by ``constraint_param``), or the request when the queue is full. Blocking
        work: call it off the event loop."""
        generations: list[Generation] = []
        lora_scale = self.lora_scale(body.lora)
        try:
            stage, check = constraint_stage(self.model, body.output_schema(), body.grammar)
            for prompt in prompts:
                for choice in range(body.n):
                    request = submit(
                        prompt,
                        max_tokens=max_tokens,
                        stop=body.stops(),
                        sampling=self.sampling(body, choice),
                        logprobs=logprobs,
                        grammar=stage,
                        lora_scale=lora_scale,
                    )
                    generations.append(Generation(request, len(generations), choice == 0, check, constraint_param))
        except BaseException as error:
            for generation in generations:
                generation.request.cancel()
            if not isinstance(error, Exception):
                raise
            if self.engine.closed:
                raise shutting_down() from error
            raise openai_error(error, "the request cannot be submitted", constraint_param) from error
        return generations

    def lora_scale(self, lora: Sequence[LoraScale] | None) -> float | None:
        """The scale of the engine's adapter (id 0) a request's ``lora`` asks for, as
        llama-server reads it (an adapter it does not list is at 0); None without ``lora``."""
        if lora is None:
            return None
        if self.engine.lora_adapter is None:
            raise ApiError(400, "this server has no LoRA adapter (start it with --lora)", param="lora")
        for entry in lora:
            if entry.id != 0:
                raise ApiError(400, f"no LoRA adapter has id {entry.id}: this server's one is id 0", param="lora")
        return next((entry.scale for entry in reversed(lora)), 0.0)

    def sampling(self, body: SamplingBody, choice: int) -> SamplingParams:
        """The engine's sampling for choice ``choice``: the body's fields named as
        ``SamplingParams``' as they are; the ``n`` choices draw with successive seeds, so that
        they differ and a seeded request repeats; seed -1 (mod 2**32) is random, as in llama.cpp,
        and so is no seed. ``repeat_last_n`` -1 is the whole sequence."""
        given = {name: getattr(body, name) for name in SAMPLING_DEFAULTS if name in SamplingBody.model_fields}
        window = body.repeat_last_n
        given.update(
            penalty_last_n=min(self.engine.n_ctx_seq, PENALTY_WINDOW_MAX) if window == -1 else window,
            logit_bias={int(token): bias for token, bias in (body.logit_bias or {}).items()},
            seed=seed_of(body.seed, choice),
        )
        return SamplingParams(**given)

    async def body(self, http: HttpRequest, schema: type[Body]) -> Body:
        """The body, read up to ``max_body_bytes`` (413 past it), parsed and checked by
        ``schema``, for this server's model (``check_model``)."""
        body = parsed(schema, await self.raw_body(http), self.n_vocab)
        self.check_model(getattr(body, "model", None))
        return body

    async def raw_body(self, http: HttpRequest) -> bytes:
        """The body's bytes, read up to ``max_body_bytes`` (413 past it)."""
        declared = http.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise ApiError(413, f"the body has {declared} bytes; this server takes at most {self.max_body_bytes}")
        chunks, size = [], 0
        async for chunk in http.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise ApiError(413, f"the body is larger than this server takes ({self.max_body_bytes} bytes)")
            chunks.append(chunk)
        return b"".join(chunks)

    def check_model(self, model: str | None) -> None:
        """Any ``model``, or none, names the one model served, as with llama-server; with
        ``strict_model`` only its id and aliases do (404 for another name, 400 for none)."""
        if not self.strict_model:
            return
        if model is None:
            raise ApiError(400, "missing required parameter: model", param="model")
        if model not in self.model_names:
            raise ApiError(
                404,
                f"the model {model!r} does not exist; this server has {', '.join(map(repr, self.model_names))}",
                param="model",
                code="model_not_found",
            )

    async def completed(
        self, http: HttpRequest, envelope: Identified, generations: list[Generation]
    ) -> list[Completion] | None:
        """The generations' completions, counted and logged (``finished``); None (the generations cancelled)
        if the client leaves first."""
        try:
            completions = await unless_disconnected(http, [generation.request for generation in generations])
        except Exception as error:
            raise openai_error(error, "the request failed while generating") from None
        if completions is not None:
            await self.finished(envelope, generations, completions)
        return completions

    async def finished(
        self, envelope: Identified, generations: list[Generation], completions: list[Completion]
    ) -> None:
        """Counts and logs a response whose choices all ended; a choice the engine cancelled
        (it was closed) fails the response, and so does a value its schema's check refuses (the
        check runs in a worker thread: its work is bounded, not small)."""
        for generation, completion in zip(generations, completions, strict=True):
            self.metrics.record(completion, prompt_counted=generation.first_of_prompt)
        if any(completion.finish_reason == "cancelled" for completion in completions):
            raise shutting_down()
        for generation, completion in zip(generations, completions, strict=True):
            if generation.check is not None and completion.finish_reason == "stop":
                try:
                    await asyncio.to_thread(generation.check.validate, completion.text)
                except SchemaError as error:
                    raise openai_error(error, "the output breaks the schema", generation.schema_param) from None
        first = completions[0]
        generated = sum(c.completion_tokens for c in completions)
        logger.info(
            "%s done: %d choice(s), prompt %d tokens (%d cached), completion %d tokens, queued %.3f s, "
            "first token after %.3f s, %.1f tokens/s",
            envelope.id,
            len(completions),
            first.prompt_tokens,
            first.cached_tokens,
            generated,
            first.queue_seconds,
            first.first_token_seconds or 0.0,
            first.tokens_per_second,
            extra={
                "request_id": envelope.id,
                "prompt_tokens": first.prompt_tokens,
                "cached_tokens": first.cached_tokens,
                "completion_tokens": generated,
                "queue_seconds": first.queue_seconds,
                "first_token_seconds": first.first_token_seconds,
            },
        )
