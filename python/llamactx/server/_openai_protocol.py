"""OpenAI's requests as this server reads them: the bodies it accepts (OpenAI's parameters where
llama.cpp can honour them, and llama-server's extras: ``top_k``, ``min_p``, ``repeat_penalty``,
``grammar``). A body is parsed and checked once, by its pydantic model: anything else, a wrong
type or an out-of-range number is refused with 400 naming the parameter before it reaches the
engine. What goes back is ``_openai_replies``'s; errors are ``_errors``'."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError, ValidationInfo, model_validator

from llamactx._limits import INT32_MAX
from llamactx._sampling import SAMPLING_DEFAULTS
from llamactx.server._errors import ApiError

__all__ = [
    "PENALTY_WINDOW_MAX",
    "ChatRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "LoraScale",
    "LoraScales",
    "Message",
    "SamplingBody",
    "parsed",
]

#: The longest penalty window the engine takes.
PENALTY_WINDOW_MAX = 2**20
# OpenAI takes a 64-bit seed; llama.cpp's generator takes 32 bits (the server uses seed mod 2**32).
SEED_RANGE = {"ge": -(2**63), "lt": 2**64}
#: The most choices one request may ask for (prompts times ``n``), as OpenAI bounds ``n``: each is
#: an engine request holding a sequence's worth of work.
MAX_CHOICES = 128

T = TypeVar("T")
NonEmpty = Annotated[T, Field(min_length=1)]
Count = Annotated[int, Field(ge=1, le=MAX_CHOICES)]
TokenCount = Annotated[int, Field(ge=0, le=INT32_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
StopStrings = str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=16)]


class _Body(BaseModel):
    """Strict JSON: no unknown fields, no strings for numbers, no infinities."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool = False


class JsonSchemaFormat(_Body):
    """``response_format.json_schema``: the schema is always enforced, ``strict`` or not. OpenAI
    requires ``name``; it names nothing here, so clients that leave it out are served too."""

    name: Annotated[str, Field(min_length=1, max_length=64)] = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """``response_format``; ``schema`` with ``json_object`` is llama-server's extension."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")

    @model_validator(mode="after")
    def _complete(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ApiError(
                400, "response_format json_schema needs its json_schema", param="response_format.json_schema"
            )
        if self.schema_ is not None and self.type != "json_object":
            raise ApiError(400, "response_format's schema goes with type json_object", param="response_format.schema")
        return self

    def output_schema(self) -> dict[str, Any] | None:
        """The JSON Schema the output must match (None: any text)."""
        if self.json_schema is not None and self.type == "json_schema":
            return self.json_schema.schema_
        if self.type == "json_object":
            return {"type": "object"} if self.schema_ is None else self.schema_
        return None


class LoraScale(_Body):
    """One adapter's scale (llama-server's ``lora`` entries and ``/lora-adapters`` body)."""

    id: Annotated[int, Field(ge=0, le=INT32_MAX)]
    scale: float


#: ``POST /lora-adapters``' body: the scale of each adapter listed.
LoraScales = RootModel[Annotated[list[LoraScale], Field(max_length=16)]]


class SamplingBody(_Body):
    """What completions and chat share: sampling, stopping and llama-server's extras. A field
    named as one of ``SamplingParams``' is passed to it as it is, and takes its default there
    (llama.cpp's); ``repeat_last_n`` is llama-server's name for ``penalty_last_n``."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Count = 1
    stop: StopStrings | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = SAMPLING_DEFAULTS["temperature"]
    top_p: Probability = SAMPLING_DEFAULTS["top_p"]
    seed: Annotated[int, Field(**SEED_RANGE)] | None = None
    presence_penalty: Penalty = SAMPLING_DEFAULTS["presence_penalty"]
    frequency_penalty: Penalty = SAMPLING_DEFAULTS["frequency_penalty"]
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    user: str | None = None
    top_k: Annotated[int, Field(ge=0, le=INT32_MAX)] = SAMPLING_DEFAULTS["top_k"]
    min_p: Probability = SAMPLING_DEFAULTS["min_p"]
    typical_p: Probability = SAMPLING_DEFAULTS["typical_p"]
    repeat_penalty: Annotated[float, Field(ge=0.0, le=10.0)] = SAMPLING_DEFAULTS["repeat_penalty"]
    repeat_last_n: Annotated[int, Field(ge=-1, le=PENALTY_WINDOW_MAX)] = SAMPLING_DEFAULTS["penalty_last_n"]
    grammar: str | None = None
    response_format: ResponseFormat | None = None
    #: llama-server's per-request adapter scales (an adapter it does not list is at 0).
    lora: Annotated[list[LoraScale], Field(max_length=16)] | None = None

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> SamplingBody:
        """What no one field says: a constraint given once, and ``logit_bias`` keys that are
        token ids of the model (``n_vocab`` in the validation context)."""
        if self.response_format is not None and self.grammar is not None and self.response_format.type != "text":
            raise ApiError(400, "give grammar or a JSON response_format, not both", param="response_format")
        n_vocab = info.context["n_vocab"] if info.context else INT32_MAX
        for key in self.logit_bias or {}:
            if not (key.isascii() and key.isdigit()) or int(key) >= n_vocab:
                raise ApiError(400, f"logit_bias keys are token ids below {n_vocab}, got {key!r}", param="logit_bias")
        return self

    def output_schema(self) -> dict[str, Any] | None:
        """The JSON Schema ``response_format`` asks for (None: any text)."""
        return None if self.response_format is None else self.response_format.output_schema()

    def stops(self) -> list[str]:
        """``stop`` as a list."""
        return [self.stop] if isinstance(self.stop, str) else (self.stop or [])


class CompletionRequest(SamplingBody):
    """``POST /v1/completions``: one choice per prompt and ``n``."""

    prompt: str | NonEmpty[list[str]] | NonEmpty[list[TokenId]] | NonEmpty[list[NonEmpty[list[TokenId]]]]
    max_tokens: TokenCount | None = 16
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: Literal[False] = False
    best_of: Count | None = None
    suffix: None = None

    @model_validator(mode="after")
    def _bounded(self) -> CompletionRequest:
        """``best_of`` no other than ``n``, and at most ``MAX_CHOICES`` choices in all."""
        if self.best_of not in (None, self.n):
            raise ApiError(400, "best_of must equal n (choices are not ranked)", param="best_of")
        if len(self.prompts()) * self.n > MAX_CHOICES:
            raise ApiError(
                400,
                f"the request asks for {len(self.prompts())} prompt(s) times n={self.n} choices; this server takes "
                f"at most {MAX_CHOICES}",
                param="n",
            )
        return self

    def prompts(self) -> list[str] | list[list[int]]:
        """The prompts, each a text or token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if isinstance(self.prompt[0], int):
            return [self.prompt]  # a list of ids is one prompt
        return self.prompt


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ImageUrl(_Body):
    #: A ``data:image/...;base64`` URL (``llamactx._media.bitmap_of_url`` refuses any other).
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Body):
    type: Literal["image_url"]
    image_url: ImageUrl


class InputAudio(_Body):
    #: A WAV file, base64 (``llamactx._media.bitmap_of_audio`` refuses other formats).
    data: str
    format: Literal["wav", "mp3"]


class AudioPart(_Body):
    type: Literal["input_audio"]
    input_audio: InputAudio


#: A part of a message's content: text, or (for a server started with a projector) an image or
#: an audio clip.
ContentPart = Annotated[TextPart | ImagePart | AudioPart, Field(discriminator="type")]


class FunctionCall(_Body):
    name: str
    arguments: str


class ToolCall(_Body):
    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class Function(_Body):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern="^[A-Za-z0-9_-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: Function


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: FunctionName


class ChatRequest(SamplingBody):
    """``POST /v1/chat/completions``: the reply to ``messages``, formatted with the model's
    chat template."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    # Accepted and ignored, as by OpenAI without storage or tiers.
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    #: llama-server's extra variables of the chat template (e.g. ``enable_thinking``).
    chat_template_kwargs: dict[str, Any] | None = None
    #: llama-server's: how this reply's reasoning comes back (``REASONING_FORMATS``; default:
    #: the server's ``--reasoning-format``).
    reasoning_format: str | None = None

    @model_validator(mode="after")
    def _logprobs_asked(self) -> ChatRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return self


class EmbeddingRequest(_Body):
    """``POST /v1/embeddings``."""

    model: str | None = None
    input: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=2048)]
        | NonEmpty[list[TokenId]]
        | Annotated[list[NonEmpty[list[TokenId]]], Field(min_length=1, max_length=2048)]
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None


Body = TypeVar("Body", bound=BaseModel)


def parsed(schema: type[Body], data: bytes, n_vocab: int) -> Body:
    """``data`` as a ``schema`` body (``ApiError`` 400 naming the first problem), its token ids
    checked against a vocabulary of ``n_vocab``."""
    try:
        return schema.model_validate_json(data, context={"n_vocab": n_vocab})
    except ValidationError as error:
        raise _invalid(error) from None


_TYPE_NAMES = frozenset(["str", "int", "float", "bool", "list", "dict"])


def _invalid(error: ValidationError) -> ApiError:
    """The first problem pydantic found, as OpenAI words it: the parameter and what is wrong."""
    problem = error.errors(include_url=False)[0]
    # Without the union members pydantic names ("str", "list[TextPart]"): the client's path.
    path = [str(part) for part in problem["loc"] if isinstance(part, int) or part.isidentifier()]
    param = ".".join(part for part in path if part not in _TYPE_NAMES) or None
    if problem["type"] == "json_invalid":
        return ApiError(400, f"the body is not valid JSON: {problem['msg']}")
    if problem["type"] == "model_type":
        if param is None:
            return ApiError(400, "the body must be a JSON object")
        return ApiError(400, f"invalid value for {param}: expected a JSON object", param=param)
    if problem["type"] == "extra_forbidden":
        return ApiError(400, f"unknown or unsupported parameter: {param}", param=param)
    if problem["type"] == "missing":
        return ApiError(400, f"missing required parameter: {param}", param=param)
    return ApiError(400, f"invalid value for {param}: {problem['msg']}", param=param)
